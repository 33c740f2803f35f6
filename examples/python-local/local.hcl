# The demo without Slurm: workers are processes on this machine, started by
# the Python reference plugin. From the repository root, after make build:
#
#   bin/host-example run -config examples/python-local/local.hcl -need cpus=2 -need cpus=1,label=x86
#
# The plugin's path is relative to this file; worker_command is run by
# the plugin, from the directory the engine was started in.

engine {
  listen = "127.0.0.1:8470"
}

provisioner "local" "laptop" {
  plugin         = "provisioner-local"
  engine_url     = "http://127.0.0.1:8470"
  worker_command = ["bin/host-example", "worker"]
  max_idle       = "30s"

  profile "small" {
    cpus = 1
  }
  profile "medium" {
    cpus   = 2
    ram_mb = 2000
    labels = ["x86"]
  }
}
