#!/usr/bin/env bash
# ptrun against the plain loop on this machine's GPU, needing no network: run on a host with its own CUDA torch
# (`source .gpu-kit/install.sh` first where ptrun is not installed: ../shared/gpu/README.md, or docs/gpu.md).
#   1-2. bbc_news_bert (the embedded default) at 128 and at 512 tokens: the plain transformers loop, ptrun with
#        freezing off, ptrun's default (freezing + AutoCache), each eager and compiled (`train.compile`; the loop
#        compiles the library model with torch.compile: `benchmarks.peers --compiled`), compiled on an empty inductor
#        cache of its own (cold) and again on the cache that run filled (warm)
#   2a.  auto128: the default as it is (`train.compile=auto`: compiles where its priced line says it pays), on an
#        empty inductor cache with nothing kept (cold), then again on what that run left (warm): its line, wall
#        and training seconds against 1's plain loop, eager and compiled
#   2b.  cudagraphs128: ptrun with freezing off and the default at 128 tokens, compiled with CUDA graphs
#        (`train.compile_mode=reduce-overhead`), against 1's compiled runs
#   2c.  shared_store: the default at 128 tokens on one worker with AutoCache's node-shared store (`cache.keep`,
#        which every job of several workers uses) instead of the one-worker store in device memory (1's default)
#   3.   steps512: the model's own step at 512 tokens, ptrun's units against the library's model on one batch,
#        and the kernels each spends its time in (`python -m benchmarks.model_step --profile`)
#   4.   profile512: ptrun with freezing off at 512 tokens, steps 20-22 under torch.profiler (`train.profile_step`):
#        the kernels' time and, in the trace, the host's gaps between them
#   5.   digits_vit: the same three as 1-2, eager and compiled
#   6.   causal_lm on a small random-weight Llama (`python -m benchmarks.tiny_decoder`): the loop and ptrun, freezing
#        off, eager and compiled
#   7.   profile_lm: ptrun's steps 20-22 on that Llama under torch.profiler, as profile512
#   8.   steps_lm: that Llama's own step, as steps512 (and how often each reads a value on the host: a sync)
# Each job runs under `timeout` and prints one line: training seconds (the sum of epoch times) and the ratio
# to the plain loop (> 1: faster than it; a compiled run's also to the compiled loop), and the final metric; a
# profile job adds its top five operators. The other compiled runs (cudagraphs128, the profiles, the steps) start
# with inductor's cache as this host has it ($TORCHINDUCTOR_CACHE_DIR, default ~/.cache/ptrun/torchinductor).
# Everything lands in $1 (default: a new temp dir):
# a job's log, its runs, and its bench_peers_<recipe>.json.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$(mktemp -d -t ptrun-gpu-check-XXXX)}
limit=${PTRUN_GPU_CHECK_TIMEOUT:-420}  # seconds per job
jobs=" ${PTRUN_GPU_CHECK_JOBS:-bbc128 bbc512 auto128 cudagraphs128 shared_store steps512 profile512 digits causal_lm profile_lm steps_lm} "  # which jobs, to rerun a few
read -r -a extra <<< "${PTRUN_GPU_CHECK_EXTRA:-}"  # overrides for every job (a dry run on the CPU: train.epochs=1 ...)
py=${PYTHON:-python3}
mkdir -p "$out"
"$py" -c "import torch, transformers; print('gpu_check:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', '| torch', torch.__version__, '| transformers', transformers.__version__)"

