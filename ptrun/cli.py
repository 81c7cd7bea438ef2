"""`ptrun SUBCOMMAND [args]`: the console script's entry (`main`) and the dispatch to the subcommands, each in
a module of its own: `train` (`ptrun.cli_train`: Hydra overrides follow), `recipes` (here), `report`
(`ptrun.cli_report`) and `plan` (`ptrun.cli_plan`). What they share, the usage text, the one-line error (exit
code 2 for bad input: docs/errors.md lists the cases) and option parsing, is `ptrun.cli_args`.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from ptrun.cli_args import USAGE, fail
from ptrun.cli_plan import run_plan
from ptrun.cli_report import run_report
from ptrun.cli_train import run_train
from ptrun.compose import RECIPE_DIR
from ptrun.signal_scope import handlers_restored
from ptrun.train.run_end import ExitCode


def recipe_summaries() -> dict[str, str]:
    """Recipe name -> its first descriptive comment line."""
    out = {}
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        lines = [
            line[1:].strip()
            for line in path.read_text().splitlines()
            if line.startswith("#") and "@package" not in line
        ]
        out[path.stem] = lines[0] if lines else ""
    return out


def main(argv: list[str] | None = None) -> None:
    """The console script's entry (`argv` None: the command line's); a caller in a process that goes on passes
    `argv`."""
    try:
        _main(argv)
    except BrokenPipeError:
        # The reader left early (`ptrun recipes | head -3`): stop quietly, as Unix tools do. stdout goes to
        # /dev/null so that the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(ExitCode.SIGPIPE) from None
    finally:
        if argv is None:
            # The process ends next: its last garbage collections would walk every object torch and elastic
            # made (0.5 s after a run on 2 CPU cores); frozen, they are skipped. Exit handlers still run.
            gc.freeze()


def _main(argv: list[str] | None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = argv[0], argv[1:]
    if command == "train":
        from ptrun.launcher.worker_server import stop_worker_server, user_cache_dir  # inner import: start-up

        # before anything imports torch._dynamo, which makes its cache directory (see worker_environment)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_cache_dir() / "torchinductor"))
        # The SIGTERM handler found is back when the command ends (a caller of `main` in a process that goes on).
        with handlers_restored([signal.SIGTERM]):
            # SIGTERM before the workers run (composing, waiting for other machines): exit as after a stop, with
            # the private files cleaned up (elastic's own handler takes over while the workers run).
            signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(ExitCode.SIGTERM))
            try:
                run_train(rest)
            except KeyboardInterrupt:
                fail("interrupted", code=ExitCode.SIGINT)
            finally:
                # However the command ends (done, refused, interrupted), the workers' server ends with it, at
                # once: it holds this process's stdout and stderr, and ending on its own it would first tear down
                # the libraries it imported (1.5 s on 2 CPU cores), or finish importing them after a refused start.
                stop_worker_server()
    elif command == "recipes":
        for name, summary in recipe_summaries().items():
            print(f"{name:<22} {summary}")
    elif command == "report":
        run_report(rest)
    elif command == "plan":
        run_plan(rest)
    else:
        fail(f"unknown subcommand '{command}' (allowed: train, recipes, report, plan)")


if __name__ == "__main__":
    main()
