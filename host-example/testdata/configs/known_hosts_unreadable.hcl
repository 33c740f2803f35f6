# want: 8:17 known_hosts names /, which cannot be read: read /: is a directory
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "dir-hosts" {
  login       = "u@127.0.0.1"
  known_hosts = "/"
  engine_url  = "http://127.0.0.1:8470"
  profile "cpu" {}
}
