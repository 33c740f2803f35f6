# want: 6:32 The argument "login" is required
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "no-login" {
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
