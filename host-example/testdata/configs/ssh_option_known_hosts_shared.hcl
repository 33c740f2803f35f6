# want: 8:38 chmod go-w
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "ssh-opt" {
  login       = "u@127.0.0.1"
  ssh_options = ["ConnectTimeout=5", "UserKnownHostsFile=/tmp/fluksio-test-no-such-known-hosts"]
  engine_url  = "http://127.0.0.1:8470"
  profile "cpu" {}
}
