"""`paper.*`: the published numbers a paper recipe reproduces (PipeTransformer, ICML 2021, Table 1 and section 5),
carried in the run's resolved config so that `ptrun report` can put them beside the run's own. Training never
reads them."""

from __future__ import annotations

from dataclasses import dataclass

from ptrun.config.cross import run_inputs
from ptrun.config.rules import require


@dataclass
class PaperConfig:
    setup: str | None = None
    """What the paper ran, in words (model, data, machines): the report's heading for its numbers. Null: the
    recipe reproduces no published run."""
    metric: str | None = None
    """The eval key the paper's metrics are in, as the run logs it (`top1`, `f1`, `accuracy`)."""
    baseline: float | None = None
    """The paper's baseline (GPipe with data parallelism, no freezing) metric, in percent."""
    result: float | None = None
    """PipeTransformer's metric in the paper, in percent."""
    baseline_time: str | None = None
    """The baseline's training time in the paper (`35m06s`)."""
    time: str | None = None
    """PipeTransformer's training time in the paper."""
    speedup: float | None = None
    """PipeTransformer's speedup over the baseline in the paper (training time)."""
    gpus: int | None = None
    """The GPUs the paper's run used (2 machines of 8: 16)."""
    epochs: int | None = None
    """The epochs the paper trained."""


def check_paper(cfg) -> None:
    p = cfg.paper
    require(
        p.setup is not None or (p.metric is None and p.result is None),
        "paper.setup",
        "the words naming the paper's setup whenever its numbers are given",
        p.setup,
    )
    require(p.gpus is None or p.gpus >= 1, "paper.gpus", "an integer >= 1 or null", p.gpus)
    require(p.epochs is None or p.epochs >= 1, "paper.epochs", "an integer >= 1 or null", p.epochs)


def quick_try(cfg, gpus: int) -> str | None:
    """The line `ptrun train` prints where a paper recipe starts at its full size on a machine without GPUs
    (`gpus`: those its workers use): hours or days of work there, so it names the keys that shrink the run to
    a quick try. None elsewhere, and for a run that already caps its epochs' steps."""

    if cfg.paper.setup is None or gpus or cfg.train.max_steps_per_epoch is not None:
        return None
    batch = (
        f"train.pipeline_batch_size={min(16, cfg.train.pipeline_batch_size)}"
        if cfg.train.pipeline_batch_size
        else f"train.global_batch_size={min(16, cfg.train.global_batch_size)}"
    )
    size = "data.image_size=64" if run_inputs(cfg) == "images" else "data.max_length=64"
    return (
        f"ptrun: recipe {cfg.recipe} trains at the paper's size, on this machine's CPU for hours or days; a quick "
        f"try shrinks it: train.epochs=1 train.max_steps_per_epoch=20 {batch} {size}"
    )
