"""LoRA's options as peft users write them: targets (all-linear, names, dotted ends, a regex, exclusions),
alpha that follows r, rsLoRA, DoRA and the gaussian init. Each trains one step as peft's own
`get_peft_model` model does; the family table is the libraries' own module names; every target form the
docs and the recipes' headers write runs as written; the exports of the options load with peft alone."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from conftest import REPO
from hf_families import auto_class, tiny_config
from test_lora import library_out, lora_model, train_beside_peft, trained_output

from ptrun.config import AdapterConfig
from ptrun.config.adapter import ALPHA_PER_RANK, BLOCK_LINEARS, check_targets_of, lora_alpha
from ptrun.errors import ConfigError
from ptrun.models.adapters import library_name

LORA = AdapterConfig(name="lora", r=4, alpha=8.0)
TASKS = {"gpt2": "causal_lm", "llama": "causal_lm", "qwen2": "causal_lm", "qwen3": "causal_lm", "mistral": "causal_lm"}


def wrapped(layered) -> list[str]:
    """The full names of the modules that got an adapter, in model order."""
    return list(dict.fromkeys(n.split(".lora_")[0] for n in layered.adapters))


@pytest.mark.parametrize("family", [f for f in BLOCK_LINEARS if f != "vit"])
def test_the_family_table_is_the_library_models_own_block_linears(family):
    """`BLOCK_LINEARS` names each block's linear modules by their paths and the blocks' prefix as the task
    model has them: what a dotted end and a regex are matched against, before the model exists."""
    model = auto_class(TASKS.get(family, "classification")).from_config(tiny_config(family))
    linears = BLOCK_LINEARS[family]
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]
    in_blocks = [n for n in names if re.match(rf"{re.escape(linears.prefix)}\.\d+\.", n)]
    assert in_blocks
    assert sorted({n.split(".", linears.prefix.count(".") + 2)[-1] for n in in_blocks}) == sorted(linears.block)


def test_the_vit_table_is_timms_block_linears():
    layered, _ = lora_model("vit", "classification", replace(LORA, targets="all-linear"))
    got = {n.split(".", 2)[-1] for n in wrapped(layered)}
    assert {n.split(".", 1)[0] for n in wrapped(layered)} == {BLOCK_LINEARS["vit"].prefix}
    assert got == set(BLOCK_LINEARS["vit"].block)


@pytest.mark.parametrize(
    "kind,task,adapter,want",
    [
        # all-linear: every linear of the blocks; never the pooler nor the classifier
        ("bert", "classification", dict(targets="all-linear"), list(BLOCK_LINEARS["bert"].block)),
        (
            "bert",
            "classification",
            dict(targets=["dense"]),
            ["attention.output.dense", "intermediate.dense", "output.dense"],
        ),
        ("bert", "classification", dict(targets=["attention.output.dense"]), ["attention.output.dense"]),
        ("bert", "classification", dict(targets=["output.dense"]), ["attention.output.dense", "output.dense"]),
        (
            "bert",
            "classification",
            dict(targets="all-linear", exclude=["attention.output.dense", "intermediate.dense"]),
            ["attention.self.query", "attention.self.key", "attention.self.value", "output.dense"],
        ),
        (
            "bert",
            "classification",
            dict(targets=r".*\.(query|value)"),
            ["attention.self.query", "attention.self.value"],
        ),
        ("gpt2", "causal_lm", dict(targets=["attn.c_proj"]), ["attn.c_proj"]),
        ("gpt2", "causal_lm", dict(targets=["c_proj"], exclude=r".*mlp\.c_proj"), ["attn.c_proj"]),
        ("llama", "causal_lm", dict(targets=["q_proj", "v_proj"]), ["self_attn.q_proj", "self_attn.v_proj"]),
    ],
)
def test_targets_pick_what_peft_would(kind, task, adapter, want):
    layered, _ = lora_model(kind, task, replace(LORA, **adapter))
    prefix = BLOCK_LINEARS[kind].prefix
    blocks = {int(n[len(prefix) + 1 :].split(".")[0]) for n in wrapped(layered)}
    expected = [f"{prefix}.{b}.{p}" for b in sorted(blocks) for p in want]
    assert sorted(wrapped(layered)) == sorted(expected) and len(blocks) == tiny_config(kind).num_hidden_layers
    check_targets_of(replace(LORA, **adapter), kind)  # the launcher's check, before the model, agrees


def documented_target_forms() -> set[str]:
    """Every `adapter.targets=...` and `adapter.exclude=...` the guide and the recipes' headers write."""
    texts = [(REPO / "docs" / "guide.md").read_text()] + [p.read_text() for p in (REPO / "recipes").glob("*.yaml")]
    pattern = r"adapter\.(?:targets|exclude)=(?:'[^']*'|[^\s`|\"]+)"  # a regex in Hydra's quotes, whole
    return {m for t in texts for m in re.findall(pattern, t.replace("\\|", "|"))}  # a table's escaped bar


