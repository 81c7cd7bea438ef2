"""Pipeline equivalence cases run inside real worker processes (imported by name by the spawned workers).

Each case trains two optimizer steps of a tiny model under one layout (schedule, K, DP, stages per rank,
recompute) through the runtime ptrun builds for the plan (a single stage run directly, DDP over its
replicas; more stages through the schedule), and writes what each rank holds: its parameters, the global
loss and the pre-clip gradient norm of every step. The test compares them with a plain single-process
reference on the same global batches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from helpers import process_group
from helpers.process_group import run_elastic  # noqa: F401  (tests import it from here)

from ptrun.config import ModelConfig, OptimConfig
from ptrun.layout.plan import Plan, even_bounds
from ptrun.models import build_model
from ptrun.models.losses import WeightedLoss, loss_weight, make_target
from ptrun.numerics.optim import build_optimizer
from ptrun.parallel.flushing import flushing_runtime
from ptrun.parallel.groups import build_groups
from ptrun.parallel.pipeline import StageParts, Step

GLOBAL_BATCH = 16
STEPS = 2
CLIP = 0.25  # below every reference step's gradient norm (0.31 .. 3.1), so the global-norm clip is exercised
# eps 1e-6, not AdamW's 1e-8: a parameter whose gradient cancels to below eps (|g| ~ 1e-9 where the median is
# 3e-3, from sums of terms a thousand times larger) moves by lr * g / (|g| + eps), which turns the last-bit
# differences of any two correct summation orders into visible ones; a gradient far above both moves alike.
OPTIM = OptimConfig(name="adamw", lr=1e-2, weight_decay=0.01, schedule="constant", warmup_fraction=0.0, eps=1e-6)
SEQ, VOCAB = 12, 100
MODELS = {
    "vit": dict(
        name="vit_tiny_patch16_224",
        img_size=16,
        patch_size=4,
        in_chans=3,
        embed_dim=32,
        depth=4,
        num_heads=2,
        dropout=0.0,
        drop_path=0.0,
    ),
    "bert": dict(
        name="bert-tiny", embed_dim=32, depth=4, num_heads=2, vocab_size=VOCAB, max_position_embeddings=32, dropout=0.0
    ),
    "bert_mlm": dict(
        name="bert-tiny",
        task="mlm",
        embed_dim=32,
        depth=4,
        num_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        dropout=0.0,
    ),
}
NUM_CLASSES = {"vit": 10, "bert": 3, "bert_mlm": 2}
FAMILIES = {
    "roberta": "classification",
    "distilbert": "classification",
    "qwen3": "classification",
    "deberta-v2": "classification",
    "deberta-v2-conv": "classification",
    "modernbert": "classification",
    "gpt2_lm": "causal_lm",
    "llama_lm": "causal_lm",
}
"""Tiny transformers families (tests/hf_families.py) by case kind, and their task: GPT-2's LM head is tied
to its input embedding across the stages, DeBERTa's relative-position table is shared by the attention halves
of every stage."""


@dataclass(frozen=True)
class Case:
    kind: str
    schedule: str
    pp: int
    dp: int
    stages_per_rank: int = 1
    microbatches: int = 0  # 0 = 2K, which every schedule accepts
    recompute: str = "none"

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.schedule}-K{self.pp}-DP{self.dp}-v{self.stages_per_rank}-{self.recompute}"

    @property
    def m(self) -> int:
        return self.microbatches or 2 * self.pp


def even_plan(n: int, pp: int, dp: int, m: int, schedule: str, per_rank: int = 1, frozen: int = 0, **fields):
    """The checked plan of `n` units, the first `frozen` frozen, split evenly into `pp` x `per_rank` stages
    (`per_rank` on each rank of a pipeline), `dp` pipelines, `m` micro-batches; `fields` sets the others."""
    return Plan(
        num_units=n,
        frozen_units=frozen,
        pp=pp,
        dp=dp,
        stage_bounds=even_bounds(n, pp * per_rank),
        microbatches=m,
        schedule=schedule,
        stages_per_rank=per_rank,
        **fields,
    ).check()


def model(kind: str, adapter=None):
    """The tiny model of `kind` (with `adapter`'s adapters, if given)."""
    torch.manual_seed(0)  # every process builds the same initial weights
    if kind in FAMILIES:
        from hf_families import tiny_config

        family = kind.removesuffix("_lm")
        return build_model(
            ModelConfig(name=family, task=FAMILIES[kind]),
            num_classes=3,
            library_config=tiny_config(family),
            adapter=adapter,
        )
    return build_model(ModelConfig(**MODELS[kind]), num_classes=NUM_CLASSES[kind], vocab_size=VOCAB, adapter=adapter)


def batch(kind: str, step: int) -> dict[str, torch.Tensor]:
    """The global batch of `step`: seeded by (kind, step); step 1 ends with 3 padding samples (weight 0)."""
    g = torch.Generator().manual_seed(1000 + 7 * step + len(kind))
    b = GLOBAL_BATCH
    weight = torch.ones(b)
    if step == 1:
        weight[-3:] = 0
    if kind == "vit":
        return {
            "pixel_values": torch.randn(b, 3, 16, 16, generator=g),
            "labels": torch.randint(0, 10, (b,), generator=g),
            "weight": weight,
        }
    ids = torch.randint(1, VOCAB, (b, SEQ), generator=g)
    lengths = torch.randint(4, SEQ + 1, (b,), generator=g)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    types = (torch.arange(SEQ)[None, :] >= lengths[:, None] // 2).long() * mask
    out = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types, "weight": weight}
    if task(kind) == "causal_lm":
        out["labels"] = torch.where(mask.bool(), ids, -100)
    elif kind != "bert_mlm":
        out["labels"] = torch.randint(0, 3, (b,), generator=g)
    else:
        chosen = (torch.rand(b, SEQ, generator=g) < 0.3) & mask.bool()
        chosen[:, 0] = True  # every sample predicts at least one token
        out["labels"] = torch.where(chosen, torch.randint(1, VOCAB, (b, SEQ), generator=g), -100)
    return out


def textbook_loss(net, kind: str, b: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference loss with the library model on a whole global batch, written out with plain
    F.cross_entropy (no ptrun loss code): the mean over real samples, or for MLM over their predicted
    tokens."""
    import torch.nn.functional as F

    w = b["weight"]
    if kind == "vit":
        return (F.cross_entropy(net(b["pixel_values"]), b["labels"], reduction="none") * w).sum() / w.sum()
    types = {"token_type_ids": b["token_type_ids"]} if getattr(net.config, "type_vocab_size", 0) > 1 else {}
    logits = net(input_ids=b["input_ids"], attention_mask=b["attention_mask"], **types).logits
    if task(kind) == "classification":
        return (F.cross_entropy(logits, b["labels"], reduction="none") * w).sum() / w.sum()
    if task(kind) == "causal_lm":  # position t predicts token t + 1
        labels = b["labels"][:, 1:]
        counted = (labels != -100).float() * w[:, None]
        token = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels, ignore_index=-100, reduction="none")
        return (token * counted).sum() / counted.sum()
    counted = (b["labels"] != -100).float() * w[:, None]
    return (F.cross_entropy(logits.transpose(1, 2), b["labels"], reduction="none") * counted).sum() / counted.sum()


def task(kind: str) -> str:
    return "mlm" if kind == "bert_mlm" else FAMILIES.get(kind, "classification")


def steps(layered, kind: str, first: int, count: int):
    """The pipeline `Step`s of the global batches `first` .. `first + count - 1` of `kind`."""
    for t in range(first, first + count):
        full = batch(kind, t)
        target = make_target(full, task(kind))
        yield Step(t, tuple(full[k] for k in layered.input_names), target, float(loss_weight(target, task(kind))))


def run_case(case: Case, rank: int, out_dir: Path) -> None:
    layered = model(case.kind)
    plan = even_plan(len(layered.units), case.pp, case.dp, case.m, case.schedule, case.stages_per_rank)
    groups = build_groups(plan, rank, layered.tied)
    loss = WeightedLoss(task(case.kind))
    runtime = flushing_runtime(StageParts(layered, plan, rank, groups, torch.device("cpu"), loss, case.recompute))
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    optimizer = build_optimizer([(name_of[id(p)], p) for p in runtime.trainable_parameters()], OPTIM)
    replica, _ = plan.coords(rank)
    per_replica = GLOBAL_BATCH // plan.dp
    rows = slice(replica * per_replica, (replica + 1) * per_replica)
    losses, norms = [], []
    for step in range(STEPS):
        full = batch(case.kind, step)
        denominator = float(loss_weight(make_target(full, loss.task), loss.task))
        local = {k: v[rows] for k, v in full.items()}
        inputs = tuple(local[k] for k in layered.input_names)
        share = runtime.forward_backward(inputs, make_target(local, loss.task), denominator).double()
        norms.append(runtime.sync_and_clip(CLIP).total.item())
        optimizer.step()
        runtime.zero_grad()
        dist.all_reduce(share)
        losses.append(share.item())
    held = {
        name for u in runtime.unit_indices for name in layered.unit_param_names(u) + layered.unit_shared_param_names(u)
    }
    params = dict(layered.model.named_parameters())
    saved = {"params": {k: params[k].detach().clone() for k in held}, "losses": losses, "norms": norms}
    process_group.save_rank(saved, out_dir, case.name, rank)
    groups.destroy()


def launch(cases: list[Case], nproc: int, out_dir: Path) -> None:
    """Run `cases` on `nproc` real worker processes."""
    process_group.launch_cases(run_case, cases, nproc, "cases", out_dir, minutes=5)


# ---- AutoDP transitions inside one job ------------------------------------------------------------------

TRANSITIONS = [  # (K, DP, frozen units): 4 x 1 -> 2 x 2 (embedding + block 0 frozen) -> 1 x 4 (+ block 1),
    # each followed by a freeze in place (one more unit; two more), which keeps every unit where it is
    (4, 1, 0),
    (2, 2, 3),
    (2, 2, 4),
    (1, 4, 5),
    (1, 4, 7),
]
IN_PLACE = {2, 4}
"""The steps of TRANSITIONS that a freeze in place leads into (the same K, DP and stages)."""


def transition_plans(n: int, schedule: str = "GPipe") -> list[Plan]:
    return [even_plan(n, k, dp, k, schedule, frozen=f) for k, dp, f in TRANSITIONS]


def run_transitions(kind: str, rank: int, out_dir: Path) -> None:
    """One clipped AdamW step under each plan of TRANSITIONS, changing layout in between exactly as the
    trainer does; after each step every rank saves what it holds (parameters and optimizer state)."""
    from ptrun.auto.autodp import Builder, build_engine, change_engine, optimizer_state_by_name
    from ptrun.auto.residency import release_unheld

    layered = model(kind)
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    loss = WeightedLoss(task(kind))
    builder = Builder(layered, rank, torch.device("cpu"), loss, OPTIM, name_of)
    plans = transition_plans(len(layered.units))
    layout = None
    for step, plan in enumerate(plans):
        if layout is None:
            layout = build_engine(builder, plan)
            release_unheld(layered, plan, rank)  # as the trainer does after its first layout
        else:
            old_groups = layout.groups
            layout = change_engine(builder, layout, plan)
            same_groups = layout.groups is old_groups
        replica, _ = plan.coords(rank)
        per_replica = GLOBAL_BATCH // plan.dp
        full = batch(kind, step)
        denominator = float(loss_weight(make_target(full, loss.task), loss.task))
        local = {k: v[replica * per_replica : (replica + 1) * per_replica] for k, v in full.items()}
        layout.runtime.forward_backward(
            tuple(local[k] for k in layered.input_names), make_target(local, loss.task), denominator
        )
        layout.runtime.sync_and_clip(CLIP)
        if layout.optimizer is not None:
            layout.optimizer.step()
        layout.runtime.zero_grad()
        held = {
            n
            for u in layout.runtime.unit_indices
            for n in layered.unit_param_names(u) + layered.unit_shared_param_names(u)
        }
        params = dict(layered.model.named_parameters())
        saved = {
            "params": {k: params[k].detach().clone() for k in held},
            "optim": optimizer_state_by_name(layout.optimizer, name_of),
            "received_bytes": layout.received_bytes,
            "same_groups": step > 0 and same_groups,
            "materialized": sorted(n for n, p in params.items() if p.numel() > 0),
        }
        process_group.save_rank(saved, out_dir, f"transition-{kind}-step{step}", rank)
    layout.groups.destroy()


def count_leaks(rank: int, out_dir: Path, changes: int = 32) -> None:
    """Open file descriptors and threads after 2 and after `changes` layout changes (4x1 <-> 2x2)."""
    import threading

    from ptrun.auto.autodp import Builder, build_engine, change_engine

    layered = model("vit")
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    loss = WeightedLoss("classification")
    n = len(layered.units)
    plans = [
        Plan(n, 0, 4, 1, even_bounds(n, 4), 4, "GPipe").check(),
        Plan(n, 0, 2, 2, even_bounds(n, 2), 2, "1F1B").check(),
    ]
    builder = Builder(layered, rank, torch.device("cpu"), loss, OPTIM, name_of)
    layout = build_engine(builder, plans[0])
    counts = []
    for i in range(1, changes + 1):
        layout = change_engine(builder, layout, plans[i % 2])
        if i in (2, changes):
            dist.barrier()
            counts.append(
                {
                    "fds": len(os.listdir("/proc/self/fd")),
                    "threads": threading.active_count(),
                    "tasks": len(os.listdir("/proc/self/task")),
                }
            )
    layout.groups.destroy()
    process_group.save_rank(counts, out_dir, "leaks", rank)


def run_all_transitions(rank: int, kinds: list[str], out_dir: Path) -> None:
    for kind in kinds:
        run_transitions(kind, rank, out_dir)
    count_leaks(rank, out_dir)


def launch_transitions(kinds: list[str], out_dir: Path) -> None:
    process_group.launch(run_all_transitions, 4, "transitions", kinds, out_dir, minutes=5)
