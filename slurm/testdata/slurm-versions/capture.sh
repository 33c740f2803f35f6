#!/usr/bin/env bash
# capture.sh - record, from a running sandbox, what its Slurm prints where
# the versions differ; the files are the fixtures of versions_test.go.
# Run after `source STATE_DIR/env.sh` (any SANDBOX_SLURM), as root:
#   bash slurm/testdata/slurm-versions/capture.sh
# It writes slurm/testdata/slurm-versions/<version>/, submits as the job
# user over the sandbox's ssh, as the plugin does, and cancels what it
# submitted.
set -euo pipefail
: "${SANDBOX_SSH_CONFIG:?source STATE_DIR/env.sh first}"
v="${SANDBOX_SLURM_VERSION:-$(squeue --version | awk '{print $2}')}"
out="$(cd "$(dirname "$0")" && pwd)/$v"
mkdir -p "$out"
on() { ssh -F "$SANDBOX_SSH_CONFIG" sandbox "$@"; }
script='#!/bin/sh
sleep 300
'
# rc FILE CMD...: CMD's stdout and stderr into FILE, its exit code after.
rc() {
  local f="$1" code=0
  shift
  "$@" >"$out/$f" 2>&1 || code=$?
  echo "exit $code" >>"$out/$f"
}

# 1. A --deadline earlier than now + the time limit.
rc deadline-sbatch.txt on sbatch --parsable --job-name=fx-deadline --time=10 --deadline=now+5minutes <<<"$script"
rc deadline-test-only.txt on sbatch --test-only --time=10 --deadline=now+5minutes <<<"$script"
# 2. What --test-only says of a job that fits.
rc test-only.txt on sbatch --test-only --time=1 <<<"$script"
# 3. A warning sbatch prints and submits anyway.
rc warning-test-only.txt on sbatch --test-only --time=1 --nodes=2 --ntasks=1 <<<"$script"

# 4. A pending array task cancelled alone, beside one that runs.
job="$(on sbatch --parsable --job-name="fx-array-$$" --comment=fx-array-tag --time=5 --array=0-1 --hold <<<"$script")"
job="${job%%;*}"
on scontrol release "${job}_1"
on scancel "${job}_0"
for _ in $(seq 100); do
  [[ "$(on squeue -h -j "${job}_1" -o %T)" == RUNNING ]] && break
  sleep 0.1
done
on squeue -h -t all -r --me --name="fx-array-$$" -o "'%i|%T|%r|%S|%k'" >"$out/array-one-cancelled.squeue"
on squeue -h -t all -j "${job}_1,${job}_0" -o "'%i %T'" >"$out/array-one-cancelled-by-id.squeue"
on scontrol show job "${job}_1" >"$out/scontrol-show-job.txt"
on scancel "$job" || true
on rm -f "slurm-${job}_0.out" "slurm-${job}_1.out"
# Whatever the deadline job became, it goes too.
on scancel --name=fx-deadline || true
echo "captured Slurm $v into $out"
