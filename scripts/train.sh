#!/usr/bin/env bash
# Set up (or reuse) the venv and run `ptrun train` with the given overrides (none = the embedded default).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$repo/scripts/setup.sh")
exec "$venv/bin/ptrun" train "$@"
