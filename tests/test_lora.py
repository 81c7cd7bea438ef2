"""LoRA through peft (`adapter=lora`): ptrun's units with adapters train as peft's `get_peft_model` does on the
library model itself (the same LoraConfig, the same trainable head), over 20 steps, for every kind of model
ptrun builds: a BERT-like encoder under a classification head (its last layer's first-token tail runs the
family's cross-attention forward on the adapted weights), DistilBERT, GPT-2 (Conv1D), a Llama decoder and a
timm ViT. The base weights stay fixed, and after a freeze a frozen unit's adapters take no gradient.
(A 2-stage 1F1B pipeline against K = 1: tests/pipeline_cases.py.)"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hf_families import VOCAB, auto_class, tiny_config
from lora_cases import peft_twin

from ptrun.auto.autodp import set_frozen
from ptrun.compiling.compiler import UnitCompiler, unit_shape
from ptrun.config import AdapterConfig, ConfigError, ModelConfig, OptimConfig
from ptrun.models import build_model
from ptrun.models.adapters import library_name
from ptrun.models.losses import loss_weight, make_target, per_sample_loss
from ptrun.numerics.optim import build_optimizer
from ptrun.parallel.stage_module import StageModule

LORA = AdapterConfig(name="lora", r=4, alpha=8.0)
CASES = [
    ("bert", "classification"),
    ("distilbert", "classification"),
    ("gpt2", "classification"),
    ("llama", "causal_lm"),
    ("vit", "classification"),
]
MORE = [(k, "classification") for k in ("roberta", "xlm-roberta", "electra", "deberta-v2", "modernbert")] + [
    (k, "causal_lm") for k in ("qwen2", "qwen3", "mistral")
]
"""The other families, in the slow tier (their units are the ones above's kinds)."""
STEPS = 20
VIT = dict(name="vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4)


def lora_model(kind: str, task: str, adapter: AdapterConfig = LORA, seed: int = 0):
    """ptrun's layered model of the tiny `kind` with adapters, and the library model it wraps, built alone."""
    torch.manual_seed(seed)
    if kind == "vit":
        import timm

        layered = build_model(ModelConfig(**VIT), num_classes=3, img_size=16, in_chans=3, adapter=adapter)
        config = dict(layered.library_config)
        return layered, timm.create_model(config.pop("model_name"), pretrained=False, **config)
    layered = build_model(
        ModelConfig(name=kind, task=task), num_classes=3, library_config=tiny_config(kind), adapter=adapter
    )
    return layered, auto_class(task).from_config(tiny_config(kind))


def batches(kind: str, task: str, steps: int = STEPS):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        if kind == "vit":
            inputs = {"pixel_values": torch.randn(4, 3, 16, 16, generator=g)}
        else:
            mask = torch.ones(4, 10, dtype=torch.long)
            mask[1, 7:] = 0
            ids = torch.randint(3, VOCAB, (4, 10), generator=g) * mask
            inputs = {"input_ids": ids, "attention_mask": mask}
            if kind in ("bert", "electra"):  # the families whose tiny configuration has token types
                inputs["token_type_ids"] = (torch.arange(10) >= 5).long().expand(4, 10) * mask
        if task == "causal_lm":
            labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        else:
            labels = torch.randint(0, 3, (4,), generator=g)
        yield inputs, make_target({"labels": labels, "weight": torch.ones(4)}, task)


def loss_of(out, target, task):
    return per_sample_loss(out, target, task).sum() / loss_weight(target, task)


def library_out(twin, inputs, task):
    out = twin(inputs["pixel_values"]) if "pixel_values" in inputs else twin(**inputs)  # timm: positional
    return out if isinstance(out, torch.Tensor) else out.logits


OPTIM = OptimConfig(name="adamw", lr=1e-2, weight_decay=0.0, schedule="constant", warmup_fraction=0.0)


def train_beside_peft(kind: str, task: str, compiled: bool = False, adapter: AdapterConfig = LORA, steps: int = STEPS):
    """`steps` AdamW steps of ptrun's LoRA units of `kind` (with `adapter`) at K = 1 (one stage, its units
    compiled or eager) and of peft on the library model, side by side. Returns the pairs of losses, the layered
    model, peft's twin, the stage's compiler (None eager) and its counts after each step."""
    layered, library = lora_model(kind, task, adapter)
    twin = peft_twin(layered, library)
    compiler = UnitCompiler("default", layered) if compiled else None
    stage = StageModule(layered.units, compiler=compiler).train()
    twin.train()
    ours = build_optimizer([(n, p) for n, p in layered.model.named_parameters()], OPTIM)
    theirs = torch.optim.AdamW([p for p in twin.parameters() if p.requires_grad], lr=OPTIM.lr, weight_decay=0.0)
    trained = {n for n, p in layered.model.named_parameters() if p.requires_grad}
    assert trained and trained <= layered.adapters | set(layered.unit_param_names(len(layered.units) - 1))
    assert (
        sum(len(g["params"]) for g in ours.param_groups)
        == len(trained)
        == sum(p.requires_grad for p in twin.parameters())
    )
    losses, counts = [], []
    for inputs, target in batches(kind, task, steps):
        mine = loss_of(stage(*(inputs[k] for k in layered.input_names)), target, task)
        want = loss_of(library_out(twin, inputs, task), target, task)
        mine.backward()
        want.backward()
        for optimizer in (ours, theirs):
            optimizer.step()
            optimizer.zero_grad()
        losses.append((mine.item(), want.item()))
        counts.append(compiler.counts.snapshot() if compiler else None)
    return losses, layered, twin, compiler, counts


def assert_follows_peft(losses, layered, twin) -> None:
    """Every step's loss within 1e-4 relative of peft's; every adapter trained; the base as it was built."""
    for step, (mine, want) in enumerate(losses):
        assert abs(mine - want) <= 1e-4 * abs(want), (step, mine, want)
    built = dict(layered.model.named_parameters())
    lora_b = [n for n in layered.adapters if ".lora_B." in n]  # zero at the start: the model began as the base
    assert lora_b and all(built[n].abs().sum() > 0 for n in lora_b), "every adapter trained, the tail's included"
    base = {n: p for n, p in twin.base_model.model.named_parameters() if n in layered.fixed}
    assert all(torch.equal(built[n], p) for n, p in base.items()), "base weights stay as they were"


@pytest.mark.parametrize("kind,task", CASES + [pytest.param(*c, marks=pytest.mark.slow) for c in MORE])
def test_lora_units_train_as_peft_on_the_library_model(kind, task):
    assert_follows_peft(*train_beside_peft(kind, task)[:3])


@pytest.fixture
def one_thread():
    """One intra-op thread, as a ptrun worker has, for this test alone: on two cores other work keeps busy,
    a second thread spins waiting for the first at every kernel, which made the compiled units' steps cost
    more than twice the CPU time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kind,task", CASES[:1] + [pytest.param(*c, marks=pytest.mark.slow) for c in CASES[1:]])
def test_compiled_lora_units_train_as_peft_on_the_library_model(kind, task, one_thread):
    """`train.compile=true`: each unit compiled on its own with its adapters inside (peft's LoRA layers run
    in the unit's graph) follows peft on the library model as the eager units do. No unit kind falls back to
    eager, no graph breaks, and nothing compiles after the first step: one variant a unit shape, and at most
    one more, the first block's, whose input takes no gradient (nothing below it trains)."""
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    losses, layered, twin, compiler, counts = train_beside_peft(kind, task, compiled=True)
    assert_follows_peft(losses, layered, twin)
    assert compiler.kinds and not compiler.eager_kinds
    assert sum(counters["graph_break"].values()) == breaks
    assert counts[0] == counts[-1], "nothing compiled after the first step"
    shapes = {unit_shape(layered, u) for u in range(len(layered.units))}
    assert len(shapes) <= counts[0]["compiles"] <= len(shapes) + 1, (counts[0], shapes)


@pytest.mark.parametrize("kind,task", [("bert", "classification"), ("llama", "causal_lm")])
def test_after_a_freeze_frozen_adapters_and_base_weights_take_no_gradient(kind, task):
    layered, _ = lora_model(kind, task)
    set_frozen(layered, 3)  # the embedding and block 0's two halves
    stage = StageModule(layered.units).train()
    inputs, target = next(batches(kind, task))
    loss_of(stage(*(inputs[k] for k in layered.input_names)), target, task).backward()
    params = dict(layered.model.named_parameters())
    frozen = {n for u in range(3) for n in layered.unit_param_names(u)}
    assert not [n for n in layered.fixed if params[n].grad is not None], "no base weight takes a gradient"
    assert not [n for n in layered.adapters & frozen if params[n].grad is not None]
    live = (layered.adapters - frozen) | (set(params) - layered.fixed - layered.adapters)
    assert live and all(params[n].grad is not None for n in live)
    assert stage.frozen == 3


def peft_linear_pair(dropout: float = 0.0, dtype: torch.dtype = torch.float32):
    """One linear wrapped by peft's LoRA twice, the same values: peft's own `lora.Linear` and ptrun's
    `FusedLoraLinear` (B moved off zero, so that the adapter adds something)."""
    from peft import LoraConfig, inject_adapter_in_model

    from ptrun.models.lora_linear import FusedLoraLinear, fuse_lora_linears

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20))
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["0"])
    inject_adapter_in_model(config, model)
    with torch.no_grad():
        model[0].lora_B["default"].weight.normal_()
    model = model.to(dtype)
    fused = copy.deepcopy(model)
    assert fuse_lora_linears(fused) == 1 and type(fused[0]) is FusedLoraLinear
    return model[0], fused[0]


