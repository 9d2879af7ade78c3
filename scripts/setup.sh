#!/usr/bin/env bash
# Idempotent setup: a Python 3.11 virtualenv with the pinned stack, and redis-server.
# Usage: scripts/setup.sh [--test]   (--test also installs Chromium for the browser tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
want_test=0; [[ "${1:-}" == "--test" ]] && want_test=1

say() { printf '\033[1;36m==>\033[0m %s\n' "$*"; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }
apt_install() {
  if ! command -v apt-get >/dev/null; then return 1; fi
  if [[ ! -f /tmp/.pearl-apt-updated ]]; then as_root apt-get update -qq && touch /tmp/.pearl-apt-updated; fi
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

command -v "$PY" >/dev/null || { echo "Python 3.11 is required ($PY not found). Install python3.11 and retry." >&2; exit 1; }

if ! command -v redis-server >/dev/null; then
  say "installing redis-server"
  apt_install redis-server || { echo "redis-server is missing. Install it (Debian/Ubuntu: sudo apt-get install redis-server) or set REDIS_URL to a reachable Redis." >&2; exit 1; }
fi

stamp=.venv/.pearl-installed
if [[ ! -x .venv/bin/python ]]; then say "creating .venv"; "$PY" -m venv .venv; fi
if [[ ! -f $stamp || pyproject.toml -nt $stamp || constraints.txt -nt $stamp ]]; then
  say "installing Python packages (pinned in constraints.txt; torch is the 2.13.0 CPU build)"
  extra=()
  # torch==2.13.0 must be the CPU build: use a local wheel directory if the machine has one,
  # else PyTorch's CPU index (a plain PyPI install would pull a multi-GB CUDA build).
  if ! ls ${PIP_FIND_LINKS:-/opt/wheels}/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    extra+=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q "${extra[@]}" -c constraints.txt -e '.[test,lint]'
  touch "$stamp"
fi

if [[ $want_test == 1 ]] && ! command -v chromium >/dev/null && [[ ! -x /usr/bin/chromium ]]; then
  say "installing Chromium for the browser tests"
  apt_install chromium || echo "Chromium could not be installed: the browser tests will be skipped." >&2
fi
say "setup done"
