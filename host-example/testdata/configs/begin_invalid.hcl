# want: 10:34 sbatch refuses it at position 5 ("min" is not a unit
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-begin-min" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["--time=01:00:00", "--begin=now+5min"]
  }
}
