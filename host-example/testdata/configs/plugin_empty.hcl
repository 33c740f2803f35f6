# want: 3:16 Empty plugin path
provisioner "slurm" "empty-plugin" {
  plugin     = ""
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}
