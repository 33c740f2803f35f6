# want: 8:20 Empty worker_command
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "no-worker" {
  login          = "u@127.0.0.1"
  worker_command = []
  engine_url     = "http://127.0.0.1:8470"
  profile "cpu" {}
}
