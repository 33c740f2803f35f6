#!/usr/bin/env bash
# up.sh [STATE_DIR] - start (or repair) a throwaway Slurm cluster (one host,
# SANDBOX_NODES slurmd daemons, each a node of its own) with an sshd "login
# node" on 127.0.0.1, for tests and demos. Run as root.
#
# STATE_DIR: first argument, else $SANDBOX_DIR, else /tmp/pvsb (for
# SANDBOX_SLURM=trixie or sid, /tmp/pvsb-trixie or /tmp/pvsb-sid). Everything
# lives there. Keep it short: ssh ControlPath sockets made under it must stay
# below 108 bytes.
#
# Settings (environment; remembered in STATE_DIR/settings for later runs):
#   SANDBOX_SSH_PORT=2222 SANDBOX_CTLD_PORT=6817 SANDBOX_SLURMD_PORT=6818
#   (100 more each for trixie, 200 more for sid)
#   SANDBOX_NODE=$(hostname -s) SANDBOX_CPUS=50 SANDBOX_MEM_MB=16000
#   SANDBOX_GPUS=2 (fake: /dev/null symlinks, on the first node only)
#   SANDBOX_NODES=2 (nodes NODE, NODE2, ...; node i's slurmd listens on
#   SANDBOX_SLURMD_PORT+i-1). Two, so that a multi-node job (--nodes=2,
#   one srun task per node) runs as it would on a real cluster.
#   SANDBOX_SLURM=bookworm|trixie|sid: which Debian's Slurm runs it:
#   bookworm is this machine's own (22.05); trixie (24.11) and sid (26.05)
#   run from a root that debootstrap makes once and a cache keeps
#   (sandbox/root.sh). A state dir keeps the Slurm it was made with.
#   SANDBOX_ACCOUNTING=0|1: 1 adds accounting as a real site has it: a
#   MariaDB of the sandbox's own (this machine's mariadb-server, its data,
#   socket and pid under STATE_DIR/db, on 127.0.0.1:SANDBOX_DB_PORT) and
#   slurmdbd (from the root for trixie and sid) on SANDBOX_DBD_PORT, with
#   AccountingStorageEnforce=associations,limits,qos, and the job user in
#   account "proj" of cluster "sandbox". Limits are then set with sacctmgr
#   as root, e.g. `sacctmgr -i modify user slurmuser set maxsubmitjobs=5`.
#   SANDBOX_DBD_PORT=6831 SANDBOX_DB_PORT=6832 (100 more for trixie, 200
#   for sid; past the slurmd ports of 8 nodes).
#   SANDBOX_MIN_JOB_AGE=300: slurm.conf's MinJobAge, how many seconds the
#   controller keeps a finished job; a test of jobs it has forgotten sets 2.
#   SANDBOX_JOB_SUBMIT=: the site's submit rules, slurm.conf's
#   JobSubmitPlugins: empty (none), or a comma list of require_timelimit
#   (a job without --time is refused) and throttle (at most
#   SANDBOX_JOBS_PER_HOUR=5 submissions per user an hour, as
#   SchedulerParameters=jobs_per_user_per_hour). Each Debian's Slurm has
#   both (job_submit_*.so in bookworm's, trixie's and sid's).
#   SANDBOX_BASTION_PORT=0: a port starts a second sshd there, a jump host
#   in front of the login node (same users and keys), and adds the Host
#   "sandbox-via-bastion" to the sandbox's ssh_config, which reaches the
#   login node through it (ProxyJump), as a site behind a bastion is
#   reached; its log is STATE_DIR/log/sshd-bastion.log. 0: none.
#   SANDBOX_MAX_ARRAY_SIZE=10001 SANDBOX_MAX_JOB_COUNT=50000: slurm.conf's
#   MaxArraySize and MaxJobCount, high enough for a burst of 10,000 pending
#   array tasks (bench row P9b asks for 1,000 as one array; Slurm's own
#   defaults, 1001 and 10000, fit one such burst and nothing beside it).
#   SANDBOX_RATE_LIMIT=: slurmctld's per-user RPC rate limiter, as large
#   sites turn it on: BUCKET,REFILL (e.g. 10,1) adds rl_enable,
#   rl_bucket_size=BUCKET,rl_refill_rate=REFILL to SlurmctldParameters
#   (each user may make BUCKET RPCs at once, and gets REFILL back each
#   second; Slurm's defaults are 30 and 2). A rationed client command
#   sleeps a second and tries again, and says so only with -v. Slurm 23.02
#   and later (trixie, sid); bookworm's 22.05 has no limiter and is
#   refused. Empty: off; "none" clears a remembered setting.
#   SANDBOX_DEFAULT_TIME=: the partition's DefaultTime, the time limit of a
#   job without --time, in Slurm's form (2, 00:02:00, 1-00:00:00). Empty:
#   none (DefaultTime=NONE: such a job gets MaxTime, 1-00:00:00); "none"
#   clears a remembered setting.
#   SANDBOX_EXCLUSIVE=0|1: 1 makes the partition OverSubscribe=EXCLUSIVE, as
#   sites that allocate whole nodes have it: every job gets a whole node,
#   whatever it asks for (SLURM_CPUS_ON_NODE is the node's CPUs).
# Not remembered: SANDBOX_SMOKE=auto|1|0 - submit a test job over ssh: auto
#   does it only when a daemon was (re)started, else it runs `sbatch
#   --test-only` over ssh, which uses no resources.
#
# Idempotent: when everything is up it only checks it; dead daemons (pid file
# + /proc/PID/stat, zombies count as dead) are restarted; a changed config
# restarts the daemons that read it.
#
# Jobs run as the unprivileged user "slurmuser". Anything a job executes or
# reads (e.g. a worker binary a test puts in /tmp/xyz/bin) must be readable
# and executable by slurmuser: make every directory on the path o+rx (mktemp -d
# creates 0700 directories: chmod 755 them) and the file itself o+rx.
#
# Afterwards: source STATE_DIR/env.sh; ssh -F "$SANDBOX_SSH_CONFIG" sandbox ...
set -euo pipefail
umask 022

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"
# shellcheck source-path=SCRIPTDIR source=root.sh
. "$HERE/root.sh"

T0="$(sb_now)"
JOB_USER=slurmuser
PARTITION=debug
PACKAGES=(slurmctld slurmd slurm-client munge openssh-server openssh-client)
NEEDED_CMDS=(slurmctld slurmd sbatch squeue sinfo scontrol scancel munged munge unmunge sshd ssh ssh-keygen runuser)
# With SANDBOX_ACCOUNTING=1: the database and slurmdbd (added below).
DB_PACKAGES=(mariadb-server)
DB_CMDS=(mariadbd mariadb-install-db mariadb)
DBD_PACKAGES=(slurmdbd)
DBD_CMDS=(slurmdbd sacctmgr sacct)
# The account every job of the job user is charged to, with accounting.
ACCOUNT=proj

