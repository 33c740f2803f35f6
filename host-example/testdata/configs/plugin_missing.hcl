# want: 3:16 The plugin @PLUGIN_DIR@/provisioner-nope does not exist
provisioner "slurm" "missing-plugin" {
  plugin     = "@PLUGIN_DIR@/provisioner-nope"
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
