"""`adapter.layers` (adapters on chosen blocks, peft's `layers_to_transform`) and `adapter.pretrained` (a peft
adapter continued), in one process: ptrun's first step with adapters on a subset of blocks is peft's own
`get_peft_model(..., layers_to_transform=...)` step on the library model; the blocks below the lowest adapter
start frozen and the policy counts the adapted blocks only (a block without adapters freezes with the one
below it); the planner prices the prefix frozen from the start; a saved adapter starts a model with its
values; bad input is one line. (Runs of real workers: tests/test_lora_continue.py.)"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import assert_one_error_line
from hf_families import auto_class, tiny_config
from test_lora import batches, library_out, loss_of

from ptrun.auto.autodp import set_frozen
from ptrun.auto.controller import start
from ptrun.compose import compose
from ptrun.config import AdapterConfig, ModelConfig
from ptrun.config.adapter_layers import adapted_blocks, adapted_count_below, fixed_blocks, frozen_blocks_for
from ptrun.costs.adapters import adapter_params, trained_params
from ptrun.costs.from_config import costs_from_config
from ptrun.models import build_model
from ptrun.models.adapters import library_name, save_adapter
from ptrun.parallel.stage_module import StageModule
from ptrun.sim.cluster import get_cluster
from ptrun.sim.simulate import plan_epochs, simulate_one, total_seconds

LORA = AdapterConfig(name="lora", r=4, alpha=8.0)
MINILM = ["recipe=bbc_news_lora", "pipe.length=1", "launcher.nproc_per_node=1"]
"""The embedded default's MiniLM (6 blocks) with LoRA, on one worker."""


def test_the_forms_of_adapter_layers_name_the_blocks_and_what_freezes_with_them():
    assert adapted_blocks(None, 4) == (0, 1, 2, 3)
    assert adapted_blocks("top:2", 6) == (4, 5)
    assert adapted_blocks([5, 1, 3], 6) == (1, 3, 5)
    adapted = adapted_blocks([1, 3, 4], 6)
    assert fixed_blocks(adapted) == 1  # block 0 and the embedding train nothing
    # the policy's count of frozen adapted blocks -> the model's frozen blocks: block 2 (no adapter) freezes
    # with block 1 below it, block 5 (none) with block 4
    assert [frozen_blocks_for(adapted, k, 6) for k in range(4)] == [1, 3, 4, 6]
    assert [adapted_count_below(adapted, f) for f in (1, 3, 4, 6)] == [0, 1, 2, 3]