def forward_backward(module, x, seed: int = 3):
    """The module's output on a copy of `x` and the gradients of `x` and of each trainable parameter."""
    x = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)  # the same dropout mask for both
    out = module(x)
    out.float().square().sum().backward()
    grads = {n: p.grad for n, p in module.named_parameters() if p.requires_grad}
    return out, x.grad, grads


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_the_fused_lora_linear_computes_what_peft_does(dropout):
    """ptrun's wrapped linears add the adapter in one kernel; the output and every gradient (input, A, B) are
    peft's to rounding, dropout included; merged (peft's own forward then) it is the same module as peft's."""
    theirs, ours = peft_linear_pair(dropout)
    x = torch.randn(2, 5, 12)
    (out_t, gx_t, g_t), (out_o, gx_o, g_o) = forward_backward(theirs, x), forward_backward(ours, x)
    torch.testing.assert_close(out_o, out_t)
    torch.testing.assert_close(gx_o, gx_t)
    assert set(g_o) == set(g_t) == {"lora_A.default.weight", "lora_B.default.weight"}
    for name in g_t:
        torch.testing.assert_close(g_o[name], g_t[name])
    theirs.merge()
    ours.merge()
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))


def test_the_fused_lora_linear_follows_peft_under_autocast_and_in_half_precision():
    """bf16 autocast over fp32 weights, and bf16 weights without autocast: the output keeps peft's dtype and
    its values to bf16's rounding; fp32 adapters on a bf16 base without autocast take peft's own sum."""
    theirs, ours = peft_linear_pair()
    x = torch.randn(6, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = theirs(x), ours(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    theirs, ours = peft_linear_pair(dtype=torch.bfloat16)
    want, got = theirs(x.bfloat16()), ours(x.bfloat16())
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for module in (theirs, ours):  # a bf16 base under fp32 adapters (peft's `autocast_adapter_dtype`)
        module.lora_A.float()
        module.lora_B.float()
    want, got = theirs(x.bfloat16()), ours(x.bfloat16())
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_every_wrapped_linear_of_the_units_is_the_fused_one():
    """The exactness tests above compare these units with peft's own modules: they hold the fused linear."""
    from peft.tuners.lora import LoraLayer

    from ptrun.models.lora_linear import FusedLoraLinear

    for kind, task in CASES:
        layered, _ = lora_model(kind, task)
        wrapped = [m for m in layered.model.modules() if isinstance(m, LoraLayer)]
        assert wrapped and all(type(m) is FusedLoraLinear for m in wrapped), kind


def test_targets_follow_the_family_table():
    layered, _ = lora_model("bert", "classification", AdapterConfig(name="lora", targets=["query", "value"]))
    wrapped = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in layered.adapters}
    assert wrapped == {"query", "value"}
    auto, _ = lora_model("llama", "causal_lm")
    wrapped = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in auto.adapters}
    assert wrapped == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any(n.startswith(("lm_head", "model.embed")) for n in auto.adapters)
    vit, _ = lora_model("vit", "classification")
    wrapped = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in vit.adapters}
    assert wrapped == {"qkv", "proj", "fc1", "fc2"}  # the attention's output projection, as BERT's and Llama's
    assert not any(n.startswith("patch_embed.") for n in vit.adapters)  # its `proj` is the embedding's conv
    assert auto.fixed == {n for n in auto.param_shapes if ".lora_" not in n}  # causal_lm: adapters only


