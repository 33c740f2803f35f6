#!/usr/bin/env bash
# capture-submit-rules.sh - record what a site's submit rules make sbatch
# say: job_submit/require_timelimit and job_submit/throttle. The files are
# fixtures of submitrules_test.go, beside capture.sh's. Run as root after
# `source STATE_DIR/env.sh` of a sandbox brought up with
#   SANDBOX_JOB_SUBMIT=require_timelimit,throttle SANDBOX_JOBS_PER_HOUR=2
# (any SANDBOX_SLURM), soon after slurmctld started: throttle's counts
# live in slurmctld's memory, and up.sh's own smoke job is one of them.
#   bash slurm/testdata/slurm-versions/capture-submit-rules.sh
# It writes slurm/testdata/slurm-versions/<version>/submit-rule-*.txt,
# submits as the job user over the sandbox's ssh, as the plugin does, and
# cancels what it submitted.
set -euo pipefail
: "${SANDBOX_SSH_CONFIG:?source STATE_DIR/env.sh first}"
[[ "${SANDBOX_JOB_SUBMIT:-}" == *require_timelimit* && "${SANDBOX_JOB_SUBMIT:-}" == *throttle* ]] ||
  { echo "the sandbox needs SANDBOX_JOB_SUBMIT=require_timelimit,throttle (it has '${SANDBOX_JOB_SUBMIT:-}')" >&2; exit 1; }
v="${SANDBOX_SLURM_VERSION:-$(squeue --version | awk '{print $2}')}"
out="$(cd "$(dirname "$0")" && pwd)/$v"
mkdir -p "$out"
on() { ssh -F "$SANDBOX_SSH_CONFIG" sandbox "$@"; }
script='#!/bin/sh
sleep 300
'
rc() {
  local f="$1" code=0
  shift
  "$@" >"$out/$f" 2>&1 || code=$?
  echo "exit $code" >>"$out/$f"
}

# 1. A job without --time, submitted and tested.
rc submit-rule-timelimit-sbatch.txt on sbatch --parsable --job-name=fx-rule <<<"$script"
rc submit-rule-timelimit-test-only.txt on sbatch --test-only <<<"$script"
# 2. Jobs with --time until the throttle refuses one (at most 20 tries).
for _ in $(seq 20); do
  rc submit-rule-throttle-sbatch.txt on sbatch --parsable --job-name=fx-rule --time=1 --hold <<<"$script"
  grep -q '^exit 0$' "$out/submit-rule-throttle-sbatch.txt" || break
done
on scancel --name=fx-rule || true
grep -q 'jobs per hour' "$out/submit-rule-throttle-sbatch.txt" ||
  { echo "the throttle never refused: $(cat "$out/submit-rule-throttle-sbatch.txt")" >&2; exit 1; }
echo "captured Slurm $v's submit rules into $out"
