# want: 6:13 Invalid provisioner kind
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "sl/urm" "hpc" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
