#!/usr/bin/env bash
# Set up (or reuse) the venv and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$repo/scripts/setup.sh")
cd "$repo"
exec "$venv/bin/python" -m pytest -q "$@"
