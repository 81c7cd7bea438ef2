"""AutoCache benchmark on the embedded default, side by side in one invocation.

Two runs of `ptrun train` (the digits ViT recipe, same seed and data), one without and one with the cache,
freezing one more block every `--hold` epochs (a fixed schedule, so both runs freeze the same blocks at the
same epochs) on a fixed layout (K = 1, DP = 2 by default), so the only difference is the cache. For each
frozen depth it prints the training time of an epoch without the cache, with the cache in its first epoch
at that depth (filling it, or advancing the entries by the newly frozen units), and in the later epochs
(reading it), the speedup of reading over no cache, and the memory the cache used.

    python scripts/bench_cache.py [--hold 2] [--out runs/bench_cache] [ptrun overrides ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

DEPTH = 6  # blocks of the embedded default's ViT


def run(out: Path, name: str, overrides: list[str]) -> list[dict]:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "ptrun.cli", "train", f"hydra.run.dir={run_dir}", *overrides]
    print("$ " + " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "epoch"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=int, default=2, help="epochs at each frozen depth (>= 2)")
    parser.add_argument("--out", default="runs/bench_cache")
    args, extra = parser.parse_known_args()
    out = Path(args.out)
    blocks = [b for b in range(DEPTH + 1) for _ in range(args.hold)]
    common = ["pipe.length=1", "pipe.microbatches=1", "pipe.schedule=GPipe", "freeze.policy=schedule",
              f"freeze.blocks=[{','.join(map(str, blocks))}]", "freeze.max_fraction=1.0",
              f"train.epochs={len(blocks)}", "checkpoint.every_epochs=0", "cache.min_frozen_units=1", *extra]
    off = run(out, "cache_off", common + ["auto.cache=false"])
    on = run(out, "cache_on", common + ["auto.cache=true"])

    rows = []
    for depth in range(DEPTH + 1):
        span = range(depth * args.hold, (depth + 1) * args.hold)
        base = statistics.mean(off[e]["epoch_time_s"] for e in span)
        first = on[span[0]]["epoch_time_s"]
        later = statistics.mean(on[e]["epoch_time_s"] for e in span[1:])
        cache = on[span[-1]].get("cache", {})
        rows.append({"frozen_blocks": depth, "frozen_units": 1 + 2 * depth if depth else 0,
                     "epoch_s_off": base, "epoch_s_on_first": first, "epoch_s_on_read": later,
                     "speedup_read": base / later,
                     "cache_mib": (cache.get("memory_bytes", 0) + cache.get("disk_bytes", 0)) / 2**20
                     if depth else 0.0,
                     "top1_off": off[span[-1]]["eval"].get("top1"), "top1_on": on[span[-1]]["eval"].get("top1")})
    total_off = sum(e["epoch_time_s"] for e in off)
    total_on = sum(e["epoch_time_s"] for e in on)

    print("\n| frozen blocks (units) | epoch, no cache (s) | epoch, cache: first (s) | epoch, cache: read (s) "
          "| read vs no cache | cache memory (MiB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['frozen_blocks']} ({r['frozen_units']}) | {r['epoch_s_off']:.2f} | {r['epoch_s_on_first']:.2f} "
              f"| {r['epoch_s_on_read']:.2f} | {r['speedup_read']:.2f}x | {r['cache_mib']:.1f} |")
    print(f"\ntraining time: {total_off:.1f}s without the cache, {total_on:.1f}s with it "
          f"({total_off / total_on:.2f}x); final top-1 {off[-1]['eval'].get('top1'):.2f} vs "
          f"{on[-1]['eval'].get('top1'):.2f}")
    result = {"rows": rows, "total_s_off": total_off, "total_s_on": total_on, "hold": args.hold, "overrides": extra}
    (out / "bench_cache.json").write_text(json.dumps(result, indent=1))
    print(f"written: {out / 'bench_cache.json'}")


if __name__ == "__main__":
    main()
