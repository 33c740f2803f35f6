# want: 8:3 Did you mean "engine_url"?
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "typo" {
  login     = "u@127.0.0.1"
  engine_ur = "http://127.0.0.1:8470"
  profile "cpu" {}
}
