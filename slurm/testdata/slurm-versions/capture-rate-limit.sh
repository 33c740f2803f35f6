#!/usr/bin/env bash
# capture-rate-limit.sh - record what slurmctld's per-user RPC rate limiter
# makes the client commands say: scontrol show config with the limiter on,
# and the same once the job user's bucket is empty (its last ping is not
# retried: "Slurmctld(primary) at ... is DOWN", exit 1), and squeue -v while
# rationed. The files are fixtures of ratelimit_test.go, beside capture.sh's.
# Run as root after `source STATE_DIR/env.sh` of a sandbox brought up with
#   SANDBOX_SLURM=trixie (or sid) SANDBOX_RATE_LIMIT=10,1
#   bash slurm/testdata/slurm-versions/capture-rate-limit.sh
# It writes slurm/testdata/slurm-versions/<version>/ratelimit-*.txt, each
# ending with the command's exit code, and runs every command as the job
# user over the sandbox's ssh, as the plugin does (root is not rationed).
set -euo pipefail
: "${SANDBOX_SSH_CONFIG:?source STATE_DIR/env.sh first}"
[[ -n "${SANDBOX_RATE_LIMIT:-}" ]] ||
  { echo "the sandbox needs SANDBOX_RATE_LIMIT=10,1 (it has none)" >&2; exit 1; }
v="${SANDBOX_SLURM_VERSION:-$(squeue --version | awk '{print $2}')}"
out="$(cd "$(dirname "$0")" && pwd)/$v"
mkdir -p "$out"
on() { ssh -F "$SANDBOX_SSH_CONFIG" sandbox "$@"; }
rc() {
  local f="$1" code=0
  shift
  "$@" >"$out/$f" 2>&1 || code=$?
  echo "exit $code" >>"$out/$f"
}
# drain: spend the job user's bucket with squeues run at once.
drain() {
  local pids=() i
  for i in $(seq 8); do
    on squeue -h >/dev/null 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
}
# let the bucket fill again.
sleep 12
# 1. The configuration, the bucket full.
rc ratelimit-show-config.txt on scontrol show config
sleep 12
# 2. The same, right after other clients of the job user drained the
#    bucket: until it ends with the ping's DOWN (at most 10 tries).
for _ in $(seq 10); do
  drain &
  d=$!
  sleep 0.3
  rc ratelimit-show-config-drained.txt on scontrol show config
  wait "$d"
  grep -q 'is DOWN' "$out/ratelimit-show-config-drained.txt" && break
  sleep 12
done
grep -q 'is DOWN' "$out/ratelimit-show-config-drained.txt" ||
  { echo "scontrol show config never ended DOWN with the bucket drained" >&2; exit 1; }
# 3. squeue -v, rationed: the words on stderr, its options on stdout.
sleep 12
drain
rc ratelimit-squeue-v.txt on squeue -v
echo "captured Slurm $v's rate limiter into $out"