case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  -*) sb_die "unknown option '$1' (usage: up.sh [STATE_DIR])" ;;
esac
(($# <= 1)) || sb_die "too many arguments (usage: up.sh [STATE_DIR])"

[[ "$(id -u)" == 0 ]] ||
  sb_die "must run as root (it installs packages, creates $JOB_USER and runs slurmd); re-run with sudo"
sb_resolve_dir "${1:-}"
((${#SB_DIR} <= 40)) ||
  sb_log "warning: state dir is ${#SB_DIR} chars; ssh ControlPath sockets under it may exceed 108 bytes"

if [[ -d "$SB_DIR" && ! -e "$SB_DIR/$SB_MARKER" ]] && [[ -n "$(ls -A "$SB_DIR")" ]]; then
  sb_die "$SB_DIR exists, is not empty and is not a sandbox state dir; choose another path"
fi

ETC="$SB_DIR/etc" SSHD="$SB_DIR/ssh" LOG="$SB_DIR/log" PIDS="$SB_DIR/pid" MUNGE="$SB_DIR/munge"

export SLURM_CONF="$ETC/slurm.conf"
MUNGE_SOCKET="$MUNGE/munge.socket.2"
SSH_CONFIG="$SSHD/ssh_config"

# ---------------------------------------------------------------- settings
# Precedence: environment > STATE_DIR/settings > default.
# Each Slurm's ports are 100 apart by default, so the three can be up at
# once (trixie 2322/6917/6918, sid 2422/7017/7018).
case "${SANDBOX_SLURM:-$(sed -n 's/^SANDBOX_SLURM=//p' "$SB_DIR/settings" 2>/dev/null)}" in
  trixie) PORT_OFFSET=100 ;;
  sid) PORT_OFFSET=200 ;;
  *) PORT_OFFSET=0 ;;
esac
declare -A SET=(
  [SANDBOX_SSH_PORT]=$((2222 + PORT_OFFSET)) [SANDBOX_CTLD_PORT]=$((6817 + PORT_OFFSET)) [SANDBOX_SLURMD_PORT]=$((6818 + PORT_OFFSET))
  [SANDBOX_NODE]="$(hostname -s)" [SANDBOX_CPUS]=50 [SANDBOX_MEM_MB]=16000 [SANDBOX_GPUS]=2
  [SANDBOX_NODES]=2 [SANDBOX_SLURM]=bookworm
  [SANDBOX_ACCOUNTING]=0 [SANDBOX_MIN_JOB_AGE]=300 [SANDBOX_DBD_PORT]=$((6831 + PORT_OFFSET)) [SANDBOX_DB_PORT]=$((6832 + PORT_OFFSET))
  [SANDBOX_BASTION_PORT]=0 [SANDBOX_JOB_SUBMIT]= [SANDBOX_JOBS_PER_HOUR]=5
  [SANDBOX_MAX_ARRAY_SIZE]=10001 [SANDBOX_MAX_JOB_COUNT]=50000 [SANDBOX_RATE_LIMIT]= [SANDBOX_DEFAULT_TIME]=
  [SANDBOX_EXCLUSIVE]=0
)
if [[ -r "$SB_DIR/settings" ]]; then
  while IFS='=' read -r k v; do
    if [[ -n "${SET[$k]+x}" && -n "$v" ]]; then SET[$k]="$v"; fi
  done <"$SB_DIR/settings"
fi
for k in "${!SET[@]}"; do
  if [[ -n "${!k:-}" ]]; then SET[$k]="${!k}"; fi
done
for k in SANDBOX_SSH_PORT SANDBOX_CTLD_PORT SANDBOX_SLURMD_PORT SANDBOX_DBD_PORT SANDBOX_DB_PORT; do
  if ! [[ "${SET[$k]}" =~ ^[0-9]+$ ]] || ((SET[$k] < 1 || SET[$k] > 65535)); then
    sb_die "$k='${SET[$k]}' is not a port number"
  fi
done
for k in SANDBOX_CPUS SANDBOX_MEM_MB SANDBOX_GPUS SANDBOX_NODES SANDBOX_MIN_JOB_AGE SANDBOX_BASTION_PORT SANDBOX_JOBS_PER_HOUR SANDBOX_MAX_ARRAY_SIZE SANDBOX_MAX_JOB_COUNT; do
  [[ "${SET[$k]}" =~ ^[0-9]+$ ]] || sb_die "$k='${SET[$k]}' is not a number"
done
((SET[SANDBOX_CPUS] >= 1 && SET[SANDBOX_MEM_MB] >= 100)) || sb_die "need SANDBOX_CPUS >= 1 and SANDBOX_MEM_MB >= 100"
((SET[SANDBOX_NODES] >= 1 && SET[SANDBOX_NODES] <= 8)) || sb_die "SANDBOX_NODES must be 1 to 8"
[[ "${SET[SANDBOX_NODE]}" =~ ^[A-Za-z][A-Za-z0-9-]*$ ]] ||
  sb_die "SANDBOX_NODE='${SET[SANDBOX_NODE]}' is not a valid node name (letters, digits, -)"
SSH_PORT="${SET[SANDBOX_SSH_PORT]}" CTLD_PORT="${SET[SANDBOX_CTLD_PORT]}" SLURMD_PORT="${SET[SANDBOX_SLURMD_PORT]}"
NODE="${SET[SANDBOX_NODE]}" CPUS="${SET[SANDBOX_CPUS]}" MEM_MB="${SET[SANDBOX_MEM_MB]}" GPUS="${SET[SANDBOX_GPUS]}"
NNODES="${SET[SANDBOX_NODES]}"
ACCOUNTING="${SET[SANDBOX_ACCOUNTING]}" DBD_PORT="${SET[SANDBOX_DBD_PORT]}" DB_PORT="${SET[SANDBOX_DB_PORT]}"
BASTION_PORT="${SET[SANDBOX_BASTION_PORT]}"
JOB_SUBMIT="${SET[SANDBOX_JOB_SUBMIT]}"
# "none" clears a remembered list (an empty value keeps it).
[[ "$JOB_SUBMIT" == none ]] && JOB_SUBMIT=""
SET[SANDBOX_JOB_SUBMIT]="$JOB_SUBMIT"
[[ -z "$JOB_SUBMIT" || "$JOB_SUBMIT" =~ ^(require_timelimit|throttle)(,(require_timelimit|throttle))?$ ]] ||
  sb_die "SANDBOX_JOB_SUBMIT='$JOB_SUBMIT' is not a comma list of require_timelimit and throttle (or none)"
JOBS_PER_HOUR="${SET[SANDBOX_JOBS_PER_HOUR]}"
((JOBS_PER_HOUR >= 1)) || sb_die "SANDBOX_JOBS_PER_HOUR must be 1 or more"
((BASTION_PORT <= 65535)) || sb_die "SANDBOX_BASTION_PORT='$BASTION_PORT' is not a port number (0: no bastion)"
((BASTION_PORT == 0 || BASTION_PORT != SSH_PORT)) || sb_die "SANDBOX_BASTION_PORT must differ from SANDBOX_SSH_PORT"
[[ "$ACCOUNTING" == 0 || "$ACCOUNTING" == 1 ]] || sb_die "SANDBOX_ACCOUNTING must be 0 or 1, not '$ACCOUNTING'"
NODES=("$NODE")
for ((i = 2; i <= NNODES; i++)); do NODES+=("$NODE$i"); done
NODE_LIST="$(
  IFS=,
  echo "${NODES[*]}"
)"
((SLURMD_PORT + NNODES - 1 <= 65535)) || sb_die "SANDBOX_SLURMD_PORT+SANDBOX_NODES-1 is not a port number"
for ((i = 0; i < NNODES; i++)); do
  ((SSH_PORT != SLURMD_PORT + i && CTLD_PORT != SLURMD_PORT + i)) ||
    sb_die "SANDBOX_SSH_PORT and SANDBOX_CTLD_PORT must differ from the slurmd ports $SLURMD_PORT..$((SLURMD_PORT + NNODES - 1))"
done
((SSH_PORT != CTLD_PORT)) || sb_die "SANDBOX_SSH_PORT and SANDBOX_CTLD_PORT must differ"
if ((ACCOUNTING)); then
  for port in "$SSH_PORT" "$CTLD_PORT" $(seq "$SLURMD_PORT" $((SLURMD_PORT + NNODES - 1))); do
    ((DBD_PORT != port && DB_PORT != port)) ||
      sb_die "SANDBOX_DBD_PORT and SANDBOX_DB_PORT must differ from the ssh, slurmctld and slurmd ports (port $port)"
  done
  ((DBD_PORT != DB_PORT)) || sb_die "SANDBOX_DBD_PORT and SANDBOX_DB_PORT must differ"
fi
SUITE="${SET[SANDBOX_SLURM]}"
[[ " $SB_SUITES " == *" $SUITE "* ]] || sb_die "SANDBOX_SLURM='$SUITE' is not one of: $SB_SUITES"
RATE_LIMIT="${SET[SANDBOX_RATE_LIMIT]}"
# "none" clears a remembered limiter (an empty value keeps it).
[[ "$RATE_LIMIT" == none ]] && RATE_LIMIT=""
SET[SANDBOX_RATE_LIMIT]="$RATE_LIMIT"
if [[ -n "$RATE_LIMIT" ]]; then
  RL_BUCKET="${RATE_LIMIT%%,*}" RL_REFILL="${RATE_LIMIT#*,}"
  [[ "$RATE_LIMIT" =~ ^[0-9]{1,6},[0-9]{1,6}$ ]] && ((RL_BUCKET >= 1 && RL_REFILL >= 1)) ||
    sb_die "SANDBOX_RATE_LIMIT='$RATE_LIMIT' is not BUCKET,REFILL (two whole numbers, 1 or more, such as 10,1; none turns the limiter off)"
  ! sb_suite_native "$SUITE" ||
    sb_die "SANDBOX_RATE_LIMIT needs Slurm 23.02 or later (SlurmctldParameters=rl_enable); SANDBOX_SLURM=$SUITE runs Slurm 22.05, which has no RPC rate limiter: use SANDBOX_SLURM=trixie or sid, or SANDBOX_RATE_LIMIT=none"
fi
DEFAULT_TIME="${SET[SANDBOX_DEFAULT_TIME]}"
# "none" clears a remembered DefaultTime (an empty value keeps it).
[[ "$DEFAULT_TIME" == none ]] && DEFAULT_TIME=""
SET[SANDBOX_DEFAULT_TIME]="$DEFAULT_TIME"
[[ -z "$DEFAULT_TIME" || "$DEFAULT_TIME" =~ ^([0-9]{1,3}-)?[0-9]{1,4}(:[0-9]{1,2}){0,2}$ ]] ||
  sb_die "SANDBOX_DEFAULT_TIME='$DEFAULT_TIME' is not a Slurm time limit (minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, such as 2 or 00:02:00; none clears it)"
EXCLUSIVE="${SET[SANDBOX_EXCLUSIVE]}"
[[ "$EXCLUSIVE" == 0 || "$EXCLUSIVE" == 1 ]] || sb_die "SANDBOX_EXCLUSIVE='$EXCLUSIVE' must be 0 or 1"
if [[ -r "$SB_DIR/settings" ]]; then
  was="$(sed -n 's/^SANDBOX_SLURM=//p' "$SB_DIR/settings")"
  [[ -z "$was" || "$was" == "$SUITE" ]] ||
    sb_die "$SB_DIR holds a SANDBOX_SLURM=$was sandbox, and a controller's state does not move between Slurm releases; run 'bash sandbox/down.sh $SB_DIR --purge' first, or choose another SANDBOX_DIR"
fi
SMOKE="${SANDBOX_SMOKE:-auto}"
case "$SMOKE" in auto | 1 | 0) ;; *) sb_die "SANDBOX_SMOKE must be auto, 1 or 0" ;; esac

