"""The layered-model contract: units reproduce the library forward and backward exactly (a classification
model's last layer computes the first token's row only: equal to the float rounding of a one-row product), own
every parameter once (a declared tied parameter is owned by its first unit and shared by the others), can be cut
anywhere, and pretrained weights load (or fail) as documented."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_families import library_logits
from torch import nn

from ptrun.config import ConfigError, ModelConfig
from ptrun.models import LayeredModel, build_model, run_units
from ptrun.models.lazy import init_units

VIT = dict(name="vit_tiny_patch16_224", img_size=8, patch_size=2, in_chans=1, embed_dim=32, depth=3, num_heads=2)
BERT = dict(name="bert-tiny", depth=2, embed_dim=32, num_heads=2, vocab_size=100)
KINDS = ["vit", "bert-classification", "bert-qa", "bert-mlm"]
WORD_EMB = "bert.embeddings.word_embeddings.weight"


def make(kind: str, seed: int = 0, **overrides) -> LayeredModel:
    torch.manual_seed(seed)
    fields = dict(VIT) if kind == "vit" else dict(BERT, task=kind.split("-")[1])
    return build_model(ModelConfig(**{**fields, **overrides}), num_classes=10)


def inputs(kind: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    if kind == "vit":
        return (torch.randn(4, 1, 8, 8, generator=g),)
    ids = torch.randint(0, 100, (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # padded rows, so the additive mask matters
    mask[3, 2:] = 0
    token_types = (torch.arange(9) >= 4).long().expand(4, 9)
    return ids, mask, token_types


def library_forward(layered: LayeredModel, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The library model's own forward, as the logits the units return."""
    if layered.family == "vit":
        return layered.model(*xs)
    return library_logits(layered.model, dict(zip(layered.input_names, xs, strict=True)), layered.task)


def assert_equal(kind: str, ours: torch.Tensor, library: torch.Tensor, name: str = "") -> None:
    """Bitwise, except under the first-token tail, whose one-row products the matrix kernels may sum in
    another order than the whole sequence's."""
    if kind == "bert-classification":
        torch.testing.assert_close(ours, library, rtol=1e-5, atol=1e-7, msg=name)
    else:
        assert torch.equal(ours, library), name


@pytest.mark.parametrize("kind", KINDS)
def test_units_equal_library_forward(kind):
    layered = make(kind).eval()
    xs = inputs(kind)
    with torch.no_grad():
        assert_equal(kind, layered(*xs), library_forward(layered, xs))


@pytest.mark.parametrize("kind", KINDS)
def test_units_equal_library_gradients(kind):
    layered = make(kind).train()  # dropout 0 by default, so train mode is deterministic
    xs = inputs(kind)
    grads = []
    for forward in (lambda: layered(*xs), lambda: library_forward(layered, xs)):
        layered.zero_grad()
        out = forward()
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in layered.model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert_equal(kind, grads[0][name], grads[1][name], name)


@pytest.mark.parametrize("kind", KINDS)
def test_only_a_classification_head_keeps_the_first_token_of_the_last_layer(kind):
    layered = make(kind).eval()
    xs = inputs(kind)
    outs = []
    with torch.no_grad():
        out = xs
        for unit in layered.units[:-1]:
            out = unit(*(out if isinstance(out, tuple) else (out,)))
            outs.append(out[0] if isinstance(out, tuple) else out)
    rows = [o.shape[1] for o in outs]
    if kind == "bert-classification":  # the last attention half and the MLP half after it: one row each
        assert layered.sequence_units == len(layered.units) - 3 and rows[-2:] == [1, 1] and set(rows[:-2]) == {9}
    else:
        assert layered.sequence_units == len(layered.units) and 1 not in rows


@pytest.mark.parametrize("kind", KINDS)
def test_units_partition_parameters(kind):
    layered = make(kind)
    depth = VIT["depth"] if kind == "vit" else BERT["depth"]
    n = len(layered.units)
    assert layered.num_blocks == depth and n == 2 * depth + 2 == len(layered.unit_names)
    assert layered.unit_names[:3] == ["embed", "block.0.attn", "block.0.mlp"] and layered.unit_names[-1] == "head"
    assert [layered.unit_block(i) for i in range(n)] == [None] + [b for b in range(depth) for _ in "am"] + [None]
    owned = [name for i in range(n) for name in layered.unit_param_names(i)]
    assert sorted(owned) == sorted(name for name, _ in layered.model.named_parameters())
    assert len(owned) == len(set(owned))
    assert list(layered._modules) == ["model"]  # units are not registered: each parameter is registered once


