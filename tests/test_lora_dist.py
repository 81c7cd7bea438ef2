"""LoRA units in a real 2-stage 1F1B pipeline (2 gloo processes, tests/lora_cases.py), a freeze in place after
10 of 20 steps: the losses are peft's on the library model (`get_peft_model`, the same LoraConfig, the frozen
adapters leaving the backward pass at the same step) within 1e-4, and after the freeze no frozen adapter and
no base weight holds a gradient on either stage. One launch covers BERT, Llama, GPT-2 and ViT, and LoRA
units as a 2-stage PipeDream pipeline (BERT, GPT-2), which must end with the parameters of PipeDream's
semantics replayed in one process (as tests/test_pipedream_dist.py replays it) having stashed only the
adapters' and the head's weights."""

from __future__ import annotations

import json

import lora_cases as lc
import pipedream_cases as pd
import pipeline_cases as pc
import pytest
import torch
from helpers.process_group import load_rank, load_ranks

from ptrun.layout.plan import even_bounds


def peft_losses(kind: str) -> list[float]:
    """The same 20 steps with peft on the library model, in this process: AdamW as ptrun configures it
    (decay on matrices only), the global-norm clip, the first units' adapters frozen after FREEZE_AT."""

    layered = lc.lora_model(kind)
    if kind == "vit":
        import timm

        config = dict(layered.library_config)
        library = timm.create_model(config.pop("model_name"), pretrained=False, **config)
    else:  # the task model's own class and configuration
        library = type(layered.model)(layered.model.config)
    twin = lc.peft_twin(layered, library)
    theirs = dict(twin.base_model.model.named_parameters())
    trained = [p for p in theirs.values() if p.requires_grad]
    o = pc.OPTIM
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in trained if p.ndim > 1], "weight_decay": o.weight_decay},
            {"params": [p for p in trained if p.ndim <= 1], "weight_decay": 0.0},
        ],
        lr=o.lr,
        betas=tuple(o.betas),
        eps=o.eps,
    )
    frozen = {name for u in range(lc.FROZEN) for name in layered.unit_param_names(u)}
    twin.train()
    losses = []
    for step in range(lc.STEPS):
        if step == lc.FREEZE_AT:
            for name in layered.adapters & frozen:
                theirs[name].requires_grad_(False)
        loss = pc.textbook_loss(twin, kind, pc.batch(kind, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in trained if p.grad is not None], pc.CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One launch for every pipeline case."""
    out = tmp_path_factory.mktemp("lora_cases")
    lc.launch(lc.KINDS, lc.PIPEDREAM_KINDS, out)
    return out


@pytest.mark.slow
@pytest.mark.dist
def test_lora_pipelines_train_as_peft_and_frozen_adapters_take_no_gradient(results):
    for kind in lc.KINDS:
        want = peft_losses(kind)
        for rank in (0, 1):
            got = load_rank(results, kind, rank)
            assert got["losses"] == pytest.approx(want, rel=1e-4), kind
            assert got["stray"] == [], kind
        assert sum(held["trained"] for held in load_ranks(results, kind, 2)) > 0


def pipedream_reference(kind: str) -> dict[str, torch.Tensor]:
    """PipeDream with weight stashing on 2 stages, in one process on the library model with its adapters: for
    each step, each stage's trained weights are the version its forward pass chose (the updates its 1F1B
    order had applied by then), the gradient is taken through them, and plain SGD applies it to the stage's
    newest ones; the base weights stay as built. The final parameters."""
    from torch.func import functional_call

    layered = lc.lora_model(kind)
    net = layered.model
    built = {n: p.detach().clone() for n, p in net.named_parameters()}
    trained = set(built) - layered.fixed
    bounds = even_bounds(len(layered.units), 2)
    names = [{n for u in range(lo, hi) for n in layered.unit_param_names(u)} & trained for lo, hi in bounds]
    used = pd.forward_versions(2, 0, lc.PIPEDREAM_STEPS, ())
    history = [[{n: built[n] for n in names[s]}] for s in range(2)]
    for t in range(lc.PIPEDREAM_STEPS):
        weights = {n: w.clone().requires_grad_(True) for s in range(2) for n, w in history[s][used[s][t]].items()}

        def bound(*args, weights=weights, **kwargs):
            return functional_call(net, weights, args, kwargs)

        bound.config = getattr(net, "config", None)  # textbook_loss reads whether it takes token types
        pc.textbook_loss(bound, kind, pc.batch(kind, t)).backward()
        for s in range(2):
            newest = history[s][-1]
            history[s].append({n: newest[n] - pd.LR * weights[n].grad for n in names[s]})
    return {**built, **{n: w for s in range(2) for n, w in history[s][-1].items()}}


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize("kind", lc.PIPEDREAM_KINDS)
def test_lora_under_pipedream_trains_as_its_semantics_and_stashes_only_what_trains(results, kind):
    """Each backward pass ran on its forward pass's weights, the parameters are the replayed reference's (the
    base weights unchanged), and the input stage held at most two versions of its adapters, never the base."""
    expected = pipedream_reference(kind)
    ranks = load_ranks(results, f"pipedream-{kind}", 2)
    for saved in ranks:
        for name, value in saved["params"].items():
            torch.testing.assert_close(
                value, expected[name], rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
            )
        assert len(saved["trace"]) == lc.PIPEDREAM_STEPS
        assert all(r["forward_fingerprint"] == r["backward_fingerprint"] for r in saved["trace"])
    first, last = sorted(ranks, key=lambda s: s["stage"])
    assert 0 < first["trained_bytes"] < sum(v.numel() * v.element_size() for v in first["params"].values()) / 4
    assert first["stash_peak"] == 2 * first["trained_bytes"]  # the adapters' weights, two versions in flight
    assert last["stash_peak"] == 0


LORA_RUN = [
    "recipe=digits_vit",
    "model.embed_dim=32",
    "model.depth=2",
    "model.num_heads=2",
    "train.max_steps_per_epoch=6",
    "train.global_batch_size=16",
    "adapter=lora",
    "freeze.policy=schedule",
    "cache.min_frozen_units=1",
    "auto.cache=true",
]


@pytest.mark.slow
@pytest.mark.dist
def test_a_lora_run_freezes_caches_checkpoints_its_adapters_and_resumes_into_another_layout(tmp_path):
    """`ptrun train adapter=lora` as a 2-stage pipeline that freezes a block after the first epoch (AutoPipe
    repacks it, AutoDP widens, AutoCache serves the frozen prefix): the start line says how many parameters
    train, the checkpoints hold the adapters and the head only, a resume on one worker goes on from them, and
    the export loads with peft alone onto the base model built from the run's own initial values."""
    from conftest import final_params, run_events, run_ptrun
    from safetensors import safe_open

    run = tmp_path / "run"
    first = [*LORA_RUN, "train.epochs=2", "freeze.blocks=[0,1]", "launcher.nproc_per_node=2", "pipe.length=2"]
    out = run_ptrun("train", *first, f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    start = run_events(run, "start")[0]
    assert 0 < start["trainable_params"] < start["params"] / 2
    assert f"{start['trainable_params'] / 1e6:.3f} M trained" in out.stdout
    plans = run_events(run, "plan")
    assert (plans[0]["pp"], plans[-1]["frozen_units"], plans[-1]["cached_units"]) == (2, 3, 3)
    ckpt = sorted((run / "checkpoints").iterdir())[-1]
    saved = set()
    for f in ckpt.glob("params-stage*.safetensors"):
        with safe_open(str(f), framework="pt") as handle:
            saved |= set(handle.keys())
    optim = {n for f in ckpt.glob("optim-stage*.pt") for n in torch.load(f, weights_only=True)}
    assert saved and all(".lora_" in n or n.startswith("head.") for n in saved), sorted(saved)
    assert optim and optim <= saved and not any(n.startswith("blocks.0.") for n in optim)  # block 0 froze
    again = [*LORA_RUN, "train.epochs=3", "freeze.blocks=[0,1,1]", "launcher.nproc_per_node=1", "pipe.length=1"]
    out = run_ptrun("train", *again, "train.resume=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len({e["epoch"] for e in run_events(run, "epoch")}) == 3  # the third epoch on from the checkpoint
    import timm
    from peft import PeftModel

    options = json.loads((run / "model" / "config.json").read_text())  # the export says how to build the base
    loaded = PeftModel.from_pretrained(timm.create_model(options.pop("model_name"), **options), run / "model")
    trained = final_params(run)
    theirs = dict(loaded.base_model.model.named_parameters())
    adapters = [n for n in trained if ".lora_" in n]
    assert adapters and all(torch.equal(theirs[n], trained[n]) for n in adapters)
    assert torch.equal(theirs["head.modules_to_save.default.weight"], trained["head.weight"])


@pytest.mark.slow
@pytest.mark.dist
def test_a_run_with_peft_options_checkpoints_resumes_and_exports_them(tmp_path):
    """DoRA, rsLoRA and the gaussian init on dotted-end targets, through real workers: the checkpoints hold
    DoRA's magnitudes (computed from the units' base weights, not the meta device), a resume goes on from them
    with the same settings (and is refused with another), and the export loads with peft alone, its
    adapters those the run ended with."""
    from conftest import final_params, run_events, run_ptrun
    from peft import PeftModel

    options = ["adapter.dora=true", "adapter.rslora=true", "adapter.init=gaussian", "adapter.targets=[attn.qkv,fc2]"]
    run = tmp_path / "run"
    first = [*LORA_RUN, *options, "train.epochs=1", "freeze.blocks=[0]", "launcher.nproc_per_node=1"]
    out = run_ptrun("train", *first, f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    other = run_ptrun(
        "train", *first[:-1], "adapter.rslora=false", "train.resume=true", f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert other.returncode == 2 and "adapter.rslora=False is not allowed: checkpoint" in other.stderr
    again = [*LORA_RUN, *options, "train.epochs=2", "freeze.blocks=[0,0]", "launcher.nproc_per_node=1"]
    out = run_ptrun("train", *again, "train.resume=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len({e["epoch"] for e in run_events(run, "epoch")}) == 2
    import timm

    trained = final_params(run)
    magnitudes = [n for n in trained if ".lora_magnitude_vector." in n]
    assert magnitudes and all(trained[n].abs().min() > 0 for n in magnitudes)
    assert {n.split(".lora_")[0].split(".", 2)[-1] for n in magnitudes} == {"attn.qkv", "mlp.fc2"}
    config = json.loads((run / "model" / "config.json").read_text())
    loaded = PeftModel.from_pretrained(timm.create_model(config.pop("model_name"), **config), run / "model")
    assert loaded.peft_config["default"].use_dora and loaded.peft_config["default"].use_rslora
    theirs = dict(loaded.base_model.model.named_parameters())
    adapters = [n for n in trained if ".lora_" in n]
    assert all(torch.equal(theirs[n], trained[n]) for n in adapters)