mkdir -p "$SB_DIR" "$ETC" "$SSHD/authorized_keys" "$LOG" "$PIDS" "$MUNGE" \
  "$SB_DIR/spool/ctld" "$SB_DIR/spool/d" "$SB_DIR/dev"
# The job user reads slurm.conf, the munge socket and its authorized_keys.
chmod 0755 "$SB_DIR" "$ETC" "$SSHD" "$SSHD/authorized_keys" "$LOG" "$PIDS" "$MUNGE" "$SB_DIR/dev"
touch "$SB_DIR/$SB_MARKER"
{
  for k in SANDBOX_SSH_PORT SANDBOX_CTLD_PORT SANDBOX_SLURMD_PORT SANDBOX_NODE SANDBOX_CPUS SANDBOX_MEM_MB SANDBOX_GPUS SANDBOX_NODES SANDBOX_SLURM \
    SANDBOX_ACCOUNTING SANDBOX_MIN_JOB_AGE SANDBOX_DBD_PORT SANDBOX_DB_PORT SANDBOX_BASTION_PORT \
    SANDBOX_JOB_SUBMIT SANDBOX_JOBS_PER_HOUR SANDBOX_RATE_LIMIT SANDBOX_DEFAULT_TIME SANDBOX_EXCLUSIVE; do
    printf '%s=%s\n' "$k" "${SET[$k]}"
  done
} >"$SB_DIR/settings"

