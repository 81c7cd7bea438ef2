"""AutoDP inside one job, on 4 real worker processes (gloo, elastic_launch on localhost).

A tiny ViT, BERT and BERT-MLM (tied weights) go K = 4, DP = 1 -> K = 2, DP = 2 (embedding + block 0 frozen)
-> K = 1, DP = 4 (+ block 1), one clipped AdamW step per layout. After every step the parameters and the
optimizer state each rank holds equal a single-process run with the same freeze schedule; frozen parameters
never change and hold no optimizer state; 32 layout changes leak no file descriptors or threads. The full
trainer (controller, sample coverage, checkpoints) is exercised by the run at the end.
"""

from __future__ import annotations

import json

import pipeline_cases as pc
import pytest
import torch
from conftest import final_params, run_events, run_workers
from helpers.process_group import load_rank

from ptrun.numerics.optim import build_optimizer

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

FOUR_STAGES = [
    "launcher.nproc_per_node=4",
    "pipe.length=4",
    "pipe.microbatches=4",
    "pipe.schedule=GPipe",
    "pipe.partition=params",
    "model.mlp_ratio=4.0",
    "data.eval_fraction=0.9",
    "freeze.policy=schedule",
    "freeze.max_fraction=1.0",
]
"""4 workers starting as a 4-stage GPipe pipeline, its stages split by parameters, freezing the blocks a
forced schedule names: 180 training samples (12 steps an epoch, little drift)."""

KINDS = ["vit", "bert", "bert_mlm"]


@pytest.fixture(scope="module")
def transitions(tmp_path_factory):
    out = tmp_path_factory.mktemp("transitions")
    pc.launch_transitions(KINDS, out)
    return out


