# want: 10:15 is not an sbatch option
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-nodash" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["partition=debug"]
  }
}
