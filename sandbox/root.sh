# shellcheck shell=bash
# A newer Slurm for the sandbox, from a newer Debian suite, run under
# chroot. Sourced by up.sh and down.sh after lib.sh, not run.
#
# Why a chroot and not containers or a source build: Debian 12 ships Slurm
# 22.05 only, and client and controller must be the same release (a 22.05
# squeue cannot read a 24.11 controller, and a 24.11 sbatch gets "Zero
# Bytes were transmitted or received" from a 22.05 one). Debian's own
# packages of trixie (24.11) and sid (26.05), unpacked by debootstrap into
# a directory, are the real thing a site installs, and run on this kernel
# without a container engine, which these machines do not have. The cost
# is a root of about 300 MB per sandbox, and bind mounts that must be
# undone before the state dir is removed (sb_root_umount; down.sh does it
# first, and removes the state dir with --one-file-system).
#
# Layout: the root lives in STATE_DIR/root. The daemons and clients run
# inside it by their usual names, through wrappers in STATE_DIR/bin that
# exec `chroot ROOT` with the caller's working directory. /proc, /dev,
# /dev/pts, /sys, /tmp, the job user's home and the state dir are bound at
# the same paths, so pid files, sockets, logs, keys, a test's worker binary
# under /tmp and a job's output in the home are where both sides look.
# The network is the host's: the daemons listen on loopback as before.
#
# The cache: debootstrap takes 40-50 s and 300 MB of downloads, so the
# root is packed once into SANDBOX_CACHE (default
# /var/cache/fluksio-sandbox) as slurm-SUITE-VERSION.tar.gz, VERSION being
# the Slurm it holds; a bring-up unpacks the newest one of its suite in a
# few seconds. SANDBOX_SLURM_REFRESH=1 makes a new one (sid moves).

SB_SUITES="bookworm trixie sid"

# sb_suite_native SUITE: true for the suite this machine's own packages
# give (Debian 12), which runs without a chroot.
sb_suite_native() { [[ "$1" == bookworm ]]; }

# sb_mirror: the Debian mirror this machine's apt already uses (the first
# deb URI of its sources that is not a security archive), or
# SANDBOX_MIRROR.
sb_mirror() {
  if [[ -n "${SANDBOX_MIRROR:-}" ]]; then
    printf '%s\n' "$SANDBOX_MIRROR"
    return
  fi
  local m
  m="$(
    {
      grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{for (i = 2; i <= NF; i++) print $i}'
      grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:/) {print $i; break}}'
    } | grep -v -e security -e '^cdrom:' | head -n 1
  )"
  [[ -n "$m" ]] || sb_die "no Debian mirror in /etc/apt/sources*; set SANDBOX_MIRROR to one"
  printf '%s\n' "$m"
}

# sb_root_cached SUITE: the newest cached root tarball of SUITE, if any.
sb_root_cached() {
  local cache="${SANDBOX_CACHE:-/var/cache/fluksio-sandbox}" f newest=""
  for f in "$cache"/slurm-"$1"-*.tar.gz; do
    [[ -s "$f" ]] || continue
    if [[ -z "$newest" || "$f" -nt "$newest" ]]; then newest="$f"; fi
  done
  [[ -n "$newest" ]] && printf '%s\n' "$newest"
}

