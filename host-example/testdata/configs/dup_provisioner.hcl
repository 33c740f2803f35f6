# want: 12:21 Duplicate provisioner name
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "twin" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}

provisioner "slurm" "twin" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
