"""The planner prices a LoRA step (`adapter=lora`, `ptrun.costs.adapters`): it counts the adapters and the
trained head per unit as the model builds them, keeps gradients and optimizer state for those only, prices a
block's backward as its input gradient plus the adapters' weight gradient (about two forwards against full
fine-tuning's three), and so `pipe.length=auto` picks a shorter pipeline where LoRA's state fits a device."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ptrun.compose import compose, for_launch
from ptrun.costs.adapters import adapter_params, trained_params, trained_share
from ptrun.costs.from_config import costs_from_config
from ptrun.layout.fill import fit_memory
from ptrun.layout.fit import choose_length, state_copies
from ptrun.models import build_model
from ptrun.sim.cluster import get_cluster
from ptrun.sim.pricing import adapter_seconds, frozen_grad_seconds, step_time, unit_seconds
from ptrun.sim.simulate import plan_epochs

LORA, FULL = ["recipe=bbc_news_lora"], ["recipe=bbc_news_lora", "adapter=none"]
"""The embedded default's MiniLM with LoRA, and the same run as full fine-tuning."""


@pytest.mark.parametrize(
    "recipe,data",
    [
        (["recipe=digits_vit", "adapter=lora"], dict(num_classes=10, img_size=8, in_chans=1)),
        (["recipe=bbc_news_lora", "model.num_classes=2"], dict(num_classes=2)),
        (["recipe=bbc_news_lora", "model.num_classes=2", "adapter.targets=[query,value]"], dict(num_classes=2)),
        (
            ["recipe=bbc_news_lora", "model.num_classes=2", "adapter.targets=[attention.output.dense]"],
            dict(num_classes=2),
        ),
        (
            [
                "recipe=bbc_news_lora",
                "model.num_classes=2",
                "adapter.exclude=[intermediate.dense]",
                "adapter.dora=true",
            ],
            dict(num_classes=2),
        ),
        (
            ["recipe=bbc_news_lora", "model.num_classes=2", r"adapter.targets='.*layer\.[0-2]\..*(query|value)'"],
            dict(num_classes=2),
        ),
        (["recipe=digits_vit", "adapter=lora", "adapter.dora=true"], dict(num_classes=10, img_size=8, in_chans=1)),
    ],
    ids=["vit", "minilm", "minilm-query-value", "minilm-dotted-end", "minilm-exclude-dora", "minilm-regex", "vit-dora"],
)
def test_the_planner_counts_what_lora_trains_as_the_model_builds_it(recipe, data):
    """Per unit, the adapters' elements and the trained ones (adapters and the head's classifier) are those of
    the model ptrun builds with peft from the same config (on the meta device: nothing allocated)."""
    cfg = compose(recipe)
    costs = costs_from_config(cfg.model, cfg.data)
    layered = build_model(cfg.model, units=(), adapter=cfg.adapter, **data)
    shapes = layered.param_shapes

    def per_unit(names) -> list[int]:
        return [
            sum(shapes[n].numel() for n in layered.unit_param_names(u) if n in names) for u in range(costs.num_units)
        ]

    assert per_unit(layered.adapters) == adapter_params(costs, cfg)
    assert per_unit(set(shapes) - layered.fixed) == trained_params(costs, cfg)
    assert per_unit(set(shapes)) == [p + a for p, a in zip(costs.params, adapter_params(costs, cfg), strict=True)]


def test_lora_keeps_gradients_and_optimizer_state_for_what_trains_only():
    """A unit's state is its weights (the base and the adapters) once, and a gradient and AdamW's two moments of
    what trains: a tenth of full fine-tuning's for MiniLM with rank-8 adapters on every projection."""
    lora, full = compose(LORA), compose(FULL)
    costs = costs_from_config(lora.model, lora.data)
    assert costs == costs_from_config(full.model, full.data)
    added, trained = adapter_params(costs, lora), trained_params(costs, lora)
    copies = state_copies("adamw")
    assert fit_memory(costs, full).state_bytes == [4.0 * copies * p for p in costs.params]
    assert fit_memory(costs, lora).state_bytes == [
        4.0 * (p + a) + 4.0 * (copies - 1) * t for p, a, t in zip(costs.params, added, trained, strict=True)
    ]
    assert 0 < sum(trained) < 0.02 * sum(costs.params)
    assert sum(fit_memory(costs, lora).state_bytes) < 0.3 * sum(fit_memory(costs, full).state_bytes)
    assert fit_memory(costs, lora).activation_bytes == fit_memory(costs, full).activation_bytes


