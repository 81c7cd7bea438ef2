"""The LoRA traps a peft user walks into, each refused in one line before any worker, with no run directory
left: an adapter key without `adapter=lora`, a target that names no module, an init that rewrites the base,
extra trained modules, and a resume with other adapter settings. docs/errors.md quotes each line."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import REPO, assert_one_error_line

TINY = ["train.epochs=1", "train.max_steps_per_epoch=2", "train.global_batch_size=16", "train.export=false"]
"""The default recipe (a timm ViT on digits), small: its blocks' linears are attn.qkv, attn.proj, mlp.fc1 and
mlp.fc2."""

CASES = {
    "key_without_lora": (
        ["adapter.r=8"],
        "adapter.r=8 is not allowed: adapter.* keys are read only with adapter=lora (without it every weight "
        "trains); add adapter=lora, or leave adapter.r out",
    ),
    "keys_without_lora": (
        ["adapter.targets=all-linear", "adapter.merge=true"],
        "adapter.targets='all-linear' is not allowed: adapter.* keys are read only with adapter=lora",
    ),
    "bool_key_without_lora": (
        ["recipe=digits_vit", "adapter.dora=true"],
        "adapter.dora=True is not allowed: adapter.* keys are read only with adapter=lora",
    ),
    "dotted_end_naming_nothing": (
        ["adapter=lora", "adapter.targets=[attention.output.dense]"],
        "adapter.targets=['attention.output.dense'] is not allowed: names or dotted ends of a vit block's linear "
        "modules: attn.qkv, attn.proj, mlp.fc1, mlp.fc2 (attention.output.dense names none)",
    ),
    "regex_wrapping_nothing": (
        ["adapter=lora", r"adapter.targets='.*\.query'"],
        "adapter.targets='.*\\\\.query' is not allowed: it wraps no linear module of a vit model's blocks "
        "(their full names: blocks.0.attn.qkv, ...)",
    ),
    "exclude_leaving_nothing": (
        ["adapter=lora", "adapter.targets=[attn.qkv]", "adapter.exclude=[qkv]"],
        "adapter.targets=['attn.qkv'] is not allowed: it wraps no linear module of a vit model's blocks once "
        "adapter.exclude=['qkv'] is left out",
    ),
    "base_rewriting_init": (
        ["adapter=lora", "adapter.init=pissa"],
        "adapter.init='pissa' is not allowed: true (Kaiming-uniform A) or gaussian, which start the model as the "
        "base (it rewrites the base weights, moving their principal part into the adapter: a resume and the "
        "export would need that rewritten base, which ptrun never saves)",
    ),
    "unknown_init": (
        ["adapter=lora", "adapter.init=false"],
        "adapter.init=False is not allowed: true (Kaiming-uniform A) or gaussian, which start the model as the base",
    ),
    "modules_to_save": (
        ["adapter=lora", "adapter.modules_to_save=[norm]"],
        "adapter.modules_to_save=['norm'] is not allowed: null (the task head's new layer trains and is saved already",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_lora_trap_is_one_line_before_any_worker(case, tmp_path, cli):
    args, message = CASES[case]
    run_dir = tmp_path / "run"
    out = cli("train", *TINY, *args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    line = assert_one_error_line(out)
    assert message in line, line
    assert not run_dir.exists()
    assert message in (REPO / "docs" / "errors.md").read_text().replace("\\|", "|"), "docs/errors.md quotes it"


def checkpoint_of(run_dir, settings: dict):
    """A valid checkpoint directory whose trainer.json records a LoRA run with `settings`."""
    ckpt = run_dir / "checkpoints" / "step_00000004"
    ckpt.mkdir(parents=True)
    model = {"name": "m", "num_units": 6, "adapter": "lora", "adapter_settings": settings}
    (ckpt / "trainer.json").write_text(json.dumps({"model": model}))
    digest = hashlib.sha256((ckpt / "trainer.json").read_bytes()).hexdigest()
    size = (ckpt / "trainer.json").stat().st_size
    (ckpt / "manifest.json").write_text(
        json.dumps({"format": 1, "files": {"trainer.json": {"sha256": digest, "bytes": size}}})
    )
    return ckpt


@pytest.mark.parametrize(
    "key,saved,asked,written",
    [
        ("r", 16, "8", "16"),
        ("alpha", 32.0, "16", "32.0"),  # r=8 and alpha unset: 16, as the run uses it
        ("targets", ["attn.qkv"], "all-linear", "[attn.qkv]"),
        ("dora", True, "false", "true"),
    ],
)
def test_resume_with_other_adapter_settings(key, saved, asked, written, tmp_path, cli):
    """Every adapter key the checkpoint recorded is compared with the run's, each as the run uses it (alpha
    filled from r); the first that differs is named with both values, before any worker."""
    from ptrun.config import AdapterConfig
    from ptrun.config.adapter import adapter_settings

    run_dir = tmp_path / "run"
    settings = adapter_settings(AdapterConfig(name="lora")) | {key: saved}
    ckpt = checkpoint_of(run_dir, settings)
    before = sorted(p.name for p in run_dir.rglob("*"))
    out = cli(
        "train",
        *TINY,
        "adapter=lora",
        f"adapter.{key}={asked}",
        "train.resume=true",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    line = assert_one_error_line(out)
    assert line.endswith(
        f"is not allowed: checkpoint {ckpt} is of a run with adapter.{key}={saved!r}; resume with "
        f"adapter.{key}={written} or start a new run in another hydra.run.dir"
    ), line
    assert line.startswith(f"ptrun: error: adapter.{key}="), line
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_resume_may_change_what_the_export_writes(tmp_path):
    """`adapter.merge` says only what the export writes: a resume may change it; any other key it may not."""
    from ptrun.config import AdapterConfig
    from ptrun.config.adapter import adapter_settings
    from ptrun.train.checkpoint.lookup import adapter_problem

    ckpt = checkpoint_of(tmp_path, adapter_settings(AdapterConfig(name="lora")))
    assert adapter_problem(ckpt, adapter_settings(AdapterConfig(name="lora", merge=True))) is None
    assert adapter_problem(ckpt, adapter_settings(AdapterConfig(name="lora", alpha=16.0))) is None  # 2 x r
    assert "adapter.rslora=True" in adapter_problem(ckpt, adapter_settings(AdapterConfig(name="lora", rslora=True)))


def test_an_adapter_key_a_config_sets_without_lora_is_refused():
    """Set in a config (a recipe, a sweep's job) rather than on the command line: the same line."""
    from dataclasses import replace

    from ptrun.compose import composed
    from ptrun.config import ConfigError, check_adapter

    cfg = composed([])
    check_adapter(cfg)
    with pytest.raises(ConfigError, match=r"^adapter.targets=\['query'\] is not allowed: adapter.\* keys are read"):
        check_adapter(replace(cfg, adapter=replace(cfg.adapter, targets=["query"])))
