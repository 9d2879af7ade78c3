#!/usr/bin/env bash
# The wheel check (a CI step): build PEARL's wheel from this checkout, install it (not editable) into a fresh
# virtualenv with the pinned dependencies, and run, from outside the repository, what a user of the installed
# package runs: `pearl --help`, the simulator on a shipped scenario, and Django's system check through
# `pearl-manage` (the installed package's manage.py), plus a template and a static file found as package data.
# pip's own cache is reused, so a second run downloads nothing.
# Usage: scripts/check-wheel.sh   (PYTHON=python3.11 by default; KEEP=1 keeps the temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pearl-wheel.XXXXXX")
[[ ${KEEP:-0} == 1 ]] || trap 'rm -rf "$tmp"' EXIT
say() { printf '\033[1;36m==>\033[0m [%3ds] %s\n' "$SECONDS" "$*"; }

say "copying the checkout's files (tracked and untracked, none ignored) to $tmp/src"
mkdir -p "$tmp/src"
git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tmp/src"

say "building the wheel (in a fresh virtualenv, which then gets it)"
"$PY" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" wheel -q --no-deps -w "$tmp/dist" "$tmp/src" 2>&1 | grep -v "is ignored" || true
wheel=$(ls "$tmp"/dist/pearl-*.whl)

say "installing $(basename "$wheel") non-editable (dependencies pinned by constraints.txt)"
extra=()
# torch==2.13.0 is the CPU build: a local wheel directory if the machine has one, else PyTorch's CPU index
if ! ls "${PIP_FIND_LINKS:-/opt/wheels}"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  extra+=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
"$tmp/venv/bin/pip" install -q "${extra[@]}" -c constraints.txt "$wheel" 2>&1 | grep -v "is ignored" || true
"$tmp/venv/bin/pip" show -q pearl >/dev/null

say "running the installed package from outside the repository"
mkdir -p "$tmp/run" && cd "$tmp/run"
export PEARL_VAR_DIR=$tmp/var DATABASE_URL=sqlite:///$tmp/var/db.sqlite3
unset PYTHONPATH DJANGO_SETTINGS_MODULE
bin=$tmp/venv/bin
where=$("$bin/python" -c 'import controlplane, pathlib; print(pathlib.Path(controlplane.__file__).parent)')
[[ $where == "$tmp/venv/"* ]] || { echo "controlplane imported from $where, not from the installed wheel" >&2; exit 1; }
"$bin/pearl" --help >/dev/null
"$bin/python" -m controlplane.sim compare --scenario paper-qwen3-8b-seg1 | tail -1
"$bin/pearl-manage" check
"$bin/pearl-manage" findstatic --verbosity 0 pearl.css
"$bin/pearl-manage" shell -c "from django.template.loader import get_template; get_template('dashboard.html')"
say "wheel check passed"
