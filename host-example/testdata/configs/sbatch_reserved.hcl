# want: 10:36 --job-name cannot be set in a profile
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-reserved" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["--partition=debug", "--job-name=mine"]
  }
}
