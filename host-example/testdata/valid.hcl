# A configuration that validates: the engine block, and one Slurm
# provisioner with two profiles. @PLUGIN_DIR@ is replaced by the test.
engine {
  listen     = "127.0.0.1:0"
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "valid" {
  login          = "slurmuser@127.0.0.1"
  ssh_port       = 2222
  engine_url     = "http://127.0.0.1:8470"
  worker_command = ["/opt/fluksio/host-example", "worker"]
  max_idle       = "30s"

  profile "cpu" {
    cpus   = 2
    ram_mb = 500
    sbatch = ["--partition=debug", "--time=00:10:00"]
  }
  profile "gpu" {
    cpus   = 2
    gpus   = 1
    labels = ["cuda"]
    sbatch = ["--partition=debug"]
    prerun = ["module load cuda"]
  }
}
