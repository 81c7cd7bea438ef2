"""`train.*`, `optim.*` and `checkpoint.*`: the loop, the optimizer and its schedule, and checkpoints."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field

from ptrun.config.rules import check_choices, choice, require


@dataclass(frozen=True)
class Precision:
    """What ptrun knows of one `train.precision`, in one place: the stages' autocast (`ptrun.numerics.precision`),
    the loss scale (the trainer's), PipeDream's rule (`ptrun.config.cross`) and the planner's byte counts read it."""

    autocast: str | None
    """The dtype stages compute in under torch.autocast (a torch dtype's name); None: plain float32."""
    bytes: int
    """Bytes of one activation element in that dtype."""
    loss_scale: bool = False
    """Whether the loss is scaled before backward (fp16's range underflows small gradients), so every stage
    must step or skip a step together."""


PRECISION_SPECS: dict[str, Precision] = {
    "fp32": Precision(autocast=None, bytes=4),
    "bf16": Precision(autocast="bfloat16", bytes=2),
    "fp16": Precision(autocast="float16", bytes=2, loss_scale=True),
}
"""Every `train.precision`, by name, with its properties."""
PRECISIONS = tuple(PRECISION_SPECS)
"""`train.precision`."""


@dataclass(frozen=True)
class Optimizer:
    """What ptrun knows of one `optim.name`: the torch class (`ptrun.numerics.optim.build_optimizer`), the
    keywords it takes from the config besides the learning rate, and the state it keeps per parameter element
    (`ptrun.layout.fit`'s memory estimate)."""

    torch_class: str
    """Its class in torch.optim."""
    options: Callable[[OptimConfig], dict]
    """Its keywords from `optim.*` (the learning rate and weight decay are set per group)."""
    state_copies: int
    """float32 tensors of optimizer state per parameter element."""


OPTIMIZER_SPECS: dict[str, Optimizer] = {
    "adamw": Optimizer("AdamW", lambda o: {"betas": tuple(o.betas), "eps": o.eps}, state_copies=2),
    "sgd": Optimizer("SGD", lambda o: {"momentum": o.momentum}, state_copies=1),
}
"""Every `optim.name`, by name: AdamW keeps two moments (`exp_avg`, `exp_avg_sq`), SGD a momentum buffer."""
OPTIMIZERS = tuple(OPTIMIZER_SPECS)
"""`optim.name`."""

LR_SCHEDULE_SPECS: dict[str, Callable[[float], float]] = {
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
    "linear": lambda progress: max(0.0, 1.0 - progress),
    "constant": lambda progress: 1.0,
}
"""Every `optim.schedule`, by name: the peak learning rate's multiplier after the warm-up, at `progress` (0 to 1)
through the steps after it."""
LR_SCHEDULES = tuple(LR_SCHEDULE_SPECS)
"""`optim.schedule`."""
COMPILE = ("auto", True, False)
"""`train.compile`."""
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""`train.compile_mode`: torch.compile's modes."""
COMPILERS = ("CXX", "CC", "g++", "c++", "clang++", "gcc", "cc", "clang")
"""Where inductor finds a C/C++ compiler: the environment's `CXX` / `CC`, else one of these on the PATH."""


@dataclass
class TrainConfig:
    epochs: int = 10
    """Number of passes over the training set."""
    global_batch_size: int | None = 32
    """Samples per optimizer step over all data-parallel replicas (the batch the loss is averaged over); null
    when `pipeline_batch_size` gives the batch instead."""
    pipeline_batch_size: int | None = None
    """The batch of one pipeline replica at the start, the paper's way of stating a batch (ViT: 320 samples a
    pipeline on CIFAR): the global batch is this times the starting data-parallel width, filled in once the
    layout is known (on one machine at the start, else in the workers), so every machine size and pipeline
    length trains with the same per-pipeline batch. Set with `global_batch_size=null`; null (the default):
    `global_batch_size` gives the batch."""
    seed: int = 0
    """Seed for model initialisation and the per-epoch data order."""
    grad_clip: float = 0.0
    """Clip gradients to this global L2 norm over all parameters of all stages and replicas; 0 = off."""
    max_steps_per_epoch: int | None = None
    """Stop each epoch after this many optimizer steps (quick tests); None = the whole epoch."""
    eval_every_epochs: int = 1
    """Evaluate on the held-out split every this many epochs (and always after the last)."""
    resume: bool = False
    """Continue the run in `hydra.run.dir` from its newest valid checkpoint (automatic after an elastic restart)."""
    log_every_steps: int = 10
    """Progress-bar and log refresh interval, in optimizer steps."""
    timeline_step: int | None = None
    """Record when each stage runs each micro-batch's forward and backward in this (0-based) step of the
    first epoch, into RUN_DIR/timeline.json; `ptrun report` draws it as a Gantt chart. None = off."""
    profile_step: int | None = None
    """Profile `PROFILE_STEPS` (3) steps from this (0-based) step of the run on with torch.profiler: every
    operator and, on a GPU, every kernel, per rank into RUN_DIR/profile/rankR.json (a Chrome trace:
    https://ui.perfetto.dev) and rankR.txt (the operators by self time, after a line that counts the host's
    reads of tensor values: on a GPU, each a wait for the device). A step after a freeze shows what training
    costs with it. None = off."""
    precision: str = choice("fp32", PRECISIONS)
    """Compute precision: `fp32`, `bf16` (autocast to bfloat16) or `fp16` (autocast to float16 with a dynamic
    loss scale; a step whose gradients overflow on any stage is skipped on every rank). Weights, gradients and
    optimizer state stay float32; activations cross stage boundaries in the compute dtype."""
    compile: bool | str = choice("auto", COMPILE, wording=lambda _: "auto, true or false")
    """Compile each unit on its own with torch.compile (regional compilation: identical units, a model's
    blocks, share one compiled graph, so a 12-layer model compiles each kind of unit once): `true`, `false`, or
    `auto` (on where the seconds it saves over the steps left are 1.5 times what its graphs cost, cold or in
    inductor's cache, priced on this machine's measured step and compile times; one line says the decision and
    its figures: docs/guide.md).
    Frozen units run their own no-grad variant; a unit whose compilation fails runs eager, with one line. Not
    with the schedules that split a stage's backward pass (ZBVZeroBubble, DualPipeV, InterleavedZeroBubble).
    Compiled graphs are kept in inductor's cache ($TORCHINDUCTOR_CACHE_DIR, by default
    ~/.cache/ptrun/torchinductor), so a second run of the same model starts warm. Needs a C++ compiler."""
    compile_mode: str = choice("default", COMPILE_MODES)
    """torch.compile's mode with `compile` on: `default` (inductor's kernels), `reduce-overhead` (adds CUDA
    graphs: less launch overhead, static shapes; GPU only), `max-autotune` (slow to compile, tunes matmuls),
    `max-autotune-no-cudagraphs`."""
    export: bool = True
    """At the end, save the trained model in its library's own format into RUN_DIR/model (timm: weights +
    `create_model` arguments; BERT: `save_pretrained` with the tokenizer), usable without ptrun."""


@dataclass
class OptimConfig:
    name: str = choice("adamw", OPTIMIZERS)
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
    schedule: str = choice("cosine", LR_SCHEDULES)
    """Learning-rate schedule after warm-up: `cosine` (to zero), `linear` (to zero) or `constant`."""
    warmup_fraction: float = 0.1
    """Fraction of all optimizer steps spent in linear warm-up from zero."""


@dataclass
class CheckpointConfig:
    every_epochs: int = 1
    """Write a checkpoint every this many epochs (and after the last); 0 = never."""
    every_steps: int = 0
    """Also write a checkpoint every this many optimizer steps within an epoch, so a failure loses at most that
    many steps (a restart resumes at the exact step, with the epoch's sample order and sums); 0 = off."""
    keep: int = 2
    """Checkpoints kept in the run directory; older ones are deleted after a newer one is complete."""


PROFILE_STEPS = 3
"""Steps `train.profile_step` covers: enough to see a step's pattern repeat, few enough to keep traces small."""


def check_training(cfg) -> None:
    t, o, ck = cfg.train, cfg.optim, cfg.checkpoint
    check_choices(t, "train")
    require(t.epochs >= 1, "train.epochs", "an integer >= 1", t.epochs)
    if t.pipeline_batch_size is None:
        require(
            t.global_batch_size is not None and t.global_batch_size >= 1,
            "train.global_batch_size",
            "an integer >= 1 (or null with train.pipeline_batch_size set)",
            t.global_batch_size,
        )
    else:
        require(
            t.pipeline_batch_size >= 1, "train.pipeline_batch_size", "an integer >= 1 or null", t.pipeline_batch_size
        )
        require(
            t.global_batch_size is None,
            "train.global_batch_size",
            f"null while train.pipeline_batch_size={t.pipeline_batch_size} gives the batch (the global batch "
            f"is that times the data-parallel width); to give the global batch, add "
            f"train.pipeline_batch_size=null",
            t.global_batch_size,
        )
    require(t.grad_clip >= 0, "train.grad_clip", "a norm >= 0 (0 = off)", t.grad_clip)
    require(t.eval_every_epochs >= 1, "train.eval_every_epochs", "an integer >= 1", t.eval_every_epochs)
    require(t.log_every_steps >= 1, "train.log_every_steps", "an integer >= 1", t.log_every_steps)
    require(t.profile_step is None or t.profile_step >= 0, "train.profile_step", "a step >= 0 or null", t.profile_step)
    require(
        t.max_steps_per_epoch is None or t.max_steps_per_epoch >= 1,
        "train.max_steps_per_epoch",
        "an integer >= 1 or null",
        t.max_steps_per_epoch,
    )
    check_choices(o, "optim")
    require(o.lr > 0, "optim.lr", "a learning rate > 0", o.lr)
    require(o.weight_decay >= 0, "optim.weight_decay", "a value >= 0", o.weight_decay)
    require(0.0 <= o.warmup_fraction < 1.0, "optim.warmup_fraction", "0 <= f < 1", o.warmup_fraction)
    require(
        len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), "optim.betas", "two values in [0, 1)", list(o.betas)
    )
    require(ck.every_epochs >= 0, "checkpoint.every_epochs", "an integer >= 0", ck.every_epochs)
    require(ck.keep >= 1, "checkpoint.keep", "an integer >= 1", ck.keep)
    require(ck.every_steps >= 0, "checkpoint.every_steps", "an integer >= 0 (0 = off)", ck.every_steps)


def check_compiler(t: TrainConfig, env: dict | None = None) -> None:
    """`train.compile=true` on the machine that launches: inductor builds its kernels with a C++ compiler
    (on a GPU too: triton's launchers are C), so none found is refused before any worker starts."""
    if t.compile is True:
        require(
            c_compiler(env) is not None,
            "train.compile",
            "true only where inductor can build, and no C "
            "compiler was found ($CXX, $CC, g++, c++, clang++, gcc, cc, clang): install one, or leave it auto",
            "true",
        )


def c_compiler(env: dict | None = None) -> str | None:
    """The C/C++ compiler inductor would build with (`COMPILERS`), or None where there is none."""
    env = os.environ if env is None else env
    for name in COMPILERS:
        command = env.get(name) if name.isupper() else name
        found = command and shutil.which(command.split()[0], path=env.get("PATH"))
        if found:
            return found
    return None
