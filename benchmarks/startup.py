"""Start-up: seconds from spawning a training command to its first training step, ptrun against the plain loop
a user writes without it, and ptrun with the tokenized-data cache cold and warm.

In interleaved rounds (a slow spell of the shared machine hits every run alike), on one recipe:
  plain loop         `python -m benchmarks.plain_loop` (one process using every core), tokenizing its data
                     as a loop without ptrun does on every run (an empty tokenized-data cache of its own)
  ptrun, cold cache  `ptrun train recipe=NAME` with an empty tokenized-data cache (`$PTRUN_TOKENIZED_DIR`, a
                     fresh directory each round): the first run on a data file
  ptrun, warm cache  the same command again, on the cache the cold run filled: every later run on that file
Text of `data.name=hf` and the packaged corpora (`bbc_news_bert`) go through that cache; a recipe whose data
does not (the images) has one ptrun run, "ptrun". Every run trains `--steps` steps of one
epoch (`train.epochs=1 train.max_steps_per_epoch=N` after the recipe's keys, for every run alike), then
evaluates, saves and exits as usual.

Per run, in seconds from the moment the benchmark spawns the command (what a user waits for): to the first
training step (the process's own clock just before the first step's forward pass: the first epoch event's
`first_step_time` of a ptrun run, the plain loop's JSON), to the end of that step (its update done), to
ptrun's `start` event (the workers hold their data, model and first layout), and to the exit (the wall
time). Over the rounds: medians and min-max ranges, and each ptrun run's time to its first step over the
plain loop's in the same round.

The default recipe, text_classification, fine-tunes the packaged MiniLM on the news sample that
`ptrun.data.sample_files` writes into --out: `--per-class` articles per topic, 20 by default (the recipe's own
try-out: 100 articles, too few for tokenizing to cost much); `--per-class 400` takes the whole corpus (1,916
articles). A `data.path=` override replaces the sample. Before the rounds, one untimed run of the plain loop
fills the `datasets` library's cache of the data file (which every run then shares) and reads the libraries
and the model from disk, so the first timed run does not pay for that alone.

    python -m benchmarks.startup [--recipe text_classification | --recipe bbc_news_bert] [--repeats 3]
        [--steps 3] [--per-class 20] [--out DIR] [--reuse] [overrides ...]

Writes `bench_startup_<recipe>.json` into --out (`benchmarks/results_page.py` makes the results page's table from it).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

from benchmarks.harness import (
    command_line,
    dir_name,
    fresh_run_dir,
    label_rows,
    machine_description,
    publish,
    rounds_caption,
    rounds_parser,
    rows_table,
    run_to_end,
)
from benchmarks.peer_runs import command as peer_command
from benchmarks.peer_runs import shown

PLAIN, COLD, WARM, PTRUN = "plain loop", "ptrun, cold cache", "ptrun, warm cache", "ptrun"
TOKENIZED_DIR = "PTRUN_TOKENIZED_DIR"
"""The environment variable naming the tokenized-data cache (`ptrun.data.hf_tokens`)."""
SAMPLES = {"text_classification": "news.csv"}
"""Recipe -> the file of `ptrun.data.sample_files` it trains on where no `data.path=` override is given."""
KEYS = ("first_step_s", "first_step_end_s", "over_plain_s", "start_event_s", "wall_s")
COLUMNS = [
    ("first step (s)", "first_step_s", ".1f", ""),
    ("first step done (s)", "first_step_end_s", ".1f", ""),
    ("first step, over the plain loop (s)", "over_plain_s", ".1f", ""),
    ("ptrun's start event (s)", "start_event_s", ".1f", ""),
    ("wall (s)", "wall_s", ".1f", ""),
]
"""The table's columns: (header, key, format spec, suffix), as `rows_table` takes them."""


def uses_token_cache(recipe: str, overrides: list[str]) -> bool:
    """Whether the recipe's data is tokenized through ptrun's tokenized-data cache: `data.name=hf` text and the
    packaged corpora."""
    from benchmarks.plain_loop import recipe_config
    from ptrun.data.packaged_text import PACKAGED_TEXT

    data = recipe_config(recipe, overrides).data
    return (data.name == "hf" and data.image_column is None) or data.name in PACKAGED_TEXT


def labels(cached: bool) -> list[str]:
    return [PLAIN, COLD, WARM] if cached else [PLAIN, PTRUN]


def sample_data(recipe: str, overrides: list[str], out: Path, per_class: int) -> list[str]:
    """The `data.path=` override of the recipe's sample file, written into `out/samples` (none where the
    recipe has no sample or the overrides name a data path)."""
    if recipe not in SAMPLES or any(o.startswith("data.path=") for o in overrides):
        return []
    from ptrun.data.sample_files import write_news_csv

    return [f"data.path={write_news_csv(out / 'samples', per_class=per_class)}"]


def command(label: str, recipe: str, run_dir: Path, overrides: list[str]) -> list[str]:
    """The plain loop as the peer benchmark runs it, or `ptrun train recipe=NAME overrides`."""
    return peer_command(label, recipe, run_dir, overrides, variants={label: []})


def execute(cmd: list[str], run_dir: Path, tokenized: Path, empty_cache: bool, reuse: bool) -> dict:
    """Run `cmd` with its tokenized-data cache in `tokenized` (emptied first if `empty_cache`), or with `reuse`
    read the run already in `run_dir`: when it was spawned (Unix time) and its wall time."""
    spawned = run_dir / "spawn.json"
    if fresh_run_dir(spawned, reuse):
        if empty_cache:
            shutil.rmtree(tokenized, ignore_errors=True)
        print(f"$ {TOKENIZED_DIR}={tokenized} {shown(cmd)}", flush=True)
        env = {**os.environ, TOKENIZED_DIR: str(tokenized)}
        spawn, t0 = time.time(), time.perf_counter()
        run_to_end(cmd, env)
        spawned.write_text(json.dumps({"spawn_time": spawn, "wall_s": time.perf_counter() - t0}))
    return json.loads(spawned.read_text())


