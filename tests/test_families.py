"""Every supported transformers family, from a directory the library itself wrote (tiny random configs from its
own config classes): the layered model's logits equal the library model's (fp32, with padding), frozen units
take no gradient and no optimizer state, the export reloads with `AutoModelFor*.from_pretrained` to equal
logits, and what ptrun cannot split is one line. (K = 2 pipelines against K = 1: tests/test_pipeline_dist.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from hf_families import DECODERS, ENCODERS, VOCAB, auto_class, tiny_config
from ptrun.config import ConfigError, ModelConfig, OptimConfig
from ptrun.models import build_model
from ptrun.models.export import export_model
from ptrun.models.losses import WeightedLoss, make_target
from ptrun.parallel.optim import build_optimizer

CASES = [(k, t) for k in ENCODERS for t in ("classification", "qa")] + \
        [(k, t) for k in DECODERS for t in ("classification", "causal_lm")]
FAST = {("roberta", "classification"), ("distilbert", "qa"), ("llama", "causal_lm"), ("gpt2", "classification")}
"""What the fast tier checks of the slower tests (each model build is about a second); `slow` runs them all."""


def tiered(cases):
    return [pytest.param(*c, marks=() if c in FAST else pytest.mark.slow) for c in cases]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(kind, task) -> a directory holding that task model, as `save_pretrained` writes it."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for kind, task in CASES:
        torch.manual_seed(0)
        config = tiny_config(kind, num_labels=2 if task == "qa" else 3)
        path = root / f"{kind}-{task}"
        auto_class(task).from_config(config).save_pretrained(path)
        out[kind, task] = path
    return out


def batch() -> dict[str, torch.Tensor]:
    """Three sequences of 10 tokens, two of them padded on the right (pad id 0 never appears inside)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def library_logits(model, b: dict[str, torch.Tensor], task: str) -> torch.Tensor:
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    return torch.stack([out.start_logits, out.end_logits], -1) if task == "qa" else out.logits


def layered_from(path, task: str, attention: str = "sdpa"):
    return build_model(ModelConfig(name="mine", pretrained=str(path), task=task, attention=attention),
                       num_classes=3)


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind,task", CASES)
def test_units_equal_the_library_model(saved, kind, task, attention):
    layered = layered_from(saved[kind, task], task, attention).eval()
    library = auto_class(task).from_pretrained(saved[kind, task], attn_implementation=attention).eval()
    b = batch()
    with torch.no_grad():
        ours = layered(*(b[k] for k in layered.input_names))
        want = library_logits(library, b, task)
    assert layered.family == kind and len(layered.units) == 2 * 2 + 2
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind,task", tiered([(k, t) for k, t in CASES if t != "qa"]))
def test_frozen_units_take_no_gradient_and_no_optimizer_state(saved, kind, task):
    layered = layered_from(saved[kind, task], task).train()
    frozen = [name for u in range(3) for name in layered.unit_param_names(u)]  # embed + block 0
    params = dict(layered.model.named_parameters())
    for name in frozen:
        params[name].requires_grad_(False)
    optimizer = build_optimizer([(n, p) for n, p in params.items() if p.requires_grad],
                                OptimConfig(name="adamw", lr=1e-2, schedule="constant", warmup_fraction=0.0))
    b = batch()
    b["labels"] = (b["input_ids"] * b["attention_mask"] - 100 * (1 - b["attention_mask"])
                   if task == "causal_lm" else torch.tensor([0, 2, 1]))
    b["weight"] = torch.ones(3)
    target = make_target(b, task)
    out = layered(*(b[k] for k in layered.input_names))
    loss = WeightedLoss(task)
    loss(out, target).backward()
    before = {n: params[n].detach().clone() for n in frozen}
    optimizer.step()
    tied = set(layered.tied)  # GPT-2's / Qwen2's tied lm_head trains through the head unit
    for name in frozen:
        if name in tied:
            continue
        assert params[name].grad is None, name
        assert torch.equal(params[name], before[name]), name
        assert params[name] not in optimizer.state, name
    assert all(params[n].grad is not None for n in params if n not in frozen), "the rest trains"


@pytest.mark.parametrize("kind,task", tiered(CASES))
def test_export_reloads_with_the_library(saved, kind, task, tmp_path):
    layered = layered_from(saved[kind, task], task).eval()
    with torch.no_grad():  # change the weights, so the export is not the input directory again
        for p in layered.model.parameters():
            p.add_(0.01)
    names = ["negative", "neutral", "positive"]
    out = export_model(layered, tmp_path / "model", class_names=names)
    library = auto_class(task).from_pretrained(out).eval()
    b = batch()
    with torch.no_grad():
        torch.testing.assert_close(layered(*(b[k] for k in layered.input_names)), library_logits(library, b, task),
                                   rtol=0, atol=1e-5)
    if task == "classification":
        assert library.config.id2label == dict(enumerate(names))


def test_tied_output_embedding_is_declared_across_the_model(saved):
    layered = layered_from(saved["gpt2", "causal_lm"], "causal_lm")
    assert layered.tied == {"transformer.wte.weight": (0, len(layered.units) - 1)}
    assert layered.model.lm_head.weight is layered.model.transformer.wte.weight


def test_unsupported_model_type_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ConfigError, match=r"is a 't5' model.*supported are bert, roberta.*mistral$"):
        layered_from(tmp_path, "classification")


@pytest.mark.parametrize("kind,task", [("llama", "qa"), ("roberta", "causal_lm")])
def test_a_task_the_family_does_not_do_is_one_line(saved, kind, task):
    source = saved[kind, "classification"]
    with pytest.raises(ConfigError, match=rf"model.task='{task}' is not allowed: a {kind} model does"):
        layered_from(source, task)
