#!/usr/bin/env bash
# Create (or reuse) the virtual environment and install ptrun into it; prints the venv's path last.
#
# The venv is several GB (torch's CUDA build), so it lives outside the clone, keyed by a hash of the
# dependency files: a change to them builds a fresh venv from scratch (a missing install step shows),
# an unchanged set reuses it. PTRUN_VENV_ROOT moves the cache (default ~/.cache/ptrun/venvs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
key=$(cat "$repo/pyproject.toml" "$repo/requirements/constraints.txt" | sha256sum | cut -c1-16)
root=${PTRUN_VENV_ROOT:-$HOME/.cache/ptrun/venvs}
venv="$root/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "setting up $venv (a few minutes; torch comes from local disk where available)" >&2
  rm -rf "$venv"
  mkdir -p "$root"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip >&2
  # torch 2.14.1 + torchvision 0.29.1 are pinned by the constraints file (the newest this project uses).
  "$venv/bin/pip" install --quiet -c "$repo/requirements/constraints.txt" -e "$repo[dev]" >&2
  touch "$venv/.complete"
  # Keep only the newest few venvs so the disk does not fill up.
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
fi
# The checkout itself is installed editable-free into the cached venv; reinstall it (fast, no deps) so the
# venv always runs this clone's code.
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation --force-reinstall -e "$repo" >&2
echo "$venv"
