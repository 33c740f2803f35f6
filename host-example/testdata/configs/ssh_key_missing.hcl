# want: 8:16 ssh_key names /nonexistent/fluksio-test/id_ed25519, which does not exist
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "no-key" {
  login      = "u@127.0.0.1"
  ssh_key    = "/nonexistent/fluksio-test/id_ed25519"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