@pytest.mark.parametrize("kind", KINDS)
def test_any_cut_gives_the_same_output(kind):
    layered = make(kind).eval()
    xs = inputs(kind)
    params = dict(layered.model.named_parameters())
    with torch.no_grad():
        full = layered(*xs)
        for k in range(1, len(layered.units)):  # both sides non-empty, as two stages
            front, back = nn.ModuleList(layered.units[:k]), nn.ModuleList(layered.units[k:])  # like stages
            carry = run_units(front, *xs)
            assert torch.equal(run_units(back, *(carry if isinstance(carry, tuple) else (carry,))), full)
            # a stage holding these units holds exactly their parameters: owned, plus replicas of tied ones
            names = [
                name
                for i in range(k, len(layered.units))
                for name in layered.unit_param_names(i) + layered.unit_shared_param_names(i)
            ]
            assert {id(p) for p in back.parameters()} == {id(params[name]) for name in names}


@pytest.mark.parametrize("kind", ["vit", "bert-classification", "bert-qa"])
def test_no_tied_parameters_outside_mlm(kind):
    layered = make(kind)
    assert layered.tied == {} and layered.tied_parameter_names() == []
    assert all(layered.unit_shared_param_names(i) == [] for i in range(len(layered.units)))


def test_mlm_ties_word_embeddings_to_the_decoder():
    layered = make("bert-mlm")
    model, last = layered.model, len(layered.units) - 1
    assert type(model).__name__ == "BertForMaskedLM" and model.bert.pooler is None
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert layered.tied == {WORD_EMB: (0, last)}
    assert layered.tied_parameter_names() == [WORD_EMB] == layered.tied_parameter_names(range(last, last + 1))
    assert layered.tied_parameter_names(range(1, last)) == []
    assert WORD_EMB in layered.unit_param_names(0)
    assert all(WORD_EMB not in layered.unit_param_names(i) for i in range(1, last + 1))
    assert layered.unit_shared_param_names(last) == [WORD_EMB]
    assert all(layered.unit_shared_param_names(i) == [] for i in range(last))
    # the owned names cover the model's parameters exactly once each (the tie counted once)
    owned = [name for i in range(last + 1) for name in layered.unit_param_names(i)]
    assert len(owned) == len(set(owned)) and set(owned) == {name for name, _ in model.named_parameters()}
    xs = inputs("bert-mlm")
    assert layered.eval()(*xs).shape == (4, 9, BERT["vocab_size"])


def test_mlm_gradient_step_updates_the_tied_weight_once():
    layered = make("bert-mlm").train()
    decoder = layered.model.cls.predictions.decoder.weight
    before = decoder.detach().clone()
    opt = torch.optim.SGD(layered.model.parameters(), lr=0.1)  # parameters() yields the tied tensor once
    out = layered(*inputs("bert-mlm"))
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    opt.step()
    assert decoder is layered.model.bert.embeddings.word_embeddings.weight  # still one object
    assert not torch.equal(decoder, before)
    # one update with the gradient summed over both uses (applied twice it would be off by 0.1 * grad)
    torch.testing.assert_close(decoder.detach(), before - 0.1 * decoder.grad, rtol=0, atol=1e-6)


def test_mlm_tied_replicas_on_two_stages_sum_to_the_full_gradient():
    """What the pipeline runtime does: each stage holds a replica; their gradients summed are the true one."""
    layered = make("bert-mlm").train()
    xs = inputs("bert-mlm")
    weight = dict(layered.model.named_parameters())[WORD_EMB]
    out = layered(*xs)
    probe = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * probe).sum().backward()
    full = weight.grad.clone()

    k = len(layered.units) // 2
    memo: dict = {}  # deepcopy's memo maps the original Parameter to each stage's replica
    front = copy.deepcopy(nn.ModuleList(layered.units[:k]), memo)
    front_weight = memo[id(weight)]
    memo = {}
    back = copy.deepcopy(nn.ModuleList(layered.units[k:]), memo)
    back_weight = memo[id(weight)]
    assert front_weight is not back_weight and torch.equal(front_weight, back_weight)
    carry = run_units(front, *xs)
    sent = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in carry)  # the stage boundary
    (run_units(back, *sent) * probe).sum().backward()
    torch.autograd.backward([t for t in carry if t.requires_grad], [s.grad for s in sent if s.requires_grad])
    assert not torch.equal(front_weight.grad, full) and not torch.equal(back_weight.grad, full)
    torch.testing.assert_close(front_weight.grad + back_weight.grad, full, rtol=1e-5, atol=1e-6)


