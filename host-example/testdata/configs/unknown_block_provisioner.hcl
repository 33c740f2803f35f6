# want: 9:3 Unsupported block type
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "unk-block" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profiles "cpu" {
    cpus = 2
  }
}
