"""`ptrun plan`: analytic costs, the time model on hand-made plans, the Controller's plans, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import compose_config, with_test_recipe
from helpers.metrics import write_simulated
from hf_families import LLAMA_3_8B

from ptrun.auto.controller import Controller
from ptrun.cli import main
from ptrun.compose import compose
from ptrun.costs.units import ModelCosts, bert_costs
from ptrun.freezing.policies import make_policy
from ptrun.layout.first import first_plan, param_costs
from ptrun.layout.plan import Plan
from ptrun.sim import costs_from_config, get_cluster, load_profile, save_profile, speedups, vit_costs
from ptrun.sim.cluster import Cluster
from ptrun.sim.simulate import (
    COMBINATIONS,
    combination_config,
    frozen_grad_seconds,
    pipeline_seconds,
    plan_epochs,
    plannable,
    sharing_slowdown,
    simulate,
    stand_in,
    step_time,
    total_seconds,
    update_seconds,
)

ONE_TFLOP = Cluster(
    "test",
    nodes=1,
    gpus_per_node=4,
    peak_tflops=1.0,
    efficiency=1.0,
    intra_gbs=1.0,
    inter_gbs=0.5,
    host_gbs=1.0,
    host_memory_gb=1.0,
    disk_gbs=1.0,
    transition_s=0.0,
)
"""1e12 FLOP/s, 1 GB/s inside a node, 0.5 GB/s between nodes, no fixed costs: easy arithmetic."""

TOY = ModelCosts(
    names=("embed", "block.0.attn", "block.0.mlp", "head"),
    params=(10.0, 20.0, 30.0, 40.0),
    act_bytes=(100.0, 100.0, 100.0, 10.0),
    fwd_flops=(1e9, 2e9, 3e9, 1e9),
)


def toy_plan(**kw) -> Plan:
    base = dict(
        num_units=4, frozen_units=0, pp=2, dp=2, stage_bounds=((0, 2), (2, 4)), microbatches=2, schedule="GPipe"
    )
    return Plan(**{**base, **kw}).check()


PAPER_START = ("pipe.length=8", "pipe.microbatches=16")
"""The paper's first pipeline, 8 GPUs long in 16 micro-batches (a recipe's own length follows the memory of the
machine it starts on)."""


def paper_config(recipe: str, tmp_path, *extra: str, start: tuple[str, ...] = PAPER_START):
    """A paper recipe as the paper ran it: two machines of 8 GPUs, the first pipeline `start` (8 long), the
    global batch of its two pipelines (`ptrun plan` fills it so for `cluster=paper`); its config and costs."""
    from ptrun.layout.fill import fill_batch

    cfg = compose(
        with_test_recipe(
            [
                f"recipe={recipe}",
                f"data.path={tmp_path}",
                f"model.pretrained={tmp_path}",
                *start,
                "launcher.nnodes=2",
                *extra,
            ]
        ),
        run_dir=tmp_path,
        recipe="test",
    )
    cfg = fill_batch(cfg, 16)
    return cfg, costs_from_config(cfg.model, cfg.data)


# ---- analytic costs ------------------------------------------------------------------------------------


def test_vit_b16_units_match_the_textbook_formulas():
    c = vit_costs(img_size=224, patch_size=16, embed_dim=768, depth=12, num_classes=1000)
    n, d = 197, 768
    assert c.names[:3] == ("embed", "block.0.attn", "block.0.mlp") and c.names[-1] == "head" and c.num_units == 26
    assert c.fwd_flops[1] == 4 * n * d**2 * 2 + 2 * n**2 * d * 2  # qkv + proj, q k^T + attn v
    assert c.fwd_flops[2] == 2 * n * d * 4 * d * 2  # fc1 + fc2
    assert c.fwd_flops[0] == 2 * 196 * (3 * 16 * 16) * d  # the patch convolution
    assert sum(c.params) == 86_567_656  # timm's vit_base_patch16_224
    assert c.act_bytes[0] == c.act_bytes[24] == n * d * 4  # 0.6 MB a sample between units (fp32)
    assert sum(c.fwd_flops) == pytest.approx(35.13e9, rel=1e-3)  # the 17.6 GMAC usually quoted


def test_bert_large_qa_parameters_match_hugging_face():
    c = bert_costs(seq_len=256, hidden=1024, depth=24, intermediate=4096, task="qa")
    # BertModel(bert-large) with its pooler has 335,141,888; the QA model drops the pooler, adds qa_outputs
    assert sum(c.params) == 335_141_888 - (1024 * 1024 + 1024) + 2 * 1024 + 2
    assert c.num_units == 50 and c.fwd_flops[0] == 0  # embedding lookups: no matmul
    assert c.act_bytes[1] == 256 * 1024 * 4 + 256 * 4  # hidden state + the additive mask


def test_analytic_sizes_equal_the_built_models(tmp_path):
    from ptrun.models import build_model
    from ptrun.parallel.profile import profile_units

    cfg, costs = paper_config("digits_vit", tmp_path)
    model = build_model(replace(cfg.model, pretrained=None), num_classes=10, img_size=8, in_chans=1)
    assert list(costs.params) == param_costs(model)  # what the Controller balances in a real run
    import torch

    prof = profile_units(model, (torch.zeros(2, 1, 8, 8),), torch.device("cpu"), repeats=1)
    assert [2 * a for a in costs.act_bytes] == prof.activation_bytes


@pytest.mark.parametrize("task", ["classification", "qa"])
def test_analytic_sizes_follow_the_last_layer_a_classification_head_reads(task):
    import torch

    from ptrun.config import ModelConfig
    from ptrun.models import build_model
    from ptrun.parallel.profile import profile_units

    layered = build_model(
        ModelConfig(name="bert-tiny", depth=2, embed_dim=32, num_heads=2, vocab_size=100, task=task), num_classes=3
    )
    costs = bert_costs(seq_len=9, hidden=32, depth=2, intermediate=128, vocab_size=100, task=task, num_labels=3)
    ids = torch.randint(1, 100, (2, 9))
    prof = profile_units(layered, (ids, torch.ones_like(ids), torch.zeros_like(ids)), torch.device("cpu"), repeats=1)
    assert [2 * a for a in costs.act_bytes] == prof.activation_bytes  # one row out of the last layer's halves
    assert stand_in(costs).sequence_units == layered.sequence_units == (3 if task == "classification" else 6)
    whole = bert_costs(seq_len=9, hidden=32, depth=2, intermediate=128, vocab_size=100, task="qa")
    assert (costs.fwd_flops[-3] < whole.fwd_flops[-3]) == (task == "classification")  # the last MLP: one token


def test_costs_from_the_recipes(tmp_path):
    _, vit = paper_config("vit_cifar100", tmp_path)
    assert vit.params[-1] == 2 * 768 + 768 * 100 + 100  # CIFAR-100's head, at 224 px (data.image_size)
    _, bert = paper_config("bert_squad", tmp_path)
    assert bert.act_bytes[1] == 256 * 1024 * 4 + 256 * 4  # data.max_length=256


def test_profile_round_trip_and_errors(tmp_path):
    from types import SimpleNamespace

    path = tmp_path / "p.json"
    save_profile(SimpleNamespace(time_s=[0.4, 0.8, 1.2, 0.4], activation_bytes=[400.0] * 4), 4, path)
    costs = load_profile(path, TOY)
    assert costs.fb_seconds == (0.1, 0.2, 0.3, 0.1) and costs.act_bytes == (100.0,) * 4
    assert costs.params == TOY.params
    path.write_text(json.dumps({"batch": 4, "time_s": [1.0], "activation_bytes": [1.0]}))
    with pytest.raises(ValueError, match="time_s must list 4 finite numbers"):
        load_profile(path, TOY)


# ---- the time model on hand-made plans -----------------------------------------------------------------


def test_step_time_of_a_hand_made_plan(tmp_path):
    cfg, _ = paper_config("vit_cifar100", tmp_path)
    # 4 samples a replica, M = 2: micro-batches of 2. Trainable units cost 3 x forward: 3, 6, 9, 3 ms a sample.
    st = step_time(toy_plan(), TOY, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=0)
    stage0 = 2 * (3e-3 + 6e-3) + 2 * (2 * 100 / 1e9)  # compute + activation out and gradient back
    stage1 = 2 * (9e-3 + 3e-3)
    assert st.stage_s == pytest.approx((stage0, stage1), rel=1e-12)
    # Fill and drain once (both stages), then M - 1 = 1 more micro-batch at the slower stage's pace. (Changed
    # from (M + K - 1) x slowest = 3 x stage1: the two agree only for balanced stages.)
    assert st.pipeline_s == pytest.approx(stage0 + stage1 + stage1, rel=1e-12)
    assert st.allreduce_s == pytest.approx(1 * 4 * 70 / 1e9)  # ring 2(DP-1)/DP = 1, the larger stage's fp32
    assert st.total_s == pytest.approx(st.pipeline_s + st.allreduce_s, rel=1e-12)
    assert st.update_s == 0 and st.slowdown == 1  # no measured update, no CPU sharing

    # Units 0-1 frozen: forward only (1 x), nothing of it to all-reduce. The gradient still comes back to
    # stage 0 (changed from 1 move: stage 1's received activation requires a gradient, so it sends one).
    st = step_time(toy_plan(frozen_units=2), TOY, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=0)
    assert st.stage_s[0] == pytest.approx(2 * (1e-3 + 2e-3) + 2 * (2 * 100 / 1e9), rel=1e-12)
    assert st.allreduce_s == pytest.approx(4 * 70 / 1e9)

    # Replicas on two nodes: every stage's ring crosses the one inter-node link, which carries all stages.
    two_nodes = replace(ONE_TFLOP, nodes=2, gpus_per_node=2)
    st = step_time(toy_plan(), TOY, two_nodes, cfg, per_replica=4, samples=100, filled=0)
    assert st.allreduce_s == pytest.approx(4 * (30 + 70) / 0.5e9)


def test_cached_prefix_costs_a_read_and_a_fill_once(tmp_path):
    cfg, _ = paper_config("vit_cifar100", tmp_path)  # cache.max_memory 50% of 1 GB: everything fits
    plan = toy_plan(frozen_units=1, cached_units=1)
    fill = step_time(plan, TOY, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=0)
    assert fill.cache_read_s == 0 and fill.cache_fill_s == pytest.approx(4 * 1e-3 + 4 * 100 / 1e9)
    hit = step_time(plan, TOY, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=1)
    assert hit.cache_fill_s == 0 and hit.cache_read_s == pytest.approx(4 * 100 / 1e9)
    assert hit.stage_s[0] == pytest.approx(2 * 6e-3 + 2 * 2 * 100 / 1e9)  # unit 0 runs in no stage
    assert hit.total_s == pytest.approx(max(hit.cache_read_s, hit.pipeline_s) + hit.allreduce_s)


MEASURED = replace(
    TOY,
    fb_seconds=(3e-3, 6e-3, 9e-3, 3e-3),
    fwd_seconds=(0.5e-3, 1.5e-3, 2e-3, 1e-3),
    frozen_seconds=(2e-3, 5e-3, 7e-3, 2e-3),
    update_seconds=(1e-3, 2e-3, 3e-3, 4e-3),
)
"""TOY with a measured profile: per-sample forward + backward, forward alone, frozen with an input gradient
(per sample), and the optimizer update per step of each unit."""


def test_a_measured_profile_prices_a_known_plan(tmp_path):
    cfg, _ = paper_config("vit_cifar100", tmp_path)
    costs = replace(
        ONE_TFLOP,
        microbatch_overhead_s=1e-3,
        link_latency_s=1e-4,
        loader_batch_s=2e-3,
        loader_samples_s=1000.0,
        step_overhead_s=5e-4,
        overlap_io=False,
    )
    st = step_time(toy_plan(), MEASURED, costs, cfg, per_replica=4, samples=100, filled=0)
    # micro-batches of 2: overhead + compute + (activation out, gradient back: latency + bytes each)
    stage0 = 1e-3 + 2 * (3e-3 + 6e-3) + 2 * (1e-4 + 2 * 100 / 1e9)
    stage1 = 1e-3 + 2 * (9e-3 + 3e-3)
    assert st.stage_s == pytest.approx((stage0, stage1), rel=1e-12)
    assert st.pipeline_s == pytest.approx(stage0 + stage1 + (2 - 1) * stage1, rel=1e-12)
    # ring of 2 replicas: 2 steps of latency + the larger stage's fp32 bytes; the clip's norm over K = 2: 2 more
    assert st.allreduce_s == pytest.approx(2 * 1e-4 + 4 * 70 / 1e9 + 2 * 1e-4, rel=1e-12)
    assert st.update_s == pytest.approx(3e-3 + 4e-3)  # the slower rank: units 2 and 3
    assert st.load_s == pytest.approx(2e-3 + 4 / 1000.0)  # a batch of 4 raw samples
    # nothing overlaps on this cluster: loading, then the pipeline, the all-reduce, the update, the overhead
    assert st.total_s == pytest.approx(st.load_s + st.pipeline_s + st.allreduce_s + st.update_s + 5e-4, rel=1e-12)


def test_a_frozen_unit_costs_its_forward_on_the_first_stage_only(tmp_path):
    cfg, _ = paper_config("vit_cifar100", tmp_path)
    # units 0-2 frozen: 0 and 1 on stage 0 (forward only), 2 on stage 1, whose input needs a gradient
    st = step_time(toy_plan(frozen_units=3), MEASURED, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=0)
    assert st.stage_s[0] == pytest.approx(2 * (0.5e-3 + 1.5e-3) + 2 * (2 * 100 / 1e9), rel=1e-12)
    assert st.stage_s[1] == pytest.approx(2 * (7e-3 + 3e-3), rel=1e-12)
    assert st.update_s == pytest.approx(4e-3)  # only the head trains
    # Without measured forward / frozen times: forward = fb / 3 and frozen = forward + half the backward
    st = step_time(toy_plan(frozen_units=3), TOY, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=0)
    assert st.stage_s[0] == pytest.approx(2 * (1e-3 + 2e-3) + 2 * (2 * 100 / 1e9), rel=1e-12)
    assert st.stage_s[1] == pytest.approx(2 * (2 * 3e-3 + 3e-3), rel=1e-12)
    assert frozen_grad_seconds(TOY, ONE_TFLOP) == pytest.approx([2e-3, 4e-3, 6e-3, 2e-3])


def test_the_cache_term_replaces_raw_loading_on_the_first_stage(tmp_path):
    cfg, _ = paper_config("vit_cifar100", tmp_path)
    cpu = replace(
        ONE_TFLOP,
        loader_batch_s=2e-3,
        loader_samples_s=1000.0,
        cache_batch_s=1e-3,
        cache_sample_s=1e-4,
        overlap_io=False,
    )
    raw = 2e-3 + 4 / 1000.0
    entry_io = 4 * 100 / 1e9 + 4 * 1e-4  # bytes from memory + the per-entry cost
    # K = 2, a settled cache: stage 0 reads the entries, stage 1 still loads the raw batch (for its labels)
    hit = step_time(toy_plan(frozen_units=1, cached_units=1), MEASURED, cpu, cfg, per_replica=4, samples=100, filled=1)
    assert hit.cache_read_s == pytest.approx(1e-3 + entry_io) and hit.cache_fill_s == 0
    assert hit.total_s == pytest.approx(
        max(hit.cache_read_s, raw) + hit.pipeline_s + hit.allreduce_s + hit.update_s, rel=1e-12
    )
    # K = 1: the only stage is the first, so no raw samples are loaded at all
    k1 = Plan(
        num_units=4,
        frozen_units=1,
        cached_units=1,
        pp=1,
        dp=4,
        stage_bounds=((0, 4),),
        microbatches=1,
        schedule="GPipe",
    ).check()
    st = step_time(k1, MEASURED, cpu, cfg, per_replica=4, samples=100, filled=1)
    assert st.pipeline_s == pytest.approx(4 * (6e-3 + 9e-3 + 3e-3), rel=1e-12)  # unit 0 runs nowhere
    assert st.total_s == pytest.approx(st.cache_read_s + st.pipeline_s + st.allreduce_s + st.update_s, rel=1e-12)
    # The fill epoch: the raw batch is loaded for the misses, the prefix runs forward, the entries are written
    fill = step_time(k1, MEASURED, cpu, cfg, per_replica=4, samples=100, filled=0)
    assert fill.cache_read_s == pytest.approx(1e-3)
    assert fill.cache_fill_s == pytest.approx(4 * 0.5e-3 + entry_io)
    assert fill.total_s == pytest.approx(
        raw + 1e-3 + fill.cache_fill_s + fill.pipeline_s + fill.allreduce_s + fill.update_s, rel=1e-12
    )


def test_pipeline_makespan_and_per_rank_updates():
    plan = Plan(
        num_units=6, frozen_units=0, pp=3, dp=1, stage_bounds=((0, 2), (2, 4), (4, 6)), microbatches=4, schedule="1F1B"
    ).check()
    assert pipeline_seconds(plan, [1.0, 3.0, 2.0]) == pytest.approx(1 + 3 + 2 + 3 * 3)  # sum + (M - 1) max
    assert pipeline_seconds(plan, [2.0, 2.0, 2.0]) == pytest.approx((4 + 3 - 1) * 2)  # balanced: (M + K - 1) t
    costs = replace(
        MEASURED,
        names=tuple(f"u{i}" for i in range(6)),
        params=(1.0,) * 6,
        act_bytes=(1.0,) * 6,
        update_seconds=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0),
    )
    assert update_seconds(replace(plan, frozen_units=3), costs) == [0.0, 4.0, 11.0]


def test_cpu_sharing_stretches_a_busy_step_more():
    shared = replace(ONE_TFLOP, nodes=1, gpus_per_node=2, cores_per_node=2.0, background_load=1.0)
    k1 = Plan(num_units=4, frozen_units=0, pp=1, dp=2, stage_bounds=((0, 4),), microbatches=1, schedule="GPipe").check()
    k2 = toy_plan(dp=1)
    # two replicas busy the whole step + 1 background process on 2 cores: 1.5 x
    assert sharing_slowdown(k1, shared, busy_s=1.0, step_s=1.0) == pytest.approx(1.5)
    # a pipeline whose two ranks are busy 1.2 of the step's seconds between them: (1.2 + 1) / 2
    assert sharing_slowdown(k2, shared, busy_s=1.2, step_s=1.0) == pytest.approx(1.1)
    assert sharing_slowdown(k2, shared, busy_s=0.5, step_s=1.0) == 1.0  # enough cores: no stretch
    assert sharing_slowdown(k1, replace(shared, background_load=0.0), busy_s=1.0, step_s=1.0) == 1.0
    # cores worth less than one per worker (two workers slow each other down): a busy step stretches alone
    assert sharing_slowdown(
        k1, replace(shared, background_load=0.0, cores_per_node=1.6), busy_s=1.0, step_s=1.0
    ) == pytest.approx(2 / 1.6)
    assert sharing_slowdown(k1, replace(shared, cores_per_node=0.0), busy_s=1.0, step_s=1.0) == 1.0


# the measured profile's own round trip and bad field, in the form of the plain profile's test above
def test_measured_profile_round_trip(tmp_path):
    from types import SimpleNamespace

    path = tmp_path / "p.json"
    prof = SimpleNamespace(
        time_s=[0.4, 0.8, 1.2, 0.4], activation_bytes=[400.0] * 4, forward_s=[0.1] * 4, frozen_s=[0.3] * 4
    )
    save_profile(prof, 4, path, update_s=[0.5, 0.5, 0.5, 0.0])
    costs = load_profile(path, TOY)
    assert costs.fwd_seconds == (0.025,) * 4 and costs.frozen_seconds == (0.075,) * 4  # per sample
    assert costs.update_seconds == (0.5, 0.5, 0.5, 0.0)  # per step, not divided by the batch
    doc = json.loads(path.read_text())
    doc["update_s"] = [1.0]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="update_s must list 4 finite numbers"):
        load_profile(path, TOY)


def test_profile_units_detail_times_frozen_and_forward_passes(tmp_path):
    import torch

    from ptrun.models import build_model
    from ptrun.parallel.profile import profile_units

    cfg, _ = paper_config("digits_vit", tmp_path)
    model = build_model(replace(cfg.model, pretrained=None), num_classes=10, img_size=8, in_chans=1)
    model.units[1].requires_grad_(False)  # a frozen unit stays frozen, the others stay trainable
    prof = profile_units(model, (torch.zeros(2, 1, 8, 8),), torch.device("cpu"), repeats=1, detail=True)
    assert len(prof.forward_s) == len(prof.frozen_s) == len(prof.time_s) == len(model.units)
    assert all(t > 0 for t in prof.forward_s + prof.frozen_s)
    assert [all(p.requires_grad for p in u.parameters()) for u in model.units] == [
        u != 1 for u in range(len(model.units))
    ]
    assert all(p.grad is None for p in model.parameters())
    assert profile_units(model, (torch.zeros(2, 1, 8, 8),), torch.device("cpu"), repeats=1).forward_s is None


@pytest.mark.slow
def test_the_validator_replays_the_runs_freeze_schedule_and_fits_the_load(tmp_path):
    from conftest import write_config

    from benchmarks import simulator_check as vs
    from ptrun.sim.simulate import simulate_one

    run = tmp_path / "round0" / "all_four"
    # The run's own policy (pipetransformer from epoch 8) would freeze nothing in 4 epochs: the validator must
    # take [0, 0, 2, 4] from the run's plan events.
    cfg = compose_config(["recipe=digits_vit", "train.epochs=4"], run)
    write_config(cfg)
    cluster = get_cluster("this_machine")
    costs = costs_from_config(cfg.model, cfg.data)
    replayed = replace(cfg, freeze=replace(cfg.freeze, policy="schedule", blocks=[0, 0, 2, 4], max_fraction=1.0))
    records = simulate_one(costs, cluster, replayed, 1437)
    write_simulated(run, records, slower=1.25)  # "measured": 1.25 x the simulated epoch
    report = vs.validate_combination("all_four", [run], None, cluster, 0.15)
    assert report["freeze_blocks"] == [0, 0, 2, 4] and not report["notes"]
    assert all(e["plan_matches"] for e in report["epochs"])
    assert [e["plan"]["cached_units"] for e in report["epochs"]] == [0, 0, 5, 9]  # AutoCache replayed too
    assert [e["error"] for e in report["epochs"]] == pytest.approx([1 / 1.25 - 1] * 4)
    # The machine's load fitted on the epochs before the first freeze makes those come out as measured
    load, at_zero = vs.fit_load([run], {0, 1}, None, cluster)
    assert at_zero == pytest.approx(1 / 1.25 - 1) and load > 0
    fitted = vs.validate_combination("all_four", [run], None, replace(cluster, background_load=load), 0.15, {0, 1})
    assert sum(e["predicted_s"] for e in fitted["epochs"][:2]) == pytest.approx(
        sum(e["measured_s"] for e in fitted["epochs"][:2]), rel=1e-6
    )
    assert [e["role"] for e in fitted["epochs"]] == ["calibration"] * 2 + ["validation"] * 2


# ---- the simulation: the real Controller's plans -------------------------------------------------------


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("imagenet")
    cfg, costs = paper_config("vit_imagenet", tmp)
    cluster = get_cluster("paper")
    return cfg, costs, cluster, simulate(costs, cluster, cfg, 1_281_167)


def test_baseline_epochs_take_the_same_time(imagenet):
    *_, results = imagenet
    times = {r.time_s for r in results["baseline"]}
    assert len(times) == 1 and all(
        r.plan.pp == 8 and r.plan.dp == 2 and r.plan.frozen_units == 0 for r in results["baseline"]
    )


def test_every_component_helps_over_freezing_alone(imagenet):
    *_, results = imagenet
    assert any(r.plan.frozen_units for r in results["freeze"])
    freeze_only = total_seconds(results["freeze"])
    assert all(total_seconds(results[name]) <= freeze_only for name in COMBINATIONS if name != "baseline")
    up = speedups(results)
    assert up["all"] > up["freeze+pipe+dp"] > up["freeze"] and up["all"] > up["freeze+pipe+cache"]


def test_simulated_plans_are_the_controllers(imagenet):
    cfg, costs, cluster, results = imagenet
    alpha = make_policy("alpha", 12, alpha=cfg.freeze.alpha)
    blocks = [0] + [alpha.target(e) for e in range(1, 10)]
    assert blocks == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]  # the paper's schedule
    for name in COMBINATIONS:
        c = plannable(combination_config(cfg, name))
        layered = stand_in(costs)
        first = first_plan(c.pipe, layered, cluster.world_size)
        controller = Controller(c, 12, param_costs(layered), first)  # built here, independently
        plans = [r.plan for r in results[name]]
        assert plans[0] == first
        for e in range(1, 10):
            want = blocks[e] if c.auto.freeze else 0
            assert plans[e] == controller.plan_for(plans[e - 1], want, cluster.world_size), (name, e)
    assert [r.plan.pp for r in results["all"]] == [8, 8, 4, 2, 2, 1, 1, 1, 1, 1]  # 8 -> 4 -> 2 -> 1
    assert [r.plan.dp for r in results["all"]][-1] == 16
    assert all(r.plan.pp == 8 for r in results["freeze+pipe+cache"])  # auto.dp=false keeps K


def test_fixed_per_pipeline_widens_the_global_batch(imagenet):
    *_, results = imagenet
    last = results["all"][-1]
    assert last.global_batch == 400 * 16 and last.steps == -(-1_281_167 // 6400)


def test_this_machine_runs_the_digits_recipe(tmp_path):
    cfg = compose_config(["recipe=digits_vit"], tmp_path)
    costs = costs_from_config(cfg.model, cfg.data)
    cluster = get_cluster("this_machine")
    _, plans = plan_epochs(costs, cluster, cfg)
    # pipe.length=auto: the model fits one device (K = 1, DP = 2); the paper's rule freezes at most 3 of 6 blocks
    # (the embedding and 3 blocks of 2 units each)
    assert (plans[0].pp, plans[0].dp, plans[0].microbatches) == (1, 2, 1) and plans[-1].frozen_units == 7
    assert plannable(cfg).freeze.policy == "alpha"


# ---- the command line ----------------------------------------------------------------------------------


def plan_cli(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(["plan", *args])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_the_tables_and_the_papers_numbers(capsys):
    code, out, err = plan_cli(capsys, "recipe=vit_imagenet", "cluster=paper", *PAPER_START)
    assert code == 0, err
    assert out.count("== ") == 5 and "Table 1 (vit_imagenet)" in out and "2.83x" in out
    assert "freeze + AutoPipe + AutoDP" in out and "2.27x" in out and "0.95x" in out
    # memory a device, priced per stage of the first layout (K = 8 on the paper's 32 GB devices), of the 90%
    # the trainer would leave a stage (`ptrun.layout.fill.DEVICE_SHARE`)
    line = next(printed for printed in out.splitlines() if printed.startswith("memory a device"))
    assert "(K = 8, M = 16)" in line and "stage 7 ~" in line and "of 26.8 GiB" in line


# `ptrun plan`'s own bad input: the same form as test_cli.py's table for `ptrun train`, other keys and lines
@pytest.mark.parametrize(
    "args, message",
    [
        (["cluster=moon"], "cluster='moon' is not allowed: one of paper, this_machine"),
        (["cluster.efficiency=2"], "cluster.efficiency='2' is not allowed: a number > 0 and <= 1"),
        (["cluster.speed=2"], "unknown key 'cluster.speed'"),
        (["--samples", "0"], "--samples 0 is not allowed"),
        (["--profile", "/nonexistent.json"], "--profile /nonexistent.json: No such file"),
        (["--fast"], "unknown option '--fast' for plan"),
        (["train.epoch=3"], "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
        (["recipe=vit_imagenet", "pipe.length=3"], "pipe.length=3 is not allowed: a divisor of the world size 16"),
        (
            ["recipe=vit_imagenet", "freeze.policy=autofreeze"],
            "freeze.policy='autofreeze' is not allowed: it needs measured gradient norms",
        ),
        (
            ["recipe=vit_imagenet", "freeze.policy=plasticity"],
            "freeze.policy='plasticity' is not allowed: it needs measured weight changes",
        ),
        (
            ["recipe=vit_imagenet", "pipe.length=1", "pipe.microbatches=5", "device.memory=1GB"],
            "pipe.length=1: stage 0 (units 0-25) needs ~34.79 GiB, a device offers 1.00 GiB (device.memory)",
        ),
        (
            [
                "recipe=bert_glue",
                "data.task=cola",
                "cluster=this_machine",
                "pipe.length=2",
                "model.name=bert-ultra",
                "model.pretrained=null",
            ],
            "model.name='bert-ultra'",
        ),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(capsys, args, message):
    code, out, err = plan_cli(capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert out == ""


def test_the_simulator_starts_where_the_trainer_does_with_a_replicated_first_stage(tmp_path):
    """One start for the trainer and the simulator (`ptrun.auto.controller.start`, fed by the same replica batch):
    with PipeDream's replicated first stage, a replica's batch is the global batch over the replicas. The
    simulator once divided it by world / K, profiling (and so partitioning) on twice the samples."""
    from ptrun.auto.controller import start
    from ptrun.sim.simulate import start_profile, unit_seconds

    cfg = compose_config(
        [
            "model.embed_dim=32",
            "model.depth=4",
            "model.num_heads=2",
            "train.global_batch_size=16",
            "pipe.schedule=pipedream",
            "pipe.length=2",
            "pipe.first_stage_replicas=2",
            "pipe.microbatches=1",
            "pipe.partition=time",
            "auto.pipe=false",
            "auto.dp=false",
            "launcher.nproc_per_node=3",
        ],
        tmp_path,
    )
    costs = costs_from_config(cfg.model, cfg.data)
    cluster = replace(ONE_TFLOP, gpus_per_node=3)
    profile, bandwidth = start_profile(cfg, costs, cluster)
    per_sample = unit_seconds(costs, cluster)[0]
    assert profile.time_s == pytest.approx([8 * t for t in per_sample])  # 16 samples over 2 replicas, M = 1
    controller, plans = plan_epochs(costs, cluster, cfg)
    want = start(cfg, stand_in(costs), 3, profile=profile, bandwidth=bandwidth).first
    assert plans[0] == controller.first == want and want.replicate_first_only and want.dp == 2


def test_freeze_decisions_fall_where_the_trainers_do(tmp_path):
    """The simulator places decisions with the trainer's arithmetic (`ptrun.auto.intervals`): every 5 steps of
    10-step epochs is every half epoch; with epochs capped at 5 steps (`train.max_steps_per_epoch`) it is
    every epoch, and the epochs have 5 steps."""
    from ptrun.sim.simulate import simulate_one

    def run(*extra):
        cfg = compose_config(
            [
                "model.embed_dim=32",
                "model.depth=4",
                "model.num_heads=2",
                "train.global_batch_size=16",
                "train.epochs=3",
                "freeze.policy=schedule",
                "freeze.blocks=[0,1,2,3,4]",
                *extra,
            ],
            tmp_path,
        )
        costs = costs_from_config(cfg.model, cfg.data)
        records = simulate_one(costs, get_cluster("this_machine"), cfg, 160)
        return [r.plan.frozen_units for r in records], [r.steps for r in records]

    assert run("freeze.every_steps=5") == run("freeze.every=0.5") == ([0, 5, 5], [10, 10, 10])
    assert run("freeze.every_steps=5", "train.max_steps_per_epoch=5") == ([0, 3, 5], [5, 5, 5])
    assert run() == ([0, 3, 5], [10, 10, 10])


def test_decoder_costs_count_llama_3_8b_exactly(tmp_path):
    """A Llama-3-8B-shaped config.json (32 layers, width 4096, 8 KV heads, gated MLP 14336, vocab 128256,
    untied head) is priced unit by unit with its published 8,030,261,248 parameters."""
    import json

    from ptrun.config import DataConfig, ModelConfig
    from ptrun.costs.from_config import costs_from_config

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    costs = costs_from_config(
        ModelConfig(name="llama", pretrained=str(tmp_path), task="causal_lm"), DataConfig(max_length=2048)
    )
    assert costs.num_units == 66 and sum(costs.params) == 8_030_261_248
    assert costs.params[1] == 41_947_136 and costs.params[2] == 176_164_864  # attention and MLP halves
    assert costs.act_bytes[1] == 2048 * 4096 * 4 + 2048 * 4  # hidden states plus the padding mask
