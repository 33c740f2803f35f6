# want: 3:3 Did you mean "plugin_dir"?
engine {
  plugin_dri = "@PLUGIN_DIR@"
}

provisioner "slurm" "typo" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
