# want: 3:25 Unclosed configuration block
engine {
provisioner "slurm" "a" {
  login = "u@h"
