# want: 10:34 may start at 2099-01-01 00:00:00
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-begin-date" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["--time=01:00:00", "--begin=2099-01-01T00:00:00"]
  }
}
