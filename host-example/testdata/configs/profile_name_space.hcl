# want: 9:11 Invalid profile name
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "prof-space" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "big cpu" {
    cpus = 2
  }
}
