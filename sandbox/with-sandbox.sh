#!/usr/bin/env bash
# with-sandbox.sh STATE_DIR -- COMMAND...
#
# Runs COMMAND with the sandbox's environment (env.sh) exported, bringing
# the sandbox up first when it can. Tests that need Slurm read that
# environment: with it they run, without it they skip locally and fail in
# CI. If this script started the sandbox, it stops it again afterwards, so
# `make test` leaves a machine as it found it.
set -euo pipefail
dir="${1:?usage: with-sandbox.sh STATE_DIR -- COMMAND...}"
shift
[[ "${1:-}" == "--" ]] && shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"
sb_resolve_dir "$dir"
sb_check_suite

started=0
if bash "$here/status.sh" "$dir" >/dev/null 2>&1; then
  echo "==> sandbox already up in $dir; leaving it up afterwards"
elif [[ "$(id -u)" != 0 ]]; then
  msg="the sandbox Slurm needs root (it installs packages, adds a user and runs slurmd)"
  if [[ -n "${CI:-}" ]]; then echo "==> $msg: CI must run as root" >&2; exit 1; fi
  echo "==> $msg; run 'sudo make sandbox-up' first. Tests that need Slurm will SKIP."
else
  echo "==> bringing the sandbox up in $dir"
  if bash "$here/up.sh" "$dir"; then
    started=1
  else
    if [[ -n "${CI:-}" ]]; then echo "==> the sandbox did not come up; in CI that is a failure" >&2; exit 1; fi
    echo "==> the sandbox did not come up (see above). Tests that need Slurm will SKIP."
  fi
fi

if [[ -f "$dir/env.sh" ]] && bash "$here/status.sh" "$dir" >/dev/null 2>&1; then
  # shellcheck disable=SC1091
  . "$dir/env.sh"
fi

rc=0
"$@" || rc=$?
if ((started)); then
  echo "==> stopping the sandbox this run started"
  bash "$here/down.sh" "$dir" --purge >/dev/null || true
fi
exit "$rc"