# ---------------------------------------------------------------- helpers
fail() { # fail MESSAGE LOGNAME... : print the message, log tails, exit 1
  local msg="$1"
  shift
  sb_tail_logs "$@"
  printf '%s: %s (state in %s)\n' "$SB_PROG" "$msg" "$SB_DIR" >&2
  exit 1
}

# poll SECONDS CMD...: re-run CMD every 0.1 s until it succeeds (0), gives
# up (2) or the deadline passes (1).
poll() {
  local deadline=$((SECONDS + $1)) rc
  shift
  while :; do
    rc=0
    "$@" || rc=$?
    ((rc == 0 || rc == 2)) && return "$rc"
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

port_listening() { # is something LISTENing on TCP port $1?
  local hex
  hex="$(printf ':%04X' "$1")"
  awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# write_if_changed DEST: stdin -> DEST; returns 0 when the content changed.
write_if_changed() {
  local dest="$1" tmp
  tmp="$(mktemp "$dest.XXXXXX")"
  cat >"$tmp"
  if [[ -f "$dest" ]] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
    return 1
  fi
  chmod 0644 "$tmp"
  mv -f "$tmp" "$dest"
}

daemon_died() { # NAME: true if its pid file names a process that is gone
  local pid
  [[ -r "$PIDS/$1.pid" ]] || return 1
  read -r pid <"$PIDS/$1.pid" || return 1
  ! sb_proc_live "$pid"
}

# ---------------------------------------------------------------- packages
POLICY_CREATED=0
cleanup() {
  if ((POLICY_CREATED)); then rm -f /usr/sbin/policy-rc.d; fi
  return 0
}
trap cleanup EXIT

apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    -o DPkg::Lock::Timeout=120 -o Dpkg::Use-Pty=0 "${PACKAGES[@]}" >>"$LOG/apt.log" 2>&1
}

if ! sb_suite_native "$SUITE"; then
  # The daemons and clients come from the root; this machine needs only
  # the ssh client and what makes and enters the root.
  PACKAGES=(openssh-client)
  NEEDED_CMDS=(ssh ssh-keygen runuser chroot mount mountpoint tar)
fi
if ((ACCOUNTING)); then
  # MariaDB runs from this machine for every Slurm: slurmdbd speaks to it
  # over loopback, whatever release it is. slurmdbd must be the
  # controller's release, so for a newer Slurm it comes from the root.
  PACKAGES+=("${DB_PACKAGES[@]}")
  NEEDED_CMDS+=("${DB_CMDS[@]}")
  if sb_suite_native "$SUITE"; then
    PACKAGES+=("${DBD_PACKAGES[@]}")
    NEEDED_CMDS+=("${DBD_CMDS[@]}")
  fi
fi
missing=()
for c in "${NEEDED_CMDS[@]}"; do
  command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
if ((${#missing[@]})); then
  command -v apt-get >/dev/null 2>&1 ||
    sb_die "missing ${missing[*]} and apt-get is not available: install ${PACKAGES[*]} (Slurm 22.05+, munge, OpenSSH >= 8.7) yourself"
  sb_log "installing ${PACKAGES[*]} (missing: ${missing[*]}; log: $LOG/apt.log)"
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    # Keep apt from starting system-wide munged/sshd/slurm services.
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    POLICY_CREATED=1
  fi
  if ! apt_install; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$LOG/apt.log" 2>&1 || true
    apt_install || fail "apt-get install ${PACKAGES[*]} failed" apt
  fi
  cleanup
  POLICY_CREATED=0
  for c in "${NEEDED_CMDS[@]}"; do
    command -v "$c" >/dev/null 2>&1 || fail "$c is still missing after apt-get install" apt
  done
fi

# ---------------------------------------------------------------- job user
if ! id -u "$JOB_USER" >/dev/null 2>&1; then
  useradd -m -s /bin/bash "$JOB_USER"
fi
# useradd leaves the account locked ('!'); with UsePAM no, sshd then refuses
# even key logins. '*' = no password, but not locked.
if [[ "$(getent shadow "$JOB_USER" | cut -d: -f2)" == '!'* ]]; then
  usermod -p '*' "$JOB_USER"
fi

# ---------------------------------------------------------------- root
# A newer Slurm runs from its own root (root.sh); every command below then
# finds the root's through the wrappers in STATE_DIR/bin.
SSHD_BIN=/usr/sbin/sshd
if ! sb_suite_native "$SUITE"; then
  sb_root_ensure "$SUITE" "$SB_DIR/root" "$LOG/root.log"
  sb_root_user "$SB_DIR/root" "$JOB_USER"
  if sb_root_hosts "$SB_DIR/root" && sb_pid_of munged >/dev/null; then
    sb_log "the root's /etc/hosts changed: restarting munged, which looks up its origin at start"
    sb_stop munged
  fi
  mkdir -p "/home/$JOB_USER"
  sb_root_mount "$SB_DIR/root" "$JOB_USER" "$SB_DIR"
  if ((ACCOUNTING)); then sb_root_add "$SB_DIR/root" "$LOG/root.log" slurmdbd; fi
  sb_root_wrappers "$SB_DIR/root" "$SB_DIR/bin"
  PATH="$SB_DIR/bin:$PATH"
  SSHD_BIN="$SB_DIR/bin/sshd"
fi
# The package's version: scontrol --version wants a configuration first.
if sb_suite_native "$SUITE"; then
  SLURM_VERSION="$(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null)" || true
else
  SLURM_VERSION="$(chroot "$SB_DIR/root" dpkg-query -W -f='${Version}' slurm-client 2>/dev/null)" || true
fi
SLURM_VERSION="${SLURM_VERSION%%-*}"
SLURM_VERSION="${SLURM_VERSION:-unknown}"

# ---------------------------------------------------------------- configs
CTLD_HOST="$(hostname -s)"
gres_node="" gres_line="# no GPUs configured (SANDBOX_GPUS=0)"
rm -f "$SB_DIR"/dev/gpu*
if ((GPUS > 0)); then
  for ((i = 0; i < GPUS; i++)); do ln -sfn /dev/null "$SB_DIR/dev/gpu$i"; done
  gres_node=" Gres=gpu:$GPUS"
  if ((GPUS == 1)); then files="$SB_DIR/dev/gpu0"; else files="$SB_DIR/dev/gpu[0-$((GPUS - 1))]"; fi
  # File= is required: a file-less GPU makes slurmd report 0 GPUs and the
  # node goes INVAL. Regular files are rejected; symlinks to /dev/null pass.
  gres_line="NodeName=$NODE Name=gpu File=$files"
fi

SLURM_CHANGED=0
write_if_changed "$ETC/slurm.conf" <<EOF && SLURM_CHANGED=1
# Generated by sandbox/up.sh - edits are overwritten.
ClusterName=sandbox
SlurmctldHost=$CTLD_HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$SB_DIR/spool/ctld
SlurmdSpoolDir=$SB_DIR/spool/d/%n
SlurmctldPidFile=$PIDS/slurmctld.pid
SlurmdPidFile=$PIDS/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0$(if [[ ",$JOB_SUBMIT," == *,throttle,* ]]; then echo ",jobs_per_user_per_hour=$JOBS_PER_HOUR"; fi)$(
  if [[ -n "$JOB_SUBMIT" ]]; then printf '\nJobSubmitPlugins=%s' "$JOB_SUBMIT"; fi
)
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=100
EnforcePartLimits=ALL
MinJobAge=${SET[SANDBOX_MIN_JOB_AGE]}
MaxArraySize=${SET[SANDBOX_MAX_ARRAY_SIZE]}
MaxJobCount=${SET[SANDBOX_MAX_JOB_COUNT]}
$(if [[ -n "$RATE_LIMIT" ]]; then
  echo "SlurmctldParameters=rl_enable,rl_bucket_size=$RL_BUCKET,rl_refill_rate=$RL_REFILL"
else
  echo "# no RPC rate limiter (SANDBOX_RATE_LIMIT)"
fi)
$(if ((ACCOUNTING)); then
  cat <<ACCT
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# slurmctld's connection to slurmdbd ignores AuthInfo: this is how it
# finds a munged that is not at the default socket.
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations,limits,qos
JobAcctGatherType=jobacct_gather/linux
ACCT
else
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobAcctGatherType=jobacct_gather/none"
fi)
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt
GresTypes=gpu
SlurmdParameters=config_overrides
$(for ((i = 0; i < NNODES; i++)); do
  g=""
  ((i == 0)) && g="$gres_node"
  echo "NodeName=${NODES[i]} NodeAddr=127.0.0.1 Port=$((SLURMD_PORT + i)) CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM_MB$g State=UNKNOWN"
done)
PartitionName=$PARTITION Nodes=$NODE_LIST Default=YES MaxTime=1-00:00:00$(if [[ -n "$DEFAULT_TIME" ]]; then echo " DefaultTime=$DEFAULT_TIME"; fi)$(if ((EXCLUSIVE)); then echo " OverSubscribe=EXCLUSIVE"; fi) State=UP
EOF

write_if_changed "$ETC/gres.conf" <<EOF && SLURM_CHANGED=1
# Generated by sandbox/up.sh - edits are overwritten.
$gres_line
EOF

# Slurm 24.11 and later will not start slurmd without a cgroup filesystem,
# which a sandbox has no business mounting, unless told to do without;
# 22.05 does not know the word and refuses it.
if sb_suite_native "$SUITE"; then
  cgroup_conf="# Slurm 22.05: nothing to say (it does not know CgroupPlugin=disabled)"
else
  cgroup_conf="CgroupPlugin=disabled"
fi
write_if_changed "$ETC/cgroup.conf" <<EOF && SLURM_CHANGED=1
# Generated by sandbox/up.sh - edits are overwritten.
$cgroup_conf
EOF

DB="$SB_DIR/db"
DB_SOCKET="$DB/mysqld.sock"
DBD_CHANGED=0
if ((ACCOUNTING)); then
  mkdir -p "$DB"
  chmod 0700 "$DB"
  # slurmdbd's password for the database: the database listens on
  # loopback only, and the file that holds it is root's alone.
  [[ -s "$DB/password" ]] || (umask 077 && od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$DB/password")
  DB_PASS="$(cat "$DB/password")"
  # slurmdbd reads slurmdbd.conf from SLURM_CONF's directory and refuses
  # one that anybody but SlurmUser (root) can read.
  write_if_changed "$ETC/slurmdbd.conf" <<EOF && DBD_CHANGED=1
# Generated by sandbox/up.sh - edits are overwritten.
DbdHost=$(hostname -s)
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
PidFile=$PIDS/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
EOF
  chmod 0600 "$ETC/slurmdbd.conf"
else
  rm -f "$ETC/slurmdbd.conf"
fi

[[ -s "$SSHD/host_ed25519_key" ]] ||
  ssh-keygen -q -t ed25519 -N '' -C sandbox-host -f "$SSHD/host_ed25519_key"
[[ -s "$SSHD/client_key" ]] ||
  ssh-keygen -q -t ed25519 -N '' -C sandbox-client -f "$SSHD/client_key"
chmod 0600 "$SSHD/host_ed25519_key" "$SSHD/client_key"
cp "$SSHD/client_key.pub" "$SSHD/authorized_keys/$JOB_USER"
chmod 0644 "$SSHD/authorized_keys/$JOB_USER"

SSHD_CHANGED=0
# No MaxSessions/MaxStartups: keep OpenSSH's defaults (10 sessions per
# connection, 10:30:100 startups) like a real login node.
write_if_changed "$SSHD/sshd_config" <<EOF && SSHD_CHANGED=1
# Generated by sandbox/up.sh - edits are overwritten.
ListenAddress 127.0.0.1
Port $SSH_PORT
HostKey $SSHD/host_ed25519_key
PidFile $PIDS/sshd.pid
AuthorizedKeysFile $SSHD/authorized_keys/%u
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers $JOB_USER
UsePAM no
StrictModes no
PrintMotd no
X11Forwarding no
SetEnv SLURM_CONF=$ETC/slurm.conf
Subsystem sftp /usr/lib/openssh/sftp-server
EOF

host_pub="$(cut -d' ' -f1,2 "$SSHD/host_ed25519_key.pub")"
if ((SSH_PORT == 22)); then kh_host="127.0.0.1"; else kh_host="[127.0.0.1]:$SSH_PORT"; fi
printf '%s %s\n' "$kh_host" "$host_pub" >"$SSHD/known_hosts"
# The bastion: the login node's sshd_config on another port, with the
# same host key (one machine), so one known_hosts line more.
BASTION_CHANGED=0
if ((BASTION_PORT)); then
  sed -e "s/^Port .*/Port $BASTION_PORT/" -e "s|^PidFile .*|PidFile $PIDS/sshd-bastion.pid|" \
    -e "1s/.*/# Generated by sandbox\/up.sh (the bastion: SANDBOX_BASTION_PORT) - edits are overwritten./" \
    "$SSHD/sshd_config" | write_if_changed "$SSHD/sshd_bastion_config" && BASTION_CHANGED=1
  printf '[127.0.0.1]:%s %s\n' "$BASTION_PORT" "$host_pub" >>"$SSHD/known_hosts"
fi
# No ControlMaster/ControlPath here: callers do their own multiplexing.
cat >"$SSH_CONFIG" <<EOF
# Generated by sandbox/up.sh. Use: ssh -F $SSH_CONFIG sandbox CMD
Host sandbox
  HostName 127.0.0.1
  Port $SSH_PORT
  User $JOB_USER
  IdentityFile $SSHD/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $SSHD/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
EOF
if ((BASTION_PORT)); then
  # The login node as a site behind a bastion has it: reached only
  # through the jump host. docs/operators.md's "Real sites" has the same recipe.
  # No GlobalKnownHostsFile /dev/null here: the plugin refuses a
  # known-hosts file others can write, and /dev/null is one.
  cat >>"$SSH_CONFIG" <<EOF
Host sandbox-bastion
  HostName 127.0.0.1
  Port $BASTION_PORT
  User $JOB_USER
  IdentityFile $SSHD/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $SSHD/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
Host sandbox-via-bastion
  HostName 127.0.0.1
  Port $SSH_PORT
  ProxyJump sandbox-bastion
  User $JOB_USER
  IdentityFile $SSHD/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $SSHD/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
EOF
fi

# A job user who cannot read slurm.conf cannot run sbatch over ssh.
runuser -u "$JOB_USER" -- test -r "$ETC/slurm.conf" ||
  sb_die "$JOB_USER cannot read $ETC/slurm.conf: every parent of $SB_DIR must be world-executable (o+x)"

# ---------------------------------------------------------------- daemons
STARTED=()

# Config changed under running daemons: restart them (plugins and ports
# cannot be reconfigured live).
if ((SLURM_CHANGED)); then
  running=()
  for d in slurmctld $(sb_slurmds); do
    if sb_pid_of "$d" >/dev/null; then running+=("$d"); fi
  done
  if ((${#running[@]})); then
    sb_log "slurm.conf/gres.conf changed: restarting ${running[*]}"
    for d in $(sb_slurmds) slurmctld; do sb_stop "$d"; done
  fi
fi
if ((DBD_CHANGED || SLURM_CHANGED)) && sb_pid_of slurmdbd >/dev/null; then
  sb_log "slurmdbd.conf/slurm.conf changed: restarting slurmdbd"
  sb_stop slurmdbd
fi
if ((!ACCOUNTING)); then
  # Accounting switched off: its daemons have no business running.
  sb_stop slurmdbd
  sb_stop mariadbd
fi
if ((BASTION_CHANGED || !BASTION_PORT)) && sb_pid_of sshd-bastion >/dev/null; then
  sb_log "the bastion's settings changed: stopping its sshd"
  sb_stop sshd-bastion
fi
if ((SSHD_CHANGED)) && sb_pid_of sshd >/dev/null; then
  sb_log "sshd_config changed: restarting sshd"
  sb_stop sshd
fi

# Refuse before starting anything if a port we need is taken by a stranger.
specs=("slurmctld $CTLD_PORT SANDBOX_CTLD_PORT" "sshd $SSH_PORT SANDBOX_SSH_PORT")
for ((i = 0; i < NNODES; i++)); do specs+=("slurmd-${NODES[i]} $((SLURMD_PORT + i)) SANDBOX_SLURMD_PORT"); done
if ((ACCOUNTING)); then specs+=("slurmdbd $DBD_PORT SANDBOX_DBD_PORT" "mariadbd $DB_PORT SANDBOX_DB_PORT"); fi
if ((BASTION_PORT)); then specs+=("sshd-bastion $BASTION_PORT SANDBOX_BASTION_PORT"); fi
for spec in "${specs[@]}"; do
  read -r name port var <<<"$spec"
  if ! sb_pid_of "$name" >/dev/null && port_listening "$port"; then
    sb_die "port $port (for $name) is already in use by another process; stop it or set $var"
  fi
done

munge_ok() {
  [[ -S "$MUNGE_SOCKET" ]] &&
    munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
  daemon_died munged && return 2
  return 1
}
if ! sb_pid_of munged >/dev/null; then
  if [[ ! -s "$MUNGE/munge.key" ]]; then
    mungekey -c -k "$MUNGE/munge.key" -b 1024 2>/dev/null ||
      dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none
  fi
  chmod 0600 "$MUNGE/munge.key"
  chmod 0755 "$MUNGE" # munged refuses a socket dir without o+x
  rm -f "$PIDS/munged.pid"
  munged --key-file="$MUNGE/munge.key" --socket="$MUNGE_SOCKET" --pid-file="$PIDS/munged.pid" \
    --log-file="$LOG/munged.log" --seed-file="$MUNGE/munged.seed" </dev/null >>"$LOG/munged.log" 2>&1 ||
    fail "munged failed to start" munged
  STARTED+=(munged)
fi
poll 10 munge_ok || fail "munged is not answering on $MUNGE_SOCKET" munged

# Starting a daemon: the command forks and returns; wait for its pid file.
pidfile_ok() {
  sb_pid_of "$1" >/dev/null && return 0
  daemon_died "$1" && return 2
  return 1
}

# ---------------------------------------------------------------- accounting
# MariaDB and slurmdbd come before slurmctld, which registers with
# slurmdbd as it starts, and the cluster, account and user must exist
# before it does: with associations enforced, a user without one cannot
# submit at all.
if ((ACCOUNTING)); then
  db_ok() {
    mariadb --no-defaults -S "$DB_SOCKET" -u root -e 'SELECT 1' >/dev/null 2>&1 && return 0
    daemon_died mariadbd && return 2
    return 1
  }
  if ! sb_pid_of mariadbd >/dev/null; then
    if [[ ! -d "$DB/data/mysql" ]]; then
      rm -rf --one-file-system -- "$DB/data"
      mariadb-install-db --no-defaults --user=root --datadir="$DB/data" --auth-root-authentication-method=socket \
        --skip-test-db >>"$LOG/mariadbd.log" 2>&1 || fail "mariadb-install-db failed" mariadbd
    fi
    rm -f "$PIDS/mariadbd.pid"
    # mariadbd does not fork: setsid puts it in a session of its own, and
    # its pid file is how down.sh finds it, as for every other daemon.
    setsid mariadbd --no-defaults --user=root --datadir="$DB/data" --socket="$DB_SOCKET" \
      --pid-file="$PIDS/mariadbd.pid" --bind-address=127.0.0.1 --port="$DB_PORT" \
      --innodb-buffer-pool-size=128M --innodb-log-file-size=16M --log-error="$LOG/mariadbd.log" \
      </dev/null >>"$LOG/mariadbd.log" 2>&1 &
    poll 30 pidfile_ok mariadbd || fail "mariadbd did not stay up" mariadbd
    STARTED+=(mariadbd)
  fi
  poll 30 db_ok || fail "mariadbd does not answer on $DB_SOCKET" mariadbd
  mariadb --no-defaults -S "$DB_SOCKET" -u root >>"$LOG/mariadbd.log" 2>&1 <<EOF || fail "could not create slurmdbd's database and user" mariadbd
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF

  dbd_ok() {
    timeout 5 sacctmgr -nP show cluster format=cluster >/dev/null 2>&1 && return 0
    sb_pid_of slurmdbd >/dev/null || return 2
    return 1
  }
  if ! sb_pid_of slurmdbd >/dev/null; then
    rm -f "$PIDS/slurmdbd.pid"
    slurmdbd </dev/null >>"$LOG/slurmdbd.log" 2>&1 || fail "slurmdbd failed to start" slurmdbd mariadbd
    poll 30 pidfile_ok slurmdbd || fail "slurmdbd did not stay up" slurmdbd mariadbd
    STARTED+=(slurmdbd)
  fi
  # slurmdbd makes its tables on its first start, which takes seconds.
  poll 60 dbd_ok || fail "slurmdbd does not answer sacctmgr" slurmdbd mariadbd
  if [[ -z "$(timeout 10 sacctmgr -nP show cluster where cluster=sandbox format=cluster 2>/dev/null)" ]]; then
    timeout 10 sacctmgr -i add cluster sandbox >>"$LOG/sacctmgr.log" 2>&1 || fail "sacctmgr add cluster sandbox failed" sacctmgr slurmdbd
  fi
  if [[ -z "$(timeout 10 sacctmgr -nP show account where name=$ACCOUNT format=account 2>/dev/null)" ]]; then
    timeout 10 sacctmgr -i add account "$ACCOUNT" cluster=sandbox description=sandbox organization=sandbox >>"$LOG/sacctmgr.log" 2>&1 ||
      fail "sacctmgr add account $ACCOUNT failed" sacctmgr slurmdbd
  fi
  if [[ -z "$(timeout 10 sacctmgr -nP show assoc where user=$JOB_USER account=$ACCOUNT format=user 2>/dev/null)" ]]; then
    timeout 10 sacctmgr -i add user "$JOB_USER" account="$ACCOUNT" cluster=sandbox >>"$LOG/sacctmgr.log" 2>&1 ||
      fail "sacctmgr add user $JOB_USER failed" sacctmgr slurmdbd
  fi
fi

if ! sb_pid_of slurmctld >/dev/null; then
  rm -f "$PIDS/slurmctld.pid"
  slurmctld -f "$SLURM_CONF" </dev/null >>"$LOG/slurmctld.log" 2>&1 ||
    fail "slurmctld failed to start" slurmctld
  poll 10 pidfile_ok slurmctld || fail "slurmctld did not stay up" slurmctld
  STARTED+=(slurmctld)
fi
ctld_ok() {
  local out
  out="$(timeout 5 scontrol ping 2>/dev/null)" || true
  [[ "$out" == *"is UP"* ]] && return 0
  sb_pid_of slurmctld >/dev/null || return 2
  return 1
}
poll 30 ctld_ok || fail "slurmctld does not answer scontrol ping" slurmctld munged

# A slurmd of a node this configuration no longer has (SANDBOX_NODES went
# down) would keep a port and a pid file: stop it.
for d in $(sb_slurmds); do
  [[ " ${NODES[*]/#/slurmd-} " == *" $d "* ]] || sb_stop "$d"
done
for n in "${NODES[@]}"; do
  if ! sb_pid_of "slurmd-$n" >/dev/null; then
    rm -f "$PIDS/slurmd-$n.pid"
    slurmd -f "$SLURM_CONF" -N "$n" </dev/null >>"$LOG/slurmd-$n.log" 2>&1 ||
      fail "slurmd for node $n failed to start" "slurmd-$n"
    poll 10 pidfile_ok "slurmd-$n" || fail "slurmd for node $n did not stay up" "slurmd-$n"
    STARTED+=("slurmd-$n")
  fi
done
LAST_RESUME=-10
NODE_STATE=""
node_ok() { # NODE
  NODE_STATE="$(timeout 5 sinfo -h -n "$1" -o %T 2>/dev/null | head -n 1)" || true
  case "$NODE_STATE" in
    idle | mixed | allocated | completing | planned) return 0 ;;
    *drain* | *inval* | *down* | *fail*)
      # Node state persists in StateSaveLocation: a node drained/INVAL by an
      # earlier problem stays so until resumed.
      if ((SECONDS - LAST_RESUME >= 2)); then
        LAST_RESUME=$SECONDS
        timeout 5 scontrol update nodename="$1" state=resume >/dev/null 2>&1 || true
      fi
      ;;
  esac
  sb_pid_of "slurmd-$1" >/dev/null || return 2
  return 1
}
for n in "${NODES[@]}"; do
  poll 30 node_ok "$n" || fail "node $n is not ready (state: '${NODE_STATE:-none}')" "slurmd-$n" slurmctld
done
# sacct -c opens the jobcomp file for append; slurmctld recreates it 0644.
if [[ -e "$LOG/jobcomp.txt" ]]; then chmod 0666 "$LOG/jobcomp.txt"; fi

ssh_ok() {
  ssh -F "$SSH_CONFIG" sandbox true </dev/null >"$LOG/ssh-client.log" 2>&1 && return 0
  sb_pid_of sshd >/dev/null || return 2
  return 1
}
if ! sb_pid_of sshd >/dev/null; then
  mkdir -p /run/sshd # privilege separation dir; sshd will not start without it
  chmod 0755 /run/sshd
  "$SSHD_BIN" -t -f "$SSHD/sshd_config" >>"$LOG/sshd.log" 2>&1 || fail "sshd_config is invalid" sshd
  rm -f "$PIDS/sshd.pid"
  # shellcheck disable=SC2094 # sshd appends to its -E log; so do we.
  "$SSHD_BIN" -f "$SSHD/sshd_config" -E "$LOG/sshd.log" </dev/null >>"$LOG/sshd.log" 2>&1 ||
    fail "sshd failed to start" sshd
  poll 10 pidfile_ok sshd || fail "sshd did not stay up" sshd
  STARTED+=(sshd)
fi
if ((BASTION_PORT)) && ! sb_pid_of sshd-bastion >/dev/null; then
  "$SSHD_BIN" -t -f "$SSHD/sshd_bastion_config" >>"$LOG/sshd-bastion.log" 2>&1 || fail "sshd_bastion_config is invalid" sshd-bastion
  rm -f "$PIDS/sshd-bastion.pid"
  # shellcheck disable=SC2094 # sshd appends to its -E log; so do we.
  "$SSHD_BIN" -f "$SSHD/sshd_bastion_config" -E "$LOG/sshd-bastion.log" </dev/null >>"$LOG/sshd-bastion.log" 2>&1 ||
    fail "the bastion's sshd failed to start" sshd-bastion
  poll 10 pidfile_ok sshd-bastion || fail "the bastion's sshd did not stay up" sshd-bastion
  STARTED+=(sshd-bastion)
  bastion_ok() { ssh -F "$SSH_CONFIG" sandbox-via-bastion true </dev/null >>"$LOG/ssh-client.log" 2>&1; }
  poll 15 bastion_ok || fail "ssh to the login node through the bastion (sandbox-via-bastion) fails" ssh-client sshd-bastion
fi
# When sshd was already up, the smoke test / --test-only below covers ssh.
if [[ " ${STARTED[*]} " == *" sshd "* || "$SMOKE" == 0 ]]; then
  poll 15 ssh_ok || fail "ssh to $JOB_USER@127.0.0.1:$SSH_PORT fails" ssh-client sshd
fi

# ---------------------------------------------------------------- env.sh
write_if_changed "$SB_DIR/env.sh" <<EOF || true
# Generated by sandbox/up.sh. Use: source $SB_DIR/env.sh
export SLURM_CONF=$ETC/slurm.conf
export SANDBOX_DIR=$SB_DIR
export SANDBOX_SSH_HOST=127.0.0.1
export SANDBOX_SSH_PORT=$SSH_PORT
export SANDBOX_SSH_USER=$JOB_USER
export SANDBOX_SSH_LOGIN=$JOB_USER@127.0.0.1
export SANDBOX_SSH_KEY=$SSHD/client_key
export SANDBOX_SSH_KNOWN_HOSTS=$SSHD/known_hosts
export SANDBOX_SSH_CONFIG=$SSH_CONFIG
export SANDBOX_PARTITION=$PARTITION
export SANDBOX_NODE=$NODE
export SANDBOX_CPUS=$CPUS
export SANDBOX_MEM_MB=$MEM_MB
export SANDBOX_GPUS=$GPUS
export SANDBOX_NODES=$NNODES
export SANDBOX_SLURM=$SUITE
export SANDBOX_SLURM_VERSION=$SLURM_VERSION
export SANDBOX_ACCOUNTING=$ACCOUNTING
export SANDBOX_BASTION_PORT=$BASTION_PORT
export SANDBOX_JOB_SUBMIT=$JOB_SUBMIT
export SANDBOX_RATE_LIMIT=$RATE_LIMIT
export SANDBOX_DEFAULT_TIME=$DEFAULT_TIME
export SANDBOX_EXCLUSIVE=$EXCLUSIVE
$(if ! sb_suite_native "$SUITE"; then
  echo "# The sandbox's own Slurm clients first: a client of another release cannot talk to its controller."
  echo "export SANDBOX_BIN=$SB_DIR/bin"
  echo "case \":\$PATH:\" in *:$SB_DIR/bin:*) ;; *) export PATH=$SB_DIR/bin:\$PATH ;; esac"
else
  echo "export SANDBOX_BIN="
fi)
EOF

# ---------------------------------------------------------------- smoke test
# shellcheck disable=SC2016 # expanded by the job, not here
SMOKE_SCRIPT='#!/bin/sh
#SBATCH --job-name=sandbox-smoke
#SBATCH --output=/dev/null
#SBATCH --time=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=16M
[ "$(id -un)" = slurmuser ] || exit 3
exit 0
'
if [[ "$SMOKE" == 1 || ("$SMOKE" == auto && ${#STARTED[@]} -gt 0) ]]; then
  JOB_ID="$(printf '%s' "$SMOKE_SCRIPT" | ssh -F "$SSH_CONFIG" sandbox sbatch --parsable 2>"$LOG/ssh-client.log")" ||
    fail "smoke test: sbatch over ssh failed" ssh-client slurmctld
  JOB_ID="${JOB_ID%%;*}"
  [[ "$JOB_ID" =~ ^[0-9]+$ ]] || fail "smoke test: sbatch printed '$JOB_ID', not a job id" slurmctld
  JOB_STATE=""
  job_done() {
    JOB_STATE="$(timeout 5 squeue -h -t all -j "$JOB_ID" -o %T 2>/dev/null)" || return 1
    case "$JOB_STATE" in
      PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED* | RESIZING | SIGNALING | STAGE_OUT | "") return 1 ;;
    esac
    return 0
  }
  poll 60 job_done || fail "smoke job $JOB_ID did not finish in 60 s (state: '$JOB_STATE')" slurmctld "slurmd-$NODE"
  [[ "$JOB_STATE" == COMPLETED ]] || fail "smoke job $JOB_ID ended $JOB_STATE" "slurmd-$NODE" slurmctld
  SMOKE_MSG="smoke job $JOB_ID COMPLETED"
elif [[ "$SMOKE" == auto ]]; then
  # Already up: an end-to-end check (ssh, munge, slurmctld) that allocates nothing.
  printf '%s' "$SMOKE_SCRIPT" | ssh -F "$SSH_CONFIG" sandbox sbatch --test-only >/dev/null 2>"$LOG/ssh-client.log" ||
    fail "check: sbatch --test-only over ssh failed" ssh-client slurmctld
  SMOKE_MSG="already up; sbatch --test-only OK"
else
  SMOKE_MSG="smoke test skipped"
fi

started="${STARTED[*]:-none}"
cat <<EOF
Slurm $SLURM_VERSION ($SUITE) sandbox up in $(sb_elapsed "$T0") s: $SMOKE_MSG; started: $started
  state   $SB_DIR   (logs in $LOG)
$(if ((ACCOUNTING)); then echo "  acct    slurmdbd on 127.0.0.1:$DBD_PORT, MariaDB on 127.0.0.1:$DB_PORT; $JOB_USER in account $ACCOUNT; enforced: associations,limits,qos"; fi)
$(if [[ -n "$RATE_LIMIT" ]]; then echo "  limit   slurmctld rations RPCs per user: bucket $RL_BUCKET, $RL_REFILL back a second (SANDBOX_RATE_LIMIT=$RATE_LIMIT)"; fi)
  nodes   $NODE_LIST  partition $PARTITION  cpus $CPUS  mem ${MEM_MB}M per node  gpus $GPUS on $NODE  (jobs run as $JOB_USER)
  use     source $SB_DIR/env.sh
          ssh -F \$SANDBOX_SSH_CONFIG sandbox sbatch --parsable < job.sh
          ssh -i \$SANDBOX_SSH_KEY -o UserKnownHostsFile=\$SANDBOX_SSH_KNOWN_HOSTS -o StrictHostKeyChecking=yes -p $SSH_PORT $JOB_USER@127.0.0.1 squeue
          squeue; sinfo       (locally, as root, after sourcing env.sh)
  note    files a job runs must be readable/executable by $JOB_USER (chmod o+rx dirs and files)
  stop    bash $HERE/down.sh $SB_DIR [--purge]
EOF
