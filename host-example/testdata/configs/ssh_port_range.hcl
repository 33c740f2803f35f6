# want: 8:16 Invalid ssh_port
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "port-range" {
  login      = "u@127.0.0.1"
  ssh_port   = 70000
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
