# want: 12:11 Duplicate profile
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "dup-prof" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    cpus = 2
  }
  profile "cpu" {
    cpus = 4
  }
}
