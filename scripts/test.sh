#!/usr/bin/env bash
# Set up (or reuse) the venv and run the whole test suite: one pytest-xdist worker per CPU core, each test file on
# one worker (its module-scoped runs are made once). Extra arguments go to pytest (`-n 0`: in one process).
#
# The suite's temporary files go to a directory of its own, removed when it ends however it ends: the session's
# end-of-run check (tests/conftest.py) then sees only what the suite made, not what a run beside it makes.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$repo/scripts/setup.sh")
cd "$repo"
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/suite.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
trap 'exit 130' INT   # Ctrl-C: pytest stops (its own handler); then the directory goes, and the shell exits
trap 'exit 143' TERM
"$venv/bin/python" -m pytest -q -n auto --dist loadfile "$@"
