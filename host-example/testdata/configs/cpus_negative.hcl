# want: 10:12 Invalid cpus
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "neg-cpus" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    cpus = -4
  }
}
