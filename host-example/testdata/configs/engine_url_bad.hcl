# want: 8:16 Invalid engine_url
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "bad-url" {
  login      = "u@127.0.0.1"
  engine_url = "ftp://127.0.0.1:8470"
  profile "cpu" {}
}
