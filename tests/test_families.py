"""Every supported transformers family, from a directory the library itself wrote (tiny random configs from its
own config classes): the layered model's logits equal the library model's (fp32, with padding), frozen units
take no gradient and no optimizer state, the export reloads with `AutoModelFor*.from_pretrained` to equal
logits, the simulator counts the parameters of those it prices from config.json, and what ptrun cannot split is
one line. (K = 2 pipelines against K = 1: tests/test_pipeline_dist.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from hf_families import DECODERS, ENCODERS, VARIANTS, VOCAB, auto_class, library_logits, tiny_config

from ptrun.config import ConfigError, DataConfig, ModelConfig, OptimConfig
from ptrun.costs.from_config import costs_from_config
from ptrun.layout.first import param_costs
from ptrun.models import build_model
from ptrun.models.export import export_model
from ptrun.models.hf import FAMILIES
from ptrun.models.losses import IGNORE_INDEX, WeightedLoss, loss_weight, make_target, per_sample_loss
from ptrun.numerics.optim import build_optimizer
from ptrun.train import traces

CASES = [(k, t) for k in (*ENCODERS, *VARIANTS) for t in ("classification", "qa")] + [
    (k, t) for k in DECODERS for t in ("classification", "causal_lm")
]
FAST = {
    ("roberta", "classification"),
    ("distilbert", "qa"),
    ("llama", "causal_lm"),
    ("gpt2", "classification"),
    ("deberta-v2-conv", "classification"),
    ("modernbert", "classification"),
}
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
    """Three sequences of 10 tokens, two of them padded on the right (pad id 0 never appears inside), the
    second half of each of type 1."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    types = (torch.arange(10) >= 5).long().expand(3, 10) * mask
    return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": types}


def library_forward(model, b: dict[str, torch.Tensor], task: str) -> torch.Tensor:
    """The library model's logits on `b`, with token types where its configuration has them."""
    types = {"token_type_ids": b["token_type_ids"]} if getattr(model.config, "type_vocab_size", 0) > 1 else {}
    return library_logits(model, {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], **types}, task)


def family(kind: str) -> str:
    """The model_type of a tiny configuration."""
    return VARIANTS.get(kind, kind)


def kernel(kind: str, attention: str) -> dict[str, str]:
    """The library's `attn_implementation` for `model.attention` (DeBERTa refuses to be asked: it has one)."""
    return {"attn_implementation": attention} if FAMILIES[family(kind)].attention_kernels else {}


def layered_from(path, task: str, attention: str = "sdpa"):
    return build_model(ModelConfig(name="mine", pretrained=str(path), task=task, attention=attention), num_classes=3)


@pytest.mark.parametrize("attention", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind,task", CASES)
def test_units_equal_the_library_model(saved, kind, task, attention):
    layered = layered_from(saved[kind, task], task, attention).eval()
    library = auto_class(task).from_pretrained(saved[kind, task], **kernel(kind, attention)).eval()
    b = batch()
    with torch.no_grad():
        ours = layered(*(b[k] for k in layered.input_names))
        want = library_forward(library, b, task)
    assert layered.family == family(kind) and len(layered.units) == 2 * 2 + 2
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-5)
    # the head pools the first token, so the last layer computes that row only (ptrun.models.encoders)
    first_token = task == "classification" and (
        kind in ("bert", "roberta", "xlm-roberta", "electra", "distilbert")
        or kind == "modernbert"
        and library.config.classifier_pooling == "cls"
    )
    assert layered.sequence_units == len(layered.units) - (3 if first_token else 0)


def test_modernbert_pooling_its_first_token_computes_one_row_of_its_last_layer(tmp_path):
    config = tiny_config("modernbert", num_labels=3)
    config.classifier_pooling = "cls"  # the tiny one pools the mean, which reads every row
    torch.manual_seed(0)
    auto_class("classification").from_config(config).save_pretrained(tmp_path)
    layered = layered_from(tmp_path, "classification").eval()
    library = auto_class("classification").from_pretrained(tmp_path).eval()
    b = batch()
    with torch.no_grad():
        ours = layered(*(b[k] for k in layered.input_names))
        want = library_forward(library, b, "classification")
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-5)
    assert layered.sequence_units == len(layered.units) - 3


def test_the_causal_lm_loss_is_the_library_loss(saved):
    """The token loss summed per sample over the predicted tokens, divided by their count, is what
    `LlamaForCausalLM(labels=...)` returns (shifted labels, padding ignored)."""
    layered = layered_from(saved["llama", "causal_lm"], "causal_lm").eval()
    library = auto_class("causal_lm").from_pretrained(saved["llama", "causal_lm"]).eval()
    b = batch()
    labels = b["input_ids"].masked_fill(b["attention_mask"] == 0, IGNORE_INDEX)
    target = make_target({"labels": labels, "weight": torch.ones(3)}, "causal_lm")
    with torch.no_grad():
        ours = per_sample_loss(layered(*(b[k] for k in layered.input_names)), target, "causal_lm")
        want = library(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=labels).loss
    assert ours.shape == (3,)
    torch.testing.assert_close(ours.sum() / loss_weight(target, "causal_lm"), want.double(), rtol=1e-6, atol=0)


