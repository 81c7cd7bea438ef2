"""Compiled units (`train.compile`): each unit compiled on its own with torch.compile, as torchtitan and
torchtune compile each transformer block (regional compilation).

A unit's compiled form lives beside it, never in its place: a stage calls `runner(unit)` where it would call
the unit, and the module tree, the parameter names, the checkpoints and the export never see torch.compile's
wrapper (`_orig_mod.`). Dynamo keys its compiled code on the unit's `forward`, and treats the parameters as
the graph's inputs, so the twelve attention halves of a model share one graph: a model compiles once per kind
of unit (its embedding, attention half, MLP half, head, and the first-token tail's own halves), whatever its
depth.

Variants. Dynamo guards on what a graph was traced with: grad mode, training flags, the inputs' shapes,
dtypes and `requires_grad`. A stage runs its frozen units under `torch.no_grad()` (`StageModule`), so a
frozen unit runs a no-grad graph of its own, the one evaluation runs too, and the trained graph is never
reused after its parameters stop requiring gradients: nothing relies on dynamo noticing a `requires_grad`
flip in place, which some torch releases miss (pytorch/pytorch#139476). A transition adds at most the new variants: the
frozen one, the first trained unit's (its input no longer requires a gradient) and, under AutoCache, a stage
input of the new depth. `warm` compiles them at the transition, on the last step's input, so the steps after
it run compiled code at once and the transition line says what compiling cost.

Costs are counted through dynamo's compile callbacks (`CompileCounts`): seconds compiling, graphs compiled
(forward and backward) and of those how many inductor's on-disk cache served ($TORCHINDUCTOR_CACHE_DIR; ptrun
sets it to ~/.cache/ptrun/torchinductor), and recompiles (a unit kind compiled again for another variant). A
unit kind whose compilation fails, or that reaches dynamo's recompile limit, runs eager from then on, with one
line naming the unit; the run goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

from ptrun.compat import keep_inductor_headers_with_its_cache
from ptrun.compiling import inductor_cache
from ptrun.config import SCHEDULE_SPECS
from ptrun.config.training import c_compiler
from ptrun.models.layered import run_units
from ptrun.numerics.precision import autocast

log = logging.getLogger(__name__)


def ruled_out(device: torch.device, schedule: str = "GPipe") -> str:
    """What keeps `train.compile=auto` eager whatever compiling would save, or "" where it may compile: no C
    compiler for inductor to build with, or a schedule that splits each stage's backward pass
    (`check_compile`). `true` is refused for both before any worker starts."""
    if c_compiler() is None:
        return "no C compiler for inductor"
    if SCHEDULE_SPECS[schedule].split_backward:
        return f"pipe.schedule={schedule} splits the backward pass"
    return ""


def make_compiler(train, layered, device: torch.device, probe: tuple = ()) -> UnitCompiler:
    """The worker's `UnitCompiler` for `train` (a TrainConfig: its `compile_mode` and global batch). `probe`:
    one training sample's model inputs, from which the first layout's first stage compiles at once."""
    if device.type == "cpu":  # inductor's C++ build says, on every worker, that a CPU machine has no CUDA runtime
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    return UnitCompiler(train.compile_mode, layered, tuple(t.to(device) for t in probe), train.global_batch_size)


def unit_shape(layered, u: int) -> tuple:
    """What dynamo compiles a unit for apart from the units of other shapes: its class, its submodules, and
    whether it or a unit before it keeps the first token only (the first-token tail's one-row halves)."""
    unit = layered.units[u]
    tail = any(getattr(layered.units[i], "first_token_only", False) for i in range(u + 1))
    return type(unit).__name__, tuple(name for name, _ in unit.named_children()), tail


def variants(layered, plan) -> dict[tuple, int]:
    """The compiled variants `plan` runs over the whole model, each with its inductor graphs: a trained
    variant a unit shape (forward and backward), the first trained unit's after a frozen prefix (its input
    takes no gradient), and a no-grad one a shape of the frozen units and of evaluation (forward only); a
    prefix AutoCache serves runs none. An estimate (a pipeline's worker compiles its own stages' only), which
    what a run measured replaces (`ptrun.compiling.kept_costs`)."""
    n, frozen = len(layered.units), plan.frozen_units
    out = {(unit_shape(layered, u), "no grad"): 1 for u in range(min(plan.cached_units, frozen), n)}
    out.update({(unit_shape(layered, u), "trained"): 2 for u in range(frozen, n)})
    if 0 < frozen < n:
        out[(unit_shape(layered, frozen), "trained, input without gradient")] = 2
    return out


def _max_over_ranks(values: dict) -> dict:
    """Each count's largest value over the job's ranks (the busiest worker's), where a job runs."""
    if not dist.is_initialized() or not values:
        return values
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    t = torch.tensor([float(v) for v in values.values()], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {k: (v if isinstance(values[k], float) else int(v)) for k, v in zip(values, t.tolist(), strict=True)}


def cost_since(compiler: UnitCompiler | None, before: dict | None) -> dict:
    """Collective: what compiling cost since `before` (a `counts()`), the busiest worker's: `compile_s` and
    `recompiles`; nothing without a compiler."""
    if compiler is None:
        return {}
    c = since(compiler.counts.snapshot(), before or {})
    return _max_over_ranks({"compile_s": c["compile_s"], "recompiles": c["recompiles"]})


def counts(compiler: UnitCompiler | None) -> dict | None:
    """The compile counts now (for `cost_since`), None without a compiler."""
    return compiler.counts.snapshot() if compiler is not None else None


class CompileCounts:
    """The process's compile work as dynamo reports it (its start and end callbacks, outermost compiles
    only), and inductor's cache counters: totals since this object was made."""

    def __init__(self) -> None:
        from torch._dynamo.callback import callback_handler  # inner import: optional library

        self.seconds = 0.0
        self.compiles = 0
        self.recompiles = 0
        self._began: float | None = None
        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)
        self._cache_base = self._cache_counts()

    def _start(self, args=None) -> None:
        self._began = time.perf_counter()

    def _end(self, args=None) -> None:
        if self._began is not None:
            self.seconds += time.perf_counter() - self._began
            self._began = None
        if getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO") != "DYNAMO":
            return  # a backward graph compiled at its first use: part of its forward's compile
        # "frame/attempt": dynamo numbers the compiles of one code object, a unit kind's `forward`, from 0
        frame, _, attempt = str(getattr(args, "compile_id", "")).partition("/")
        if frame.isdigit() and attempt[:1].isdigit():
            self.compiles += 1
            self.recompiles += int(int(attempt.split("_")[0]) > 0)

    @staticmethod
    def _cache_counts() -> tuple[int, int]:
        from torch._dynamo.utils import counters  # inner import: optional library

        inductor = counters["inductor"]
        hits = inductor["fxgraph_cache_hit"]
        return hits, hits + inductor["fxgraph_cache_miss"] + inductor["fxgraph_cache_bypass"]

    def snapshot(self) -> dict:
        """What was compiled so far: seconds, dynamo compiles and recompiles, inductor graphs built and the
        ones its cache served."""
        hits, graphs = self._cache_counts()
        return {
            "compile_s": self.seconds,
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "graphs": graphs - self._cache_base[1],
            "graphs_from_cache": hits - self._cache_base[0],
        }


def since(now: dict, before: dict) -> dict:
    """The counts of `snapshot` between two snapshots."""
    return {k: now[k] - before.get(k, 0) for k in now}


def compile_errors() -> tuple[type[BaseException], ...]:
    """What compiling a unit may raise: dynamo's errors (inductor's come wrapped in them) and the recompile
    limit. Asked for by a `UnitCompiler` as it starts, not at import: torch._dynamo takes seconds to import,
    and a run that compiles nothing never needs it."""
    from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException  # inner import: optional library

    return TorchDynamoException, FailOnRecompileLimitHit


class CompiledUnit:
    """A unit's compiled callable: the unit's own module run through torch.compile, or eager once its kind
    has failed to compile (and on meta tensors: a pipeline stage infers its shapes with them)."""

    def __init__(self, unit: nn.Module, name: str, compiler: UnitCompiler) -> None:
        self.unit, self.name, self.compiler = unit, name, compiler
        self.kind = type(unit).__name__
        self.compiled = torch.compile(unit, mode=None if compiler.mode == "default" else compiler.mode, dynamic=False)
        self.healed: set = set()  # the files of inductor's cache its compile failed on, removed

    def __call__(self, *args):
        if self.kind in self.compiler.eager_kinds or (args and args[0].device.type == "meta"):
            return self.unit(*args)
        try:
            out = self.compiled(*args)
        except self.compiler.errors as exc:  # this kind runs eager (anything else is the run's own error: raised)
            named = inductor_cache.remove_named_file(exc)
            if named is not None and named[0] not in self.healed:  # a damaged file of inductor's cache: compiled
                self.healed.add(named[0])  # once more, which writes it again (once per file)
                if named[1]:
                    inductor_cache.log.warning(
                        "inductor's cache entry %s is unusable: it failed to load (%s); removed, unit %s is "
                        "compiled again",
                        named[0],
                        type(exc).__name__,
                        self.name,
                    )
                return self(*args)
            self.compiler.give_up(self, exc)
            return self.unit(*args)
        self.compiler.kinds.add(self.kind)
        return out


class UnitCompiler:
    """One worker's compiled units (`train.compile` on): each unit's `CompiledUnit`, made once and kept across
    layouts (a new stage reuses its units' compiled code), the unit kinds compiled, those that run eager, and
    the compile counts."""

    def __init__(self, mode: str, layered, probe: tuple = (), global_batch: int = 1) -> None:
        import torch._dynamo  # inner import: optional library

        self.mode = mode
        self.layered = layered
        self.probe, self.global_batch = probe, global_batch
        self.kinds: set[str] = set()
        self.eager_kinds: set[str] = set()
        self._runners: dict[int, CompiledUnit] = {}
        self._inputs: dict[int, tuple] = {}  # a stage's first unit -> its last training input (and grad flags)
        # Hitting the recompile limit raises (caught in CompiledUnit) instead of running that frame eager
        # silently, so the unit's kind is named and goes eager as a whole.
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        self.errors = compile_errors()
        keep_inductor_headers_with_its_cache()
        inductor_cache.check_entries()  # before the first compile: no damaged graph entry is read
        self.counts = CompileCounts()

    def runners(self, units: Sequence[nn.Module], first: int) -> list[Callable]:
        """What a stage calls for `units` (unit indices `first`, `first + 1`, ...)."""
        out = []
        for i, unit in enumerate(units):
            if id(unit) not in self._runners:
                self._runners[id(unit)] = CompiledUnit(unit, self.layered.unit_names[first + i], self)
            out.append(self._runners[id(unit)])
        return out

    def remember(self, first: int, carry: tuple) -> None:
        """A stage starting at unit `first` trained on `carry` (kept by reference for `warm_stage`)."""
        self._inputs[first] = (tuple(t.detach() for t in carry), tuple(t.requires_grad for t in carry))

    def stage_input(self, first: int, compute_dtype: torch.dtype | None, rows: int) -> tuple | None:
        """A plausible training input of a stage starting at unit `first`: the last input of a stage that
        started at or before it, run through the units between (a deeper cached prefix); before any step, the
        probe sample as a batch of `rows`; None where neither reaches it."""
        seen = [k for k in self._inputs if k <= first]
        if not seen and self.probe:
            self.remember(0, tuple(t.expand(rows, *t.shape[1:]).contiguous() for t in self.probe))
            seen = [0]
        if not seen:
            return None
        start = max(seen)
        carry, grads = self._inputs[start]
        if start == first:
            return tuple(t.detach().requires_grad_(g) for t, g in zip(carry, grads, strict=True))
        with torch.no_grad(), autocast(carry[0].device, compute_dtype):
            out = run_units(self.layered.units[start:first], *carry)
        return out if isinstance(out, tuple) else (out,)  # a cached prefix's output: no gradient

    def warm_stage(self, module: nn.Module, first: int, stage: int, plan) -> None:
        """Compile stage `stage`'s variants under `plan` before its first step (`warm`) where a stage at or
        before its first unit has trained on this worker (the first stage, from the probe, before any step);
        its input takes a gradient where the stage's does (a later stage)."""
        if (stage > 0 and first not in self._inputs) or any(p.is_meta for p in module.parameters()):
            return  # its input's shape is the stage before's output's, known once a step has run; no values yet
        rows = -(-self.global_batch // (plan.dp * plan.microbatches))
        carry = self.stage_input(first, getattr(module, "compute_dtype", None), rows)
        takes_grad = stage > 0
        if carry is not None:
            warm(module, tuple(t.detach().requires_grad_(takes_grad and t.requires_grad) for t in carry))

    def give_up(self, runner: CompiledUnit, exc: Exception) -> None:
        """One line naming the unit and why; its kind runs eager from here."""
        self.eager_kinds.add(runner.kind)
        self.kinds.discard(runner.kind)
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        why = (
            "hit dynamo's recompile limit"
            if "recompile_limit" in type(exc).__name__.lower() + first.lower()
            else f"did not compile ({type(exc).__name__}: {first})"
        )
        log.warning(
            "train.compile: unit %s (%s) %s; %s units run eager from here", runner.name, runner.kind, why, runner.kind
        )

    def summary(self) -> str:
        """Collective: `compiled N unit kinds in X s (Y of Z graphs from cache)` over the job (the kinds every
        worker compiled, the busiest worker's seconds, every worker's graphs), and the kinds that run eager."""
        mine = (sorted(self.kinds), sorted(self.eager_kinds), self.counts.snapshot())
        every = [mine]
        if dist.is_initialized():
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
        kinds = {k for kinds, _, _ in every for k in kinds}
        eager = {k for _, kinds, _ in every for k in kinds}
        seconds = max(c["compile_s"] for _, _, c in every)
        graphs, cached = (sum(c[k] for _, _, c in every) for k in ("graphs", "graphs_from_cache"))
        gave_up = f"; eager: {', '.join(sorted(eager))}" if eager else ""
        return f"compiled {len(kinds)} unit kinds in {seconds:.1f} s ({cached} of {graphs} graphs from cache){gave_up}"

    def epoch_fields(self) -> dict:
        """Collective: the epoch event's `compile` (what compiling cost since the last call, the busiest
        worker's: seconds, dynamo compiles and recompiles, inductor graphs and those its cache served)."""
        now = self.counts.snapshot()
        fields = _max_over_ranks(since(now, getattr(self, "_last", {})))
        self._last = now
        return {"compile": fields}


def warm(module: nn.Module, inputs: tuple, train: bool = True) -> None:
    """Compile what a stage's steps will run before they run: one forward pass of `module` (a StageModule)
    on `inputs`, its backward pass when it trains (the gradients taken and dropped: no `.grad` changes, no
    hook of a data-parallel wrapper runs) and a no-grad forward pass as evaluation runs it. The random number
    generators are put back, so dropout in the steps draws what it would have drawn."""
    devices = [inputs[0].device] if inputs[0].device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        was = module.training
        try:
            if train:
                module.train(True)
                out = module(*inputs)
                head = out[0] if isinstance(out, tuple) else out
                params = [p for p in module.parameters() if p.requires_grad]
                if head.requires_grad and params:
                    torch.autograd.grad(head.float().sum(), params, allow_unused=True)
            module.train(False)
            with torch.no_grad():
                module(*inputs)
        finally:
            module.train(was)


def no_grad_if(frozen: bool):
    """`torch.no_grad()` for a frozen stretch of units, else nothing."""
    return torch.no_grad() if frozen else nullcontext()


@contextmanager
def as_frozen(module: nn.Module) -> Iterator[None]:
    """Evaluation (no grad) with `module`'s parameters marked frozen for the while: a unit then runs its
    frozen variant, one graph for both, where dynamo would otherwise compile another that differs only in its
    parameters' `requires_grad`, which nothing reads without autograd. Training never reuses it: its graphs
    were traced with grad mode on, which dynamo guards first."""
    flipped = [p for p in module.parameters() if p.requires_grad]
    for p in flipped:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in flipped:
            p.requires_grad_(True)
