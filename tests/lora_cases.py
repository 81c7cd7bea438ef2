"""Worker side of tests/test_lora_dist.py: LoRA units trained as a 2-stage 1F1B pipeline in real processes
(gloo), a freeze in place halfway; each case writes its per-step losses and, after the freeze, whether any
frozen adapter or any base weight held a gradient, for the test to compare with peft on the library model.
In the same launch, LoRA units as a 2-stage PipeDream pipeline (weight stashing, plain SGD) write the
parameters they end with, the runtime's trace and the bytes of weights it stashed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pipedream_cases as pd
import pipeline_cases as pc
import torch
import torch.distributed as dist
from helpers import process_group

from ptrun.auto.autodp import Builder, build_engine, change_engine
from ptrun.config import AdapterConfig
from ptrun.models.losses import WeightedLoss
from ptrun.parallel.pipeline import Step

STEPS, FREEZE_AT, FROZEN = 20, 10, 3
LORA = AdapterConfig(name="lora", r=4, alpha=8.0)
KINDS = ("bert", "llama_lm", "gpt2_lm", "vit")
"""BERT under a classification head (the first-token tail), a Llama and a GPT-2 (Conv1D, its LM head tied to
the embedding on the other stage) as language models, a timm ViT."""


def lora_model(kind: str):
    """pipeline_cases' tiny model of `kind` with LoRA adapters (the same seed: every process builds one model)."""
    return pc.model(kind, adapter=LORA)


def run_case(kind: str, rank: int, out_dir: Path) -> None:
    layered = lora_model(kind)
    n = len(layered.units)
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    builder = Builder(layered, rank, torch.device("cpu"), WeightedLoss(pc.task(kind)), pc.OPTIM, name_of)
    plan = pc.even_plan(n, 2, 1, 2, "1F1B")
    layout = build_engine(builder, plan)
    params = dict(layered.model.named_parameters())
    frozen = {name for u in range(FROZEN) for name in layered.unit_param_names(u)}
    losses, stray = [], []

    def update(item: Step, share: torch.Tensor | None) -> None:
        layout.runtime.sync_and_clip(pc.CLIP)
        if item.step >= FREEZE_AT:  # no frozen adapter and no base weight holds a gradient
            stray.extend(
                n
                for n in (layered.adapters & frozen) | layered.fixed
                if params[n].grad is not None and params[n].numel()
            )
        if layout.optimizer is not None:
            layout.optimizer.step()
        layout.runtime.zero_grad()
        losses.append(float(share) if share is not None else 0.0)

    step = 0
    while step < STEPS:
        count = FREEZE_AT - step if step < FREEZE_AT else STEPS - step
        for data in pc.steps(layered, kind, step, count):
            layout.runtime.run_step(data, update, 1.0, data.step == step + count - 1)
        step += count
        if step == FREEZE_AT:
            layout = change_engine(builder, layout, replace(plan, frozen_units=FROZEN))
    summed = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(summed)  # each step's loss: the last stage's share
    trained = sum(p.numel() for p in layout.optimizer.param_groups[0]["params"]) if layout.optimizer else 0
    process_group.save_rank({"losses": summed.tolist(), "stray": stray, "trained": trained}, out_dir, kind, rank)
    layout.groups.destroy()


PIPEDREAM_KINDS, PIPEDREAM_STEPS = ("bert", "gpt2_lm"), 6
"""BERT, its classification head training on the last stage, and GPT-2, whose LM head is tied to the
embedding on the other stage: a fixed weight, which never steps, so the stages stepping apart is no harm."""


def trained_bytes(layered, names) -> int:
    """Bytes of the parameters among `names` that train (the adapters and the task head)."""
    params = dict(layered.model.named_parameters())
    return sum(params[n].numel() * params[n].element_size() for n in set(names) - layered.fixed)


def run_pipedream(kind: str, rank: int, out_dir: Path) -> None:
    layered = lora_model(kind)
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    loss = WeightedLoss(pc.task(kind))
    plan = pd.plan_for(len(layered.units), 2, 1)
    layout = build_engine(Builder(layered, rank, torch.device("cpu"), loss, pd.SGD, name_of), plan)
    runtime = layout.runtime
    runtime.trace = []

    def update(_step: Step, _loss) -> None:
        runtime.sync_and_clip(0.0)
        if layout.optimizer is not None:
            layout.optimizer.step()
        runtime.zero_grad()

    for step in pd.steps(layered, loss.task, plan, rank, kind, 0, PIPEDREAM_STEPS):
        runtime.run_step(step, update, drain=step.step == PIPEDREAM_STEPS - 1)
    runtime.pause()
    params = dict(layered.model.named_parameters())
    held = {name for u in runtime.unit_indices for name in layered.unit_param_names(u)}
    saved = {
        "params": {n: params[n].detach().clone() for n in held},
        "trace": [{k: v for k, v in r.items() if k != "grads"} for r in runtime.trace],
        "stash_peak": runtime.stash_bytes_peak,
        "trained_bytes": trained_bytes(layered, held),
        "stage": runtime.stage,
    }
    process_group.save_rank(saved, out_dir, f"pipedream-{kind}", rank)
    layout.groups.destroy()


def run_cases(rank: int, kinds: list[str], pipedream_kinds: list[str], out_dir: Path) -> None:
    for kind in kinds:
        run_case(kind, rank, out_dir)
    for kind in pipedream_kinds:
        run_pipedream(kind, rank, out_dir)


def launch(kinds: list[str], pipedream_kinds: list[str], out_dir: Path) -> None:
    process_group.launch(run_cases, 2, "lora", list(kinds), list(pipedream_kinds), out_dir)


def peft_twin(layered, library):
    """`library` with ptrun's values, wrapped by peft's `get_peft_model` in the same LoraConfig; its task head
    trains as ptrun's does."""
    from peft import get_peft_model

    from ptrun.models.adapters import library_name

    ours = dict(layered.model.named_parameters())
    base = {library_name(n): p for n, p in ours.items() if n not in layered.adapters}
    missing = library.load_state_dict(base, strict=False).missing_keys
    assert all(library.get_parameter(m) is library.get_input_embeddings().weight for m in missing)  # a tied head
    twin = get_peft_model(library, layered.adapter_config)
    theirs = dict(twin.base_model.model.named_parameters())
    with torch.no_grad():
        for name in layered.adapters:
            theirs[name].copy_(ours[name])
    for name, p in theirs.items():
        p.requires_grad_(name not in layered.fixed)
    return twin