# sb_root_build SUITE DEST LOG: debootstrap SUITE into DEST, then pack it
# into the cache (before any mount, so the tarball holds the root alone).
sb_root_build() {
  local suite="$1" dest="$2" log="$3" cache="${SANDBOX_CACHE:-/var/cache/fluksio-sandbox}" mirror version tmp
  command -v debootstrap >/dev/null 2>&1 || {
    sb_log "installing debootstrap (log: $log)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >>"$log" 2>&1 ||
      { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >>"$log" 2>&1; } ||
      sb_die "apt-get install debootstrap failed (log: $log)"
  }
  mirror="$(sb_mirror)"
  sb_log "making a $suite root with Slurm from $mirror (about a minute, once; log: $log)"
  rm -rf --one-file-system -- "$dest"
  debootstrap --variant=minbase --include=slurmctld,slurmd,slurmdbd,slurm-client,munge,openssh-server \
    "$suite" "$dest" "$mirror" >>"$log" 2>&1 || {
    tail -n 15 "$log" >&2
    sb_die "debootstrap $suite failed (log: $log)"
  }
  version="$(chroot "$dest" dpkg-query -W -f='${Version}' slurmctld 2>/dev/null)" || version=unknown
  version="${version%%-*}"
  mkdir -p "$cache"
  tmp="$(mktemp "$cache/.slurm-$suite.XXXXXX")"
  tar -C "$dest" -czf "$tmp" . && mv -f "$tmp" "$cache/slurm-$suite-$version.tar.gz" ||
    { rm -f "$tmp"; sb_die "could not write the root's cache in $cache"; }
  sb_log "cached the $suite root (Slurm $version) as $cache/slurm-$suite-$version.tar.gz"
}

# sb_root_ensure SUITE ROOT LOG: ROOT holds SUITE's Slurm, from the cache
# or from debootstrap.
sb_root_ensure() {
  local suite="$1" root="$2" log="$3" tarball
  [[ -x "$root/usr/sbin/slurmctld" && -e "$root/.suite-$suite" ]] && return 0
  sb_root_umount "$root"
  rm -rf --one-file-system -- "$root"
  tarball="$(sb_root_cached "$suite" || true)"
  if [[ -z "$tarball" || "${SANDBOX_SLURM_REFRESH:-0}" == 1 ]]; then
    sb_root_build "$suite" "$root" "$log"
  else
    mkdir -p "$root"
    tar -C "$root" -xzf "$tarball" || sb_die "could not unpack $tarball into $root"
  fi
  touch "$root/.suite-$suite"
}

# sb_root_add ROOT LOG PACKAGE...: install packages a root from an older
# cache lacks (slurmdbd came into the root with accounting), with the
# root's own apt from the mirror it was made from, and no service
# started. The root's /proc and /dev are mounted for dpkg's scripts.
sb_root_add() {
  local root="$1" log="$2" missing=() p
  shift 2
  for p in "$@"; do
    chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  sb_log "installing ${missing[*]} into $root (log: $log)"
  mkdir -p "$root/proc" "$root/dev"
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 0755 "$root/usr/sbin/policy-rc.d"
  { chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1 ||
    { chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$log" 2>&1 &&
      chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; }; } || {
    rm -f "$root/usr/sbin/policy-rc.d"
    tail -n 15 "$log" >&2
    sb_die "could not install ${missing[*]} into the root $root (log: $log)"
  }
  rm -f "$root/usr/sbin/policy-rc.d"
}

# sb_root_user ROOT USER: the job user inside the root, with the host's
# uid and gid, and password '*' (a locked '!' makes sshd refuse even key
# logins).
sb_root_user() {
  local root="$1" user="$2" uid gid
  uid="$(id -u "$user")" gid="$(id -g "$user")"
  if ! chroot "$root" getent group "$gid" >/dev/null 2>&1; then
    chroot "$root" groupadd -g "$gid" "$user"
  fi
  if ! chroot "$root" id -u "$user" >/dev/null 2>&1; then
    chroot "$root" useradd -M -u "$uid" -g "$gid" -d "/home/$user" -s /bin/bash "$user"
  fi
  chroot "$root" usermod -p '*' "$user"
}

