#!/bin/bash
#SBATCH --job-name=fluksio-hpc
#SBATCH --comment=fluksio:v2:prod:4f3c2b1a:hpc-big-0123abcd
#SBATCH --cpus-per-task=16
#SBATCH --mem=64000M
#SBATCH --deadline=now+15300seconds
#SBATCH --output=~/.local/state/fluksio/hpc/%j.out
#SBATCH --error=~/.local/state/fluksio/hpc/%j.out
#SBATCH --partition=debug
#SBATCH --time=04:00:00
#SBATCH --account=proj-42

: end of sbatch directives
export FLUKSIO_JOB_START="$(date +%s)" FLUKSIO_WALLTIME=14400
module load python/3.12
source ~/venvs/fluksio/bin/activate
printf '%s  %s\n' 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef '/home/o'\''neil x/.local/share/fluksio/bin/fluksio-worker-0123456789abcdef' | sha256sum -c --status || { printf 'fluksio: the worker %s does not match its sha256 %s (missing, or replaced since the plugin copied it); not running it\n' '/home/o'\''neil x/.local/share/fluksio/bin/fluksio-worker-0123456789abcdef' 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef >&2; exit 92; }
FLUKSIO_WORKER_TOKEN='tok'\''en$(id)`x`"y" z' exec '/home/o'\''neil x/.local/share/fluksio/bin/fluksio-worker-0123456789abcdef' --url https://engine.example.org:8765 --cpus 16 --gpus 0 --max-idle 300 --ram-mb 64000 --labels bigmem,x86
