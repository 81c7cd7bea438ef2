"""`ptrun plan`: analytic costs, the time model on hand-made plans, the Controller's plans, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conftest import compose_config
from ptrun.auto.controller import Controller
from ptrun.auto.freeze import make_policy
from ptrun.cli import main
from ptrun.parallel.layout import first_plan, param_costs
from ptrun.parallel.plan import Plan
from ptrun.sim import costs_from_config, get_cluster, load_profile, save_profile, simulate, speedups, vit_costs
from ptrun.sim.cluster import Cluster
from ptrun.sim.costs import ModelCosts, bert_costs
from ptrun.sim.simulate import (COMBINATIONS, combination_config, plan_epochs, plannable, stand_in, step_time,
                                total_seconds)

ONE_TFLOP = Cluster("test", nodes=1, gpus_per_node=4, peak_tflops=1.0, efficiency=1.0, intra_gbs=1.0,
                    inter_gbs=0.5, host_gbs=1.0, host_memory_gb=1.0, disk_gbs=1.0, transition_s=0.0)
"""1e12 FLOP/s, 1 GB/s inside a node, 0.5 GB/s between nodes, no fixed costs: easy arithmetic."""

TOY = ModelCosts(names=("embed", "block.0.attn", "block.0.mlp", "head"), params=(10.0, 20.0, 30.0, 40.0),
                 act_bytes=(100.0, 100.0, 100.0, 10.0), fwd_flops=(1e9, 2e9, 3e9, 1e9))


def toy_plan(**kw) -> Plan:
    base = dict(num_units=4, frozen_units=0, pp=2, dp=2, stage_bounds=((0, 2), (2, 4)), microbatches=2,
                schedule="GPipe")
    return Plan(**{**base, **kw}).check()


def paper_config(recipe: str, tmp_path, *extra: str):
    cfg = compose_config([f"recipe={recipe}", f"data.path={tmp_path}", f"model.pretrained={tmp_path}", *extra],
                         tmp_path)
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
    assert st.pipeline_s == pytest.approx((2 + 2 - 1) * stage1, rel=1e-12)  # (M + K - 1) x slowest
    assert st.allreduce_s == pytest.approx(1 * 4 * 70 / 1e9)  # ring 2(DP-1)/DP = 1, the larger stage's fp32
    assert st.total_s == pytest.approx(st.pipeline_s + st.allreduce_s, rel=1e-12)

    # Units 0-1 frozen: forward only (1 x), no gradient comes back to stage 0, nothing of it to all-reduce.
    st = step_time(toy_plan(frozen_units=2), TOY, ONE_TFLOP, cfg, per_replica=4, samples=100, filled=0)
    assert st.stage_s[0] == pytest.approx(2 * (1e-3 + 2e-3) + 2 * 100 / 1e9, rel=1e-12)
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
    assert len(times) == 1 and all(r.plan.pp == 8 and r.plan.dp == 2 and r.plan.frozen_units == 0
                                   for r in results["baseline"])


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
    assert blocks == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]  # SPEC section 1's schedule
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
    cfg, costs = paper_config("digits_vit", tmp_path)
    cluster = get_cluster("this_machine")
    _, plans = plan_epochs(costs, cluster, cfg)
    assert plans[0].pp == 2 and plans[-1].frozen_units == 9 and plans[-1].pp == 1  # 4 of 6 blocks, K 2 -> 1
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
    code, out, err = plan_cli(capsys, "recipe=vit_imagenet", "cluster=paper")
    assert code == 0, err
    assert out.count("== ") == 5 and "Table 1 (vit_imagenet)" in out and "2.83x" in out
    assert "freeze + AutoPipe + AutoDP" in out and "2.27x" in out and "0.95x" in out


@pytest.mark.parametrize("args, message", [
    (["cluster=moon"], "cluster='moon' is not allowed: one of paper, this_machine"),
    (["cluster.efficiency=2"], "cluster.efficiency='2' is not allowed: a number > 0 and <= 1"),
    (["cluster.speed=2"], "unknown key 'cluster.speed'"),
    (["--samples", "0"], "--samples 0 is not allowed"),
    (["--profile", "/nonexistent.json"], "--profile /nonexistent.json: No such file"),
    (["--fast"], "unknown option '--fast' for plan"),
    (["train.epoch=3"], "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    (["recipe=vit_imagenet", "pipe.length=3"], "pipe.length=3 is not allowed: a divisor of the world size 16"),
    (["recipe=vit_imagenet", "freeze.policy=autofreeze"], "freeze.policy='autofreeze' is not allowed"),
    (["recipe=bert_glue", "data.task=cola", "cluster=this_machine", "pipe.length=2", "model.name=bert-ultra"],
     "model.name='bert-ultra'"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, args, message):
    code, out, err = plan_cli(capsys, *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert out == ""
