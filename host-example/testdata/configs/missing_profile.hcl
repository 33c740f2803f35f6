# want: 6:34 Missing profile block
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "no-profile" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
}