def host_reads(forward) -> int:
    """How often `forward()` reads a tensor's value on the host (on a GPU each one waits for the device)."""
    from torch.profiler import profile

    with profile() as prof:
        forward()
    return traces.host_reads(prof.key_averages())


def four_layers(kind: str, task: str, folder):
    """The tiny model of `kind` with four layers (two of each type where it mixes types), saved in `folder`."""
    config = tiny_config(kind)
    fields = {**config.to_dict(), "num_hidden_layers": 4}
    if fields.get("layer_types"):
        fields["layer_types"] = fields["layer_types"] * 2
    torch.manual_seed(0)
    auto_class(task).from_config(type(config)(**fields)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind,task", tiered([(k, t) for k, t in CASES if t != "qa"]))
def test_units_read_the_device_no_more_often_than_the_library_model(tmp_path, kind, task):
    """The attention halves of a pass share what the library model builds once a forward (the masks of each
    layer type, the rotary tables), so training reads values on the host (a wait for the device on a GPU) no
    more often than the library model does; the next pass, with other padding, builds its own."""
    path = four_layers(kind, task, tmp_path / kind)
    layered, library = layered_from(path, task), auto_class(task).from_pretrained(path)
    assert len(layered.units) == 4 * 2 + 2
    b = batch()
    for cut in (None, 2):  # the batch, then one whose last row is cut shorter: other padding
        if cut is not None:
            b["attention_mask"][-1, cut:] = 0
            b = {
                **b,
                "input_ids": b["input_ids"] * b["attention_mask"],
                "token_type_ids": b["token_type_ids"] * b["attention_mask"],
            }
        ours = host_reads(lambda b=b: layered(*(b[k] for k in layered.input_names)).sum().backward())
        theirs = host_reads(lambda b=b: library_forward(library, b, task).sum().backward())
        assert ours <= theirs, (ours, theirs)
        with torch.no_grad():
            torch.testing.assert_close(
                layered(*(b[k] for k in layered.input_names)), library_forward(library, b, task), rtol=0, atol=1e-5
            )


def test_a_stage_shares_one_pass_across_its_checkpointed_chunks(tmp_path):
    """A stage that recomputes every unit runs each in a chunk of its own; its forward is still one pass, so
    it reads the device as often as the library model's forward does."""
    from ptrun.parallel.stage_module import StageModule

    path = four_layers("llama", "causal_lm", tmp_path / "llama")
    layered, library = layered_from(path, "causal_lm"), auto_class("causal_lm").from_pretrained(path)
    stage = StageModule(layered.units, recompute=1).train()
    b = batch()
    inputs = [b[k] for k in layered.input_names]
    ours = host_reads(lambda: stage(*inputs))
    assert ours <= host_reads(lambda: library_forward(library, b, "causal_lm")), ours
    torch.testing.assert_close(stage(*inputs), library_forward(library, b, "causal_lm"), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind,task", tiered([(k, t) for k, t in CASES if t != "qa"]))
def test_frozen_units_take_no_gradient_and_no_optimizer_state(saved, kind, task):
    layered = layered_from(saved[kind, task], task).train()
    frozen = [name for u in range(3) for name in layered.unit_param_names(u)]  # embed + block 0
    params = dict(layered.model.named_parameters())
    for name in frozen:
        params[name].requires_grad_(False)
    optimizer = build_optimizer(
        [(n, p) for n, p in params.items() if p.requires_grad],
        OptimConfig(name="adamw", lr=1e-2, schedule="constant", warmup_fraction=0.0),
    )
    b = batch()
    b["labels"] = (
        b["input_ids"] * b["attention_mask"] - 100 * (1 - b["attention_mask"])
        if task == "causal_lm"
        else torch.tensor([0, 2, 1])
    )
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
def test_export_reloads_with_the_library(saved, kind, task, tmp_path, capfd):
    layered = layered_from(saved[kind, task], task).eval()
    with torch.no_grad():  # change the weights, so the export is not the input directory again
        for p in layered.model.parameters():
            p.add_(0.01)
    names = ["negative", "neutral", "positive"]
    out = export_model(layered, tmp_path / "model", class_names=names)
    assert "Writing model shards" not in capfd.readouterr().err  # the run's end line says where it went
    library = auto_class(task).from_pretrained(out).eval()
    b = batch()
    with torch.no_grad():
        torch.testing.assert_close(
            layered(*(b[k] for k in layered.input_names)), library_forward(library, b, task), rtol=0, atol=1e-5
        )
    if task == "classification":
        assert library.config.id2label == dict(enumerate(names))


def test_units_start_from_the_library_rules_for_their_blocks():
    """Each unit is initialised as the library's `initialize_weights` does it, children before parents, so a
    block's own rule wins over the generic one for its Linear layers: ModernBERT's truncated normals (cut at
    2 std) and its classifier's width^-1/2 (a rule of the task model itself), GPT-2's c_proj scaled by
    1/sqrt(2 L)."""

    def built(kind: str):
        torch.manual_seed(0)
        return build_model(ModelConfig(name=kind), num_classes=3, library_config=tiny_config(kind)).model

    modern = built("modernbert")
    std = modern.config.initializer_range
    for layer in modern.model.layers:
        assert layer.attn.Wqkv.weight.abs().max() <= 2 * std  # the generic normal(0, std) would exceed it
        assert layer.mlp.Wo.weight.abs().max() <= 2 * std / 2  # std / sqrt(2 L), L = 2
    classifier = modern.classifier.weight
    assert classifier.abs().max() <= 2 * 32**-0.5 and classifier.std() > 5 * std
    gpt2 = built("gpt2")
    for block in gpt2.transformer.h:
        assert block.attn.c_proj.weight.std() < 0.7 * std and block.mlp.c_proj.weight.std() < 0.7 * std


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


PUBLISHED = {  # the sizes of published config.json files, as written there
    "deberta-v3-base": {
        "model_type": "deberta-v2",
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "max_position_embeddings": 512,
        "relative_attention": True,
        "position_buckets": 256,
        "norm_rel_ebd": "layer_norm",
        "share_att_key": True,
        "pos_att_type": "p2c|c2p",
        "max_relative_positions": -1,
        "position_biased_input": False,
        "type_vocab_size": 0,
        "vocab_size": 128100,
    },
    "deberta-v2-xlarge": {
        "model_type": "deberta-v2",
        "attention_head_size": 64,
        "conv_act": "gelu",
        "conv_kernel_size": 3,
        "hidden_size": 1536,
        "intermediate_size": 6144,
        "max_position_embeddings": 512,
        "max_relative_positions": -1,
        "norm_rel_ebd": "layer_norm",
        "num_attention_heads": 24,
        "num_hidden_layers": 24,
        "pooler_hidden_size": 1536,
        "pos_att_type": "p2c|c2p",
        "position_biased_input": False,
        "position_buckets": 256,
        "relative_attention": True,
        "share_att_key": True,
        "type_vocab_size": 0,
        "vocab_size": 128100,
    },
    "modernbert-base": {
        "model_type": "modernbert",
        "attention_bias": False,
        "classifier_bias": False,
        "classifier_pooling": "mean",
        "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000.0,
        "hidden_size": 768,
        "intermediate_size": 1152,
        "local_attention": 128,
        "local_rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "norm_bias": False,
        "num_attention_heads": 12,
        "num_hidden_layers": 22,
        "pad_token_id": 50283,
        "bos_token_id": 50281,
        "eos_token_id": 50282,
        "cls_token_id": 50281,
        "sep_token_id": 50282,
        "vocab_size": 50368,
    },
}
PRICED = ("deberta-v2", "deberta-v2-conv", "modernbert")
"""The families the simulator prices from their whole config.json (`ptrun.costs.hf_families.ENCODER_COSTS`)."""


@pytest.mark.parametrize("task", ["classification", "qa"])
@pytest.mark.parametrize("name", [*PRICED, *PUBLISHED])
def test_the_planner_counts_every_parameter_of_the_library_model(saved, tmp_path, name, task):
    """The simulator's per-unit parameter counts, from config.json alone, are the built model's (what the
    planner counts in a run: a tied weight on every unit holding a replica), and over the units they are the
    library model's `num_parameters` plus those replicas. Published sizes are built on the meta device."""
    from transformers import AutoConfig

    labels = 2 if task == "qa" else 3
    if name in PUBLISHED:
        (tmp_path / "config.json").write_text(json.dumps(PUBLISHED[name]))
        path = tmp_path
    else:
        path = saved[name, task]
    config = AutoConfig.from_pretrained(path, num_labels=labels)
    costs = costs_from_config(
        ModelConfig(name=name, pretrained=str(path), task=task, num_classes=labels), DataConfig(max_length=128)
    )
    layered = build_model(ModelConfig(name=name, task=task), num_classes=labels, library_config=config, units=())
    with torch.device("meta"):
        library = auto_class(task).from_config(config)
    replicas = sum((len(users) - 1) * layered.param_shapes[n].numel() for n, users in layered.tied.items())
    assert costs.params == tuple(param_costs(layered))
    assert sum(costs.params) == library.num_parameters() + replicas
