"""A decoder fine-tuned as a causal LM on the user's own JSONL, on real worker processes: a tiny Llama (random
weights, built with transformers' own classes; a word-level BERT tokenizer of the text's words) learns
repeated text. A 2-stage pipeline trains exactly as data parallelism over the same two workers; freezing the
bottom layers inside an epoch keeps it learning; AutoCache serving the frozen prefix (hidden states and the
padding mask the decoder's units carry) trains as recomputing it does; bf16 autocast learns; a worker killed
mid-epoch resumes from the checkpoint to the uninterrupted run's exact weights; and `ptrun plan` plans the
directory. The frozen runs share one configuration, on padded rows (`data.pack=false`: each row's own padding
mask travels with its hidden states, through stage boundaries and cache entries)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import compose_config, final_params, run_events, run_killed, run_workers

from ptrun.train.checkpoint import lookup, store

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

LINES = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine",
    "all that glitters is not gold",
    "the early bird catches the worm",
]


@pytest.fixture(scope="module")
def llama_and_text(tmp_path_factory) -> tuple[Path, Path]:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    root = tmp_path_factory.mktemp("causal_lm")
    words = sorted({w for line in LINES for w in line.split()})
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "llama")
    tokenizer.save_pretrained(root / "llama")
    text = root / "text.jsonl"
    text.write_text("".join(json.dumps({"text": LINES[i % 4]}) + "\n" for i in range(96)))
    return root / "llama", text


def on_the_tiny_llama(llama: Path, text: Path) -> list[str]:
    """The causal_lm recipe on the tiny Llama and the repeated text, 16 tokens a sample."""
    return ["recipe=causal_lm", f"model.pretrained={llama}", f"data.path={text}", "data.max_length=16"]


def overrides(llama: Path, text: Path, *extra: str) -> list[str]:
    return [
        *on_the_tiny_llama(llama, text),
        "data.eval_fraction=0.25",
        "train.epochs=3",
        "train.global_batch_size=8",
        "train.export=false",
        "optim.lr=3e-3",
        "train.grad_clip=0",
        "optim.schedule=constant",
        "optim.warmup_fraction=0",
        "launcher.nproc_per_node=2",
        "pipe.microbatches=2",
        *extra,
    ]


def losses(run_dir: Path) -> list[float]:
    return [e["eval"]["loss"] for e in run_events(run_dir, "epoch") if e.get("eval")]


def test_a_pipeline_trains_a_causal_lm_exactly_as_data_parallelism(llama_and_text, tmp_path):
    llama, text = llama_and_text
    dp, pipe = tmp_path / "dp", tmp_path / "pipe"
    run_workers(overrides(llama, text, "pipe.length=1", "freeze.policy=none", "freeze.every=1"), dp)
    run_workers(overrides(llama, text, "pipe.length=2", "freeze.policy=none", "freeze.every=1"), pipe)
    want = losses(dp)
    assert len(want) == 3 and want[-1] < 0.8 * want[0], f"the repeated text is learnt: {want}"
    assert losses(pipe) == pytest.approx(want, rel=1e-5)
    end = [e for e in run_events(dp, "epoch")][-1]["eval"]
    assert end["perplexity"] == pytest.approx(torch.tensor(end["loss"]).exp().item(), rel=1e-6)
    ours, theirs = final_params(dp), final_params(pipe)
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(theirs[name], ours[name], rtol=1e-5, atol=1e-6)


# ---- freezing, AutoCache, bf16 and resume: runs that freeze block 0 in the middle of epoch 0 ----------------

FROZEN = [
    "pipe.length=2",
    "pipe.partition=params",
    "freeze.policy=schedule",
    "freeze.blocks=[0,1]",
    "freeze.every=0.5",
    "data.pack=false",
    "checkpoint.every_steps=2",
    "checkpoint.keep=20",
]
"""72 padded rows an epoch, 9 steps of 8: the embedding and block 0 (3 units) freeze after step 5 of epoch 0 (its
half, rounded up). Stages are cut by parameters, not by measured time (the recipe's), so every run takes the
same layouts. A checkpoint every 2 steps gives a killed run a mid-epoch one to resume from."""
CACHED = ["auto.cache=true", "cache.min_frozen_units=3", "cache.dtype=float32"]
"""Cache the 3 frozen units, exactly (float32 storage): the cache changes speed, not results."""


@dataclass(frozen=True)
class Run:
    """A finished run: its directory, eval losses, plan events and final parameters."""

    path: Path
    losses: list[float]
    plans: list[dict]
    params: dict[str, torch.Tensor]


def finished(path: Path) -> Run:
    return Run(path, losses(path), run_events(path, "plan"), final_params(path))


@pytest.fixture(scope="module")
def frozen_run(llama_and_text, tmp_path_factory) -> Run:
    path = tmp_path_factory.mktemp("frozen") / "run"
    run_workers(overrides(*llama_and_text, *FROZEN), path)
    return finished(path)


@pytest.fixture(scope="module")
def cached_run(llama_and_text, tmp_path_factory) -> Run:
    path = tmp_path_factory.mktemp("cached") / "run"
    run_workers(overrides(*llama_and_text, *FROZEN, *CACHED), path)
    return finished(path)


def layouts(run: Run) -> list[tuple]:
    return [(p["epoch"], p["step"], p["pp"], p["dp"], p["frozen_units"]) for p in run.plans]


def assert_same_params(got: dict, want: dict, **tolerance) -> None:
    assert got.keys() == want.keys()
    for name in want:
        if tolerance:
            torch.testing.assert_close(got[name], want[name], **tolerance, msg=lambda m, name=name: f"{name}: {m}")
        else:
            assert torch.equal(got[name], want[name]), name


@pytest.mark.slow
def test_freezing_inside_an_epoch_keeps_a_causal_lm_learning(frozen_run):
    """The embedding and block 0 freeze after step 5; the two stages stay (K = 1 would hold more than a stage
    of the start) and stage 0 takes block 1's attention half beside the frozen prefix."""
    assert max(p["frozen_units"] for p in frozen_run.plans) == 3, layouts(frozen_run)
    assert layouts(frozen_run)[:2] == [(0, 0, 2, 1, 0), (0, 5, 2, 1, 3)], layouts(frozen_run)
    assert frozen_run.plans[1]["stage_bounds"] == [[0, 4], [4, 6]]
    assert frozen_run.losses[-1] < 0.8 * frozen_run.losses[0], frozen_run.losses


@pytest.mark.slow
def test_autocache_serves_a_decoders_frozen_prefix_as_recomputing_it_does(frozen_run, cached_run):
    """The cached run freezes as the plain one does; with the prefix out of the pipeline AutoPipe repacks it
    to K = 1 x DP = 2, and each replica starts at unit 3 from the cache's (hidden, padding mask) entries,
    written in the rest of epoch 0 and read after: its eval losses and final weights are the plain run's."""
    assert [p[:2] + p[4:] for p in layouts(cached_run)] == [p[:2] + p[4:] for p in layouts(frozen_run)]
    assert layouts(cached_run)[1] == (0, 5, 1, 2, 3), "the cached prefix runs nowhere: K = 1 fits, DP widens"
    assert [p["cached_units"] for p in cached_run.plans] == [0] + [3] * (len(cached_run.plans) - 1)
    epochs = run_events(cached_run.path, "epoch")
    assert epochs[0]["cache"]["written"] > 0 and epochs[-1]["cache"]["hits"] > 0, [e["cache"] for e in epochs]
    assert epochs[-1]["cache"]["computed"] == 0 and epochs[-1]["cache"]["eval_hits"] > 0
    assert cached_run.losses == pytest.approx(frozen_run.losses, rel=1e-5)
    assert_same_params(cached_run.params, frozen_run.params, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_bf16_trains_a_causal_lm_through_the_cache(llama_and_text, cached_run, tmp_path):
    """bf16 autocast over the same frozen, cached run (entries stored in bfloat16, the mask as it is): the
    loss falls, close to float32's and not equal to it (autocast ran); weights stay float32."""
    path = tmp_path / "bf16"
    run_workers(
        overrides(*llama_and_text, *FROZEN, "auto.cache=true", "cache.min_frozen_units=3", "train.precision=bf16"), path
    )
    run = finished(path)
    assert run.losses[-1] < 0.8 * run.losses[0], run.losses
    assert run.losses == pytest.approx(cached_run.losses, rel=1e-2)  # bf16 keeps 8 significant bits
    assert run.losses != pytest.approx(cached_run.losses, rel=1e-6, abs=0)
    assert [p["cached_units"] for p in run.plans] == [p["cached_units"] for p in cached_run.plans]
    cache, float32_cache = (run_events(p, "epoch")[-1]["cache"] for p in (path, cached_run.path))
    assert cache["hits"] > 0 and cache["memory_bytes"] < float32_cache["memory_bytes"]
    assert {t.dtype for t in run.params.values()} == {torch.float32}


@pytest.mark.slow
def test_a_causal_lm_killed_mid_epoch_resumes_to_the_uninterrupted_weights(
    llama_and_text, frozen_run, tmp_path, monkeypatch
):
    """Rank 1 (the last stage) SIGKILLed right after global step 12 (epoch 1, in the frozen layout): elastic
    restarts the workers, they resume from the step-11 checkpoint (weights, AdamW state, the epoch's order) and
    the run ends with exactly the weights and optimizer state of the run that was never stopped."""
    path = tmp_path / "killed"
    kills = [{"rank": 1, "point": "step", "step": 12}]
    run_killed(overrides(*llama_and_text, *FROZEN, "launcher.max_restarts=1"), path, kills, monkeypatch)
    starts = run_events(path, "start")
    assert len(starts) == 2 and starts[1]["resumed_from"].endswith("step_00000011"), starts
    assert [e.get("resumed_at_step") for e in run_events(path, "epoch")] == [None, 2, None]
    assert losses(path) == frozen_run.losses
    got, want = (store.load(lookup.latest_valid(p)) for p in (path, frozen_run.path))
    assert got[2]["global_step"] == want[2]["global_step"] == 27
    assert_same_params(got[0], want[0])
    for name in want[1]:
        for key, value in want[1][name].items():
            assert torch.equal(got[1][name][key], value), (name, key)


# ---- planning ---------------------------------------------------------------------------------------------


def test_plan_projects_a_decoder_directory(llama_and_text, cli, tmp_path):
    """`ptrun plan` on the Llama directory: its 6 units, the frozen prefix AutoFreeze and AutoCache would
    reach, and the analytic parameter count of each unit equal to the model's own."""
    from ptrun.models import build_model
    from ptrun.sim import costs_from_config

    llama, text = llama_and_text
    args = [*on_the_tiny_llama(llama, text), "train.epochs=3", "train.global_batch_size=32"]
    out = cli("plan", *args, "cluster=paper", "--samples", "72")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("recipe causal_lm: transformers, 6 units,")
    assert "Table 1 (causal_lm)" in out.stdout and out.stdout.count("\n== ") == 5
    section = out.stdout.split("== freeze + AutoPipe + AutoCache ")[1].split("\n\n")[0]
    rows = [line.split() for line in section.splitlines()[2:] if line.split()[0].isdigit()]
    assert [(r[1], r[2]) for r in rows] == [("0/6", "0"), ("3/6", "3"), ("5/6", "5")]

    cfg = compose_config(args, tmp_path / "run")
    layered = build_model(cfg.model, num_classes=0, units=())  # shapes only: no weights read
    costs = costs_from_config(cfg.model, cfg.data)
    assert list(costs.params) == [
        sum(layered.param_shapes[n].numel() for n in layered.unit_param_names(i)) for i in range(len(layered.units))
    ]
