# want: 9:20 must be longer than zero
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "dur-zero" {
  login          = "u@127.0.0.1"
  engine_url     = "http://127.0.0.1:8470"
  submit_timeout = "0s"
  profile "cpu" {}
}
