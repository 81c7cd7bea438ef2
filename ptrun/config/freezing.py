"""`freeze.*`, `auto.*` and `cache.*`: when layers freeze, which of PipeTransformer's components run, and the
activation cache."""

from __future__ import annotations

from dataclasses import dataclass, field

from ptrun.config.rules import check_choices, choice, parse_memory, require
from ptrun.config.training import PRECISION_SPECS

FREEZE_POLICIES = ("pipetransformer", "alpha", "autofreeze", "plasticity", "linear", "schedule", "none")
"""`freeze.policy`: the policies' names, declared here once; each policy class registers under one
(`ptrun.freezing.policy.registered`), and the registry must hold them all."""


def freezes(policy: str) -> bool:
    """Whether `freeze.policy=policy` may ever freeze a block (`none` never does)."""
    return policy != "none"


BATCH_POLICIES = ("fixed_global", "fixed_per_pipeline")
"""`auto.batch`. `fixed_global`: the global batch stays, each replica's share shrinks as DP grows (the
optimization is independent of the layout). `fixed_per_pipeline`: each replica keeps its batch, so the global
batch grows with DP (the paper's setting, with no learning-rate change)."""
CACHE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Every dtype `cache.dtype` stores entries in (a torch dtype's name), with the bytes of one element."""
CACHE_DTYPES = ("auto", *CACHE_DTYPE_BYTES)
"""`cache.dtype`: `auto` is `train.precision`'s compute dtype, filled in resolution (`cache_dtype`)."""


def cache_dtype(dtype: str, precision: str) -> str:
    """The dtype a cache of `cache.dtype=dtype` stores in: `auto` is `train.precision`'s compute dtype
    (`Precision.autocast`; float32 without autocast)."""
    if dtype in CACHE_DTYPE_BYTES:
        return dtype
    return PRECISION_SPECS[precision].autocast or "float32"


CACHE_AUGMENT = ("fixed", "off")
"""`cache.augment`."""


@dataclass
class FreezeConfig:
    policy: str = choice("pipetransformer", FREEZE_POLICIES)
    """Which bottom blocks to freeze at the end of each interval (`every`): `pipetransformer` (the paper's rule: the
    smaller of the alpha bound and the active block with the smallest gradient norm over the last epoch), `alpha` (the
    closed form ceil(L(1 - (1 - alpha)^T))), `autofreeze` (relative change of block gradient norms, up to the first
    block at or above their `percentile`), `plasticity` (the longest prefix of blocks whose relative weight change per
    unit of learning rate has fallen below `threshold` times its peak), `linear` (frozen fraction rising linearly after
    `start`), `schedule` (the frozen block count per epoch from `blocks`) or `none`."""
    alpha: float = 1 / 3
    """Freeze rate per epoch: an epoch of decisions freezes at most this fraction of the still-active blocks
    (paper: 1/3). With a shorter interval each decision takes its share, 1 - (1 - alpha)^every, so the
    closed form F = ceil(L(1 - (1 - alpha)^T)) holds with T counting (fractional) epochs."""
    every: float = 1.0
    """Decide at the end of every interval of this many epochs: 1 is the paper (epoch boundaries), 0.25
    decides four times an epoch, inside it (AutoFreeze); the pipeline is repacked, DP widened and the cache
    advanced at that step, in the running job. Fractions need `auto.batch=fixed_global` and a synchronous
    schedule."""
    every_steps: int | None = None
    """Or decide every this many optimizer steps (overrides `every`, which must then stay 1)."""
    max_fraction: float = 1.0
    """At most this fraction of the blocks is ever frozen (the head and final norm always train)."""
    start: int = 0
    """No freezing before the end of this epoch (the first decision ends the first interval after it)."""
    percentile: float = 50.0
    """For `policy=autofreeze`: the percentile (0 < p <= 100, linearly interpolated between the ranks, as
    numpy's default) of the active blocks' relative gradient-norm changes that marks the first block to keep
    training; every block before it freezes. 50 is the median; a higher percentile freezes more at each
    decision (100: up to the block that changed most)."""
    threshold: float = 0.3
    """For `policy=plasticity`: a block has settled once its plasticity (its relative weight change over the
    last interval, per unit of learning rate) falls below this fraction (0 < t < 1) of the largest it has
    shown; the longest prefix of settled active blocks freezes. Higher freezes sooner."""
    blocks: list[int] | None = None
    """For `policy=schedule`: frozen block count at the start of each interval (each epoch with `every=1`),
    e.g. [0, 2, 4, 4] (held after the list ends). Useful to reproduce a run's freeze sequence exactly."""


@dataclass
class AutoConfig:
    freeze: bool = True
    """Progressive freezing (off = the policy never freezes)."""
    pipe: bool = True
    """AutoPipe: repartition the stages after a freeze (frozen units charged at 1/6) and, with `dp`, halve
    the pipeline length while the largest stage stays within the starting one."""
    dp: bool = True
    """AutoDP: turn the workers a shorter pipeline frees into more data-parallel replicas. Off, the pipeline
    length stays (ptrun keeps every worker busy; a shorter pipeline with idle workers is not offered)."""
    microbatch_table: dict[int, int] = field(default_factory=dict)
    """Micro-batches M to use at each pipeline length K after a change, e.g. {2: 2, 1: 1}; lengths not
    listed use the paper's table (16 for K = 8, 4, 2; 4 for K = 1), or with `pipe.microbatches=auto` the
    measured choice (an entry here still wins at its K; the first layout takes the measured M). The closest
    count that divides the per-replica batch and suits the schedule is taken. A free-form mapping: `+` adds an
    entry (`+auto.microbatch_table.4=2`); an entry it holds is set without (`auto.microbatch_table.2=4`)."""
    batch: str = choice("fixed_global", BATCH_POLICIES)
    """Batch policy when DP widens: `fixed_global` (the global batch stays, each replica's share shrinks:
    the optimization does not depend on the layout) or `fixed_per_pipeline` (the paper: each replica keeps
    its batch, so the global batch grows with DP and an epoch has fewer steps)."""
    cache: bool = False
    """AutoCache: once the frozen prefix is at least `cache.min_frozen_units` long, compute its output once
    per sample, keep it in node-shared memory (disk beyond `cache.max_memory`) and start later epochs from
    it, so the frozen units leave the pipeline altogether (see `cache`)."""


@dataclass
class CacheConfig:
    min_frozen_units: int | None = None
    """Cache only once this many units are frozen; None = the units of a quarter of the blocks, rounded up
    (the paper started at 3 of 12 blocks for ViT-B and 5 of 24 for BERT-large). Below it, recomputing a
    short prefix costs less than filling the cache."""
    max_memory: str = "50%"
    """Node-wide memory budget of the cache: a share of the machine's RAM (`50%`) or a size (`8GB`,
    `512MB`). Samples beyond it go to the disk tier under `dir`."""
    dir: str | None = None
    """Disk tier directory; None = `RUN_DIR/cache`. The memory tier lives in /dev/shm."""
    dtype: str = choice("auto", CACHE_DTYPES)
    """Storage dtype of cached activations: `auto` (the compute dtype of `train.precision`: what a stage
    boundary would send), `float32` (exact), `bfloat16` or `float16` (half the memory; the first active unit
    then sees inputs rounded to 8 or 11 significant bits). Masks are stored exactly."""
    augment: str = choice("fixed", CACHE_AUGMENT)
    """With random augmentation on (`data.augment`): `fixed` caches the one augmented view a sample had
    when it was cached (later epochs see that view again), `off` loads training samples without random
    augmentation while the cache is in use. Evaluation never augments."""
    eval: bool = True
    """Serve evaluation from the cache too: eval samples get their own slots after the training samples' (within
    the same `max_memory` budget, training's first), filled at the first evaluation at a depth and advanced when
    it grows, so an evaluation runs only the active units. `false` spends no memory or disk on eval samples and
    runs the frozen prefix on them at every evaluation."""
    keep: bool = False
    """Keep the cache files at the end of the run (a later run of the same model and data revalidates and
    reuses them); by default they are deleted."""


def check_alpha(alpha: float) -> float:
    """`freeze.alpha`, the share of the active blocks frozen at each decision: 0 < alpha < 1. The one rule,
    for the config and for policies built in code (`ptrun.freezing.policies`)."""
    require(0.0 < alpha < 1.0, "freeze.alpha", "0 < alpha < 1", alpha)
    return float(alpha)


def check_percentile(percentile: float) -> float:
    """`freeze.percentile`, AutoFreeze's threshold percentile: 0 < p <= 100."""
    require(0.0 < percentile <= 100.0, "freeze.percentile", "a percentile 0 < p <= 100 (50: the median)", percentile)
    return float(percentile)


def check_threshold(threshold: float) -> float:
    """`freeze.threshold`, the share of a block's peak plasticity below which it has settled: 0 < t < 1."""
    require(0.0 < threshold < 1.0, "freeze.threshold", "a share of the block's peak plasticity, 0 < t < 1", threshold)
    return float(threshold)


def inside_epochs(fr: FreezeConfig) -> bool:
    """Whether decisions may fall inside an epoch (not only at its boundaries)."""
    return fr.every_steps is not None or float(fr.every) != int(fr.every)


def check_freezing(cfg) -> None:
    fr, au, ca, m = cfg.freeze, cfg.auto, cfg.cache, cfg.model
    check_choices(fr, "freeze")
    check_alpha(fr.alpha)
    check_percentile(fr.percentile)
    check_threshold(fr.threshold)
    require(fr.every > 0, "freeze.every", "a number of epochs > 0 (e.g. 1, 0.5, 0.25)", fr.every)
    require(
        fr.every_steps is None or fr.every_steps >= 1, "freeze.every_steps", "an integer >= 1 or null", fr.every_steps
    )
    require(
        fr.every_steps is None or fr.every == 1.0,
        "freeze.every",
        "1 when freeze.every_steps is set (one interval length)",
        fr.every,
    )
    require(0.0 <= fr.max_fraction <= 1.0, "freeze.max_fraction", "0 <= f <= 1", fr.max_fraction)
    require(fr.start >= 0, "freeze.start", "an epoch >= 0", fr.start)
    require(
        (fr.blocks is not None) == (fr.policy == "schedule"),
        "freeze.blocks",
        "a list of frozen block counts per interval exactly when freeze.policy=schedule",
        fr.blocks,
    )
    if fr.blocks is not None:
        blocks = list(fr.blocks)
        require(
            all(b >= 0 for b in blocks)
            and blocks == sorted(blocks)
            and (m.depth is None or blocks[-1:] <= [m.depth])
            and blocks[:1] == [0],
            "freeze.blocks",
            f"non-decreasing counts starting at 0, at most model.depth={m.depth}",
            blocks,
        )
    check_choices(ca, "cache")
    require(
        ca.min_frozen_units is None or ca.min_frozen_units >= 1,
        "cache.min_frozen_units",
        "an integer >= 1 or null",
        ca.min_frozen_units,
    )
    parse_memory(ca.max_memory)
    check_choices(au, "auto")
    if inside_epochs(fr):
        # A fixed_per_pipeline transition changes the global batch, so the epoch's remaining steps would
        # no longer be the windows of the same order that the steps before it used.
        require(
            au.batch == "fixed_global",
            "auto.batch",
            "fixed_global when freezing decides inside epochs (freeze.every not a whole number, or freeze.every_steps)",
            au.batch,
        )
