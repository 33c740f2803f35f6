# want: 6:21 Invalid provisioner name
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "../hpc" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