def test_a_lora_block_is_priced_at_its_forward_its_input_gradient_and_its_adapters_weight_gradient():
    """With the FLOP model (backward = 2 forwards, half of it the input gradient): a LoRA block costs 2 + s
    forwards, s the share of its weights that trains (under 5% here), against full fine-tuning's 3; the
    embedding, with nothing to train below every adapter, runs its forward only; the step's compute is about a
    third shorter, and the gradients' all-reduce carries the trained elements only."""
    lora, full = compose(LORA), compose(FULL)
    costs, cluster = costs_from_config(lora.model, lora.data), get_cluster("paper")
    fb, fwd = unit_seconds(costs, cluster)
    share = trained_share(costs, lora)
    priced, untrained = adapter_seconds(fb, frozen_grad_seconds(costs, cluster), share)
    assert untrained == 1 and share[0] == 0
    for u in range(1, costs.num_units - 1):
        assert 0 < share[u] < 0.05
        assert priced[u] == pytest.approx((2 + share[u]) * fwd[u])
    assert adapter_seconds(fb, frozen_grad_seconds(costs, cluster), trained_share(costs, full))[0] == fb
    times = {}
    for name, cfg in (("lora", lora), ("full", full)):
        cfg = replace(cfg, launcher=replace(cfg.launcher, nproc_per_node=cluster.gpus_per_node, nnodes="1"))
        plan = plan_epochs(costs, cluster, cfg)[1][0]
        times[name] = step_time(plan, costs, cluster, cfg, cfg.train.global_batch_size // plan.dp, 1000, 0)
    compute = {k: t.pipeline_s - cluster.microbatch_overhead_s for k, t in times.items()}  # K = 1, M = 1
    assert 0.6 < compute["lora"] / compute["full"] < 0.7
    assert times["lora"].total_s < times["full"].total_s
    assert times["lora"].allreduce_s < times["full"].allreduce_s / 10


def test_pipe_length_auto_picks_a_shorter_pipeline_for_lora():
    """A device that holds MiniLM with LoRA whole but not fully fine-tuned (its budget between the two, from
    the memory model's own numbers): the launcher fills K = 1 for LoRA and K = 2 for full fine-tuning."""
    lora, full = (compose([*r, "launcher.nproc_per_node=2", "pipe.length=auto"]) for r in (LORA, FULL))
    costs = costs_from_config(lora.model, lora.data)
    whole = {
        name: choose_length(fit_memory(costs, cfg), cfg, world_size=2, budget=2**50).whole_bytes
        for name, cfg in (("lora", lora), ("full", full))
    }
    assert whole["lora"] < whole["full"]
    budget = f"{int((whole['lora'] + whole['full']) / 2)}B"
    chosen = {}
    for name, cfg in (("lora", lora), ("full", full)):
        filled, choice = for_launch(replace(cfg, device=replace(cfg.device, memory=budget)))
        chosen[name] = (filled.pipe.length, choice.length)
    assert chosen == {"lora": (1, 1), "full": (2, 2)}


@pytest.mark.slow
def test_ptrun_plan_says_what_trains_and_prices_a_lora_device_lower(tmp_path):
    """`ptrun plan` names the trained parameters beside the total, and its first layout's device needs less
    under LoRA than under full fine-tuning of the same model."""
    import re

    from conftest import run_ptrun

    need = {}
    for adapter in ("lora", "none"):
        out = run_ptrun("plan", "recipe=bbc_news_lora", f"adapter={adapter}", "--samples", "2000", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        trains = "(0.33 M trained: adapter=lora)" in out.stdout.splitlines()[0]
        assert trains == (adapter == "lora"), out.stdout.splitlines()[0]
        need[adapter] = float(re.search(r"stage 0 ~([\d.]+) GiB", out.stdout).group(1))
    assert need["lora"] < need["none"] / 2
