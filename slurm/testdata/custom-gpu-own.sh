#!/bin/bash
#SBATCH --job-name=fluksio-hpc
#SBATCH --comment=fluksio:v2:prod:4f3c2b1a:hpc-gpu-own-0123abcd
#SBATCH --output=~/.local/state/fluksio/hpc/%j.out
#SBATCH --error=~/.local/state/fluksio/hpc/%j.out
#SBATCH --signal=B:TERM@60
#SBATCH --gres=gpu:a100:2
#SBATCH --mem-per-cpu=4G
#SBATCH -c 8
#SBATCH --partition=gpu

: end of sbatch directives
FLUKSIO_WORKER_TOKEN='tok'\''en$(id)`x`"y" z' exec '/opt/fluksio env/bin/fluksio-worker' --log-level=debug --url 'http://10.0.0.5:8765/?a=b&c=d' --cpus 8 --gpus 2 --max-idle 90 --ram-mb 32768 --artifact-url https://artifacts.example.org/store
