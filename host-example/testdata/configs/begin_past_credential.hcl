# want: 10:34 the begin plus the time limit must fit the credential's 12h cap
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "sb-begin" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    sbatch = ["--time=01:00:00", "--begin=now+2days"]
  }
}