def test_undeclared_sharing_between_units_is_an_error():
    layered = make("bert-classification")
    units = list(layered.units)
    units[-1].shared = units[0].embeddings.word_embeddings  # accidental reuse in the head
    with pytest.raises(RuntimeError, match=f"{WORD_EMB} is not owned once"):
        LayeredModel(layered.model, family="bert", task="classification", units=units, input_names=layered.input_names)
    tied = LayeredModel(
        layered.model,
        family="bert",
        task="classification",
        units=units,
        input_names=layered.input_names,
        tied=[WORD_EMB],
    )  # declared: allowed
    assert tied.tied == {WORD_EMB: (0, len(units) - 1)}
    del units[-1].shared
    with pytest.raises(RuntimeError, match="parameters in no unit"):
        LayeredModel(
            layered.model,
            family="bert",
            task="classification",
            units=units[:-1] + [nn.Identity()],
            input_names=layered.input_names,
        )


def test_cfg_sizes_win_over_data_facts():
    layered = build_model(ModelConfig(**VIT, num_classes=5), num_classes=10, img_size=32, in_chans=3)
    assert layered.model.head.out_features == 5
    assert layered(torch.randn(2, 1, 8, 8)).shape == (2, 5)
    bert = build_model(ModelConfig(name="bert-mini", depth=1, mlp_ratio=2), num_classes=3, vocab_size=50)
    config = bert.model.config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size) == (
        1,
        256,
        512,
        50,
    )
    assert config._attn_implementation == "sdpa"  # model.attention's default
    eager = build_model(ModelConfig(name="bert-mini", depth=1, attention="eager"), num_classes=3, vocab_size=50)
    assert eager.model.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", ["vit_no_such_model", "resnet50", "bert-huge"])
def test_unknown_model_is_a_config_error(name):
    with pytest.raises(ConfigError, match=f"model.name='{name}' is not a known model"):
        build_model(ModelConfig(name=name), num_classes=2)


def test_load_pretrained_round_trip(tmp_path):
    from safetensors.torch import save_file

    source = make("vit", seed=0).eval()
    path = tmp_path / "vit.safetensors"
    save_file(source.model.state_dict(), str(path))
    loaded = make("vit", seed=1, pretrained=str(path)).eval()
    x = inputs("vit")
    assert torch.equal(loaded(*x), source(*x))

    # another class count: the head is re-initialised, everything else loads
    other = make("vit", seed=1, pretrained=str(path), num_classes=3)
    src = source.model.state_dict()
    for name, value in other.model.state_dict().items():
        if name.startswith("head."):
            assert value.shape[0] == 3
        else:
            assert torch.equal(value, src[name]), name


def test_load_pretrained_torch_file_with_prefix(tmp_path):
    source = make("bert-classification", seed=0).eval()
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.model.state_dict().items()}}, path)
    loaded = make("bert-classification", seed=1, pretrained=str(path)).eval()
    xs = inputs("bert-classification")
    assert torch.equal(loaded(*xs), source(*xs))


def test_load_pretrained_errors(tmp_path):
    from safetensors.torch import save_file

    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"not safetensors at all")
    with pytest.raises(ConfigError, match=f"model.pretrained='{corrupt}': cannot read weights"):
        make("vit", pretrained=str(corrupt))

    state = make("vit").model.state_dict()
    del state["blocks.1.attn.qkv.weight"]
    missing = tmp_path / "missing.safetensors"
    save_file(state, str(missing))
    with pytest.raises(ConfigError, match="blocks.1.attn.qkv.weight is missing"):
        make("vit", pretrained=str(missing))

    wrong = tmp_path / "wrong.safetensors"
    save_file(make("vit", embed_dim=16).model.state_dict(), str(wrong))
    with pytest.raises(ConfigError, match="cls_token has shape"):
        make("vit", pretrained=str(wrong))


def saved_bert(path, model_class, **config):
    """A tiny eager BERT (seed 0) of the library's `model_class`, saved at `path` as a Hugging Face directory."""
    from transformers import BertConfig

    torch.manual_seed(0)
    sizes = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    source = model_class(BertConfig(**sizes, attn_implementation="eager", **config)).eval()
    source.save_pretrained(path)  # a tied weight is written once
    return source


def test_bert_from_hugging_face_directory(tmp_path):
    from transformers import BertForSequenceClassification

    source = saved_bert(tmp_path, BertForSequenceClassification, num_labels=4)
    cfg = dict(name="my-bert", family="bert", pretrained=str(tmp_path), attention="eager")  # as the source

    torch.manual_seed(1)
    layered = build_model(ModelConfig(**cfg), num_classes=4).eval()
    xs = inputs("bert-classification")
    with torch.no_grad():
        assert torch.equal(layered(*xs), source(*xs).logits)

    qa = build_model(ModelConfig(**cfg, task="qa"), num_classes=4)  # classifier dropped, qa_outputs new
    assert qa.model.qa_outputs.out_features == 2
    assert torch.equal(qa.model.bert.embeddings.word_embeddings.weight, source.bert.embeddings.word_embeddings.weight)

    with pytest.raises(ConfigError, match="model.depth=3 is not allowed"):
        build_model(ModelConfig(**cfg, depth=3), num_classes=4)