summary() {  # one line from a benchmarks.peers JSON
  "$py" - "$1" "$2" <<'PY'
import json, sys
job, path = sys.argv[1], sys.argv[2]
r = json.load(open(path))
metric = r["metric"]
rows = {row["label"]: row for row in r["rows"]}
plain = rows.get("plain loop") or rows.get("plain loop, eager")
suffixes = (", compiled, cold cache", ", compiled, warm cache", ", compiled")
seconds = lambda row: row["train_time_s"]["median"] if isinstance(row["train_time_s"], dict) else row["train_time_s"]
parts = []
for label, row in rows.items():
    t = seconds(row)
    final = row.get(f"final_{metric}")
    final = final["median"] if isinstance(final, dict) else final
    ratio = ""
    if plain is not None and row is not plain:
        ratio = f" ({seconds(plain) / t:.2f}x"
        suffix = next((s for s in suffixes if label.endswith(s)), None)
        compiled = rows.get("plain loop" + suffix) if suffix else None
        if compiled is not None and row is not compiled:
            ratio += f", {seconds(compiled) / t:.2f}x the compiled loop"
        ratio += f", wall {plain['wall_s'] / row['wall_s']:.2f}x)" if isinstance(row.get("wall_s"), float) else ")"
    part = f"{label} {t:.2f} s{ratio} {metric} {final:.2f}" if final is not None else f"{label} {t:.2f} s{ratio}"
    if row.get("to_first_step_s") is not None:  # the wall time outside training, split
        run = row["runs"][0]
        start = ""
        if run.get("start_phases"):  # ptrun: the launcher's share, then the worker's phases
            start = (f" (to the worker {run['to_worker_s']:.1f}, then "
                     + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in run["start_phases"].items()) + ")")
        part += (f" [wall {row['wall_s']:.1f} s: to the first step {row['to_first_step_s']:.1f}{start}, "
                 f"eval {row['eval_s']:.1f}, rest {row['rest_s']:.1f}]")
    parts.append(part)
print(f"{job}: " + " | ".join(parts), flush=True)
PY
}

job() {  # job NAME RECIPE ONLY [OVERRIDES...]
  local name=$1 recipe=$2 only=$3; shift 3
  local dir="$out/$name"
  [[ $jobs == *" $name "* ]] || return 0
  if timeout "$limit" "$py" -m benchmarks.peers --recipe "$recipe" --only "$only" --repeats 1 \
       --out "$dir" "$@" "${extra[@]}" > "$dir.log" 2>&1; then
    summary "$name" "$dir/bench_peers_$recipe.json"
  else
    echo "$name: FAILED (exit $?; log $dir.log): $(grep -v '^\s*$' "$dir.log" | tail -n 1)"
  fi
}

profile() {  # profile NAME [OVERRIDES...]: ptrun, freezing off, steps 20-22 under torch.profiler; its top operators
  local name=$1; shift
  [[ $jobs == *" $name "* ]] || return 0
  if timeout "$limit" "$py" -m ptrun.cli train hydra.run.dir="$out/$name" auto.freeze=false auto.cache=false train.epochs=1 \
       train.max_steps_per_epoch=24 train.profile_step=20 train.export=false "$@" "${extra[@]}" > "$out/$name.log" 2>&1; then
    echo "$name: $out/$name/profile/rank0.json (trace); $(head -n 1 "$out/$name/profile/rank0.txt"); the top operators (on a GPU: kernels):"
    sed -n '5,9p' "$out/$name/profile/rank0.txt" | cut -c1-150
  else
    echo "$name: FAILED (exit $?; log $out/$name.log): $(grep -v '^\s*$' "$out/$name.log" | tail -n 1)"
  fi
}

steps() {  # steps NAME RECIPE OUT_JSON [OVERRIDES...]: the model's own step, ptrun's units against the library's
  local name=$1 recipe=$2 json=$3; shift 3
  [[ $jobs == *" $name "* ]] || return 0
  if timeout "$limit" "$py" -m benchmarks.model_step --recipe "$recipe" --steps 20 --profile --out "$out/$json" \
       "$@" "${extra[@]}" > "$out/$name.log" 2>&1; then
    echo "$name: $(grep -m1 'ptrun units / library model' "$out/$name.log"); host reads a step:" \
      "$(grep 'host reads' "$out/$name.log" | sed 's/ of a tensor.*//' | paste -sd ';' -)"
  else
    echo "$name: FAILED (exit $?; log $out/$name.log): $(grep -v '^\s*$' "$out/$name.log" | tail -n 1)"
  fi
}