def test_every_documented_target_form_runs_as_written():
    """Each form composes as written (Hydra's parsing), passes the launcher's check on a family whose names
    it uses, and wraps modules of that family's tiny model."""
    from ptrun.compose import composed

    forms = documented_target_forms()
    assert len(forms) >= 5, forms
    for form in forms:
        adapter = composed(["adapter=lora", form]).adapter
        ran = []
        for kind, task in (("bert", "classification"), ("gpt2", "causal_lm"), ("llama", "causal_lm")):
            try:
                check_targets_of(adapter, kind)
            except ConfigError:
                continue
            layered, _ = lora_model(kind, task, replace(adapter, r=4))
            assert layered.adapters, form
            ran.append(kind)
        assert ran, form


def test_alpha_follows_r_unless_set():
    assert AdapterConfig().alpha is None
    assert lora_alpha(AdapterConfig(name="lora", r=8)) == 16.0 == ALPHA_PER_RANK * 8
    assert lora_alpha(AdapterConfig(name="lora", r=64)) == 128.0
    assert lora_alpha(AdapterConfig(name="lora", r=64, alpha=16)) == 16.0
    layered, _ = lora_model("bert", "classification", AdapterConfig(name="lora", r=64))
    assert layered.adapter_config.lora_alpha == 128.0


OPTIONS = {
    "all-linear": dict(targets="all-linear"),
    "rslora": dict(rslora=True),
    "dora": dict(dora=True),
    "gaussian": dict(init="gaussian"),
}


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("kind,task", [("bert", "classification"), ("llama", "causal_lm")])
def test_one_step_of_each_option_is_pefts(option, kind, task):
    """Freezing off, one step of ptrun's units with the option against peft's `get_peft_model` on the library
    model with the same LoraConfig: the loss within 1e-4 relative, and after the step the adapters within
    1e-4 too (the step was the same)."""
    adapter = replace(LORA, **OPTIONS[option])
    losses, layered, twin, _, _ = train_beside_peft(kind, task, adapter=adapter, steps=2)
    for mine, want in losses:
        assert abs(mine - want) <= 1e-4 * abs(want), (option, mine, want)
    config = layered.adapter_config
    assert (config.use_rslora, config.use_dora, config.init_lora_weights) == (
        adapter.rslora,
        adapter.dora,
        adapter.init,
    )
    ours, theirs = dict(layered.model.named_parameters()), dict(twin.base_model.model.named_parameters())
    for name in layered.adapters:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-6)


def test_gaussian_init_draws_a_as_peft_does():
    layered, _ = lora_model("bert", "classification", replace(LORA, init="gaussian"))
    a = torch.cat([p.flatten() for n, p in layered.model.named_parameters() if ".lora_A." in n])
    assert abs(a.std().item() - 1 / LORA.r) < 0.03  # peft: normal, std 1 / r (Kaiming-uniform's is far smaller)


@pytest.mark.parametrize("kind,task", [("bert", "classification"), ("gpt2", "causal_lm")])
def test_dora_magnitudes_come_from_the_real_base_weights(kind, task):
    """peft computes DoRA's magnitude when it wraps a module, here on the meta device: ptrun computes it once
    the unit holds its values, the row norms of its base weight (B starts at zero), as peft does on the
    built model."""
    from peft import get_peft_model

    layered, library = lora_model(kind, task, replace(LORA, dora=True))
    params = dict(layered.model.named_parameters())
    magnitudes = sorted(n for n in layered.adapters if "lora_magnitude_vector" in n)
    assert magnitudes
    library.load_state_dict({library_name(n): p for n, p in params.items() if n not in layered.adapters}, strict=False)
    twin = dict(get_peft_model(library, layered.adapter_config).base_model.model.named_parameters())
    for name in magnitudes:
        assert params[name].abs().min() > 0
        torch.testing.assert_close(params[name], twin[name], rtol=1e-6, atol=1e-6)


def test_dora_magnitudes_follow_a_pretrained_directory(tmp_path):
    """From a Hugging Face directory the base weights are read per unit after the units' own draw: the
    magnitudes are those of the file's weights."""
    from ptrun.config import ModelConfig
    from ptrun.models import build_model

    torch.manual_seed(5)
    library = auto_class("classification").from_config(tiny_config("bert"))
    library.save_pretrained(tmp_path)
    layered = build_model(
        ModelConfig(name="bert", task="classification", pretrained=str(tmp_path)),
        num_classes=3,
        adapter=replace(LORA, dora=True),
    )
    files = dict(library.named_parameters())
    for name, p in layered.model.named_parameters():
        if "lora_magnitude_vector" in name:
            base = files[name.split(".lora_magnitude_vector")[0] + ".weight"]
            torch.testing.assert_close(p, base.norm(dim=1), rtol=1e-6, atol=1e-6)


