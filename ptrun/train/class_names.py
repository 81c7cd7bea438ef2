"""The run's class names: what each predicted index means. Rank 0 writes them to `RUN_DIR/class_names.json`
once the run has started; every rank must have read the same ones from its data, and a resumed run must
read the ones the run started with (a label added to a csv between the runs would move every index after
it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ptrun.errors import ConfigError

FILE_NAME = "class_names.json"


def write_class_names(names: list[str], run_dir: str | Path) -> None:
    """The data's class names in label order, beside `config.yaml` (atomically); nothing for data without
    classes (a causal LM, a regression)."""
    if names:
        target = Path(run_dir) / FILE_NAME
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(json.dumps(list(names)) + "\n")
        os.replace(tmp, target)


def check_resumed_classes(names: list[str], run_dir: str | Path) -> None:
    """A resume's data must name the classes the run started with (its `class_names.json`, when it wrote
    one), in the same order. ConfigError in one line otherwise."""
    path = Path(run_dir) / FILE_NAME
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # not ours to judge: the run rewrites it once it has started
    if list(names) != saved:
        raise ConfigError(
            f"data: the classes the data names now, {shown(names)}, are not the run's "
            f"({path}: {shown(saved)}); resume with the data the run started on, or start a new "
            f"run in another hydra.run.dir"
        )


def ranks_disagree(names_by_rank: list[list[str]]) -> str | None:
    """Why the ranks' class names (rank order) cannot train one model: None when they are all the same."""
    first = names_by_rank[0]
    other = next((r for r, names in enumerate(names_by_rank) if names != first), None)
    if other is None:
        return None
    return (
        f"data: the workers read different classes (rank 0: {shown(first)}, rank {other}: "
        f"{shown(names_by_rank[other])}); give every machine the same data"
    )


def agree_on_classes(names: list[str]) -> None:
    """Collective: every rank's data names the same classes in the same order, or each raises ConfigError."""
    import torch.distributed as dist  # inner import: start-up (the launcher checks a resume's names)

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(names))
    problem = ranks_disagree(gathered)
    if problem is not None:
        raise ConfigError(problem)


def shown(names: list[str], limit: int = 10) -> str:
    """A list of class names for a one-line message: the first `limit` of them."""
    return str(list(names[:limit]))[:-1] + (f", ... {len(names)} in all]" if len(names) > limit else "]")
