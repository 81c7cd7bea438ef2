#!/usr/bin/env bash
# The first commands to run on a GPU machine, each a short job on digits_vit (the quickest recipe):
#   0. (1 GPU or more) the peer benchmark's pair on one GPU: the plain PyTorch loop and ptrun without freezing,
#      interleaved (`python -m benchmarks.peers`), so the engine's cost on CUDA shows beside hand-written code
#   then, with 2 GPUs or more:
#   1. a 2-GPU pipeline (K = 2, 1F1B, fp32 with TF32), no freezing
#   2. a freeze transition: 4 of 6 blocks (9 of 14 units) frozen after epoch 1, repacked to K = 1, DP = 2,
#      the frozen prefix served from AutoCache
#   3. bf16 autocast, then fp16 with its loss scale
# Each line of output says what to look for. Run dirs go under $1 (default: a new temporary directory).
# PTRUN_SMOKE_ALLOW_CPU=1 runs the same commands without GPUs (gloo, one CPU process per device), to check
# the script itself.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=$("$repo/scripts/setup.sh")
out=${1:-$(mktemp -d -t ptrun-smoke-XXXX)}
gpus=$("$venv/bin/python" -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -lt 1 ] && [ "${PTRUN_SMOKE_ALLOW_CPU:-0}" != 1 ]; then
    echo "gpu_smoke: found no CUDA device (PTRUN_SMOKE_ALLOW_CPU=1 runs it on the CPU)" >&2
    exit 2
fi

echo "== 0/4 one GPU, ptrun against the plain loop: expect the ratio line 'ptrun, freezing off, 1 worker / plain loop' near 1.00x"
(cd "$repo" && "$venv/bin/python" -m benchmarks.peers --recipe digits_vit --only a,c --repeats 2 --out "$out/peers" train.epochs=5)
if [ "$gpus" -lt 2 ] && [ "${PTRUN_SMOKE_ALLOW_CPU:-0}" != 1 ]; then
    echo "gpu_smoke: $gpus CUDA device: the 2-GPU jobs below are skipped; run dirs in $out"
    exit 0
fi
ptrun() { "$venv/bin/ptrun" train recipe=digits_vit launcher.nproc_per_node=2 "$@"; }

echo "== 1/4 two-GPU pipeline: expect 'layout: K=2 DP=1 M=2 1F1B' and 'device cuda:0' in $out/pipeline/metrics.jsonl"
ptrun auto.freeze=false train.epochs=2 pipe.length=2 hydra.run.dir="$out/pipeline"
grep -o '"device": "[^"]*"' "$out/pipeline/metrics.jsonl"

echo "== 2/4 freeze transition: expect '9 of 14 units frozen (was 0); K 2 -> 1, DP 1 -> 2', then 'cache 9 units, 100% hits' in epoch 3"
ptrun train.epochs=3 pipe.length=2 freeze.policy=schedule 'freeze.blocks=[0,4]' hydra.run.dir="$out/freeze"

echo "== 3/4 bf16: expect 'precision bf16' and the losses of 1/4 to about 2 decimals"
ptrun auto.freeze=false train.epochs=2 train.precision=bf16 hydra.run.dir="$out/bf16"

echo "== 4/4 fp16: expect the losses of 1/4 to about 2 decimals, and a loss scale with few skipped steps per epoch"
ptrun auto.freeze=false train.epochs=2 train.precision=fp16 hydra.run.dir="$out/fp16"
grep -o '"loss_scale": [0-9.]*, "skipped_steps": [0-9]*' "$out/fp16/metrics.jsonl"
echo "gpu_smoke: all four jobs finished; run dirs in $out"
