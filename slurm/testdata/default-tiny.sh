#!/bin/bash
#SBATCH --job-name=fluksio-hpc
#SBATCH --comment=fluksio:v2:prod:4f3c2b1a:hpc-tiny-0123abcd
#SBATCH --cpus-per-task=1
#SBATCH --output=~/.local/state/fluksio/hpc/%j.out
#SBATCH --error=~/.local/state/fluksio/hpc/%j.out
#SBATCH --signal=B:TERM@60

: end of sbatch directives
FLUKSIO_WORKER_TOKEN='tok'\''en$(id)`x`"y" z' exec fluksio-worker --url https://engine.example.org:8765 --cpus 1 --gpus 0 --max-idle 300
