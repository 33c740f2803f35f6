# want: 9:23 must be longer than zero
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "dur-neg" {
  login             = "u@127.0.0.1"
  engine_url        = "http://127.0.0.1:8470"
  provision_timeout = "-1s"
  profile "cpu" {}
}
