#!/usr/bin/env bash
# demo.sh - the whole loop, told as a story: an engine (bin/host-example)
# launches the Slurm provisioner plugin, the plugin submits jobs over ssh to
# a throwaway local Slurm, the worker inside each job dials back and does a
# piece of work, and on the way out nothing is left in the queue.
#
# Run it through `make demo` (which builds first), as root on Debian or
# Ubuntu. It brings the sandbox up if it is not, and takes it down again.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. sandbox/lib.sh
sb_resolve_dir "${SANDBOX_DIR:-}"
sb_check_suite
dir="$SB_DIR"

say() { printf '\n==> %s\n' "$*"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[[ "$(id -u)" == 0 ]] || die "the demo runs a real Slurm, which needs root (slurmd, a job user, packages). Run: sudo make demo. Without root, 'make test' still runs the tests that need no Slurm."
[[ -x bin/host-example && -x bin/provisioner-slurm && -x bin/fluksio-worker ]] || die "bin/ is not built; run it as 'make demo', which builds first"
if ! command -v sbatch >/dev/null && ! command -v apt-get >/dev/null; then
  die "Slurm is not installed and there is no apt-get to install it. On another distribution install slurmctld, slurmd, slurm-client, munge and openssh-server, then run make demo again."
fi

started=0
if bash sandbox/status.sh "$dir" >/dev/null 2>&1; then
  say "a sandbox Slurm is already up in $dir; using it and leaving it up"
else
  say "starting a throwaway single-node Slurm and an sshd login node on 127.0.0.1 (state in $dir)"
  bash sandbox/up.sh "$dir" | sed 's/^/    /'
  started=1
fi
cleanup() {
  if ((started)); then
    say "stopping the sandbox"
    bash sandbox/down.sh "$dir" --purge >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
# shellcheck disable=SC1091
. "$dir/env.sh"

# The worker needs no installing: worker_command is left unset, so the
# plugin ships bin/fluksio-worker, which sits beside it, to the login
# user's ~/.local/share/fluksio/bin, and the jobs run that copy.
work="$dir/demo"
mkdir -p "$work"
chmod 755 "$work"
port=$((8470 + RANDOM % 500))
cat >"$work/config.hcl" <<HCL
engine {
  listen     = "127.0.0.1:$port"
  plugin_dir = "$root/bin"
}

provisioner "slurm" "sandbox" {
  login          = "$SANDBOX_SSH_LOGIN"
  ssh_port       = $SANDBOX_SSH_PORT
  ssh_key        = "$SANDBOX_SSH_KEY"
  known_hosts    = "$SANDBOX_SSH_KNOWN_HOSTS"
  engine_url     = "http://127.0.0.1:$port"
  max_idle       = "30s"

  profile "cpu" {
    cpus   = 2
    ram_mb = 500
    sbatch = ["--partition=$SANDBOX_PARTITION", "--time=00:10:00"]
  }
  profile "gpu" {
    cpus   = 1
    gpus   = 1
    ram_mb = 500
    labels = ["cuda"]
    sbatch = ["--partition=$SANDBOX_PARTITION", "--time=00:10:00"]
  }
}
HCL
say "the configuration ($work/config.hcl):"
sed 's/^/    /' "$work/config.hcl"

say "checking it against the cluster, submitting nothing: host-example validate -check"
bin/host-example validate -check "$work/config.hcl" | sed 's/^/    /'
say "the batch script the cpu profile submits (host-example script; the credential is a placeholder):"
bin/host-example script -config "$work/config.hcl" -profile cpu | sed 's/^/    /'

# DEMO_LINGER keeps the engine up after the work, so that a person can
# look at its status page; DEMO_LINGER=0 ends the demo at once.
linger="${DEMO_LINGER:-30s}"
# The work: four tasks, each a command run on a machine of the cluster
# with its input sent from here and its stdout brought back.
for i in 1 2 3; do head -c 1048576 /dev/urandom >"$work/data-$i.bin"; done
cat >"$work/tasks.jsonl" <<'JSON'
{"id": "sum-1", "cpus": 2, "command": ["sh", "-c", "sha256sum data.bin; sleep 2"], "inputs": {"data.bin": "data-1.bin"}}
{"id": "sum-2", "cpus": 2, "command": ["sh", "-c", "sha256sum data.bin; sleep 2"], "inputs": {"data.bin": "data-2.bin"}}
{"id": "sum-3", "cpus": 2, "command": ["sh", "-c", "sha256sum data.bin; sleep 2"], "inputs": {"data.bin": "data-3.bin"}}
{"id": "gpu", "gpus": 1, "label": "cuda", "command": ["sh", "-c", "echo a gpu task on $(hostname) in job $SLURM_JOB_ID"]}
JSON
say "the work ($work/tasks.jsonl): three digests of 1 MB inputs on machines of 2 cpus (asked for as one job array), and a task on a gpu labelled cuda"
sed 's/^/    /' "$work/tasks.jsonl"
say "running the engine with them: host-example run -v -tasks (-v: a line for every task and machine, not only what needs a person; its log: $work/engine.log)"
if [[ "$linger" == 0 || "$linger" == 0s ]]; then
  say "watch it live: open http://127.0.0.1:$port/ in a browser on this machine (the engine exits when the work is done; DEMO_LINGER=30s keeps it up after)"
else
  say "watch it live: open http://127.0.0.1:$port/ in a browser on this machine (the engine stays up $linger after the work; Ctrl-C ends it)"
fi
t0=$(date +%s.%N)
set +e
rm -rf "$work/results"
bin/host-example run -config "$work/config.hcl" -v -tasks "$work/tasks.jsonl" -results "$work/results" -timeout 3m -linger "$linger" 2>"$work/engine.log" | sed 's/^/    /'
rc=${PIPESTATUS[0]}
set -e
t1=$(date +%s.%N)
printf '    (engine exited %d after %.1fs)\n' "$rc" "$(echo "$t1 - $t0" | bc)"
if ((rc != 0)); then
  echo "    the engine failed; the end of its log:"
  tail -20 "$work/engine.log" | sed 's/^/    /'
fi

say "what came back ($work/results/ID/: stdout, stderr, result.json)"
for id in sum-1 sum-2 sum-3 gpu; do
  printf '    %s: %s' "$id" "$(cat "$work/results/$id/stdout" 2>/dev/null || echo '(no stdout)')"; echo
done
(cd "$work" && sha256sum data-1.bin data-2.bin data-3.bin | sed 's/^/    here: /')

say "what is left behind"
# The clean stop as a user sees it: each worker has detached and exited 0
# before the engine returns, so within 2 s (internal/sandboxtest's
# CleanStopLimit, which the tests check too) Slurm lists none of its jobs.
left=""
while :; do
  left=$(squeue -h -u "$SANDBOX_SSH_USER" -o '%i %j %T' || true)
  waited=$(echo "$(date +%s.%N) - $t1" | bc)
  [[ -z "$left" || $(echo "$waited > 2" | bc) == 1 ]] && break
  sleep 0.1
done
if [[ -z "$left" ]]; then
  printf '    Slurm queue: empty (%.1fs after the engine exited)\n' "$waited"
else
  echo "    Slurm queue still has, 2s after the engine exited:"; echo "$left" | sed 's/^/      /'; rc=1
fi
plugins=$(pgrep -f "$root/bin/provisioner-slurm" || true)
if [[ -z "$plugins" ]]; then echo "    plugin processes: none"; else echo "    plugin processes still running: $plugins"; rc=1; fi
exit "$rc"
