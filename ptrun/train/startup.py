"""How a worker's trainer starts: the pipeline length and micro-batch count when they are `auto`, the
starting layout (with a measured profile for the time-based partitioners), micro-batch tuning, and AutoCache.
A mixin of `Trainer` (ptrun/train/trainer.py), which calls these from its constructor."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from functools import partial

import torch
import torch.distributed as dist

from ptrun.auto.autocache import AutoCache
from ptrun.auto.autodp import build_layout
from ptrun.auto.controller import Controller, start
from ptrun.config import DataConfig, PtrunConfig, validate
from ptrun.data import build_datasets
from ptrun.models.lazy import init_units
from ptrun.parallel import microtune
from ptrun.parallel.fit import device_budget, resolve_length
from ptrun.parallel.layout import NEEDS_PROFILE, start_replica_batch, starting_microbatches
from ptrun.parallel.partition import partition
from ptrun.parallel.plan import Plan
from ptrun.parallel.profile import agree, measure_bandwidth, profile_units

log = logging.getLogger("ptrun.train.trainer")


def data_config(cfg: PtrunConfig) -> DataConfig:
    """The data configuration as the sources need it: a text source's tokenizer defaults to the model's own
    directory (`model.pretrained`)."""
    if cfg.data.tokenizer is None and cfg.model.pretrained is not None:
        return replace(cfg.data, tokenizer=cfg.model.pretrained)
    return cfg.data


class StartUp:
    def _resolve_length(self, cfg: PtrunConfig) -> PtrunConfig:
        """Collective: `pipe.length=auto` made the shortest pipeline that fits a device, an unset micro-batch
        count made the one that follows the length; then the length-dependent rules checked (ConfigError).
        Every rank takes the smallest device budget, so all choose the same layout."""
        self.length_choice = None
        if cfg.pipe.length != "auto" and cfg.pipe.microbatches is not None:
            return cfg
        budget = torch.tensor([float(device_budget(cfg, self.device))], dtype=torch.float64, device=self.device)
        dist.all_reduce(budget, op=dist.ReduceOp.MIN)
        probe = dict(self.data.train[[0]])
        sample = tuple(probe[k] for k in self.layered.input_names if k in probe)
        resolved, self.length_choice = resolve_length(cfg, self.layered, sample, self.world_size,
                                                      int(budget.item()))
        validate(resolved)
        if self.is_main and self.length_choice is not None:
            log.info("%s", self.length_choice.summary())
        return resolved

    def _make_cache(self) -> AutoCache:
        """AutoCache for this worker. Its entries are keyed by everything that shapes a cached activation
        besides the frozen weights: the model and data configuration and the augmentation mode."""
        cfg = self.cfg
        self.plain_train = self.data.train
        if cfg.data.augment:
            if cfg.cache.augment == "off":  # cached samples are loaded without random augmentation
                self.plain_train = build_datasets(replace(data_config(cfg), augment=False)).train
            elif self.is_main:
                log.warning("auto.cache with data.augment: each cached sample keeps the augmented view it had "
                            "when it was cached (cache.augment=fixed); cache.augment=off trains cached epochs "
                            "without random augmentation")
        tag = json.dumps({"model": asdict(cfg.model), "data": asdict(cfg.data), "augment": cfg.cache.augment,
                          "seed": cfg.train.seed, "precision": cfg.train.precision}, sort_keys=True)
        return AutoCache(self.layered, cfg.cache, tag=tag, num_train=len(self.data.train),
                         num_eval=len(self.data.eval), device=self.device, run_dir=cfg.run_dir,
                         compute_dtype=self.compute_dtype)

    def _start(self, microbatch_table=None) -> Controller:
        """Collective: the Controller and first Plan (`ptrun.auto.controller.start`). The time-based
        partitioners need the units' profile: measured once, on one micro-batch of the first step's samples,
        and agreed by every rank."""
        pipe = self.cfg.pipe
        if pipe.partition in NEEDS_PROFILE and self._profile is None:
            # With pipe.microbatches=auto, M is a stand-in until tuning (which needs this layout) measures it.
            m = starting_microbatches(pipe, self.world_size, self.cfg.train.global_batch_size,
                                      self.cfg.auto.microbatch_table)
            micro = max(1, start_replica_batch(pipe, self.world_size, self.cfg.train.global_batch_size) // m)
            ids, _ = self.train_sampler.global_batch(0, 0)
            batch = dict(self.data.train[ids[:micro].tolist()])
            inputs = tuple(batch[k].to(self.device) for k in self.layered.input_names)
            self._profile = (agree(profile_units(self.layered, inputs, self.device), self.device),
                             measure_bandwidth(self.device))
        profile, bandwidth = self._profile or (None, None)
        return start(self.cfg, self.layered, self.world_size, profile=profile, bandwidth=bandwidth,
                     microbatch_table=microbatch_table, steps_per_epoch=self.base_steps)

    def _tune_microbatches(self) -> microtune.Tuning:
        """Collective: the M per pipeline length this run may use, from the disk cache or measured on the
        starting layout and on the nothing-frozen layouts AutoPipe would build at the shorter lengths."""
        cfg, c = self.cfg, self.controller
        first = c.first
        lengths = microtune.candidates(first.pp, self.world_size, cfg.train.global_batch_size, first.schedule,
                                       stages_per_rank=first.stages_per_rank, batch_policy=cfg.auto.batch,
                                       shrinks=microtune.shrinking(cfg))

        def plan_at(pp: int, m: int) -> Plan:
            bounds = first.stage_bounds if pp == first.pp else partition(
                c.method, pp * first.stages_per_rank, num_units=first.num_units, param_costs=c.param_costs,
                **c.partition_kwargs)
            return replace(first, pp=pp, dp=self.world_size // pp, microbatches=m,
                           stage_bounds=tuple(tuple(b) for b in bounds)).check()

        build = partial(build_layout, self.builder)
        batches = partial(microtune.training_batches, self.data.train, rank=self.rank, seed=cfg.train.seed,
                          input_names=self.layered.input_names, task=cfg.model.task, device=self.device)
        probe = dict(self.data.train[[0]])
        shapes = {k: [list(probe[k].shape[1:]), str(probe[k].dtype)] for k in self.layered.input_names if k in probe}
        fields = microtune.cache_fields(
            model=asdict(cfg.model), input_shapes=shapes, lengths=lengths, world_size=self.world_size,
            schedule=first.schedule, stages_per_rank=first.stages_per_rank,
            partition=cfg.pipe.partition if cfg.pipe.stages is None else json.dumps(cfg.pipe.stages),
            recompute=cfg.pipe.recompute, precision=cfg.train.precision, threads=torch.get_num_threads(),
            device=self.device)
        def measure():
            # Measuring builds and runs this rank's stages at every candidate length: every unit is filled
            # (emptied again, all but this rank's, once the first layout is built). A cached table needs none.
            init_units(self.layered, range(len(self.layered.units)))
            return microtune.measure(lengths, plan_at=plan_at, build=build, batches=batches,
                                     model=self.layered.model, loss=self.loss, device=self.device)

        tuning = microtune.tune(lengths, fields, measure_costs=measure, explicit_table=cfg.auto.microbatch_table,
                                device=self.device)
        if self.is_main:
            log.info("%s", tuning.summary())
        return tuning
