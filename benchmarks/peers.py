"""ptrun against the plain PyTorch a competent user writes without it, side by side in one invocation.

Per recipe, in interleaved rounds (a slow spell of the shared machine hits every run alike), five runs with
the same config, data split, seed and global batch:
  a  plain loop                      `benchmarks.plain_loop`, 1 process with every core as threads
  b  plain DDP                       the same module under torchrun, 2 processes x 1 thread, DDP over gloo
  c  ptrun, freezing off, 1 worker   `ptrun train` without freezing or AutoCache, K = 1 on 1 worker x 2 threads
  d  ptrun, freezing off, 2 workers  the same on 2 workers (K = 1, DP = 2)
  e  ptrun default                   `ptrun train recipe=NAME`, as the recipe is
and with `--trainer` one more peer, `HF Trainer` (`benchmarks.hf_trainer`: transformers' Trainer, one process
with both threads). A recipe with adapters (`adapter=lora`, e.g. `bbc_news_lora`) makes the plain peers the plain
peft loop (the library model wrapped by peft's `get_peft_model`) and the Trainer the Trainer + peft.
Per run: wall time from process start to exit, training time (the epochs' training loops only), start-up
overhead (wall - training: imports, data and model set-up, evaluation, checkpoints, shut-down), samples/s
in training, final top-1, and the training time to the best plain peer's final top-1 (cumulative over the
epochs, to the first epoch that reaches it). A causal-LM recipe (`model.task=causal_lm`) is compared on the
eval perplexity instead, where lower is better: the target is the plain peers' lowest final perplexity.
Over the rounds: medians and min-max ranges, speedups against the faster plain peer of each round (by wall
and by training time), and the throughput of ptrun without freezing against the plain peer on the same
processes (the "at least 0.95x" checks). Prints the tables and writes them with the command line to
`bench_peers_<recipe>.json` in --out (`benchmarks/results_page.py` makes the README's tables from it).

    python -m benchmarks.peers [--recipe digits_vit] [--recipe bbc_news_bert] [--repeats 3] [--seeds] [--out DIR]
        [--reuse] [--only 'plain loop' --only 'ptrun default' | --only a,e] [--variant 'LABEL: KEY=V ...']
        [--compiled] [--trainer] [overrides ...]

The causal-LM recipe needs a decoder and a text file; without a model hub, `benchmarks.tiny_decoder` writes a small
random-weight Llama and BBC News text (its docstring has the sizes):

    python -m benchmarks.tiny_decoder /tmp/lm
    python -m benchmarks.peers --recipe causal_lm \\
        --only a,c model.pretrained=/tmp/lm/llama data.path=/tmp/lm/news.jsonl

Overrides (`train.epochs=2`) apply to every run, the plain peers' included. With `--seeds`, round r runs every
run with `train.seed=r` (the split, the initial weights and the batch order all follow it), so the rounds are
seeds, and the table adds each run's mean final top-1 over them. Each `--variant 'LABEL: KEY=V ...'` adds a
ptrun run with those overrides after the recipe's (a seeded sweep of a recipe's keys against the same peers:
`--only a,e --seeds --repeats 5 --variant 'start 12: freeze.start=12'`). Each `--engine 'LABEL: PYTHON [KEY=V ...]'`
adds a ptrun run of the recipe (with those overrides) made by another interpreter, such as another checkout's
venv: the engine before and after a change, side by side (`--only e --engine 'before: ../base/.venv/bin/python'`).
With `--compiled`, every chosen run is made three times, like against like: `LABEL, eager` with
`train.compile=false`, and with `train.compile=true` (ptrun compiles its units; the plain loop compiles the library
model with `torch.compile`, as a user writes it) `LABEL, compiled, cold cache` on an empty inductor cache of its
own (every graph built, as a first run) and `LABEL, compiled, warm cache` on the cache that run filled (every later
run), so each side gets the same chance; the throughput checks pair eager with eager, cold with cold and warm
with warm.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import command_line, dir_name, publish, rounds_parser
from benchmarks.peer_runs import LABELS, PTRUN, TRAINER, commands, engine, execute, metric_of, pick, twins, variant
from benchmarks.peer_summary import aggregate, caption, measure, table


def main() -> None:
    parser = rounds_parser(__doc__, "runs/bench_peers", recipe=None)
    parser.add_argument(
        "--recipe",
        action="append",
        help="bbc_news_bert (the embedded default, default), "
        "digits_vit, or causal_lm (with model.pretrained and data.path: `python -m "
        "benchmarks.tiny_decoder DIR` writes both); repeatable",
    )
    parser.add_argument(
        "--seeds",
        action="store_true",
        help="round r runs with train.seed=r: the rounds are seeds (the table adds the mean final top-1 or perplexity)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'LABEL: KEY=V ...': one more ptrun run, the recipe with these overrides (repeatable)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        help="'LABEL: PYTHON [KEY=V ...]': one more "
        "ptrun run of the recipe (with these overrides), by another interpreter (another checkout's "
        "venv; repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        help="a run to make (repeatable): its label, or letters "
        "a-e for the runs in order, comma-separated (--only a,b,e); default: all five",
    )
    parser.add_argument(
        "--trainer",
        action="store_true",
        help="also run transformers' Trainer (with peft where the recipe has adapter=lora) as a peer: "
        "`benchmarks.hf_trainer`",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="each run three times: eager (train.compile=false), and compiled (train.compile=true; the plain "
        "loop compiles the library model) on an empty inductor cache and then on the cache it filled",
    )
    args, overrides = parser.parse_known_args()
    try:
        labels = pick(args.only) if args.only else list(LABELS)
        variants = {**PTRUN, **dict(map(variant, args.variant))}
        engines = {label: words for label, words in map(engine, args.engine)}
        pythons = {label: words[0] for label, words in engines.items()}
        variants.update({label: words[1:] for label, words in engines.items()})
    except ValueError as e:
        parser.error(str(e))
    labels += [label for label in variants if label not in LABELS] + ([TRAINER] if args.trainer else [])
    labels = twins(labels) if args.compiled else labels
    out = Path(args.out)
    for recipe in args.recipe or ["bbc_news_bert"]:
        try:
            metric = metric_of(recipe, overrides)
        except ValueError as e:
            parser.error(str(e))
        rounds = [
            measure(
                [
                    execute(
                        label,
                        recipe,
                        out / recipe / f"round{r}" / dir_name(label),
                        [*overrides, *([f"train.seed={r}"] if args.seeds else [])],
                        args.reuse,
                        variants,
                        metric,
                        pythons,
                    )
                    for label in labels
                ],
                metric,
            )
            for r in range(args.repeats)
        ]
        result = {
            "command": command_line(),
            "recipe": recipe,
            "overrides": overrides,
            "repeats": args.repeats,
            "seeds": args.seeds,
            "commands": commands(labels, recipe, overrides, variants, pythons),
            **aggregate(rounds, metric),
        }
        publish(result, out / f"bench_peers_{recipe}.json", caption, table)


if __name__ == "__main__":
    main()
