"""`train.compile=auto` against `false` and `true`, on a cold and on a warm cache: does its priced choice cost the
run nothing?

Per workload, in interleaved rounds (a slow spell of the shared machine hits every run alike), six `ptrun
train` runs, each with inductor's cache and ptrun's kept compile measurements in a state of its round:
  cold: false, true, auto   a first run on the machine: `true` and `auto` each on an empty inductor cache and
                            nothing kept (`false` first, on the state `true` then starts from: it compiles
                            nothing, and forced `true` reads nothing kept)
  warm: false, true, auto   every later run: the state the cold `false` and `true` runs left (the model's
                            graphs in inductor's cache, the eager and the compiled step time, the per-graph
                            seconds), which the warm `true` run adds to before `auto` reads it
Workloads:
  default      bbc_news_bert as it is (`ptrun train`: all-MiniLM-L6-v2, 3 epochs, 2 workers)
  digits_vit   recipe=digits_vit train.epochs=30 (long enough that a warm compile might pay)
Per run: wall time (the command, start to exit), training time (the epochs' loops), compile seconds (the busiest
worker's), final top-1 and, for `auto`, what it chose (`on`, `off`, or `on at step N` where it decided after
its first steps) and its wall time over the better of `false` and `true` in the same round and cache state
(the check: at most 1.03).

    python -m benchmarks.compile_auto [--workload default] [--workload digits_vit] [--repeats 2]
        [--out DIR] [--reuse] [overrides ...]
"""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

from benchmarks.compiled import run
from benchmarks.harness import (
    cell,
    command_line,
    label_rows,
    machine_description,
    markdown_lines,
    publish,
    rounds_parser,
)

WORKLOADS = {"default": ["recipe=bbc_news_bert"], "digits_vit": ["recipe=digits_vit", "train.epochs=30"]}
"""Each workload's `ptrun train` overrides."""
SETTINGS = ("false", "true", "auto")
STATES = ("cold", "warm")
KEYS = ("wall_s", "train_time_s", "compile_s", "final_top1", "auto_vs_best")
LIMIT = 1.03
"""`auto`'s wall time over the better of `false` and `true` on the same cache state, at most."""


def chose(run_dir: Path) -> str:
    """What a run's `compile` events decided: `on`, `off`, or `on at step N` (epoch E's step, 1-based)."""
    from ptrun.report.runs import read_events

    decided = [e for e in read_events(run_dir) if e["event"] == "compile"]
    on = next((e for e in decided if e["compile_decision"]["compile"]), None)
    if on is None:
        return "off"
    first = decided.index(on) == 0
    return "on" if first else f"on at epoch {on['epoch'] + 1}, step {on['step'] + 1}"


def state_dirs(here: Path, name: str) -> dict[str, str]:
    """The environment of a cache state `name` of a round: inductor's cache and the kept compile measurements."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(here / name / "inductor"),
        "PTRUN_COMPILE_COSTS_DIR": str(here / name / "kept"),
    }


def round_of(workload: str, out: Path, r: int, overrides: list[str], reuse: bool) -> list[dict]:
    """Round `r` of a workload: the cold runs, then the warm ones (see the module's docstring)."""
    here = out / workload / f"round{r}"
    if not reuse:
        for name in ("shared", "auto_cold"):
            shutil.rmtree(here / name, ignore_errors=True)
    # (state, setting) -> the cache state it runs on: `true` and `false` share theirs, cold `auto` starts anew
    where = {("cold", "auto"): "auto_cold"}
    rows = []
    for state in STATES:
        for setting in SETTINGS:
            run_dir = here / f"{state}_{setting}"
            env = state_dirs(here, where.get((state, setting), "shared"))
            row = run(run_dir, [*WORKLOADS[workload], f"train.compile={setting}", *overrides], env, reuse)
            rows.append({"label": f"{state}, {setting}", "state": state, "setting": setting, **row})
            if setting == "auto":
                rows[-1]["chose"] = chose(run_dir)
    return against_best(rows)


def against_best(rows: list[dict]) -> list[dict]:
    """A round's rows, `auto`'s with its wall time over the better of `false` and `true` on its cache state."""
    for state in STATES:
        best = min(row["wall_s"] for row in rows if row["state"] == state and row["setting"] != "auto")
        auto = next(row for row in rows if row["state"] == state and row["setting"] == "auto")
        auto["auto_vs_best"] = auto["wall_s"] / best
    return rows


def caption(result: dict) -> str:
    repeats = ", ".join(f"{w} {n}" for w, n in result["repeats"].items())
    return (
        f"train.compile=auto against false and true, {result['machine']}: rounds per workload ({repeats}), "
        f"interleaved; medians (min-max over the rounds); auto's wall time over the better of false and true on "
        f"the same cache state (at most {LIMIT:.2f})"
    )


def table(result: dict) -> str:
    lines = []
    for workload, rows in result["workloads"].items():
        n = result["repeats"][workload]
        header = [workload, "wall (s)", "training (s)", "compiling (s)", "final top-1", "auto chose", "auto vs best"]
        lines += markdown_lines(
            header,
            (
                [
                    r["label"],
                    cell(r, "wall_s", ".1f", "", n),
                    cell(r, "train_time_s", ".1f", "", n),
                    cell(r, "compile_s", ".1f", "", n),
                    cell(r, "final_top1", ".2f", "", n),
                    ", ".join(sorted({run.get("chose", "") for run in r["runs"]})) or "-",
                    cell(r, "auto_vs_best", ".3f", "x", n) if r["auto_vs_best"] is not None else "-",
                ]
                for r in rows
            ),
        )
        lines.append("")
    return "\n".join(lines).rstrip()


def verdicts(workloads: dict[str, list[dict]]) -> dict[str, bool]:
    """Per workload and cache state: whether auto's median wall time stays within LIMIT of the better one."""
    return {
        f"{w}, {r['state']}": r["auto_vs_best"] <= LIMIT
        for w, rows in workloads.items()
        for r in rows
        if r["auto_vs_best"] is not None
    }


def main(argv: list[str] | None = None) -> None:
    parser = rounds_parser(__doc__, "runs/bench_compile_auto", recipe=None, repeats=2)
    parser.add_argument("--workload", action="append", choices=list(WORKLOADS), help="repeatable; default: both")
    args, overrides = parser.parse_known_args(argv)
    out = Path(args.out)
    workloads = args.workload or list(WORKLOADS)
    rounds: dict[str, list[list[dict]]] = {w: [] for w in workloads}
    for r in range(args.repeats):
        for w in workloads:
            rounds[w].append(round_of(w, out, r, overrides, args.reuse))
    rows = {w: label_rows(rounds[w], KEYS) for w in workloads}
    for w in workloads:  # the states of each row, for the verdicts
        for row in rows[w]:
            row["state"] = row["runs"][0]["state"]
    result = {
        "command": command_line(),
        "date": date.today().isoformat(),
        "machine": machine_description(),
        "overrides": overrides,
        "repeats": {w: args.repeats for w in workloads},
        "workloads": rows,
        "within_limit": verdicts(rows),
    }
    out.mkdir(parents=True, exist_ok=True)
    publish(result, out / "bench_compile_auto.json", caption, table)
    print(json.dumps(result["within_limit"]))


if __name__ == "__main__":
    main()
