"""The command line: composition of every recipe, Hydra conventions, and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import compose_config
from ptrun.cli import recipe_summaries


def ptrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ptrun.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


NEEDS_LOCAL_FILES = {"vit_imagenet", "vit_cifar100", "vit_cifar10", "bert_squad", "bert_glue", "bert_sst2"}
"""Recipes of the paper's workloads: they read a dataset (and weights) from local paths the user gives."""

PAPER = {  # recipe -> (model, data source, optimizer, lr, epochs, starting K, schedule) from SPEC section 5
    "vit_imagenet": ("vit_base_patch16_224", "imagefolder", "sgd", 0.03, 10, 8, "cosine"),
    "vit_cifar100": ("vit_base_patch16_224", "cifar100", "sgd", 0.1, 10, 8, "cosine"),
    "vit_cifar10": ("vit_base_patch16_224", "cifar10", "sgd", 0.1, 10, 8, "cosine"),
    "bert_squad": ("bert-large", "squad", "adamw", 3e-5, 3, 8, "linear"),
    "bert_sst2": ("bert-base", "glue", "adamw", 2e-5, 3, 4, "linear"),
}


@pytest.mark.parametrize("recipe", sorted(recipe_summaries()))
def test_every_recipe_composes_and_validates(recipe, tmp_path):
    overrides = [f"recipe={recipe}"]
    if recipe in NEEDS_LOCAL_FILES:
        overrides += [f"data.path={tmp_path}", f"model.pretrained={tmp_path}"]
    cfg = compose_config(overrides, tmp_path)
    assert cfg.train.epochs >= 1 and cfg.launcher.nproc_per_node >= 1
    if recipe in PAPER:
        got = (cfg.model.name, cfg.data.name, cfg.optim.name, cfg.optim.lr, cfg.train.epochs, cfg.pipe.length,
               cfg.optim.schedule)
        assert got == PAPER[recipe]
        assert cfg.freeze.policy == "pipetransformer" and cfg.freeze.alpha == pytest.approx(1 / 3)
        assert cfg.auto.cache and cfg.train.grad_clip == 1.0


