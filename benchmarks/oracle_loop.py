"""The oracle loop of `benchmarks.overhead`: a plain transformers loop that freezes the same units at the same
(epoch, step) as a ptrun run, its schedule read from that run's `plan` events (the module docstring of
`benchmarks.overhead` says how it is built and what it is measured against).

    python -m benchmarks.overhead oracle --recipe NAME --schedule RUN_DIR --out FILE [overrides ...]
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from ptrun.config import LR_SCHEDULE_SPECS, PRECISION_SPECS

RECIPE = "bbc_news_bert"


# ---- the schedule ----------------------------------------------------------------------------------------


def schedule(run_dir: Path) -> list[dict]:
    """The freeze schedule of a ptrun run: every layout change's (epoch, step, frozen_units), in order, from
    its `plan` events (the latest record of each position); frozen units never thaw."""
    from ptrun.report import load_run

    changes, frozen = [], 0
    for p in load_run(Path(run_dir)).plans:
        if p["frozen_units"] != frozen:
            changes.append({"epoch": p["epoch"], "step": p.get("step", 0), "frozen_units": p["frozen_units"]})
            frozen = p["frozen_units"]
    return changes


def frozen_at(changes: list[dict], epoch: int, step: int) -> int:
    """Units frozen from (epoch, step) on."""
    frozen = 0
    for c in changes:
        if (c["epoch"], c["step"]) <= (epoch, step):
            frozen = c["frozen_units"]
    return frozen


def unit_params(net) -> list[list]:
    """The parameters of each of ptrun's units of a transformers encoder classifier, in ptrun's order
    (`ptrun.models.encoders.split_encoder`; BERT, RoBERTa, XLM-R, ELECTRA): the embeddings, each layer's
    attention half and feed-forward half, the head (pooler and classifier)."""
    base = getattr(net, net.base_model_prefix)
    project = getattr(base, "embeddings_project", None)  # ELECTRA's, where its embeddings are narrower
    units = [[*base.embeddings.parameters(), *(project.parameters() if project is not None else ())]]
    for layer in base.encoder.layer:
        units += [list(layer.attention.parameters()), [*layer.intermediate.parameters(), *layer.output.parameters()]]
    seen = {id(p) for unit in units for p in unit}
    units.append([p for p in net.parameters() if id(p) not in seen])
    return units


# ---- the oracle loop ---------------------------------------------------------------------------------------


def oracle(argv: list[str]) -> None:
    """The oracle loop (see the module docstring): writes `--out` with per-epoch training times."""
    import argparse

    import torch

    from benchmarks.plain_loop import NO_DECAY, build_model, recipe_config, summed_loss
    from ptrun.data import build_datasets

    parser = argparse.ArgumentParser(description="the oracle static-freeze loop")
    parser.add_argument("--recipe", default=RECIPE)
    parser.add_argument("--schedule", required=True, help="a ptrun run directory (its plan events) or a JSON list")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--out", required=True)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as ptrun's workers and the plain loop
    import torch.distributed as dist

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    path = Path(args.schedule)
    changes = schedule(path) if path.is_dir() else json.loads(path.read_text())

    cfg = recipe_config(args.recipe, args.overrides)
    assert cfg.model.task == "classification" and PRECISION_SPECS[cfg.train.precision].autocast is None
    data = build_datasets(cfg.data, task=cfg.model.task)
    columns = [c for c in ("input_ids", "attention_mask", "token_type_ids", "labels") if c in data.train.column_names]
    train_data = {c: (v if v.is_floating_point() else v.long()) for c, v in data.train[:].items() if c in columns}
    torch.manual_seed(cfg.train.seed)
    net = build_model(cfg.model, data)
    net.train()
    units = unit_params(net)

    def wrapped():
        """The model as the step calls it: under DDP wrapped again after each freeze (DDP registers the
        parameters that need gradients when it is built), as a user freezing by hand must."""
        return torch.nn.parallel.DistributedDataParallel(net) if world > 1 else net

    model = wrapped()
    o, t = cfg.optim, cfg.train

    def optimizer_for(frozen: int, old=None):
        """AdamW over the units from `frozen` on, carrying their state from `old`."""
        named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
        decay = [p for n, p in named if p.ndim > 1 and not any(k in n for k in NO_DECAY)]
        no_decay = [p for n, p in named if not (p.ndim > 1 and not any(k in n for k in NO_DECAY))]
        new = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o.lr,
            betas=tuple(o.betas),
            eps=o.eps,
            fused=True,
        )
        if old is not None:
            for p in (*decay, *no_decay):
                if p in old.state:
                    new.state[p] = old.state[p]
        return new

    def freeze(frozen: int, optimizer):
        for unit in units[:frozen]:
            for p in unit:
                p.requires_grad_(False)
                p.grad = None
        return optimizer_for(frozen, optimizer)

    optimizer = optimizer_for(0)
    n_train, batch = len(train_data["labels"]), t.global_batch_size
    steps = min(math.ceil(n_train / batch), t.max_steps_per_epoch or math.ceil(n_train / batch))
    total, warmup = t.epochs * steps, int(o.warmup_fraction * t.epochs * steps)

    def lr_factor(step: int) -> float:  # plain_loop's (ptrun's) schedule
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return LR_SCHEDULE_SPECS[o.schedule](progress)

    frozen, epochs, losses, global_step = 0, [], [], 0
    for epoch in range(t.epochs):
        transition_s = 0.0
        if frozen_at(changes, epoch, 0) != frozen:  # a change at the boundary: before the epoch's loop
            t0 = time.perf_counter()
            frozen = frozen_at(changes, epoch, 0)
            optimizer = freeze(frozen, optimizer)
            model = wrapped()
            transition_s = time.perf_counter() - t0
        order = torch.randperm(n_train, generator=torch.Generator().manual_seed(t.seed * 1_000_003 + epoch))
        t_epoch = time.perf_counter()
        for step, ids in enumerate(order.split(batch)[:steps]):
            if frozen_at(changes, epoch, step) != frozen:  # a change inside the epoch: part of its loop
                frozen = frozen_at(changes, epoch, step)
                optimizer = freeze(frozen, optimizer)
                model = wrapped()
            mine = torch.tensor_split(ids, world)[rank]  # this rank's contiguous share of the global batch
            b = {k: v[mine] for k, v in train_data.items()}
            # the share's summed loss over the global batch's samples over the world size: DDP's average is
            # then the global batch's mean loss
            loss = summed_loss(model, b, cfg.model.task, len(ids) / world)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for p in net.parameters() if p.requires_grad], t.grad_clip)
            for g in optimizer.param_groups:
                g["lr"] = o.lr * lr_factor(global_step)
            optimizer.step()
            losses.append(loss.detach() / world)
            global_step += 1
        epochs.append(
            {
                "epoch": epoch,
                "train_time_s": time.perf_counter() - t_epoch,
                "transition_s": transition_s,
                "frozen_units": frozen,
                "steps": steps,
                # what froze: the parameters still training, and those the optimizer still updates
                "trainable_params": sum(p.numel() for p in net.parameters() if p.requires_grad),
                "optimizer_params": sum(p.numel() for g in optimizer.param_groups for p in g["params"]),
            }
        )
        if rank == 0:
            print(
                f"oracle epoch {epoch + 1}/{t.epochs}  {epochs[-1]['train_time_s']:.2f}s  {frozen} units frozen",
                flush=True,
            )
    per_step = torch.stack(losses)
    if world > 1:
        dist.all_reduce(per_step)  # each rank's part of every step's global mean loss
    if rank == 0:
        Path(args.out).write_text(
            json.dumps(
                {
                    "epochs": epochs,
                    "schedule": changes,
                    "num_units": len(units),
                    "world_size": world,
                    "threads": args.threads,
                    "final_train_loss": per_step[-steps:].mean().item(),
                },
                indent=1,
            )
        )
    if world > 1:
        dist.destroy_process_group()
