# want: 10:37 Invalid prerun line
engine {
  plugin_dir = "@PLUGIN_DIR@"
}

provisioner "slurm" "prerun-nl" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {
    prerun = ["module load python", "cd /tmp\nrm -rf ~"]
  }
}
