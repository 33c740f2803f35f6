# want: 2:13 Plugin is of another kind
provisioner "pbs" "other-kind" {
  plugin     = "@PLUGIN_DIR@/provisioner-slurm"
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
