"""AutoCache benchmark on digits_vit, side by side in one invocation.

Two runs of `ptrun train` (the digits ViT recipe, same seed and data), one without and one with the cache,
freezing one more block every `--hold` epochs (a fixed schedule, so both runs freeze the same blocks at the
same epochs) on a fixed layout (K = 1, DP = 2 by default), so the only difference is the cache. For each
frozen depth it prints the training time of an epoch without the cache, with the cache in its first epoch
at that depth (filling it, or advancing the entries by the newly frozen units), and in the later epochs
(reading it), the speedup of reading over no cache, and the memory the cache used. It writes the same
numbers, with the command line, to `bench_cache.json` in `--out`; `benchmarks/results_page.py` makes the README's
table from it.

    python -m benchmarks.cache [--hold 2] [--out runs/bench_cache] [ptrun overrides ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.harness import command_line, fmt, publish, train

DEPTH = 6  # blocks of digits_vit's ViT


def run(out: Path, name: str, overrides: list[str]) -> list[dict]:
    """One `ptrun train` run into `out/name`: its `metrics.jsonl` events."""
    run_dir = train(out / name, overrides)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def of_kind(events: list[dict], kind: str) -> list[dict]:
    """The events of one kind ("start", "plan", "epoch"), in order."""
    return [e for e in events if e["event"] == kind]


def depth_rows(off: list[dict], on: list[dict], hold: int) -> list[dict]:
    """One row per frozen depth from the two runs' epoch events: the epoch times without the cache (mean),
    with it in the depth's first epoch and in its later ones (mean), and the cache's memory at its end."""
    rows = []
    for depth in range(DEPTH + 1):
        span = range(depth * hold, (depth + 1) * hold)
        base = statistics.mean(off[e]["epoch_time_s"] for e in span)
        first = on[span[0]]["epoch_time_s"]
        later = statistics.mean(on[e]["epoch_time_s"] for e in span[1:])
        cache = on[span[-1]].get("cache", {})
        rows.append(
            {
                "frozen_blocks": depth,
                "frozen_units": 1 + 2 * depth if depth else 0,
                "epoch_s_off": base,
                "epoch_s_on_first": first,
                "epoch_s_on_read": later,
                "speedup_read": base / later,
                "cache_mib": (cache.get("memory_bytes", 0) + cache.get("disk_bytes", 0)) / 2**20 if depth else 0.0,
                "top1_off": off[span[-1]]["eval"].get("top1"),
                "top1_on": on[span[-1]]["eval"].get("top1"),
            }
        )
    return rows


def caption(result: dict) -> str:
    """The line above the table: recipe, layout and schedule, then both runs' training time and final top-1
    (the last row's, which is the last epoch's)."""
    off, on, last = result["total_s_off"], result["total_s_on"], result["rows"][-1]
    return (
        f"{result['recipe']}, K = {result['pp']}, DP = {result['dp']}, one more block frozen every "
        f"{result['hold']} epochs; training time: {off:.1f}s without the cache, {on:.1f}s with it "
        f"({off / on:.2f}x); final top-1 {fmt(last['top1_off'])} vs {fmt(last['top1_on'])}"
    )


def table(result: dict) -> str:
    """The Markdown table of a `bench_cache.json` (printed by this script, put in the README by
    `benchmarks/results_page.py`)."""
    lines = [
        "| frozen blocks (units) | epoch, no cache (s) | epoch, cache: first (s) | epoch, cache: read (s) "
        "| read vs no cache | cache memory (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['frozen_blocks']} ({r['frozen_units']}) | {r['epoch_s_off']:.2f} "
            f"| {r['epoch_s_on_first']:.2f} | {r['epoch_s_on_read']:.2f} | {r['speedup_read']:.2f}x "
            f"| {r['cache_mib']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=int, default=2, help="epochs at each frozen depth (>= 2)")
    parser.add_argument("--out", default="runs/bench_cache")
    args, extra = parser.parse_known_args()
    out = Path(args.out)
    blocks = [b for b in range(DEPTH + 1) for _ in range(args.hold)]
    common = [
        "recipe=digits_vit",
        "pipe.length=1",
        "pipe.microbatches=1",
        "pipe.schedule=GPipe",
        "freeze.policy=schedule",
        f"freeze.blocks=[{','.join(map(str, blocks))}]",
        "freeze.max_fraction=1.0",
        f"train.epochs={len(blocks)}",
        "checkpoint.every_epochs=0",
        "cache.min_frozen_units=1",
        *extra,
    ]
    off = run(out, "cache_off", common + ["auto.cache=false"])
    on = run(out, "cache_on", common + ["auto.cache=true"])
    off_epochs, on_epochs = of_kind(off, "epoch"), of_kind(on, "epoch")
    # The recipe and layout as the run reports them, not as assumed: overrides may change either.
    start, plan = of_kind(on, "start")[0], of_kind(on, "plan")[0]
    result = {
        "command": command_line(),
        "recipe": start["recipe"],
        "pp": plan["pp"],
        "dp": plan["dp"],
        "rows": depth_rows(off_epochs, on_epochs, args.hold),
        "total_s_off": sum(e["epoch_time_s"] for e in off_epochs),
        "total_s_on": sum(e["epoch_time_s"] for e in on_epochs),
        "hold": args.hold,
        "overrides": extra,
    }
    publish(result, out / "bench_cache.json", caption, table)


if __name__ == "__main__":
    main()
