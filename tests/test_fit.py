"""`pipe.length=auto`: the memory fit that picks the shortest pipeline whose largest stage fits a device."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from ptrun.config import ConfigError, ModelConfig, PtrunConfig, validate
from ptrun.layout.fill import Devices, MachineMemory, device_budget, memory_budget, resolve
from ptrun.layout.fit import (
    UnitMemory,
    check_fits,
    choose_length,
    measure_unit_memory,
    stage_bytes,
    state_copies,
)
from ptrun.models import build_model

MIB = 2**20


def config(**pipe) -> PtrunConfig:
    cfg = PtrunConfig(run_dir="/tmp/unused")
    cfg = replace(
        cfg,
        pipe=replace(cfg.pipe, schedule="1F1B", **pipe),
        train=replace(cfg.train, global_batch_size=32),
        auto=replace(cfg.auto, microbatch_table={2: 4, 4: 8}),
    )
    return cfg


# 10 units of 10 MiB of state each; 1 MiB of activations per sample
MEMORY = UnitMemory([10.0 * MIB] * 10, [1.0 * MIB] * 10)


def test_a_model_that_fits_one_device_trains_as_data_parallelism():
    choice = choose_length(MEMORY, config(), world_size=4, budget=10**12)
    assert (choice.length, choice.microbatches) == (1, 1)
    # K = 1 at DP = 4: a replica's batch of 8 as one micro-batch -> all ten units' state + 8 samples each
    assert choice.stage_bytes == choice.whole_bytes == pytest.approx(100 * MIB + 10 * 8 * MIB)


def test_the_shortest_pipeline_that_fits_is_chosen_with_its_micro_batches():
    # K = 1 needs 180 MiB; K = 2 (DP 2, 16 per replica, M = 4 from the table, 1F1B keeps 2 of 4 in flight):
    # 5 units x (10 + 4 samples x 2 in flight x 1) = 90 MiB per stage
    choice = choose_length(MEMORY, config(), world_size=4, budget=120 * MIB)
    assert (choice.length, choice.microbatches) == (2, 4)
    assert choice.stage_bytes == pytest.approx(90 * MIB)
    assert "K = 2" in choice.summary()
    # a budget between what K = 2 and K = 4 need picks 4
    assert choose_length(MEMORY, config(), world_size=4, budget=80 * MIB).length == 4


def test_an_explicit_micro_batch_count_is_kept():
    assert choose_length(MEMORY, config(microbatches=8), world_size=4, budget=120 * MIB).microbatches == 8


def test_nothing_fits_names_what_each_length_needs():
    with pytest.raises(ConfigError) as e:
        choose_length(MEMORY, config(), world_size=4, budget=10 * MIB)
    assert str(e.value) == (
        "pipe.length=auto: no layout fits 4 workers: K=1: the largest stage needs ~0.18 GiB, a device offers 0.01 "
        "GiB; K=2: the largest stage needs ~0.09 GiB, a device offers 0.01 GiB; K=4: the largest stage needs "
        "~0.08 GiB, a device offers 0.01 GiB; use more workers, a smaller batch, pipe.recompute, or set "
        "device.memory"
    )


def with_batch(cfg: PtrunConfig, global_batch: int) -> PtrunConfig:
    return replace(cfg, train=replace(cfg.train, global_batch_size=global_batch))


# Two workers and a batch of 1: no data-parallel width divides it (K = 1), and 1F1B needs at least 2
# micro-batches at K = 2. Memory is plentiful: the refusal must not talk about it.
BATCH_OF_ONE = (
    "pipe.length=auto: no layout fits 2 workers: K=1: train.global_batch_size=1 cannot be split evenly "
    "over a data-parallel width of 2; K=2: no micro-batch count divides the per-replica batch 1 and "
    "suits pipe.schedule=1F1B at pipe.length=2 (at least pipe.length=2 for 1F1B)"
)


def test_a_batch_no_layout_can_split_names_the_batch_rule_of_each_length():
    with pytest.raises(ConfigError) as e:
        choose_length(MEMORY, with_batch(config(), 1), world_size=2, budget=10**12)
    assert str(e.value) == BATCH_OF_ONE


def test_a_batch_no_layout_can_split_is_refused_before_the_start():
    """On one machine the world size is known when the config is validated: the same line, no worker."""
    cfg = with_batch(config(length="auto"), 1)
    cfg = replace(cfg, launcher=replace(cfg.launcher, nproc_per_node=2))
    with pytest.raises(ConfigError) as e:
        validate(cfg, paths=False)
    assert str(e.value) == BATCH_OF_ONE
    validate(with_batch(cfg, 2), paths=False)  # K = 1 over DP 2 works: memory decides in the workers


def test_memory_picks_the_length_and_the_rules_are_named_at_it():
    """K = 1 fits memory but 3 samples do not split over 2 replicas: the refusal names that rule, even though
    K = 2 would split them (a pipeline appears only when memory asks for one)."""
    with pytest.raises(
        ConfigError,
        match=r"^train.global_batch_size=3 is not allowed: a multiple of the "
        r"data-parallel width 2$",
    ):
        resolve(with_batch(config(length="auto"), 3), 2, Devices(10**12, MEMORY))
    # a length whose batch rule is broken still counts for memory: here no length fits
    with pytest.raises(
        ConfigError,
        match=r"K=1: train.global_batch_size=3 cannot be split evenly over a "
        r"data-parallel width of 2; K=2: the largest stage needs",
    ):
        choose_length(MEMORY, with_batch(config(), 3), world_size=2, budget=10 * MIB)


def test_measured_activations_scale_with_the_units_and_exclude_weights():
    torch.manual_seed(0)
    layered = build_model(
        ModelConfig(
            name="vit_tiny_patch16_224", img_size=16, patch_size=4, in_chans=3, embed_dim=32, depth=2, num_heads=2
        ),
        num_classes=10,
    )
    sample = (torch.randn(1, 3, 16, 16),)
    state_before = torch.random.get_rng_state()
    memory = measure_unit_memory(layered, sample, "adamw")
    assert torch.equal(torch.random.get_rng_state(), state_before), "measuring must not move the RNG"
    params = [sum(p.numel() for p in unit.parameters()) for unit in layered.units]
    assert memory.state_bytes == [4.0 * 4 * n for n in params]  # param + grad + two AdamW moments, fp32
    tokens, width = 17, 32
    for act in memory.activation_bytes[1:-1]:  # each half-block keeps several token x width tensors
        assert 2 * tokens * width * 4 <= act <= 40 * tokens * width * 4
    # weights (saved by the linear layers for backward) are not counted: far below the MLP's weight bytes
    assert memory.activation_bytes[2] < params[2] * 4


def test_resolve_fills_in_an_unset_micro_batch_count_for_an_explicit_length():
    cfg, choice = resolve(config(length=2), 4, Devices(0))
    assert choice is None and (cfg.pipe.length, cfg.pipe.microbatches) == (2, 4)


def test_auto_length_refuses_explicit_stages():
    cfg = config(length="auto", partition="explicit", stages=[[0, 4], [4, 14]])
    with pytest.raises(ConfigError, match="pipe.length"):
        validate(cfg)


def test_a_plans_stages_are_priced_and_one_that_does_not_fit_is_named():
    from ptrun.layout.plan import Plan

    # K = 2 over 4 workers (DP 2): 16 samples a replica, M = 4, GPipe keeps all 4 micro-batches in flight
    plan = Plan(
        num_units=10, frozen_units=0, pp=2, dp=2, stage_bounds=((0, 3), (3, 10)), microbatches=4, schedule="GPipe"
    ).check()
    assert stage_bytes(MEMORY, plan, 32) == pytest.approx([3 * (10 + 16) * MIB, 7 * (10 + 16) * MIB])
    assert check_fits(MEMORY, plan, 32, 200 * MIB) == stage_bytes(MEMORY, plan, 32)
    with pytest.raises(
        ConfigError, match=r"pipe.length=2: stage 1 \(units 3-9\) needs ~0.18 GiB, a device offers 0.10"
    ):
        check_fits(MEMORY, plan, 32, 100 * MIB)


def test_the_trainer_and_the_planner_give_a_stage_the_same_share_of_a_device(monkeypatch):
    from ptrun.sim.cluster import GB, get_cluster

    cfg = PtrunConfig(run_dir="/tmp/unused")
    assert memory_budget(None, 1000) == 900 and memory_budget("50%", 1000) == 500
    assert memory_budget("1KB", 10) == 1024  # a size is taken as it is
    assert device_budget(cfg, get_cluster("paper")) == memory_budget(None, 32 * GB)
    assert device_budget(cfg, get_cluster("paper", {"device_memory_gb": "0"})) == memory_budget(None, 512 * GB // 8)
    assert device_budget(replace(cfg, device=replace(cfg.device, memory="2GB")), get_cluster("paper")) == 2 * 2**30
    # one budget for a simulated cluster, the launching machine and a worker's own device
    assert device_budget(cfg, MachineMemory(None, 512 * 10**9, 8)) == memory_budget(None, 512 * GB // 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert device_budget(cfg, torch.device("cpu")) == device_budget(cfg, MachineMemory(None, host, 2))
    assert device_budget(cfg, torch.device("cpu")) == memory_budget(None, host // 2)


def test_parameter_gradient_and_optimizer_state_copies():
    assert (state_copies("adamw"), state_copies("sgd")) == (4, 3)


# ---- filled by the launcher, from the planner's stand-in ----------------------------------------------------


def test_the_launcher_fills_the_length_and_micro_batches_from_the_stand_in():
    """`pipe.length=auto` and an unset micro-batch count become numbers before any worker starts: the digits ViT
    fits a device (K = 1, M = 1); a device of 64 KiB fits no layout, named in one error; an explicit length
    keeps its value and gets the micro-batches that follow it; nothing `auto` comes back as it was."""
    from ptrun.compose import compose, for_launch

    digits = compose(["recipe=digits_vit", "launcher.nproc_per_node=2"])
    assert (digits.pipe.length, digits.pipe.microbatches) == ("auto", None)
    filled, choice = for_launch(digits)
    assert (filled.pipe.length, filled.pipe.microbatches, choice.length) == (1, 1, 1)
    assert choice.summary().startswith("pipe.length=auto: the model needs ~0.0")
    with pytest.raises(ConfigError, match="pipe.length=auto: no layout fits 2 workers: K=1: the largest stage"):
        for_launch(replace(digits, device=replace(digits.device, memory="64KB")))
    explicit, choice = for_launch(compose(["recipe=digits_vit", "launcher.nproc_per_node=2", "pipe.length=2"]))
    assert (explicit.pipe.length, explicit.pipe.microbatches, choice) == (2, 2, None)  # auto.microbatch_table
    assert for_launch(filled) == (filled, None)


@pytest.mark.slow
def test_the_launcher_fills_the_layout_without_the_simulator():
    """The launch's modules and its layout step (`for_launch`, on the model's analytic costs) import no module
    of `ptrun.sim`: the costs sit below the layout."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import ptrun.cli, ptrun.cli_train, ptrun.launcher.launch\n"
        "from ptrun.compose import compose, for_launch\n"
        "cfg, choice = for_launch(compose(['recipe=digits_vit', 'launcher.nproc_per_node=2']))\n"
        "assert choice is not None and cfg.pipe.length == 1, (cfg.pipe, choice)\n"
        "print(sorted(m for m in sys.modules if m == 'ptrun.sim' or m.startswith('ptrun.sim.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