def test_a_unit_is_initialised_alone_adapters_included():
    """A worker fills only its own units: a unit's adapters draw their values from the unit's seed, the same
    whichever other units the process holds (peft's rule: B zero, so the model starts as the base)."""
    every, _ = lora_model("bert", "classification")
    torch.manual_seed(0)
    alone = build_model(
        ModelConfig(name="bert", task="classification"),
        num_classes=3,
        library_config=tiny_config("bert"),
        adapter=LORA,
        units=[3],
    )
    full, one = dict(every.model.named_parameters()), dict(alone.model.named_parameters())
    for name in every.unit_param_names(3):
        assert torch.equal(full[name], one[name]), name
    assert all(one[n].numel() == 0 for n in alone.unit_param_names(1))
    lora_b = [n for n in every.unit_param_names(3) if ".lora_B." in n]
    assert lora_b and all(full[n].abs().sum() == 0 for n in lora_b)


def test_targets_naming_no_module_list_the_linear_modules():
    with pytest.raises(ConfigError, match=r"adapter.targets=.*wraps no linear module.*bert.encoder.layer.0"):
        lora_model("bert", "classification", AdapterConfig(name="lora", targets=["q_proj"]))


def trained_a_little(layered) -> None:
    """Move every trained parameter off its initial value (B starts at zero: the adapters would add nothing)."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in layered.model.named_parameters():
            if name not in layered.fixed:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def trained_output(layered, kind: str, task: str) -> tuple[dict, torch.Tensor]:
    """`layered` trained a little and put in eval mode: one batch's inputs and its output on them, which an
    export must reproduce."""
    trained_a_little(layered)
    layered.eval()
    inputs, _ = next(batches(kind, task))
    with torch.no_grad():
        return inputs, layered(*(inputs[k] for k in layered.input_names))


@pytest.mark.parametrize("kind,task", [("bert", "classification"), ("llama", "causal_lm"), ("vit", "classification")])
def test_the_export_loads_with_peft_alone_and_merged_with_the_library_alone(kind, task, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    from ptrun.models.export import export_model

    layered, library = lora_model(kind, task)
    inputs, want = trained_output(layered, kind, task)
    ours = dict(layered.model.named_parameters())
    base = {library_name(n): p.detach().clone() for n, p in ours.items() if n not in layered.adapters}
    library.load_state_dict(base)  # the base model as its own file holds it (the head untrained)
    with torch.no_grad():
        for name in set(ours) - layered.fixed - layered.adapters:
            library.get_parameter(name).zero_()  # so the head must come from the adapter's files
    adapter = export_model(layered, tmp_path / "adapter")
    timm_config = {"config.json"} if kind == "vit" else set()  # how to build the base: timm.create_model(**it)
    assert {p.name for p in adapter.iterdir()} == {"adapter_config.json", "adapter_model.safetensors", *timm_config}
    saved = load_file(adapter / "adapter_model.safetensors")
    assert sum(t.numel() for t in saved.values()) == sum(ours[n].numel() for n in set(ours) - layered.fixed)
    loaded = PeftModel.from_pretrained(library, adapter).eval()
    with torch.no_grad():
        torch.testing.assert_close(library_out(loaded, inputs, task), want, rtol=0, atol=1e-5)
    out = export_model(layered, tmp_path / "merged", merge=True)
    assert any(".lora_" in n for n, _ in layered.model.named_parameters()), "the run's model keeps its adapters"
    if kind == "vit":
        import timm

        config = json.loads((out / "config.json").read_text())
        model = timm.create_model(config.pop("model_name"), pretrained=False, **config)
        model.load_state_dict(load_file(out / "model.safetensors"))
    else:
        model = auto_class(task).from_pretrained(out)
    with torch.no_grad():
        torch.testing.assert_close(library_out(model.eval(), inputs, task), want, rtol=0, atol=1e-5)