# sb_root_hosts ROOT: the root's /etc/hosts, this machine's own with
# 127.0.0.1 named localhost and the host name besides. debootstrap writes
# none, and without it every lookup the daemons make goes to DNS: the
# controller's conmgr names each connection with getnameinfo(127.0.0.1),
# on one of its worker threads, and a DNS server that drops a reverse
# query stalls that thread for the resolver's 5 s timeout. Under a burst
# of job completions the stall holds up accepting further RPCs, the
# jobs' slurmstepd give up after MessageTimeout (10 s), the controller
# logs "slurm_bufs_sendto(...) failed: Unexpected missing socket error"
# for each, and the jobs stay COMPLETING for slurmstepd's 15 s retry.
# munged, likewise, cannot find its origin address ("Failed to lookup
# origin"; slurmctld then logs "auth_p_get_host: Lookup failed for
# 0.0.0.0"). glibc reads the file at each lookup; munged looks its
# origin up once, at start. True when the file changed.
sb_root_hosts() {
  local root="$1" host tmp
  host="$(hostname)"
  tmp="$(mktemp "$root/etc/.hosts.XXXXXX")"
  {
    echo "# Generated by sandbox/up.sh from this machine's /etc/hosts - edits are overwritten."
    if [[ "$host" == *.* ]]; then echo "127.0.0.1 localhost $host ${host%%.*}"; else echo "127.0.0.1 localhost $host"; fi
    grep -v '^[[:space:]]*#' /etc/hosts 2>/dev/null || true
  } >"$tmp"
  chmod 0644 "$tmp"
  if cmp -s "$tmp" "$root/etc/hosts"; then
    rm -f "$tmp"
    return 1
  fi
  mv -f "$tmp" "$root/etc/hosts"
}

# sb_root_mounts ROOT USER DIR: the paths bound into the root, one a line.
sb_root_binds() {
  local user="$2" dir="$3"
  printf '%s\n' /dev /dev/pts /sys /tmp "/home/$user"
  case "$dir/" in /tmp/*) ;; *) printf '%s\n' "$dir" ;; esac
}

# sb_root_mount ROOT USER DIR: mount /proc and bind the shared paths,
# each once.
sb_root_mount() {
  local root="$1" user="$2" dir="$3" p
  mkdir -p "$root/proc" "$root/run/sshd"
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  while read -r p; do
    mkdir -p "$root$p"
    mountpoint -q "$root$p" || mount --bind "$p" "$root$p"
  done < <(sb_root_binds "$@")
}

# sb_root_umount ROOT: unmount everything mounted under ROOT, deepest
# first. It fails if anything stays mounted, so that nobody removes ROOT
# and, through a bind mount, /tmp or a home with it.
sb_root_umount() {
  local root="$1" m left
  [[ -d "$root" ]] || return 0
  root="$(cd "$root" && pwd -P)"
  for _ in 1 2 3; do
    left=0
    while read -r m; do
      left=1
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(awk -v r="$root/" '{ gsub(/\\040/, " ", $2) } index($2 "/", r) == 1 { print $2 }' /proc/self/mounts | sort -r)
    ((left)) || return 0
  done
  if awk -v r="$root/" 'index($2 "/", r) == 1 { f = 1 } END { exit !f }' /proc/self/mounts; then
    sb_die "could not unmount everything under $root; not removing it"
  fi
}

# sb_root_wrappers ROOT BIN: a wrapper in BIN for each command the sandbox
# and the tests run, which runs the root's own. The wrapper takes BIN out
# of PATH first, so that a job submitted through it does not find the
# wrappers (which need root) on its PATH.
sb_root_wrappers() {
  local root="$1" bin="$2" c path
  mkdir -p "$bin"
  chmod 0755 "$bin"
  for c in slurmctld slurmd slurmdbd sbatch squeue sinfo scontrol scancel sacct sacctmgr sdiag srun salloc sprio sshare \
    munged munge unmunge mungekey sshd; do
    path=""
    for d in /usr/sbin /usr/bin /sbin /bin; do
      if [[ -x "$root$d/$c" ]]; then path="$d/$c" && break; fi
    done
    [[ -n "$path" ]] || continue
    cat >"$bin/$c.tmp" <<EOF
#!/bin/bash
# Generated by sandbox/up.sh: $c of the sandbox's own Slurm root, $root.
p=":\$PATH:" b=":$bin:"
p="\${p//"\$b"/:}"
p="\${p#:}"
export PATH="\${p%:}"
exec /usr/sbin/chroot $root /bin/sh -c 'cd "\$0" 2>/dev/null || cd /; exec "\$@"' "\$PWD" $path "\$@"
EOF
    chmod 0755 "$bin/$c.tmp"
    mv -f "$bin/$c.tmp" "$bin/$c"
  done
}
