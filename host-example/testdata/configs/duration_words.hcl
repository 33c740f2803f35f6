# want: 9:16 is not a duration
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "dur-words" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  max_idle   = "5 minutes"
  profile "cpu" {}
}