auto() {  # auto NAME PEERS_JSON [OVERRIDES...]: the default with train.compile=auto, cold then warm
  local name=$1 peers=$2; shift 2
  [[ $jobs == *" $name "* ]] || return 0
  local state="$out/${name}_state" cache
  rm -rf "$state"
  for cache in cold warm; do
    local t0=$SECONDS
    if TORCHINDUCTOR_CACHE_DIR="$state/inductor" PTRUN_COMPILE_COSTS_DIR="$state/kept" timeout "$limit" "$py" -m \
         ptrun.cli train hydra.run.dir="$out/$name/$cache" train.compile=auto "$@" "${extra[@]}" > "$out/$name.$cache.log" 2>&1; then
      "$py" - "$name, $cache cache" "$out/$name/$cache" "$peers" "$((SECONDS - t0))" <<'PY'
import json, sys
from pathlib import Path
label, run, peers, wall = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
train = sum(e["epoch_time_s"] for e in {e["epoch"]: e for e in events if e["event"] == "epoch"}.values())
lines = [l for l in (run.parent.parent / f"{run.parent.name}.{run.name}.log").read_text().splitlines() if l.startswith("compile: ")]
against = ""
if peers.is_file():
    rows = {r["label"]: r for r in json.loads(peers.read_text())["rows"]}
    cache = label.rsplit(", ", 1)[1].split()[0]
    for peer in ("plain loop, eager", f"plain loop, compiled, {cache} cache"):
        if peer in rows:
            r = rows[peer]
            against += f"; {peer}: wall {r['wall_s']:.1f} s ({r['wall_s'] / wall:.2f}x), training {r['train_time_s']:.1f} s"
print(f"{label}: wall {wall:.0f} s, training {train:.1f} s{against} | " + " | ".join(lines), flush=True)
PY
    else
      echo "$name, $cache cache: FAILED (exit $?; log $out/$name.$cache.log): $(grep -v '^\s*$' "$out/$name.$cache.log" | tail -n 1)"
    fi
  done
}

cd "$repo"
job bbc128 bbc_news_bert a,c,e --compiled
job bbc512 bbc_news_bert a,c,e --compiled data.max_length=512
auto auto128 "$out/bbc128/bench_peers_bbc_news_bert.json"
job cudagraphs128 bbc_news_bert c,e train.compile=true train.compile_mode=reduce-overhead
if [[ $jobs == *" shared_store "* ]]; then
  store="$out/shared_store_cache"  # the node-shared store's files, removed after the job (cache.keep keeps them)
  job shared_store bbc_news_bert e launcher.nproc_per_node=1 cache.keep=true "cache.dir=$store"
  "$py" -c "import shutil, sys; from ptrun.auto.autocache import cache_dirs; from ptrun.config import CacheConfig
[shutil.rmtree(d, ignore_errors=True) for d in cache_dirs(CacheConfig(dir=sys.argv[1]), '')]" "$store"
fi
steps steps512 bbc_news_bert model_step_bbc_news_bert_512_gpu.json data.max_length=512
profile profile512 data.max_length=512
job digits digits_vit a,c,e --compiled
if [[ $jobs != *" causal_lm "* && $jobs != *" profile_lm "* && $jobs != *" steps_lm "* ]]; then :
elif timeout 120 "$py" -m benchmarks.tiny_decoder "$out/lm" > "$out/lm.log" 2>&1; then
  job causal_lm causal_lm a,c --compiled "model.pretrained=$out/lm/llama" "data.path=$out/lm/news.jsonl" train.max_steps_per_epoch=40
  profile profile_lm recipe=causal_lm "model.pretrained=$out/lm/llama" "data.path=$out/lm/news.jsonl"
  steps steps_lm causal_lm model_step_causal_lm_gpu.json "model.pretrained=$out/lm/llama" "data.path=$out/lm/news.jsonl"
else
  echo "causal_lm: FAILED to write the small Llama (log $out/lm.log)"
fi
echo "gpu_check: done; runs and logs in $out"
