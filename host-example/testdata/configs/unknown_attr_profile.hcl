# want: 11:5 Unsupported argument
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "unk-prof" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"

  profile "cpu" {
    memory = 500
  }
}