def ptrun_marks(events: list[dict]) -> dict:
    """A ptrun run's start-up marks from its events (Unix times): the `start` event's time, and the first step's
    begin and end from the first epoch event that has them."""
    start = next(e for e in events if e["event"] == "start")
    first = next(e for e in events if e["event"] == "epoch" and "first_step_time" in e)
    return {
        "start_time": start["time"],
        "first_step_time": first["first_step_time"],
        "first_step_end_time": first["first_step_end_time"],
    }


def plain_marks(result: dict) -> dict:
    """The plain loop's marks from its JSON (it writes no start event)."""
    return {
        "start_time": None,
        "first_step_time": result["first_step_time"],
        "first_step_end_time": result["first_step_end_time"],
    }


def marks_of(label: str, run_dir: Path) -> dict:
    if label == PLAIN:
        return plain_marks(json.loads((run_dir / "plain.json").read_text()))
    from ptrun.report.runs import read_events

    return ptrun_marks(read_events(run_dir))


def since(spawn: float, marks: dict) -> dict:
    """Seconds from the spawn to each mark (None for a mark the run does not have)."""
    return {
        "first_step_s": marks["first_step_time"] - spawn,
        "first_step_end_s": marks["first_step_end_time"] - spawn,
        "start_event_s": None if marks["start_time"] is None else marks["start_time"] - spawn,
    }


def measure(runs: list[dict]) -> list[dict]:
    """One round's rows: each run's seconds to its first step over the plain loop's of the round (None for the
    plain loop itself, or without one)."""
    plain = next((r["first_step_s"] for r in runs if r["label"] == PLAIN), None)
    return [
        dict(r, over_plain_s=None if r["label"] == PLAIN or plain is None else r["first_step_s"] - plain) for r in runs
    ]


def run_round(recipe: str, round_dir: Path, runs: list[str], overrides: list[str], reuse: bool) -> list[dict]:
    """Every run of one round, in order: the plain loop with a cache of its own, emptied; the cold ptrun run
    with the round's cache emptied; the warm one on what the cold one left there."""
    rows = []
    for label in runs:
        run_dir = round_dir / dir_name(label)
        tokenized = round_dir / ("tokenized_plain" if label == PLAIN else "tokenized")
        timing = execute(
            command(label, recipe, run_dir, overrides), run_dir, tokenized, empty_cache=label != WARM, reuse=reuse
        )
        rows.append(
            {
                "label": label,
                "wall_s": timing["wall_s"],
                **since(timing["spawn_time"], marks_of(label, run_dir)),
                "run_dir": str(run_dir),
            }
        )
    return measure(rows)


def warm_up(recipe: str, out: Path, overrides: list[str]) -> None:
    """One untimed run of the plain loop: the `datasets` cache of the data file filled, the libraries and the
    model read from disk once."""
    run_dir = out / "warm-up"
    execute(command(PLAIN, recipe, run_dir, overrides), run_dir, run_dir / "tokenized", empty_cache=True, reuse=False)


def caption(result: dict) -> str:
    cache = (
        "the tokenized-data cache emptied before the plain loop and the cold run of each round"
        if result["tokenized_cache"]
        else "its data is tokenized in memory on every run (no tokenized-data cache)"
    )
    return (
        rounds_caption(result) + f"; seconds from spawning each command; {result['steps']} training step(s) "
        f"of 1 epoch per run; {cache}"
    )


def table(result: dict) -> str:
    """The Markdown table of a `bench_startup_<recipe>.json`."""
    return "\n".join(rows_table(result["rows"], COLUMNS, result["repeats"]))


def main() -> None:
    parser = rounds_parser(__doc__, "runs/bench_startup", recipe="text_classification", repeats=3)
    parser.add_argument(
        "--steps", type=int, default=3, help="training steps per run (train.max_steps_per_epoch of one epoch)"
    )
    parser.add_argument(
        "--per-class",
        type=int,
        default=20,
        help="articles per topic in the sample file of text_classification (400: the whole corpus)",
    )
    args, extra = parser.parse_known_args()
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats: integers >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = args.recipe
    overrides = ["train.epochs=1", f"train.max_steps_per_epoch={args.steps}", *extra]
    overrides = [*sample_data(recipe, extra, out, args.per_class), *overrides]
    cached = uses_token_cache(recipe, overrides)
    runs = labels(cached)
    if not args.reuse:
        warm_up(recipe, out / recipe, overrides)
    rounds = [run_round(recipe, out / recipe / f"round{r}", runs, overrides, args.reuse) for r in range(args.repeats)]
    result = {
        "command": command_line(),
        "date": datetime.now().isoformat(timespec="seconds"),
        "machine": machine_description(),
        "recipe": recipe,
        "overrides": overrides,
        "repeats": args.repeats,
        "steps": args.steps,
        "tokenized_cache": cached,
        "commands": {label: shown(command(label, recipe, Path("RUN_DIR"), overrides)) for label in runs},
        "rows": label_rows(rounds, KEYS),
    }
    if recipe in SAMPLES and not any(o.startswith("data.path=") for o in extra):
        result["per_class"] = args.per_class
    publish(result, out / f"bench_startup_{recipe}.json", caption, table)


if __name__ == "__main__":
    main()
