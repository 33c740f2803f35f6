# want: 8:16 Incorrect attribute value type
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "type-list" {
  login      = "u@127.0.0.1"
  engine_url = ["http://127.0.0.1:8470"]
  profile "cpu" {}
}
