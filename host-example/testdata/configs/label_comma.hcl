# want: 11:23 Invalid label
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "label-comma" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "gpu" {
    gpus   = 1
    labels = ["cuda", "a100,h100"]
  }
}
