"""How a worker's trainer starts (once `ptrun.compose.for_world` has checked the layout against the world a
rendezvous counted): the data, the model's units (without values), what its engines are built from, the units'
profile for the time-based partitioners, the controller and its first plan, micro-batch tuning, and AutoCache.
Each function is called once from `Trainer.__init__`, in this order."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from functools import partial

import torch
import torch.distributed as dist

from ptrun.auto.autocache import AutoCache
from ptrun.auto.autodp import Builder, build_engine
from ptrun.auto.controller import Controller, start
from ptrun.auto.intervals import epoch_steps
from ptrun.compiling.compiler import make_compiler
from ptrun.config import PtrunConfig
from ptrun.data import EpochSampler, build_datasets
from ptrun.data.splits import DataSplits, first_sample
from ptrun.layout import microtune
from ptrun.layout.autopipe import unfrozen_plan
from ptrun.layout.first import starting_micro_batch
from ptrun.layout.partition import NEEDS_PROFILE
from ptrun.layout.tuning import Tuning, cache_fields, tune
from ptrun.models import build_model
from ptrun.models.lazy import init_units
from ptrun.models.losses import WeightedLoss
from ptrun.numerics.precision import compute_dtype
from ptrun.parallel.profile import agree, measure_bandwidth, profile_units
from ptrun.train.class_names import agree_on_classes, check_resumed_classes

log = logging.getLogger("ptrun.train.trainer")


def load_data(cfg: PtrunConfig, resume: bool) -> DataSplits:
    """Collective: the run's data. Every rank maps labels to the same indices, and a resume keeps the indices
    the run began with."""
    data = build_datasets(cfg.data, task=cfg.model.task)
    agree_on_classes(data.class_names)
    if resume:
        check_resumed_classes(data.class_names, cfg.run_dir)
    return data


def build_units(cfg: PtrunConfig, data: DataSplits):
    """The model as layer units without values: a worker fills its own stages' units once it knows its layout
    (`PlanInUse.start`). The seed first: identical per-unit initial values on every rank."""
    torch.manual_seed(cfg.train.seed)
    return build_model(cfg.model, **data.model_sizes, units=(), adapter=cfg.adapter)


def make_builder(cfg: PtrunConfig, layered, data: DataSplits, rank: int, device: torch.device) -> Builder:
    """What this worker's layouts are built from (the same for every Plan), its compiled units with
    `train.compile=true` included (the micro-batch tuning measures compiled steps then): they compile the
    first layout's first stage at once, on the first training sample. `auto` adds them once it has priced
    compiling (`ptrun.compiling.in_run`)."""
    param_name = {id(p): n for n, p in layered.model.named_parameters()}
    forced = cfg.train.compile is True
    return Builder(
        layered,
        rank,
        device,
        WeightedLoss(cfg.model.task),
        cfg.optim,
        param_name,
        cfg.pipe.recompute,
        compute_dtype(cfg.train.precision),
        cfg.pipe.weight_stashing,
        cfg.pipe.vertical_sync,
        make_compiler(cfg.train, layered, device, first_sample(data, layered.input_names)) if forced else None,
    )


def measure_profile(
    cfg: PtrunConfig, layered, data: DataSplits, sampler: EpochSampler, world_size: int, device: torch.device
):
    """Collective: for the time-based partitioners, the units' profile (measured once, on one micro-batch of
    the first step's samples, agreed by every rank) and the link's bandwidth; (None, None) for the others and
    for a one-stage start."""
    pipe = cfg.pipe
    if pipe.partition not in NEEDS_PROFILE:
        return None, None
    if pipe.length * pipe.stages_per_rank == 1:
        # One stage from the start: nothing to balance now, and AutoPipe only ever shortens a pipeline, so the
        # profile (seconds of every worker's start-up) would never be read.
        return None, None
    # With pipe.microbatches=auto, M is a stand-in until tuning (which needs this layout) measures it.
    micro = starting_micro_batch(pipe, world_size, cfg.train.global_batch_size, cfg.auto.microbatch_table)
    ids, _ = sampler.global_batch(0, 0)
    batch = dict(data.train[ids[:micro].tolist()])
    inputs = tuple(batch[k].to(device) for k in layered.input_names)
    return agree(profile_units(layered, inputs, device), device), measure_bandwidth(device)


def tune_microbatches(
    cfg: PtrunConfig,
    controller: Controller,
    builder: Builder,
    layered,
    data: DataSplits,
    world_size: int,
    device: torch.device,
) -> Tuning:
    """Collective: the M per pipeline length this run may use, from the disk cache or measured on the
    starting layout and on the nothing-frozen layouts AutoPipe would build at the shorter lengths."""
    first = controller.first
    lengths = microtune.candidates(
        first.pp,
        world_size,
        cfg.train.global_batch_size,
        first.schedule,
        stages_per_rank=first.stages_per_rank,
        batch_policy=cfg.auto.batch,
        shrinks=microtune.shrinking(cfg),
    )

    # measured with nothing frozen (nor cached: the batches are raw), as at the start of a full fine-tune
    plan_at = partial(
        unfrozen_plan,
        first,
        method=controller.method,
        param_costs=controller.param_costs,
        partition_kwargs=controller.partition_kwargs,
    )
    batches = partial(
        microtune.training_batches,
        data.train,
        rank=builder.rank,
        seed=cfg.train.seed,
        input_names=layered.input_names,
        task=cfg.model.task,
        device=device,
    )
    probe = dict(data.train[[0]])
    shapes = {k: [list(probe[k].shape[1:]), str(probe[k].dtype)] for k in layered.input_names if k in probe}
    fields = cache_fields(
        model=asdict(cfg.model),
        input_shapes=shapes,
        lengths=lengths,
        world_size=world_size,
        schedule=first.schedule,
        stages_per_rank=first.stages_per_rank,
        partition=cfg.pipe.partition if cfg.pipe.stages is None else json.dumps(cfg.pipe.stages),
        recompute=cfg.pipe.recompute,
        precision=cfg.train.precision,
        threads=torch.get_num_threads(),
        device=device,
    )

    def measure():
        # Measuring builds and runs this rank's stages at every candidate length: every unit is filled
        # (emptied again, all but this rank's, once the first layout is built). A cached table needs none.
        init_units(layered, range(len(layered.units)))
        return microtune.measure(
            lengths,
            plan_at=plan_at,
            build=partial(build_engine, builder),
            batches=batches,
            model=layered.model,
            device=device,
        )

    tuning = tune(lengths, fields, measure_costs=measure, explicit_table=cfg.auto.microbatch_table, device=device)
    if builder.rank == 0:
        log.info("%s", tuning.summary())
    return tuning


def start_controller(
    cfg: PtrunConfig, layered, builder: Builder, data: DataSplits, world_size: int
) -> tuple[Controller, Tuning | None]:
    """Collective: the Controller and its first Plan (`ptrun.auto.controller.start`), over the epochs of the
    configured global batch. With `pipe.microbatches=auto` the first start's layout is measured for the M per
    length, and the controller starts again with that table, so the first plan and AutoPipe's later picks use
    it."""
    batch = cfg.train.global_batch_size
    sampler = EpochSampler(len(data.train), batch, cfg.train.seed)
    steps_per_epoch = epoch_steps(len(data.train), batch, cfg.train.max_steps_per_epoch)
    profile, bandwidth = measure_profile(cfg, layered, data, sampler, world_size, builder.device)
    begin = partial(
        start, cfg, layered, world_size, profile=profile, bandwidth=bandwidth, steps_per_epoch=steps_per_epoch
    )
    controller = begin()
    if cfg.pipe.microbatches != "auto":
        return controller, None
    tuning = tune_microbatches(cfg, controller, builder, layered, data, world_size, builder.device)
    # the first layout runs at the M measured for it; `auto.microbatch_table`'s entries apply after a change
    measured = tuning.choices[controller.first.pp].microbatches
    return begin(microbatch_table=tuning.table, first_microbatches=measured), tuning


def make_cache(
    cfg: PtrunConfig, layered, data: DataSplits, device: torch.device, compute_dtype, is_main: bool
) -> tuple[AutoCache | None, object]:
    """AutoCache for this worker (None without `auto.cache`), and the training set cached samples are read
    from (without random augmentation where `cache.augment=off`). Its entries are keyed by everything that
    shapes a cached activation besides the frozen weights and the split: the model and data configuration and
    the augmentation mode. Eval samples have slots only with `cache.eval`."""
    plain_train = data.train
    if not cfg.auto.cache:
        return None, plain_train
    if cfg.data.augment:
        if cfg.cache.augment == "off":  # cached samples are loaded without random augmentation
            plain_train = build_datasets(replace(cfg.data, augment=False), task=cfg.model.task).train
        elif is_main:
            log.warning(
                "auto.cache with data.augment: each cached sample keeps the augmented view it had "
                "when it was cached (cache.augment=fixed); cache.augment=off trains cached epochs "
                "without random augmentation"
            )
    tag = json.dumps(
        {
            "model": asdict(cfg.model),
            "data": asdict(cfg.data),
            "augment": cfg.cache.augment,
            "seed": cfg.train.seed,
            "precision": cfg.train.precision,
        },
        sort_keys=True,
    )
    cache = AutoCache(
        layered,
        cfg.cache,
        tag=tag,
        num_train=len(data.train),
        num_eval=len(data.eval) if cfg.cache.eval else 0,
        device=device,
        run_dir=cfg.run_dir,
        compute_dtype=compute_dtype,
        local=dist.get_world_size() == 1,
        speaks=is_main,
    )
    return cache, plain_train
