#!/bin/bash
#SBATCH --job-name=fluksio-hpc
#SBATCH --comment=fluksio:v2:prod:4f3c2b1a:hpc-gpu-0123abcd
#SBATCH --cpus-per-task=8
#SBATCH --mem=32000M
#SBATCH --gres=gpu:2
#SBATCH --output=~/.local/state/fluksio/hpc/%j.out
#SBATCH --error=~/.local/state/fluksio/hpc/%j.out
#SBATCH --signal=B:TERM@60

: end of sbatch directives
printf '%s  %s\n' 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef '/home/o'\''neil x/.local/share/fluksio/bin/fluksio-worker-0123456789abcdef' | sha256sum -c --status || { printf 'fluksio: the worker %s does not match its sha256 %s (missing, or replaced since the plugin copied it); not running it\n' '/home/o'\''neil x/.local/share/fluksio/bin/fluksio-worker-0123456789abcdef' 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef >&2; exit 92; }
FLUKSIO_WORKER_TOKEN='tok'\''en$(id)`x`"y" z' exec '/home/o'\''neil x/.local/share/fluksio/bin/fluksio-worker-0123456789abcdef' --url https://engine.example.org:8765 --cpus 8 --gpus 2 --max-idle 300 --ram-mb 32000 --labels cuda
