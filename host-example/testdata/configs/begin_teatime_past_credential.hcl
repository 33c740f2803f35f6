# want: 11:7 a job waits for the next one); its worker's credential, minted at submission, expires at
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-begin-tea" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["--time=01:00:00",
      "--begin=teatime"]
  }
}
