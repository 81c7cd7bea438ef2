"""Does continuing an adapter end where a longer run ends? For each seed, a LoRA recipe's run of E epochs, a run
of E - 1 epochs, and that run's exported adapter continued for one more epoch (`adapter.pretrained=RUN/model`,
`train.epochs=1`): the continued run's final top-1 against the E-epoch run's.

    python -m benchmarks.lora_continue [--recipe bbc_news_lora] [--seeds 0 1 2] [--runs DIR] [--reuse]
        [--out FILE.json]

The continued run starts as an adapter starts in peft (`PeftModel.from_pretrained(..., is_trainable=True)`): the
adapter's values and its head, a fresh optimizer and the recipe's schedule over its one epoch, since an adapter
holds no optimizer state. The runs go one after another, each using the whole machine.
"""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path
from statistics import mean

from benchmarks.harness import command_line, final_top1, machine_description, markdown_lines, publish, train


def seed_row(recipe: str, epochs: int, seed: int, runs: Path, reuse: bool) -> dict:
    """The three runs of one seed, and their final top-1."""
    base = [f"recipe={recipe}", f"train.seed={seed}"]
    where = runs / f"s{seed}"
    longer = train(where / "longer", base, reuse)
    shorter = train(where / "shorter", [*base, f"train.epochs={epochs - 1}"], reuse)
    continued = train(where / "continued", [*base, "train.epochs=1", f"adapter.pretrained={shorter / 'model'}"], reuse)
    tops = {"longer": final_top1(longer), "shorter": final_top1(shorter), "continued": final_top1(continued)}
    return {"seed": seed, **tops, "difference": tops["continued"] - tops["longer"]}


def caption(result: dict) -> str:
    e = result["epochs"]
    return (
        f"{result['recipe']}: {e} epochs against {e - 1} epochs continued for 1 from their exported adapter, "
        f"final top-1 per seed; continued minus {e} epochs: mean {mean(r['difference'] for r in result['rows']):+.2f}"
    )


def table(result: dict) -> str:
    e = result["epochs"]
    header = ("seed", f"{e} epochs", f"{e - 1} epochs", f"{e - 1} + 1 continued", "continued - longer")
    rows = [
        (
            str(r["seed"]),
            f"{r['longer']:.2f}%",
            f"{r['shorter']:.2f}%",
            f"{r['continued']:.2f}%",
            f"{r['difference']:+.2f}",
        )
        for r in result["rows"]
    ]
    mean_row = ("mean", *(f"{mean(r[k] for r in result['rows']):.2f}%" for k in ("longer", "shorter", "continued")))
    mean_row += (f"{mean(r['difference'] for r in result['rows']):+.2f}",)
    return "\n".join(markdown_lines(header, [*rows, mean_row]))


def main() -> int:
    from ptrun.compose import compose

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="bbc_news_lora", help="a recipe with adapter=lora")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", type=Path, default=Path("runs/lora_continue"), help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="read back runs already in --runs")
    parser.add_argument("--out", type=Path, default=Path("lora_continue.json"))
    args = parser.parse_args()
    epochs = compose([f"recipe={args.recipe}"]).train.epochs
    rows = [seed_row(args.recipe, epochs, s, args.runs.resolve(), args.reuse) for s in args.seeds]
    result = {
        "command": command_line(),
        "date": str(date.today()),
        "machine": machine_description(),
        "recipe": args.recipe,
        "epochs": epochs,
        "rows": rows,
    }
    publish(result, args.out, caption, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