def test_paper_recipes_say_which_local_files_they_need(tmp_path):
    out = ptrun("train", "recipe=bert_squad", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2 and "data.path=None is not allowed: the local dataset directory" in out.stderr


def test_recipes_lists_each_with_a_summary(tmp_path):
    out = ptrun("recipes", cwd=tmp_path)
    assert out.returncode == 0
    for name in recipe_summaries():
        line = next(l for l in out.stdout.splitlines() if l.startswith(name))
        assert len(line.split(None, 1)[1]) > 10


def test_cfg_job_prints_the_composed_config_with_overrides(tmp_path):
    out = ptrun("train", "--cfg", "job", "optim.lr=0.123", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "lr: 0.123" in out.stdout and "global_batch_size:" in out.stdout


def test_help_lists_recipes_and_groups(tmp_path):
    out = ptrun("train", "--help", cwd=tmp_path)
    assert out.returncode == 0
    assert "digits_vit" in next(l for l in out.stdout.splitlines() if l.startswith("recipe: "))
    assert "optim: adamw, sgd" in out.stdout


BAD_INPUT = [
    (["train.epoch=3"], "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    (["train.epochs=abc"], "train.epochs: Value 'abc'"),
    (["train.epochs=0"], "train.epochs=0 is not allowed"),
    (["recipe=nope"], "unknown recipe 'nope' (available: bbc_news_bert, bert_glue, bert_squad, bert_sst2, digits_vit"),
    (["model=nope"], "unknown model 'nope'"),
    (["launcher.nproc_per_node=0"], "launcher.nproc_per_node=0 is not allowed"),
    (["launcher.nnodes=3:1"], "launcher.nnodes='3:1' is not allowed"),
    (["pipe.length=3"], "pipe.length=3 is not allowed: a divisor of the world size 2"),
    (["pipe.length=1", "train.global_batch_size=33"], "train.global_batch_size=33 is not allowed: a multiple of the data-parallel width 2"),
    (["optim.name=lamb"], "optim.name='lamb' is not allowed: one of adamw, sgd"),
    (["data.path=/does/not/exist"], "data.path='/does/not/exist': no such directory"),
    (["model.pretrained=/does/not/exist.safetensors"], "model.pretrained='/does/not/exist.safetensors': no such file"),
    (["train.epochs=[3"], "cannot parse the override 'train.epochs=[3'"),
    (["pipe.schedule=DualPipeV"], "pipe.stages_per_rank=1 is not allowed: 2 for DualPipeV"),
    (["pipe.length=2", "pipe.schedule=Interleaved1F1B", "pipe.stages_per_rank=2", "pipe.microbatches=1"],
     "pipe.microbatches=1 is not allowed: a multiple of pipe.length=2 for Interleaved1F1B"),
    (["pipe.length=2", "pipe.microbatches=1"], "pipe.microbatches=1 is not allowed: at least pipe.length=2"),
    (["pipe.length=2", "pipe.schedule=ZBVZeroBubble", "pipe.stages_per_rank=2", "pipe.microbatches=2"],
     "pipe.microbatches=2 is not allowed: at least 2 x pipe.length=4"),
    (["pipe.length=1", "pipe.microbatches=3"], "pipe.microbatches=3 is not allowed: a divisor of the per-replica batch 8"),
    (["pipe.microbatches=fast"], "pipe.microbatches='fast' is not allowed: an integer >= 1, auto, or unset"),
    (["pipe.microbatches=2.5"], "pipe.microbatches: Value '2.5' of type 'float' is not allowed: an integer >= 1, auto or null"),
    (["pipe.partition=explicit"], "pipe.stages=None is not allowed"),
    (["pipe.partition=greedy"], "pipe.partition='greedy' is not allowed: one of uniform, params"),
    (["pipe.length=2", "pipe.partition=explicit", "pipe.stages=[[0,5],[6,14]]"], "is not allowed: contiguous non-empty [lo, hi) unit ranges"),
    (["pipe.length=2", "pipe.partition=explicit", "pipe.stages=[[0,5],[5,12]]"], "from 0 to the model's 14"),
    (["pipe.length=2", "pipe.stages_per_rank=8"], "pipe.length=2 is not allowed: at most 14 stages"),
    (["pipe.length=fast"], "pipe.length='fast' is not allowed: an integer >= 1 or auto"),
    (["pipe.partition=explicit", "pipe.stages=[[0,5],[5,14]]"], "pipe.length='auto' is not allowed: an integer with pipe.stages"),
    (["device.memory=lots"], "device.memory='lots' is not allowed"),
    (["freeze.policy=fast"], "freeze.policy='fast' is not allowed: one of pipetransformer, alpha"),
    (["freeze.policy=schedule", "freeze.blocks=[1,2]"], "freeze.blocks=[1, 2] is not allowed: non-decreasing counts"),
    (["auto.batch=huge"], "auto.batch='huge' is not allowed: one of fixed_global, fixed_per_pipeline"),
    (["pipe.recompute=sometimes"], "pipe.recompute='sometimes' is not allowed: none, stage or every:N"),
    (["cache.dtype=int8"], "cache.dtype='int8' is not allowed: one of auto, float32, bfloat16, float16"),
    (["cache.max_memory=lots"], "cache.max_memory='lots' is not allowed: a share such as 50%"),
    (["cache.augment=random"], "cache.augment='random' is not allowed: one of fixed, off"),
    (["cache.min_frozen_units=0"], "cache.min_frozen_units=0 is not allowed: an integer >= 1 or null"),
    (["cache.dir=/etc/hostname"], "cache.dir='/etc/hostname' is not allowed: a directory"),
    (["train.precision=fp8"], "train.precision='fp8' is not allowed: one of fp32, bf16, fp16"),
    (["checkpoint.every_steps=-5"], "checkpoint.every_steps=-5 is not allowed: an integer >= 0 (0 = off)"),
    (["pipe.schedule=pipedream", "pipe.microbatches=2"], "pipe.microbatches=2 is not allowed: 1 for pipedream"),
    (["pipe.schedule=pipedream", "pipe.microbatches=1", "train.precision=fp16"],
     "train.precision='fp16' is not allowed: fp32 or bf16 with pipe.schedule=pipedream"),
    (["pipe.vertical_sync=true", "pipe.weight_stashing=false"],
     "pipe.vertical_sync=True is not allowed: false unless pipe.weight_stashing=true"),
    (["pipe.first_stage_replicas=0"], "pipe.first_stage_replicas=0 is not allowed: an integer >= 1"),
    (["pipe.first_stage_replicas=2"], "pipe.first_stage_replicas=2 is not allowed: 1 unless pipe.schedule=pipedream"),
    (["pipe.schedule=pipedream", "pipe.microbatches=1", "pipe.first_stage_replicas=2"],
     "auto.pipe=True is not allowed: false with pipe.first_stage_replicas > 1"),
    (["pipe.schedule=pipedream", "pipe.microbatches=1", "pipe.first_stage_replicas=2", "auto.pipe=false",
      "auto.dp=false"], "pipe.length='auto' is not allowed: an integer with pipe.first_stage_replicas > 1"),
    (["pipe.schedule=pipedream", "pipe.length=2", "pipe.first_stage_replicas=2", "auto.pipe=false",
      "auto.dp=false"], "launcher.nproc_per_node=2 is not allowed: 3 workers for pipe.first_stage_replicas=2"),
]


@pytest.mark.parametrize("args,message", BAD_INPUT, ids=[a[0] for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_exit_2_and_touches_nothing(args, message, tmp_path):
    run_dir = tmp_path / "run"
    out = ptrun("train", *args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptrun: error: "), out.stderr
    assert message in lines[0]
    assert "Traceback" not in out.stderr + out.stdout
    assert not run_dir.exists()


def test_existing_run_is_not_overwritten_without_resume(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step_00000001").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("precious: true\n")
    out = ptrun("train", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 2
    assert "already holds a run; continue it with train.resume=true" in out.stderr
    assert (run_dir / "config.yaml").read_text() == "precious: true\n"
    assert sorted(p.name for p in run_dir.rglob("*")) == ["checkpoints", "config.yaml", "step_00000001"]


def test_unknown_subcommand(tmp_path):
    out = ptrun("fly", cwd=tmp_path)
    assert out.returncode == 2 and "unknown subcommand 'fly' (allowed: train, recipes, report" in out.stderr