def layer_subset(kind: str, task: str, layers, blocks: int = 3, pattern: str | None = None):
    """ptrun's units of the tiny `kind` (`blocks` blocks) with adapters on `layers`, and peft's own model of
    the library with the same values: `get_peft_model` with the leaf names and `layers_to_transform` (and
    `layers_pattern`, where peft cannot find the block index alone)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = tiny_config(kind)
    config.num_hidden_layers = blocks
    adapter = AdapterConfig(name="lora", r=4, alpha=8.0, layers=layers)
    layered = build_model(ModelConfig(name=kind, task=task), num_classes=3, library_config=config, adapter=adapter)
    library = auto_class(task).from_config(config)
    ours = dict(layered.model.named_parameters())
    library.load_state_dict({library_name(n): p for n, p in ours.items() if n not in layered.adapters}, strict=False)
    leaves = sorted({n.rsplit(".", 1)[-1] for n in layered.adapter_config.target_modules})
    want = adapted_blocks(layers, blocks)
    peft_config = LoraConfig(
        r=4, lora_alpha=8, target_modules=leaves, layers_to_transform=list(want), layers_pattern=pattern
    )
    twin = get_peft_model(library, peft_config)
    theirs = dict(twin.base_model.model.named_parameters())
    assert {n for n in theirs if ".lora_" in n} == layered.adapters, "peft wraps the modules ptrun wraps"
    with torch.no_grad():
        for name in layered.adapters:
            theirs[name].copy_(ours[name])
            if ".lora_B." in name:  # off zero, so that the adapters change the loss
                theirs[name].normal_(std=0.1)
                ours[name].copy_(theirs[name])
    for name, p in theirs.items():
        p.requires_grad_(name not in layered.fixed)
    return layered, twin


@pytest.mark.parametrize(
    "kind,task,layers",
    [("bert", "classification", [0, 2]), ("bert", "classification", "top:1"), ("llama", "causal_lm", [1])],
)
def test_one_step_on_a_layer_subset_is_peft_layers_to_transform(kind, task, layers):
    """The run's first plan (`ptrun.auto.controller.start`, freezing off) freezes the embedding and the
    blocks below the lowest adapted block; one AdamW step of ptrun's stage in that plan gives peft's loss
    (within 1e-4 relative), then peft's second loss after the update, and no unit of the prefix holds a
    gradient."""
    layered, twin = layer_subset(kind, task, layers)
    cfg = compose([*MINILM, "auto.freeze=false", f"adapter.layers={layers}".replace(" ", "")])
    first = start(cfg, layered, 1).first
    fixed = fixed_blocks(adapted_blocks(layers, 3))
    assert first.frozen_units == (1 + 2 * fixed if fixed else 0)
    set_frozen(layered, first.frozen_units)
    stage = StageModule(layered.units).train()
    twin.train()
    ours = torch.optim.AdamW([p for p in layered.model.parameters() if p.requires_grad], lr=1e-2)
    theirs = torch.optim.AdamW([p for p in twin.parameters() if p.requires_grad], lr=1e-2)
    assert sum(p.numel() for g in ours.param_groups for p in g["params"]) == sum(
        p.numel() for g in theirs.param_groups for p in g["params"]
    )
    prefix = {n for u in range(first.frozen_units) for n in layered.unit_param_names(u)}
    params = dict(layered.model.named_parameters())
    for step, (inputs, target) in enumerate(batches(kind, task, 2)):
        mine = loss_of(stage(*(inputs[k] for k in layered.input_names)), target, task)
        want = loss_of(library_out(twin, inputs, task), target, task)
        assert abs(mine.item() - want.item()) <= 1e-4 * abs(want.item()), (step, mine.item(), want.item())
        mine.backward()
        want.backward()
        assert not [n for n in prefix if params[n].grad is not None], "the fixed prefix takes no gradient"
        for optimizer in (ours, theirs):
            optimizer.step()
            optimizer.zero_grad()


def test_peft_finds_the_same_blocks_of_a_timm_vit_by_its_blocks_pattern():
    """timm names its blocks `blocks.N`: peft needs `layers_pattern="blocks"` to find them, and then wraps the
    modules ptrun wraps for `adapter.layers=[1]`."""
    from peft import LoraConfig, get_peft_model

    vit = dict(name="vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=3, num_heads=4)
    adapter = AdapterConfig(name="lora", r=4, alpha=8.0, layers=[1])
    layered = build_model(ModelConfig(**vit), num_classes=3, img_size=16, in_chans=3, adapter=adapter)
    import timm

    options = dict(layered.library_config)
    library = timm.create_model(options.pop("model_name"), pretrained=False, **options)
    config = LoraConfig(
        r=4, target_modules=["qkv", "proj", "fc1", "fc2"], layers_to_transform=[1], layers_pattern="blocks"
    )
    twin = get_peft_model(library, config)
    wrapped = {n for n, _ in twin.base_model.model.named_parameters() if ".lora_" in n}
    assert wrapped == layered.adapters and all(n.startswith("blocks.1.") for n in wrapped)


def test_the_first_plan_freezes_the_prefix_and_the_policy_counts_the_adapted_blocks():
    """With adapters on blocks 2 and 5 of MiniLM's 6 and `freeze.policy=schedule`: the first plan freezes
    the embedding and blocks 0-1 (and caches them: AutoCache's threshold is met); the schedule's counts are
    of the adapted blocks, so freezing block 2 freezes blocks 3 and 4 (no adapters) with it."""
    cfg = compose(
        [*MINILM, "adapter.layers=[2,5]", "freeze.policy=schedule", "freeze.every=1", "freeze.blocks=[0,1,2]"]
    )
    costs = costs_from_config(cfg.model, cfg.data)
    controller, plans = plan_epochs(costs, get_cluster("paper"), cfg)
    assert controller.policy.num_blocks == 2
    assert [(p.frozen_units, p.cached_units) for p in plans] == [(5, 5), (11, 11), (13, 11)]


def test_the_planner_prices_the_prefix_frozen_from_the_start():
    """The planner counts the adapters the model builds for `adapter.layers=top:2` (none below block 4), and
    its first epoch, with freezing off, is cheaper than with adapters on every block: the prefix runs its
    forward only, and from the cache where it pays."""
    cfg = compose([*MINILM, "adapter.layers=top:2"])
    costs = costs_from_config(cfg.model, cfg.data)
    layered = build_model(cfg.model, units=(), adapter=cfg.adapter, num_classes=5)  # bbc_news: five topics
    shapes = layered.param_shapes
    per_unit = [
        sum(shapes[n].numel() for n in layered.unit_param_names(u) if n in layered.adapters)
        for u in range(costs.num_units)
    ]
    assert per_unit == adapter_params(costs, cfg) and per_unit[:9] == [0] * 9 and all(per_unit[9:13])
    assert sum(trained_params(costs, cfg)) < sum(trained_params(costs, compose(MINILM)))
    cluster = get_cluster("paper")
    seconds = {}
    for name, extra in (("top2", ["adapter.layers=top:2"]), ("all", [])):
        c = compose([*MINILM, *extra, "auto.freeze=false"])
        c = replace(c, launcher=replace(c.launcher, nproc_per_node=cluster.gpus_per_node, nnodes="1"))
        records = simulate_one(costs, cluster, c, 2000)
        assert records[0].plan.frozen_units == (9 if name == "top2" else 0)
        seconds[name] = total_seconds(records)
    assert seconds["top2"] < 0.8 * seconds["all"]


def test_a_saved_adapter_starts_the_model_with_its_values(tmp_path):
    """`adapter.pretrained`: the adapters and the task head of a model built from a saved adapter are the saved
    values, bit for bit (peft's keys read back to ptrun's names); the base weights are the model's own."""
    vit = dict(name="vit_tiny_patch16_224", img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4)
    adapter = AdapterConfig(name="lora", r=4, alpha=8.0, layers="top:1")
    torch.manual_seed(0)
    saved = build_model(ModelConfig(**vit), num_classes=3, img_size=16, in_chans=3, adapter=adapter)
    with torch.no_grad():
        for name, p in saved.model.named_parameters():
            if name not in saved.fixed:
                p.normal_()
    save_adapter(saved, tmp_path)
    again = AdapterConfig(name="lora", r=4, alpha=8.0, layers="top:1", pretrained=str(tmp_path))
    torch.manual_seed(0)
    loaded = build_model(ModelConfig(**vit), num_classes=3, img_size=16, in_chans=3, adapter=again)
    ours, theirs = dict(saved.model.named_parameters()), dict(loaded.model.named_parameters())
    trained = set(ours) - saved.fixed
    assert trained and any(n.startswith("head.") for n in trained)
    assert all(torch.equal(ours[n], theirs[n]) for n in ours), "trained values loaded, base values the same seed's"


def test_an_adapter_peft_saved_starts_the_model_with_its_values(tmp_path):
    """An adapter saved by peft itself (`get_peft_model(..., layers_to_transform=[1], modules_to_save=
    ["classifier"])`, then `save_pretrained`): its settings pass the launcher's check, and the model built with
    `adapter.pretrained` holds its adapters and classifier, bit for bit."""
    from peft import LoraConfig, get_peft_model

    from ptrun.config.adapter import BLOCK_LINEARS
    from ptrun.config.adapter_source import check_adapter_source

    torch.manual_seed(0)
    library = auto_class("classification").from_config(tiny_config("bert"))
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["query", "value"],
        layers_to_transform=[1],
        modules_to_save=["classifier"],
    )
    peft_model = get_peft_model(library, config)
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.normal_()
    peft_model.save_pretrained(tmp_path)
    adapter = AdapterConfig(
        name="lora", r=4, alpha=8.0, targets=["query", "value"], layers=[1], pretrained=str(tmp_path)
    )
    check_adapter_source(adapter, "bert", 2, ("query", "value"), BLOCK_LINEARS["bert"].conv1d)
    layered = build_model(
        ModelConfig(name="bert", task="classification"),
        num_classes=3,
        library_config=tiny_config("bert"),
        adapter=adapter,
    )
    theirs = dict(peft_model.base_model.model.named_parameters())
    trained = {n: p for n, p in layered.model.named_parameters() if n not in layered.fixed}
    assert len(trained) == 6 and "classifier.weight" in trained
    for name, p in trained.items():
        want = theirs[name.replace("classifier.", "classifier.modules_to_save.default.")]
        assert torch.equal(p, want), name


