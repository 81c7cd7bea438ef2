"""PipeDream mode (`pipe.schedule=pipedream`) on real worker processes (gloo, elastic_launch on localhost).

A single-process reference replays PipeDream's semantics on the library model: for each step, every stage's
weights are the version its forward pass chose (the number of updates its 1F1B order had applied by then,
or with vertical sync the input stage's), the gradient is taken through those weights, and plain SGD applies
it to the stage's newest weights. The pipeline must end with exactly the reference's parameters:
- with weight stashing, so each backward pass used the weights of its own forward pass (any other version
  would change the gradient), and the trace shows the same weights at both passes;
- without it, the backward passes of stale mini-batches see newer weights: detectable in the trace, and the
  parameters leave the stashing reference;
- with vertical sync, every stage uses the input stage's version for a mini-batch;
- across a drain and a layout change (K = 2 -> K = 1, DP 1 -> 2), no update is lost or applied twice;
- with the first stage replicated (its replicas' mini-batches taken in turn by each later stage), the
  parameters are those of the K x DP grid: each gradient went back to the replica whose forward pass made it.
"""

from __future__ import annotations

import pipedream_cases as pd
import pipeline_cases as pc
import pytest
import torch
from conftest import TINY_MODEL
from helpers.process_group import load_ranks
from pipedream_cases import Case, forward_versions
from torch.func import functional_call

from ptrun.layout.plan import even_bounds

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

CASES = {
    2: [
        Case("vit-stash", "vit", 2, 1, 6),
        Case("vit-nostash", "vit", 2, 1, 6, stashing=False),
        Case("bert-vertical", "bert", 2, 1, 6, vertical=True),
        Case("vit-drain-change", "vit", 2, 1, 5, drains=(1,), then=(1, 2, 3)),
    ],
    4: [
        Case("vit-K4-vertical", "vit", 4, 1, 8, vertical=True),
        Case("vit-K4-stash", "vit", 4, 1, 8),
        Case("bert-K2-DP2", "bert", 2, 2, 6),
        # stage replication 2-1-1: two input-stage replicas, then two shared stages (lanes pass shared -> shared)
        Case("bert-K3-R2-vertical", "bert", 3, 2, 6, vertical=True, replicated=True),
    ],
    3: [Case("vit-K2-R2", "vit", 2, 2, 6, replicated=True)],  # PipeDream's "2-1"
}
BY_NAME = {c.name: (c.world, c) for cases in CASES.values() for c in cases}
assert all(c.world == world for world, cases in CASES.items() for c in cases)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipedream_cases")
    for world, cases in CASES.items():
        pd.launch(cases, world, out)
    return out


def load(results, name: str) -> list[dict]:
    world, _ = BY_NAME[name]
    return load_ranks(results, name, world)


def reference(case: Case, vertical: bool | None = None) -> tuple[dict[str, torch.Tensor], list]:
    """PipeDream with weight stashing in one process: the final parameters, and per phase the version each
    stage used per step."""
    vertical = case.vertical if vertical is None else vertical
    layered = pc.model(case.kind)
    net = layered.model
    n = len(layered.units)
    current = {name: p.detach().clone() for name, p in net.named_parameters()}
    phases = [(case.pp, 0, case.steps, case.drains)]
    if case.then is not None:
        phases.append((case.then[0], case.steps, case.then[2], ()))
    used_all = []
    for pp, first, count, drains in phases:
        names = [[name for u in range(lo, hi) for name in layered.unit_param_names(u)] for lo, hi in even_bounds(n, pp)]
        fwd = forward_versions(pp, first, count, drains)
        used = [{t: (fwd[0][t] if vertical else fwd[s][t]) for t in fwd[s]} for s in range(pp)]
        used_all.append(used)
        history = [[{name: current[name] for name in names[s]}] for s in range(pp)]
        for t in range(first, first + count):
            weights = {
                name: w.clone().requires_grad_(True) for s in range(pp) for name, w in history[s][used[s][t]].items()
            }

            def bound(*args, weights=weights, **kwargs):
                return functional_call(net, weights, args, kwargs)

            bound.config = getattr(
                net, "config", None
            )  # textbook_loss reads the library config (whether it takes token types)
            pc.textbook_loss(bound, case.kind, pc.batch(case.kind, t)).backward()
            for s in range(pp):
                newest = history[s][-1]
                history[s].append(
                    {
                        name: newest[name] - pd.LR * (weights[name].grad if weights[name].grad is not None else 0)
                        for name in names[s]
                    }
                )
        current = {name: w for s in range(pp) for name, w in history[s][-1].items()}
    return current, used_all


