# want: 8:38 RemoteCommand cannot be set here
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "ssh-opt" {
  login       = "u@127.0.0.1"
  ssh_options = ["ConnectTimeout=5", "RemoteCommand=sh"]
  engine_url  = "http://127.0.0.1:8470"
  profile "cpu" {}
}
