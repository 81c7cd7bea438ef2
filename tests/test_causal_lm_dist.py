"""A decoder fine-tuned as a causal LM on the user's own JSONL, on real worker processes: a tiny Llama (random
weights, built with transformers' own classes; a word-level BERT tokenizer of the text's words) learns
repeated text, a 2-stage
pipeline trains exactly as data parallelism over the same two workers, and freezing the bottom layers inside
an epoch keeps it learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import final_params, run_events, run_workers

pytestmark = pytest.mark.dist

LINES = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
         "all that glitters is not gold", "the early bird catches the worm"]


@pytest.fixture(scope="module")
def llama_and_text(tmp_path_factory) -> tuple[Path, Path]:
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    root = tmp_path_factory.mktemp("causal_lm")
    words = sorted({w for line in LINES for w in line.split()})
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    (root / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}))
    tokenizer = AutoTokenizer.from_pretrained(root / "tokenizer")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root / "llama")
    tokenizer.save_pretrained(root / "llama")
    text = root / "text.jsonl"
    text.write_text("".join(json.dumps({"text": LINES[i % 4]}) + "\n" for i in range(96)))
    return root / "llama", text


def overrides(llama: Path, text: Path, *extra: str) -> list[str]:
    return ["recipe=causal_lm", f"model.pretrained={llama}",
            f"data.path={text}", "data.max_length=16", "data.eval_fraction=0.25",
            "train.epochs=3", "train.global_batch_size=8", "train.export=false", "optim.lr=3e-3", "train.grad_clip=0",
            "optim.schedule=constant", "optim.warmup_fraction=0", "launcher.nproc_per_node=2",
            "pipe.microbatches=2", *extra]


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


@pytest.mark.slow
def test_freezing_inside_an_epoch_keeps_a_causal_lm_learning(llama_and_text, tmp_path):
    llama, text = llama_and_text
    run = tmp_path / "frozen"
    run_workers(overrides(llama, text, "pipe.length=2", "freeze.policy=schedule", "freeze.blocks=[0,1]",
                          "freeze.every=0.5"), run)
    frozen = [e["frozen_units"] for e in run_events(run, "plan")]
    assert max(frozen) == 3, f"the embedding and block 0 froze: {frozen}"
    found = losses(run)
    assert found[-1] < 0.8 * found[0], found
