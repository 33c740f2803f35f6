# shellcheck shell=bash
# Shared helpers for sandbox/up.sh, down.sh and status.sh. Sourced, not run.
#
# State layout (everything lives in one directory, SB_DIR):
#   etc/{slurm.conf,gres.conf}  munge/{munge.key,munge.socket.2,munged.seed}
#   pid/*.pid  spool/{ctld,d}  ssh/  dev/gpuN -> /dev/null  log/*.log
#   settings (remembered env settings)  env.sh  .pvsb-sandbox (marker)

# The daemons live in /usr/sbin; a non-login root shell may not have it.
PATH="${PATH:-/usr/bin:/bin}:/usr/sbin:/sbin"
export PATH

SB_PROG="sandbox/$(basename "$0")"
# shellcheck disable=SC2034 # used by the scripts that source this file
SB_MARKER=".pvsb-sandbox"

sb_die() {
  printf '%s: %s\n' "$SB_PROG" "$*" >&2
  exit 1
}

sb_log() {
  printf '%s: %s\n' "$SB_PROG" "$*" >&2
}

sb_now() {
  # Seconds since the epoch with microseconds (bash >= 5).
  printf '%s' "${EPOCHREALTIME:-$(date +%s.%N)}"
}

sb_elapsed() { # START -> "1.23"
  awk -v s="$1" -v e="$(sb_now)" 'BEGIN { printf "%.2f", e - s }'
}

# sb_default_dir: /tmp/pvsb for this machine's own Slurm, /tmp/pvsb-SUITE
# for SANDBOX_SLURM=trixie or sid, so that sandboxes of different Slurm
# releases never share a state dir (a controller's state does not move
# between releases) and can be up side by side.
sb_default_dir() {
  case "${SANDBOX_SLURM:-bookworm}" in
    bookworm) printf '/tmp/pvsb\n' ;;
    *) printf '/tmp/pvsb-%s\n' "$SANDBOX_SLURM" ;;
  esac
}

# sb_check_suite: fail when SANDBOX_SLURM asks for another Slurm than the
# sandbox in SB_DIR runs, rather than test one release believing it is
# another.
sb_check_suite() {
  local want="${SANDBOX_SLURM:-}" have=""
  [[ -n "$want" && -r "$SB_DIR/settings" ]] || return 0
  have="$(sed -n 's/^SANDBOX_SLURM=//p' "$SB_DIR/settings")"
  [[ -z "$have" || "$have" == "$want" ]] && return 0
  sb_die "SANDBOX_SLURM=$want, but the sandbox in $SB_DIR runs SANDBOX_SLURM=$have; unset SANDBOX_DIR (each Slurm has its own default), or take that one down (bash sandbox/down.sh $SB_DIR --purge)"
}

# sb_resolve_dir [DIR] -> sets SB_DIR (absolute, no trailing slash).
# Order: argument, $SANDBOX_DIR, sb_default_dir. Refuses characters that
# would break ssh_config (%, spaces), slurm.conf or the heredoc templates.
sb_resolve_dir() {
  local d="${1:-${SANDBOX_DIR:-$(sb_default_dir)}}"
  case "$d" in
    *[[:space:]]*) sb_die "state dir '$d' contains whitespace; choose a path without spaces" ;;
  esac
  [[ "$d" =~ ^[A-Za-z0-9._/+-]+$ ]] ||
    sb_die "state dir '$d' may only contain letters, digits and . _ / + -"
  [[ "$d" == /* ]] || d="$PWD/$d"
  while [[ "$d" == */ && "$d" != / ]]; do d="${d%/}"; done
  case "$d" in
    / | /tmp | /root | /home | /usr | /etc | /var | /run) sb_die "refusing state dir '$d'" ;;
  esac
  SB_DIR="$d"
  # A sandbox of a newer Slurm (root.sh) runs its own clients: a client of
  # another release cannot talk to its controller.
  if [[ -d "$SB_DIR/bin" ]]; then PATH="$SB_DIR/bin:$PATH"; fi
}

# sb_proc_live PID: true if PID exists and is not a zombie/dead (Z or X).
# pid 1 on these machines reaps orphans only every ~2 s, so a stopped daemon
# lingers in /proc as Z; it must count as dead.
sb_proc_live() {
  local pid="$1" stat rest state
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || return 1
  rest="${stat##*) }" # comm may contain spaces/parens: cut after the last ')'
  state="${rest%% *}"
  [[ "$state" != Z && "$state" != X ]]
}

# sb_pid_of NAME: prints the live pid recorded in pid/NAME.pid whose
# /proc/PID/comm is NAME up to its first "-" (slurmd-NODE is a slurmd; the
# check guards against pid reuse); fails otherwise.
sb_pid_of() {
  local name="$1" f="$SB_DIR/pid/$1.pid" pid comm
  [[ -r "$f" ]] || return 1
  read -r pid <"$f" 2>/dev/null || return 1
  sb_proc_live "$pid" || return 1
  { read -r comm <"/proc/$pid/comm"; } 2>/dev/null || return 1
  [[ "$comm" == "${name%%-*}" ]] || return 1
  printf '%s\n' "$pid"
}

# sb_slurmds: the names (for sb_pid_of and sb_stop) of every slurmd with a
# pid file: one slurmd-NODE per node, and a plain "slurmd" left by a sandbox
# from before nodes had pid files of their own.
sb_slurmds() {
  local f
  for f in "$SB_DIR"/pid/slurmd.pid "$SB_DIR"/pid/slurmd-*.pid; do
    [[ -e "$f" ]] || continue
    f="${f##*/}"
    printf '%s\n' "${f%.pid}"
  done
}

# sb_wait_gone PID SECONDS: poll until PID is gone or a zombie.
sb_wait_gone() {
  local pid="$1" deadline
  deadline=$((SECONDS + $2))
  while sb_proc_live "$pid"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}

# sb_stop NAME: TERM the daemon by its pid file, wait up to 15 s, then KILL.
# Never matches by process name.
sb_stop() {
  local name="$1" pid
  if pid="$(sb_pid_of "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    if ! sb_wait_gone "$pid" 15; then
      sb_log "$name (pid $pid) ignored TERM for 15 s; sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
      sb_wait_gone "$pid" 5 || sb_log "$name (pid $pid) still alive after KILL"
    fi
  fi
  rm -f "$SB_DIR/pid/$name.pid"
}

# sb_children PID: pids whose parent is PID (read from /proc, not by name).
sb_children() {
  local parent="$1" f stat rest ppid
  for f in /proc/[0-9]*/stat; do
    { read -r stat <"$f"; } 2>/dev/null || continue
    rest="${stat##*) }"
    read -r _ ppid _ <<<"$rest"
    [[ "$ppid" == "$parent" ]] && printf '%s\n' "${f//[^0-9]/}"
  done
  return 0
}

# sb_tail_logs NAME...: print the tail of log/NAME.log for each name.
sb_tail_logs() {
  local n f
  for n in "$@"; do
    f="$SB_DIR/log/$n.log"
    [[ -s "$f" ]] || continue
    printf '\n----- tail of %s -----\n' "$f" >&2
    tail -n 25 "$f" >&2
  done
}