BAD = {
    "layers_malformed": (
        ["adapter.layers=top3"],
        "adapter.layers='top3' is not allowed: null (every block), a list "
        "of block indices counted from 0 at the bottom, e.g. [4,5], or top:N (the N highest blocks), e.g. top:3",
    ),
    "layers_int": (["adapter.layers=3"], "adapter.layers=3 is not allowed: null (every block), a list of block"),
    "layers_repeated": (
        ["adapter.layers=[1,1]"],
        "adapter.layers=[1, 1] is not allowed: a list of block indices, each once",
    ),
    "layers_beyond": (
        ["adapter.layers=[0,7]"],
        "adapter.layers=[0, 7] is not allowed: block indices in 0..5 (the model has 6 blocks; 7 is not one)",
    ),
    "layers_top_beyond": (
        ["adapter.layers=top:7"],
        "adapter.layers='top:7' is not allowed: top:N with N in 1..6 (the model has 6 blocks)",
    ),
    "pretrained_missing": (
        ["adapter.pretrained={tmp}/nowhere"],
        "/nowhere': no such directory (a peft adapter: adapter_config.json and adapter_model.safetensors)",
    ),
    "pretrained_no_weights": (
        ["adapter.pretrained={tmp}/config_only"],
        "/config_only': no adapter_model.safetensors in the directory",
    ),
    "pretrained_config_corrupt": (
        ["adapter.pretrained={tmp}/bad_json"],
        "/bad_json': cannot read adapter_config.json (JSONDecodeError",
    ),
    "pretrained_weights_corrupt": (
        ["adapter.pretrained={tmp}/bad_weights"],
        "/bad_weights': cannot read adapter_model.safetensors (",
    ),
    "pretrained_other_r": (
        ["adapter.pretrained={tmp}/saved", "adapter.r=16"],
        "/saved': its adapter_config.json has r=8, this run 16 (adapter.r); they must agree",
    ),
    "pretrained_other_layers": (
        ["adapter.pretrained={tmp}/saved", "adapter.layers=top:3"],
        "/saved': its "
        "adapter_config.json has layers_to_transform=[4, 5], this run [3, 4, 5] (adapter.layers); "
        "they must agree",
    ),
    "pretrained_other_targets": (
        ["adapter.pretrained={tmp}/saved", "adapter.layers=top:2", "adapter.targets=[query,value]"],
        "/saved': its adapter_config.json has target_modules=['dense', 'key', 'query', 'value'], "
        "this run ['query', 'value'] (adapter.targets); they must agree",
    ),
}
"""Each bad `adapter.layers` / `adapter.pretrained` over MINILM: its overrides ({tmp}: the test's folder) and
the key part of its one line (docs/errors.md quotes each)."""


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """A folder of adapters: `saved`, MiniLM's with adapters on its top two blocks as a LoRA run exports it,
    and broken ones."""
    root = tmp_path_factory.mktemp("adapters")
    cfg = compose([*MINILM, "adapter.layers=top:2"])
    torch.manual_seed(0)
    layered = build_model(cfg.model, num_classes=5, adapter=cfg.adapter)
    save_adapter(layered, root / "saved")
    (root / "config_only").mkdir()
    (root / "config_only" / "adapter_config.json").write_text((root / "saved" / "adapter_config.json").read_text())
    for name, config, weights in (("bad_json", "{not json", b""), ("bad_weights", None, b"\x10\x00\x00\x00junk")):
        (root / name).mkdir()
        (root / name / "adapter_config.json").write_text(config or (root / "saved" / "adapter_config.json").read_text())
        (root / name / "adapter_model.safetensors").write_bytes(
            weights or (root / "saved" / "adapter_model.safetensors").read_bytes()
        )
    return root


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_adapter_layers_or_pretrained_is_one_line(case, adapters, tmp_path, cli):
    args, message = BAD[case]
    out = cli("train", *MINILM, *(a.format(tmp=adapters) for a in args), f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert message in assert_one_error_line(out)
    assert not (tmp_path / "run").exists()


def test_ptrun_plan_refuses_blocks_the_model_lacks(cli, tmp_path):
    out = cli("plan", "recipe=bbc_news_lora", "adapter.layers=[6]", cwd=tmp_path)
    assert "adapter.layers=[6] is not allowed: block indices in 0..5" in assert_one_error_line(out)


def test_every_message_is_in_the_catalogue():
    from conftest import REPO

    doc = (REPO / "docs" / "errors.md").read_text()
    # the folder varies: the catalogue writes it PATH
    assert not [m for _, m in BAD.values() if m not in doc and f"'PATH{m}" not in doc]


def test_the_export_says_which_blocks_it_wraps(adapters):
    saved = json.loads((adapters / "saved" / "adapter_config.json").read_text())
    assert saved["layers_to_transform"] == [4, 5]
    assert {int(t.split(".")[3]) for t in saved["target_modules"]} == {4, 5}