def test_every_wrapped_linear_takes_pefts_forward_for_dora():
    """DoRA is a peft `lora_variant`: the fused linear's one-kernel sum does not do it, so it must run peft's
    forward (what the exactness above compares); plain LoRA layers take the fused path. The fused linear
    reads peft internals by name: `lora_variant`, `_cast_input_dtype`, the class it replaces. A peft that
    renames them fails here, loudly, not in a run."""
    from peft.tuners.lora import Linear as LoraLinear

    from ptrun.models.lora_linear import FusedLoraLinear

    layered, _ = lora_model("bert", "classification", replace(LORA, dora=True))
    layers = [m for m in layered.model.modules() if isinstance(m, LoraLinear)]
    assert layers and all(type(m) is FusedLoraLinear and "default" in m.lora_variant for m in layers)
    for attribute in ("lora_variant", "_cast_input_dtype", "scaling", "lora_dropout", "active_adapters"):
        assert hasattr(layers[0], attribute), f"peft's lora.Linear has no {attribute} any more"
    assert FusedLoraLinear.__mro__[1] is LoraLinear


@pytest.mark.parametrize("kind,task", [("bert", "classification"), ("gpt2", "causal_lm")])
def test_the_export_of_the_options_loads_with_peft_alone(kind, task, tmp_path):
    """DoRA, rsLoRA and the gaussian init together, adapters on dotted ends only: the export loads through
    `PeftModel.from_pretrained` and scores as the run's model; merged, through the library alone."""
    from peft import PeftModel

    from ptrun.models.export import export_model

    targets = ["attention.output.dense", "query"] if kind == "bert" else ["attn.c_proj", "c_fc"]
    adapter = replace(LORA, dora=True, rslora=True, init="gaussian", targets=targets)
    layered, library = lora_model(kind, task, adapter)
    inputs, want = trained_output(layered, kind, task)
    ours = dict(layered.model.named_parameters())
    base = {library_name(n): p.detach() for n, p in ours.items() if n not in layered.adapters}
    missing = library.load_state_dict(base, strict=False).missing_keys
    assert all(library.get_parameter(m) is library.get_input_embeddings().weight for m in missing)  # a tied head
    out = export_model(layered, tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(library, out).eval()
    assert loaded.peft_config["default"].use_dora and loaded.peft_config["default"].use_rslora
    with torch.no_grad():
        torch.testing.assert_close(library_out(loaded, inputs, task), want, rtol=0, atol=1e-5)
    merged = export_model(layered, tmp_path / "merged", merge=True)
    model = auto_class(task).from_pretrained(merged).eval()
    with torch.no_grad():
        torch.testing.assert_close(library_out(model, inputs, task), want, rtol=0, atol=1e-5)


def test_hub_targets_are_checked_against_the_models_own_family(tmp_path, hub, cli):
    """A hub id is not a family: its targets are checked once its config.json resolves from the hub cache (a
    temporary HF_HOME, offline), against its own `model_type`, never against a guessed one (BERT's)."""
    from test_hub import MAIN, cache_repo

    from ptrun.compose import for_cluster

    sizes = tmp_path / "sizes"
    tiny_config("qwen2").save_pretrained(sizes)
    snapshot = cache_repo(hub, "Qwen/Qwen2.5-0.5B", sizes, MAIN)
    args = ["recipe=causal_lm", "model.pretrained=Qwen/Qwen2.5-0.5B", "data.path=x.jsonl", "data.max_length=32"]
    args.append("adapter=lora")
    cfg = for_cluster([*args, "adapter.targets=[q_proj,v_proj]"], nodes=1, gpus_per_node=1)
    assert cfg.model.pretrained == str(snapshot) and cfg.adapter.targets == ["q_proj", "v_proj"]
    with pytest.raises(ConfigError, match=r"adapter.targets=\['query', 'value'\] .*a qwen2 block's linear modules"):
        for_cluster([*args, "adapter.targets=[query,value]"], nodes=1, gpus_per_node=1)
    out = cli("plan", *args, "adapter.targets=[query,value]", "cluster=paper")
    resolved, refused = out.stderr.strip().splitlines()  # the id's snapshot, said as it resolves; then the line
    assert out.returncode == 2 and resolved.startswith("model.pretrained=Qwen/Qwen2.5-0.5B -> ")
    assert refused.startswith("ptrun: error: adapter.targets=['query', 'value'] is not allowed: names or dotted ends")
    assert "of a qwen2 block's linear modules: self_attn.q_proj" in refused