def assert_params(ranks: list[dict], expected: dict[str, torch.Tensor], rtol=1e-5, atol=1e-6) -> None:
    for r, saved in enumerate(ranks):
        assert saved["params"], f"rank {r} holds no parameters"
        for name, value in saved["params"].items():
            torch.testing.assert_close(
                value, expected[name], rtol=rtol, atol=atol, msg=lambda m, r=r, name=name: f"rank {r} {name}: {m}"
            )


def max_rel_diff(ranks: list[dict], expected: dict[str, torch.Tensor]) -> float:
    return max(
        ((v - expected[n]).norm() / expected[n].norm().clamp_min(1e-12)).item()
        for saved in ranks
        for n, v in saved["params"].items()
    )


def as_reference(results, name: str):
    """The case `name` and what its ranks saved, with the versions each stage used in the reference, once
    the parameters every rank ended with are checked against the reference's."""
    _, case = BY_NAME[name]
    ranks = load(results, name)
    expected, used = reference(case)
    assert_params(ranks, expected)
    return case, ranks, used


@pytest.mark.parametrize("name", ["vit-stash", "vit-K4-stash", "bert-K2-DP2"])
def test_with_weight_stashing_each_backward_uses_its_forward_weights(results, name):
    case, ranks, used = as_reference(results, name)
    for saved in ranks:
        records = saved["traces"][0]
        assert len(records) == case.steps
        for rec in records:
            assert rec["version"] == used[0][saved["stage"]][rec["step"]]
            assert rec["forward_fingerprint"] == rec["backward_fingerprint"]
        assert saved["versions"] == [case.steps]  # one update per step on every stage
    # the first stage is stale (K - 1 updates behind once full); the last never is
    first = next(s for s in ranks if s["stage"] == 0)["traces"][0]
    assert [r["version"] for r in first][case.pp :] == list(range(1, case.steps - case.pp + 1))
    # the memory cost: the first stage held two versions of its weights, the last stage none
    stage_bytes = sum(
        v.numel() * v.element_size() for v in next(s for s in ranks if s["stage"] == 0)["params"].values()
    )
    assert next(s for s in ranks if s["stage"] == 0)["stash_peak"] >= 2 * stage_bytes
    assert next(s for s in ranks if s["stage"] == case.pp - 1)["stash_peak"] == 0


def test_without_weight_stashing_the_mismatch_is_detectable(results):
    _, case = BY_NAME["vit-nostash"]
    ranks = load(results, "vit-nostash")
    first = next(s for s in ranks if s["stage"] == 0)["traces"][0]
    last = next(s for s in ranks if s["stage"] == 1)["traces"][0]
    stale = [r for r in first if r["forward_fingerprint"] != r["backward_fingerprint"]]
    # every mini-batch whose update came back before its own backward pass ran on newer weights
    assert [r["step"] for r in stale] == list(range(1, case.steps))
    assert all(r["forward_fingerprint"] == r["backward_fingerprint"] for r in last)
    expected, _ = reference(case)
    assert max_rel_diff(ranks, expected) > 1e-4


def test_with_vertical_sync_every_stage_uses_the_input_stages_version(results):
    for name in ("bert-vertical", "vit-K4-vertical"):
        _, case = BY_NAME[name]
        ranks = load(results, name)
        per_stage = {s["stage"]: {r["step"]: r["version"] for r in s["traces"][0]} for s in ranks}
        for stage, versions in per_stage.items():
            assert versions == per_stage[0], f"{name}: stage {stage} used other versions than the input stage"
            assert all(r["forward_fingerprint"] == r["backward_fingerprint"] for s in ranks for r in s["traces"][0])
        expected, _ = reference(case)
        assert_params(ranks, expected)
        # and it matters: without vertical sync the later stages would have used newer weights
        plain, _ = reference(case, vertical=False)
        assert max_rel_diff(ranks, plain) > 1e-4, name


