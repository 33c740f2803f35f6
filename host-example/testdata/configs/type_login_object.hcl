# want: 7:16 Inappropriate value for argument "login"
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "type-login" {
  login      = { user = "u", host = "h" }
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
