# want: 6:37 The argument "engine_url" is required
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "no-engine-url" {
  login = "u@127.0.0.1"
  profile "cpu" {}
}