def test_a_drain_before_a_layout_change_loses_no_update(results):
    case, ranks, used = as_reference(results, "vit-drain-change")
    for saved in ranks:
        assert saved["versions"] == [case.steps, case.then[2]]  # every step updated once in each layout
        before, after = saved["traces"]
        # the drain after step 1: step 2 started with both earlier updates applied on every stage
        assert {r["step"]: r["version"] for r in before}[2] == 2
        # after the change to K = 1 the single stage is never stale
        assert [r["version"] for r in after] == list(range(case.then[2]))


@pytest.mark.parametrize("name", ["vit-K2-R2", "bert-K3-R2-vertical"])
def test_a_replicated_first_stage_trains_like_the_grid_and_routes_each_gradient_home(results, name):
    """The reference is the K x DP semantics on the whole batch. Had a later stage sent lane d's gradient to
    another replica, that replica would have back-propagated it through the wrong activations and the
    parameters would differ."""
    case, ranks, used = as_reference(results, name)
    first = [s for s in ranks if s["stage"] == 0]
    shared = [s for s in ranks if s["stage"] > 0]
    assert [s["lanes"] for s in first] == [[d] for d in range(case.dp)]  # rank d runs replica d's input stage
    assert sorted(s["stage"] for s in shared) == list(range(1, case.pp))
    for saved in shared:
        assert saved["lanes"] == list(range(case.dp))  # every replica's mini-batches, in turn
        for rec in saved["traces"][0]:
            if saved["stage"] == 1:  # lane d arrives from replica d's rank and its gradient goes back there
                assert rec["from_ranks"] == list(range(case.dp))
            assert len(rec["received_versions"]) == case.dp and len(set(rec["received_versions"])) == 1
    for saved in ranks:
        records = saved["traces"][0]
        assert [r["step"] for r in records] == list(range(case.steps))
        for rec in records:
            assert rec["version"] == used[0][saved["stage"]][rec["step"]]
            assert rec["forward_fingerprint"] == rec["backward_fingerprint"]
        assert saved["versions"] == [case.steps]
    for name_, value in first[0]["params"].items():  # the input stage's replicas all-reduce: identical weights
        assert all(torch.equal(s["params"][name_], value) for s in first[1:]), name_


# ---- the whole trainer: controller transitions, mid-epoch checkpoints and killed workers ----------------

TRAIN_EPOCHS, TRAIN_STEPS, EVERY = 3, 20, 10
TRAIN = [
    *TINY_MODEL,
    "train.global_batch_size=16",
    "checkpoint.keep=3",
    "launcher.nproc_per_node=2",
    "pipe.length=2",
    "pipe.microbatches=1",
    "pipe.schedule=pipedream",
    f"train.epochs={TRAIN_EPOCHS}",
    f"train.max_steps_per_epoch={TRAIN_STEPS}",
    f"checkpoint.every_steps={EVERY}",
    # one more block frozen at each epoch boundary: K 2 -> 1 with DP 1 -> 2, then AutoCache
    "freeze.policy=schedule",
    "freeze.blocks=[0,1,2]",
    "freeze.max_fraction=1.0",
    "auto.cache=true",
]
KILLS = [
    {"rank": 1, "point": "step", "step": 15},
    {"rank": 0, "point": "transition", "step": 20},
    {"rank": 1, "point": "checkpoint", "step": 30},
]


def test_the_trainer_drains_for_checkpoints_and_layout_changes_and_survives_kills(tmp_path, monkeypatch):
    from conftest import run_events, run_killed, run_workers

    from ptrun.train.checkpoint import lookup, store

    killed = tmp_path / "killed"
    run_killed(TRAIN + ["launcher.max_restarts=3"], killed, KILLS, monkeypatch)
    clean = tmp_path / "clean"
    run_workers(TRAIN + ["launcher.max_restarts=0"], clean)

    events = run_events(clean)
    plans = [(e["pp"], e["dp"], e["schedule"]) for e in events if e["event"] == "plan"]
    assert plans == [(2, 1, "pipedream"), (1, 2, "pipedream"), (1, 2, "pipedream")]
    epochs = [e for e in events if e["event"] == "epoch"]
    for e in epochs:
        assert e["samples"] == TRAIN_STEPS * 16 and e["sample_uses_max"] == 1, e
    assert epochs[0]["stash_bytes_peak"] > 0 and epochs[1]["stash_bytes_peak"] == 0  # K = 1 stashes nothing
    starts = run_events(killed, "start")
    assert len(starts) == 4

    got_params, got_optim, got_state = store.load(lookup.latest_valid(killed))
    want_params, want_optim, want_state = store.load(lookup.latest_valid(clean))
    assert got_state["global_step"] == want_state["global_step"] == TRAIN_EPOCHS * TRAIN_STEPS
    # no update lost or applied twice: what trains throughout stepped once per step (frozen blocks keep no state)
    assert {name for name in want_optim if name.startswith("blocks.")} == set()
    for name in ("head.weight", "norm.weight"):
        assert int(want_optim[name]["step"]) == TRAIN_EPOCHS * TRAIN_STEPS, name
    for name, value in want_params.items():
        assert torch.equal(got_params[name], value), name
    for name, state in want_optim.items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(got_optim[name][key]), torch.as_tensor(value)), (name, key)