def reference_steps(kind: str) -> list[tuple[dict, dict]]:
    """(parameters, optimizer state by name) after each step of a textbook single-process run that freezes
    the same prefix before each step and keeps the optimizer state of the parameters still training."""
    layered = pc.model(kind)
    net = layered.model
    net.train()
    n = len(layered.units)
    name_of = {id(p): name for name, p in net.named_parameters()}
    state: dict = {}
    out = []
    for step, plan in enumerate(pc.transition_plans(n)):
        frozen = {name_of[id(p)] for u in range(plan.frozen_units) for p in layered.units[u].parameters()}
        for name, p in net.named_parameters():
            p.requires_grad_(name not in frozen)
        optimizer = build_optimizer([(nm, p) for nm, p in net.named_parameters() if p.requires_grad], pc.OPTIM)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if name_of[id(p)] in state:
                    optimizer.state[p] = state[name_of[id(p)]]
        loss = pc.textbook_loss(net, kind, pc.batch(kind, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in net.parameters() if p.requires_grad], pc.CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state = {name_of[id(p)]: s for p, s in optimizer.state.items()}
        out.append(
            (
                {nm: p.detach().clone() for nm, p in net.named_parameters()},
                {nm: {k: v.clone() for k, v in s.items()} for nm, s in state.items()},
            )
        )
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_every_transition_keeps_parameters_and_optimizer_state(transitions, kind):
    ref = reference_steps(kind)
    plans = pc.transition_plans(len(pc.model(kind).units))
    before = None  # what the workers held after the previous step
    for step, (want_params, want_optim) in enumerate(ref):
        covered, now = set(), {}
        frozen_names = set()
        layered = pc.model(kind)
        for u in range(plans[step].frozen_units):
            frozen_names |= set(layered.unit_param_names(u))
        for rank in range(4):
            held = load_rank(transitions, f"transition-{kind}-step{step}", rank)
            for name, value in held["params"].items():
                torch.testing.assert_close(
                    value,
                    want_params[name],
                    rtol=1e-5,
                    atol=4e-5,
                    msg=lambda m, step=step, name=name: f"step {step} {name}: {m}",
                )
                if name in frozen_names and before is not None:
                    assert torch.equal(value, before[name]), f"frozen {name} changed at step {step}"
                covered.add(name)
                now[name] = value
            assert not frozen_names & set(held["optim"]), "a frozen parameter holds optimizer state"
            for name, st in held["optim"].items():
                for key, value in st.items():
                    torch.testing.assert_close(
                        torch.as_tensor(value).float(),
                        torch.as_tensor(want_optim[name][key]).float(),
                        rtol=1e-5,
                        atol=4e-5,
                        msg=lambda m, step=step, name=name, key=key: f"step {step} {name}.{key}: {m}",
                    )
        assert covered == set(want_params)
        before = now


@pytest.mark.parametrize("kind", KINDS)
def test_a_transition_moves_only_what_changes_hands(transitions, kind):
    """Each rank receives exactly the parameters it holds under the new layout and did not hold under the old
    one, with AdamW's two state tensors for those that still train: nothing it already had, nothing it will
    not hold; and it keeps in memory only the parameters its stages hold."""
    plans = pc.transition_plans(len(pc.model(kind).units))
    layered = pc.model(kind)
    sizes = dict((n, p.numel() * 4) for n, p in layered.model.named_parameters())
    owner = {n: u for u in range(len(layered.units)) for n in layered.unit_param_names(u)}
    moved_any = False
    for rank in range(4):  # after the start, too: each worker keeps only its first stage's parameters
        first = load_rank(transitions, f"transition-{kind}-step0", rank)
        assert first["materialized"] == sorted(first["params"]), rank
    for step in range(1, len(plans)):
        for rank in range(4):
            old = set(load_rank(transitions, f"transition-{kind}-step{step - 1}", rank)["params"])
            now = load_rank(transitions, f"transition-{kind}-step{step}", rank)
            new = set(now["params"]) - old
            want = sum(sizes[n] * (3 if owner[n] >= plans[step].frozen_units else 1) for n in new)
            assert now["received_bytes"] == want, (step, rank, sorted(new))
            # what a worker keeps in memory is exactly what its stages hold; the rest was given back
            assert now["materialized"] == sorted(now["params"]), (step, rank)
            moved_any |= want > 0
            # a freeze in place creates no process group (a new NCCL communicator costs up to a second)
            assert now["same_groups"] == (step in pc.IN_PLACE), (step, rank)
    assert moved_any


def test_32_layout_changes_leak_no_descriptors_or_threads(transitions):
    for rank in range(4):
        after_2, after_32 = load_rank(transitions, "leaks", rank)
        assert after_32["fds"] <= after_2["fds"], (rank, after_2, after_32)
        assert after_32["threads"] <= after_2["threads"], (rank, after_2, after_32)
        assert after_32["tasks"] <= after_2["tasks"], (rank, after_2, after_32)


def test_controller_run_changes_layout_and_covers_every_sample(tmp_path, tiny):
    """The trainer on 4 workers: the controller drives K = 4 -> 2 -> 1 (DP 1 -> 2 -> 4) with a forced freeze
    schedule; every epoch uses every sample exactly once; the final parameters equal the frozen-prefix
    single-process reference that freezes the same blocks at the same epochs."""
    overrides = tiny + FOUR_STAGES + ["train.epochs=3", "freeze.blocks=[0,1,2]"]
    run_workers(overrides, tmp_path)
    events = run_events(tmp_path)
    plans = [e for e in events if e["event"] == "plan"]
    assert [(p["pp"], p["dp"], p["frozen_units"]) for p in plans] == [(4, 1, 0), (2, 2, 3), (1, 4, 5)]
    assert all(p["transition_s"] > 0 for p in plans[1:])
    # after the start and after each change, no worker keeps parameter storage outside its stages
    assert [p["unheld_param_bytes"] for p in plans] == [0, 0, 0]
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [(e["sample_uses_min"], e["sample_uses_max"]) for e in epochs] == [(1, 1)] * 3
    from conftest import compose_config
    from test_train_dist import reference_params

    want = reference_params(compose_config(overrides, tmp_path / "ref"), freeze_blocks=[0, 1, 2])
    got = final_params(tmp_path)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=4e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_cached_run_matches_the_uncached_reference_through_a_transition(tmp_path, tiny):
    """AutoCache on 4 workers through K = 4 -> 2 -> 1: the frozen prefix leaves the pipeline, is computed
    once (epoch 1), advanced by the newly frozen units only (epoch 2) and read from then on (epoch 3), for
    training and evaluation alike, and training ends where the single-process reference without any cache
    does (float32 storage). The same run with `cache.eval=false` recomputes the eval samples' prefix at
    every evaluation and gets the same eval metrics. The cache files are gone after the run."""
    overrides = (
        tiny
        + FOUR_STAGES
        + [
            "train.epochs=4",
            "freeze.blocks=[0,1,2,2]",
            "auto.cache=true",
            "cache.min_frozen_units=3",
        ]
    )
    run_workers(overrides, tmp_path)
    events = run_events(tmp_path)
    plans = [e for e in events if e["event"] == "plan"]
    assert [(p["frozen_units"], p["cached_units"]) for p in plans] == [(0, 0), (3, 3), (5, 5), (5, 5)]
    assert [p["pp"] for p in plans][0] == 4 and all(p["pp"] < 4 for p in plans[1:])
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [(e["sample_uses_min"], e["sample_uses_max"]) for e in epochs] == [(1, 1)] * 4
    train = epochs[1]["samples"]
    fill, advance, read = (e["cache"] for e in epochs[1:])
    # (padding rows repeat the epoch's first samples: those read what step 0 wrote, and are never written)
    assert fill["written"] == train and fill["computed"] == train and fill["advanced"] == 0
    assert advance["advanced"] == advance["written"] == train and advance["computed"] == 0
    assert read["computed"] + read["advanced"] + read["written"] == 0 and read["hits"] >= train
    assert fill["memory_bytes"] > 0 and not (tmp_path / "cache").exists()
    # Evaluation too; its replicas do not wait for each other, so a padding row may find its sample's entry
    # written yet (a hit) or not (computed or advanced again): only the real samples' counts are exact.
    evals = run_events(tmp_path, "start")[0]["eval_samples"]
    assert fill["eval_written"] == evals and fill["eval_computed"] >= evals and fill["eval_advanced"] == 0
    assert advance["eval_written"] == evals and advance["eval_advanced"] >= evals and advance["eval_computed"] == 0
    assert read["eval_computed"] + read["eval_advanced"] + read["eval_written"] == 0 and read["eval_hits"] >= evals

    run_workers(overrides + ["cache.eval=false"], tmp_path / "eval_uncached")
    uncached = run_events(tmp_path / "eval_uncached", "epoch")
    assert all(e["cache"]["eval_computed"] >= evals for e in uncached[1:])
    assert [e["cache"]["eval_hits"] + e["cache"]["eval_written"] for e in uncached[1:]] == [0] * 3
    assert [e["cache"]["hits"] for e in uncached] == [e["cache"]["hits"] for e in epochs]  # training alike
    for cached_epoch, uncached_epoch in zip(epochs, uncached, strict=True):
        assert cached_epoch["eval"].keys() == uncached_epoch["eval"].keys() == {"loss", "top1"}
        assert cached_epoch["eval"] == pytest.approx(uncached_epoch["eval"], rel=0, abs=1e-6)

    from conftest import compose_config
    from test_train_dist import reference_params

    want = reference_params(compose_config(overrides, tmp_path / "ref"), freeze_blocks=[0, 1, 2, 2])
    got = final_params(tmp_path)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=4e-5, msg=lambda m, name=name: f"{name}: {m}")

    # The exported model is a plain timm model holding the same final weights.
    import timm
    from safetensors.torch import load_file

    library_cfg = json.loads((tmp_path / "model" / "config.json").read_text())
    vit = timm.create_model(pretrained=False, **library_cfg)
    vit.load_state_dict(load_file(str(tmp_path / "model" / "model.safetensors")))
    for name, value in vit.named_parameters():
        assert torch.equal(value, got[name]), name
