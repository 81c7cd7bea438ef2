"""What the subcommands share: the usage text, the one-line error that ends a command (`fail`), and a subcommand's
options read in order (`arguments`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from ptrun.train.run_end import ExitCode

USAGE = """usage: ptrun SUBCOMMAND [args]

subcommands:
  train [overrides]   train a recipe, e.g. `ptrun train recipe=digits_vit train.epochs=5`
                      (Hydra: `ptrun train --help`, `--cfg job`, `-m key=a,b` for a sweep)
  recipes             list the recipes, one line each
  report RUN_DIR [RUN_DIR ...] [--out DIR]
                      figures and report.md for runs or sweep dirs (the first run is the baseline;
                      default --out: the first RUN_DIR's report/); a paper recipe's run is shown beside
                      the paper's numbers, and beside a freezing-off run of its recipe when one is given
  plan [recipe=NAME] [cluster=paper|this_machine] [key=value ...] [cluster.FIELD=VALUE ...]
       [--profile FILE] [--samples N]
                      project the recipe's epochs onto a cluster without running them: the plans the
                      controller makes for each Figure-9 combination, estimated epoch times, and the
                      speedups beside the paper's (the cluster sets the world size; see docs/simulator.md)
"""


def fail(message: str, code: int = ExitCode.BAD_INPUT) -> NoReturn:  # noqa: F821
    # one line, whatever the message quotes (a library's multi-line exception text, say)
    print(f"ptrun: error: {' '.join(message.splitlines())}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def arguments(args: list[str], command: str, valued: dict[str, str], allowed: str) -> Iterator[tuple[str | None, str]]:
    """A subcommand's arguments, in order: (OPTION, VALUE) for each option of `valued` (`--OPTION VALUE` or
    `--OPTION=VALUE`; a missing value fails: `OPTION needs ...`, the words `valued` gives), (None, ARG) for
    the others. `-h` / `--help` prints USAGE and ends the command; another `-...` fails, naming `allowed`."""
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(USAGE, end="")
            raise SystemExit(0)
        option = arg.split("=", 1)[0]
        if option in valued:
            yield (
                option,
                arg[len(option) + 1 :]
                if "=" in arg
                else (args.pop(0) if args else fail(f"{option} needs {valued[option]}")),
            )
        elif arg.startswith("-"):
            fail(f"unknown option '{arg}' for {command} (allowed: {allowed})")
        else:
            yield None, arg
