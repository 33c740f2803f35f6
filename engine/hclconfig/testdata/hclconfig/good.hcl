# A complete configuration for the test schema in hclconfig_test.go.
login          = "alice"
ssh_port       = 2222
worker_command = ["fluksio-worker", "--verbose"]
password       = "hunter2"

profile "cpu" {
  cpus   = 4
  labels = ["cpu"]
}

profile "gpu" {
  gpus   = 2
  sbatch = ["--gres=gpu:2", "--partition=gpu"]
}
