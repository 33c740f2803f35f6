#!/usr/bin/env bash
# status.sh [STATE_DIR] - show the sandbox daemons, node and queue.
# Exit 0 if munged, slurmctld, sshd and every node's slurmd run (and, with
# SANDBOX_ACCOUNTING=1, mariadbd and slurmdbd), 1 otherwise.
# Read-only.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

(($# <= 1)) || sb_die "usage: status.sh [STATE_DIR]"
sb_resolve_dir "${1:-}"
if [[ ! -e "$SB_DIR/$SB_MARKER" ]]; then
  echo "sandbox $SB_DIR: no state (down and purged, or never started)"
  exit 1
fi

up=0 want=0
daemons=(munged)
# With accounting, its database and slurmdbd are part of the cluster.
if grep -q '^SANDBOX_ACCOUNTING=1' "$SB_DIR/settings" 2>/dev/null; then daemons+=(mariadbd slurmdbd); fi
for d in "${daemons[@]}" slurmctld $(sb_slurmds) sshd; do
  want=$((want + 1))
  if pid="$(sb_pid_of "$d")"; then
    printf '%-10s up   pid %s\n' "$d" "$pid"
    up=$((up + 1))
  else
    printf '%-10s down\n' "$d"
  fi
done
if sb_pid_of slurmctld >/dev/null; then
  export SLURM_CONF="$SB_DIR/etc/slurm.conf"
  timeout 5 sinfo -N -o '%N %T %c %m %G' 2>&1 || true
  timeout 5 squeue -o '%i|%j|%u|%T|%C|%m|%b|%r' 2>&1 || true
fi
if [[ -z "$(sb_slurmds)" ]]; then
  printf '%-10s down (no node was started)\n' slurmd
  want=$((want + 1))
fi
((up == want))
