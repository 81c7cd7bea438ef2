"""A worker's memory with LoRA against full fine-tuning, side by side in one invocation.

The memory benchmark's model and run (`benchmarks.memory`: BERT-base at random init, 110 M parameters, on
BBC News text at 64 tokens, 3 epochs of 2 steps that freeze 0, 6 then 9 of the 12 blocks), trained four ways in
interleaved rounds: full fine-tuning and `adapter=lora` (peft's defaults for BERT: rank 8 on query, key, value
and dense), each at K = 4 (4 workers, a GPipe pipeline) and at K = 1 (one worker holding the whole model).
Per run: each worker's resident memory in the first layout phase (nothing frozen yet: where the two differ
most), its peak over the run, and the parameter and optimizer-state bytes the worker holds (from the run's
own accounting): under LoRA the base weights have no gradient and no AdamW moments.

    python -m benchmarks.lora_memory [--repeats 1] [--out DIR] [--reuse] [overrides ...]
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from benchmarks.harness import command_line, machine_description, median, publish, rounds_parser
from benchmarks.memory import REPO, execute, mib

RUNS = {
    "full fine-tuning, K = 4": [],
    "LoRA, K = 4": ["adapter=lora"],
    "full fine-tuning, K = 1": ["launcher.nproc_per_node=1", "pipe.length=1"],
    "LoRA, K = 1": ["adapter=lora", "launcher.nproc_per_node=1", "pipe.length=1"],
}
"""Each run's overrides over the memory benchmark's own."""


def per_worker(runs: list[dict], pick) -> list[float | None]:
    """The median over the rounds of each worker's value `pick(run)[worker]`."""
    values = [pick(run) for run in runs]
    return [median([v[w] for v in values if w < len(v)]) for w in range(max(len(v) for v in values))]


def row(label: str, runs: list[dict]) -> dict:
    first = [run["phases"][0] for run in runs]
    memory = first[0]["memory"] or {}
    return {
        "label": label,
        "rss_bytes": per_worker(first, lambda p: p["rss_bytes"]),
        "peak_rss_bytes": per_worker(runs, lambda r: r["peak_rss_bytes"]),
        "param_bytes": memory.get("param_bytes"),
        "optim_bytes": memory.get("optim_bytes"),
        "runs": runs,
    }


def caption(result: dict) -> str:
    return (
        f"A worker's memory, BERT-base at random init with LoRA (rank 8 on query, key, value and dense) against full "
        f"fine-tuning; {result['repeats']} round(s), interleaved, medians; per worker by rank, in MiB: resident "
        f"memory while nothing is frozen, the peak over the run, and the parameters and AdamW state the worker holds"
    )


def table(result: dict) -> str:
    lines = [
        "| run | resident, nothing frozen | peak resident | parameters | optimizer state |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:

        def cells(key: str, r: dict = r) -> str:
            return " / ".join(mib(v) for v in r[key]) if r[key] else "-"

        lines.append(
            f"| {r['label']} | {cells('rss_bytes')} | {cells('peak_rss_bytes')} | {cells('param_bytes')} "
            f"| {cells('optim_bytes')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = rounds_parser(__doc__, "runs/bench_lora_memory", recipe=None, repeats_help="interleaved rounds")
    args, overrides = parser.parse_known_args()
    out = Path(args.out).resolve()
    rounds = [
        {
            label: execute(label, REPO, out / f"round{r}" / f"run{i}", [*extra, *overrides], args.reuse)
            for i, (label, extra) in enumerate(RUNS.items())
        }
        for r in range(args.repeats)
    ]
    result = {
        "command": command_line(),
        "date": str(date.today()),
        "machine": machine_description(),
        "repeats": args.repeats,
        "rows": [row(label, [rnd[label] for rnd in rounds]) for label in RUNS],
    }
    publish(result, out / "bench_lora_memory.json", caption, table)


if __name__ == "__main__":
    main()