def test_bert_mlm_from_hugging_face_directory(tmp_path):
    from transformers import BertForMaskedLM

    source = saved_bert(tmp_path, BertForMaskedLM)

    torch.manual_seed(1)
    layered = build_model(
        ModelConfig(name="my-bert", family="bert", task="mlm", pretrained=str(tmp_path), attention="eager"),
        num_classes=4,
    ).eval()  # as the source
    model = layered.model
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert layered.tied == {WORD_EMB: (0, len(layered.units) - 1)}
    xs = inputs("bert-mlm")
    with torch.no_grad():
        assert torch.equal(layered(*xs), source(*xs).logits)


def test_regression_loss_is_the_squared_error_of_each_sample():
    import torch.nn.functional as F

    from ptrun.models.losses import WeightedLoss, make_target

    batch = {"labels": torch.tensor([3.8, 0.25, 5.0]), "weight": torch.tensor([1.0, 1.0, 0.0])}
    target = make_target(batch, "regression")
    assert target.dtype == torch.float64 and target[:, 0].tolist() == pytest.approx([3.8, 0.25, 5.0])
    output = torch.tensor([[3.0], [1.25], [-7.0]])
    loss = WeightedLoss("regression")
    want = F.mse_loss(output[:2, 0], batch["labels"][:2])
    # over the real samples of the global batch
    assert loss(output, target, denominator=2.0).item() == pytest.approx(want.item())


# ---- building only what a worker runs (ptrun.models.lazy) -------------------------------------------------


def held(layered: LayeredModel) -> dict[str, torch.Tensor]:
    """The parameters that have values here (the others are empty)."""
    return {n: p for n, p in layered.model.named_parameters() if p.numel()}


@pytest.mark.parametrize("kind", KINDS)
def test_a_unit_starts_with_the_same_values_whatever_else_is_built(kind):
    whole = make(kind, seed=3)
    n = len(whole.units)
    for units in ([0], [2, 3], [n - 1], [1, n - 1]):
        torch.manual_seed(3)
        fields = dict(VIT) if kind == "vit" else dict(BERT, task=kind.split("-")[1])
        part = build_model(ModelConfig(**fields), num_classes=10, units=())
        assert held(part) == {}  # built without values
        init_units(part, units)
        values = held(part)
        want = {nm for u in units for nm in whole.unit_param_names(u) + whole.unit_shared_param_names(u)}
        assert set(values) == want, units
        every = dict(whole.model.named_parameters())
        for name, value in values.items():
            assert torch.equal(value, every[name]), (units, name)
    # the library's own rule, unit by unit: normal(0, 0.02)-sized linear weights, LayerNorm at identity
    linear = next(m for m in whole.units[1].modules() if isinstance(m, nn.Linear))
    assert 0.015 < linear.weight.std().item() < 0.025 and not linear.bias.any()
    norm = next(m for m in whole.units[2].modules() if isinstance(m, nn.LayerNorm))
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and not norm.bias.any()


def test_units_without_values_are_measured_one_at_a_time():
    """measure_unit_memory runs every unit of a model that has no values, and leaves it without any."""
    from ptrun.layout.fit import measure_unit_memory

    torch.manual_seed(0)
    part = build_model(ModelConfig(**VIT), num_classes=10, units=())
    memory = measure_unit_memory(part, inputs("vit")[:1], "adamw")
    assert held(part) == {}
    whole_memory = measure_unit_memory(make("vit"), inputs("vit")[:1], "adamw")
    assert memory == whole_memory


@pytest.mark.parametrize("suffix", [".safetensors", ".pt", "hf-dir"])
def test_pretrained_weights_are_read_for_the_units_filled(tmp_path, suffix):
    from safetensors.torch import save_file

    source = make("bert-mlm", seed=0)
    path = tmp_path / f"weights{suffix}"
    state = {k: v.detach().contiguous() for k, v in source.model.named_parameters()}  # the tie once
    fields = dict(BERT, task="mlm")
    if suffix == "hf-dir":  # a Hugging Face directory: its config sizes the model, its weights fill it
        source.model.save_pretrained(path)
        fields = dict(name="my-bert", family="bert", task="mlm")
    elif suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    torch.manual_seed(1)
    part = build_model(ModelConfig(**fields, pretrained=str(path)), num_classes=10, units=())
    n = len(part.units)
    assert held(part) == {}
    init_units(part, [n - 1])  # the head: its own weights and the tied word embedding, nothing else
    values = held(part)
    assert set(values) == set(part.unit_param_names(n - 1)) | {WORD_EMB}
    for name, value in values.items():
        assert torch.equal(value, source.model.get_parameter(name)), name
