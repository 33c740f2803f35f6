# want: 6:37 If they cannot reach the engine, set reach = "relay"
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "no-engine-url" {
  login = "u@127.0.0.1"
  profile "cpu" {}
}
