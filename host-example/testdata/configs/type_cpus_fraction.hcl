# want: 10:12 must be a whole number
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "type-frac" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    cpus = 1.5
  }
}
