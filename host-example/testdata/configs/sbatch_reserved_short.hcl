# want: 10:15 -J cannot be set in a profile
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-short" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["-vJ mine"]
  }
}
