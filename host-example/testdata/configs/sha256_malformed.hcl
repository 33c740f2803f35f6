# want: 7:16 Invalid sha256 pin
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "badpin" {
  sha256     = "sha256:deadbeef"
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
