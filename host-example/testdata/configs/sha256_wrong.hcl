# want: 7:16 Plugin does not match its sha256 pin
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "pinned" {
  sha256     = "0000000000000000000000000000000000000000000000000000000000000000"
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