def test_drained_after_every_step_pipedream_trains_exactly_like_gpipe(tmp_path):
    """With a drain after every step (a checkpoint is due after each) nothing is stale, so the asynchronous
    runtime must reproduce the flushing schedule bit for bit: the trainer's learning rate, loss
    normalisation, AdamW steps and dropout all go through the same code (no clipping: pipedream clips per
    stage)."""
    from conftest import final_params, run_workers

    common = [
        *TINY_MODEL,
        "train.global_batch_size=16",
        "launcher.nproc_per_node=2",
        "pipe.length=2",
        "pipe.microbatches=1",
        "train.epochs=2",
        "train.max_steps_per_epoch=8",
        "auto.freeze=false",
        "train.grad_clip=0",
        "train.export=false",
        "checkpoint.keep=1",
        "launcher.max_restarts=0",
        "model.dropout=0.1",
        "model.drop_path=0.1",
    ]
    run_workers(common + ["pipe.schedule=GPipe"], tmp_path / "gpipe")
    run_workers(common + ["pipe.schedule=pipedream", "checkpoint.every_steps=1"], tmp_path / "drained")
    want, drained = final_params(tmp_path / "gpipe"), final_params(tmp_path / "drained")
    for name, value in want.items():
        assert torch.equal(drained[name], value), name


REPLICATED = [
    *TINY_MODEL,
    "train.global_batch_size=16",
    "pipe.length=2",
    "pipe.microbatches=1",
    "pipe.schedule=pipedream",
    "train.epochs=3",
    "train.max_steps_per_epoch=8",
    "checkpoint.keep=2",
    "train.export=false",
    "checkpoint.every_steps=4",  # the pipeline drains before each: the same points in both layouts
    # a block more frozen at each epoch boundary; the stages stay where they are, AutoCache serves the prefix
    "freeze.policy=schedule",
    "freeze.blocks=[0,1,2]",
    "freeze.max_fraction=1.0",
    "auto.pipe=false",
    "auto.dp=false",
    "auto.cache=true",
]


def test_the_trainer_with_a_replicated_first_stage_trains_like_two_pipelines(tmp_path, monkeypatch):
    """3 workers (the input stage on two, the last stage on one) against 4 (two 2-stage pipelines), through
    freezing, AutoCache, a mid-epoch checkpoint and a killed shared-stage worker: the same parameters,
    every sample used once per epoch."""
    from conftest import final_params, run_events, run_killed, run_workers

    run_killed(
        REPLICATED + ["launcher.nproc_per_node=3", "pipe.first_stage_replicas=2", "launcher.max_restarts=1"],
        tmp_path / "replicated",
        [{"rank": 2, "point": "step", "step": 13}],
        monkeypatch,
    )
    run_workers(REPLICATED + ["launcher.nproc_per_node=4", "launcher.max_restarts=0"], tmp_path / "grid")

    events = run_events(tmp_path / "replicated")
    assert sum(e["event"] == "start" for e in events) == 2  # the kill restarted it once
    plans = [e for e in events if e["event"] == "plan"]
    assert all(p["replicate_first_only"] and (p["pp"], p["dp"]) == (2, 2) for p in plans)
    assert [p["frozen_units"] for p in plans][-1] == 5 and plans[-1]["cached_units"] > 0
    epochs = {e["epoch"]: e for e in events if e["event"] == "epoch"}
    assert sorted(epochs) == [0, 1, 2]
    assert all(e["samples"] == 8 * 16 and e["sample_uses_max"] == 1 for e in epochs.values())
    want, got = final_params(tmp_path / "grid"), final_params(tmp_path / "replicated")
    assert want.keys() == got.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
