#!/usr/bin/env bash
# down.sh [STATE_DIR] [--purge] - stop the sandbox started by up.sh.
#
# STATE_DIR: first non-option argument, else $SANDBOX_DIR, else /tmp/pvsb
# (/tmp/pvsb-SUITE for SANDBOX_SLURM=SUITE).
# 1. cancels every job (stopping slurmd would leave running jobs' slurmstepd
#    alive) and waits up to 20 s for the queue to empty;
# 2. stops sshd and the bastion's (and their session processes), slurmd, slurmctld, slurmdbd,
#    mariadbd (with SANDBOX_ACCOUNTING=1) and munged by
#    the pids in STATE_DIR/pid - never by name - with TERM, up to 15 s each
#    (a zombie counts as gone), then KILL.
# 3. unmounts what up.sh bound into a newer Slurm's root (root.sh).
# --purge also removes STATE_DIR. Without it the state is kept, and up.sh
# brings the same cluster back (job ids, keys, ports).
# Idempotent: when already down it exits 0 at once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=root.sh
. "$HERE/root.sh"

T0="$(sb_now)"
PURGE=0
DIR_ARG=""
for a in "$@"; do
  case "$a" in
    --purge) PURGE=1 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    -*) sb_die "unknown option '$a' (usage: down.sh [STATE_DIR] [--purge])" ;;
    *)
      [[ -z "$DIR_ARG" ]] || sb_die "too many arguments (usage: down.sh [STATE_DIR] [--purge])"
      DIR_ARG="$a"
      ;;
  esac
done
sb_resolve_dir "$DIR_ARG"

if [[ ! -d "$SB_DIR" ]]; then
  echo "sandbox $SB_DIR: nothing to stop"
  exit 0
fi
[[ -e "$SB_DIR/$SB_MARKER" ]] || sb_die "$SB_DIR is not a sandbox state dir (no $SB_MARKER); not touching it"

# slurmdbd after slurmctld, which sends it what it has not yet; the
# database after slurmdbd, which writes to it.
daemons=(sshd sshd-bastion $(sb_slurmds) slurmctld slurmdbd mariadbd munged)
alive=()
for d in "${daemons[@]}"; do
  if sb_pid_of "$d" >/dev/null; then alive+=("$d"); fi
done
((${#alive[@]} == 0)) || [[ "$(id -u)" == 0 ]] ||
  sb_die "must run as root to stop ${alive[*]}; re-run with sudo"

export SLURM_CONF="$SB_DIR/etc/slurm.conf"

# 1. Cancel all jobs, for every user, while slurmctld and munged still run.
if sb_pid_of slurmctld >/dev/null && sb_pid_of munged >/dev/null; then
  users="$(timeout 10 squeue -h -o %u 2>/dev/null | sort -u)" || users=""
  for u in slurmuser $users; do
    timeout 10 scancel -u "$u" >/dev/null 2>&1 || true
  done
  deadline=$((SECONDS + 20))
  left=""
  while :; do
    left="$(timeout 5 squeue -h -o %i 2>/dev/null)" || left="?"
    [[ -z "$left" ]] && break
    if ((SECONDS >= deadline)); then
      sb_log "jobs still in the queue after 20 s: $(echo "$left" | tr '\n' ' ')- stopping anyway"
      break
    fi
    sleep 0.1
  done
fi

# 2. Stop the daemons by pid. sshd's per-connection children survive their
# parent (e.g. a client's ControlMaster session), so stop those too.
for d in sshd sshd-bastion; do
  sshd_pid="$(sb_pid_of "$d")" || continue
  children="$(sb_children "$sshd_pid")"
  sb_stop "$d"
  for c in $children; do
    if sb_proc_live "$c"; then kill -TERM "$c" 2>/dev/null || true; fi
  done
  for c in $children; do
    if ! sb_wait_gone "$c" 15; then kill -KILL "$c" 2>/dev/null || true; fi
  done
done
for d in "${daemons[@]}"; do
  sb_stop "$d"
done

# 3. A newer Slurm's root has /tmp and the job user's home bound into it:
# unmount them, or removing the state dir would remove those too.
sb_root_umount "$SB_DIR/root"

if ((PURGE)); then
  # rm's --one-file-system does not see a bind mount of the same file
  # system: nothing may be mounted under the state dir at all.
  if awk -v r="$(cd "$SB_DIR" && pwd -P)/" 'index($2 "/", r) == 1 { f = 1 } END { exit !f }' /proc/self/mounts; then
    sb_die "something is still mounted under $SB_DIR; not removing it (see /proc/self/mounts)"
  fi
  rm -rf --one-file-system -- "$SB_DIR"
  echo "sandbox $SB_DIR: stopped (${alive[*]:-nothing was running}) and purged in $(sb_elapsed "$T0") s"
else
  echo "sandbox $SB_DIR: stopped (${alive[*]:-nothing was running}) in $(sb_elapsed "$T0") s; state kept"
fi
