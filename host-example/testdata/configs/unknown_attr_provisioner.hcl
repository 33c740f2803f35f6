# want: 9:3 Unsupported argument
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "unk-prov" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  partition  = "debug"

  profile "cpu" {
    cpus = 2
  }
}
