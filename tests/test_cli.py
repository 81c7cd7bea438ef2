"""The command line: composition of every recipe, Hydra conventions, and one-line errors for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import command_args, compose_config, with_test_recipe

from ptrun.cli import recipe_summaries
from ptrun.compose import RECIPE_DIR, compose
from ptrun.config import (
    SOURCE_IMAGES,
    TEXT_MAX_LENGTH,
    ConfigError,
    data_parallel_width,
    timm_vit_problem,
    workers_per_node,
)


def ptrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ptrun.cli", *command_args(args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


PAPER_RECIPES = {"vit_imagenet", "vit_cifar100", "vit_cifar10", "bert_squad", "bert_glue", "bert_sst2"}
"""Recipes of the paper's workloads: hub ids for their weights and data by default; a local path given wins."""

OWN_DATA = {"text_classification", "causal_lm"}
"""Recipes for the user's own data (and, for the causal LM, their own decoder): data.path (model.pretrained)."""

PAPER = {  # recipe -> (model, data source, optimizer, lr, epochs, batch, schedule) from the paper (ViT: per pipeline)
    "vit_imagenet": ("vit_base_patch16_224", "imagefolder", "sgd", 0.03, 10, 400, "cosine"),
    "vit_cifar100": ("vit_base_patch16_224", "cifar100", "sgd", 0.1, 10, 320, "cosine"),
    "vit_cifar10": ("vit_base_patch16_224", "cifar10", "sgd", 0.1, 10, 320, "cosine"),
    "bert_squad": ("bert-large", "squad", "adamw", 3e-5, 3, 64, "linear"),
    "bert_sst2": ("bert-base", "glue", "adamw", 2e-5, 3, 16, "linear"),
}


@pytest.mark.parametrize("recipe", sorted(recipe_summaries()))
def test_every_recipe_composes_and_validates(recipe, tmp_path):
    overrides = [f"recipe={recipe}"]
    if recipe in PAPER_RECIPES:  # local paths win over the recipe's hub ids; sized as an 8-GPU machine
        overrides += [f"data.path={tmp_path}", f"model.pretrained={tmp_path}", "launcher.nproc_per_node=8"]
    if recipe in OWN_DATA:  # the sample files, and a decoder's directory (validation reads its config.json)
        from ptrun.data.sample_files import main as write_samples

        write_samples([str(tmp_path)])
        decoder = tmp_path / "decoder"
        decoder.mkdir()
        (decoder / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32}')
        (decoder / "model.safetensors").write_bytes(b"")
        overrides += [f"data.path={tmp_path / ('news.csv' if recipe == 'text_classification' else 'stories.jsonl')}"]
        overrides += [f"model.pretrained={decoder}"] if recipe == "causal_lm" else []
    cfg = compose(with_test_recipe(overrides), run_dir=tmp_path, recipe="test")
    assert cfg.train.epochs >= 1 and workers_per_node(cfg.launcher) >= 1
    if recipe in PAPER_RECIPES:  # one machine, all its GPUs, the pipeline length memory asks for
        assert (cfg.launcher.nnodes, cfg.launcher.nproc_per_node, cfg.pipe.length) == ("1", 8, "auto")
    else:  # as launched here: the layout's `auto` filled (a paper recipe's full size fits no CPU machine)
        filled = compose_config(overrides, tmp_path)
        assert isinstance(filled.pipe.length, int) and isinstance(filled.train.global_batch_size, int)
    if recipe in PAPER:
        got = (
            cfg.model.name,
            cfg.data.name,
            cfg.optim.name,
            cfg.optim.lr,
            cfg.train.epochs,
            cfg.train.pipeline_batch_size or cfg.train.global_batch_size,
            cfg.optim.schedule,
        )
        assert got == PAPER[recipe]
        assert cfg.freeze.policy == "pipetransformer" and cfg.freeze.alpha == pytest.approx(1 / 3)
        assert cfg.auto.cache and cfg.train.grad_clip == 1.0
        vit = cfg.model.family == "vit"  # the paper's ViT batch is per pipeline, growing with data parallelism
        assert (cfg.auto.batch == "fixed_per_pipeline") == vit == (cfg.train.pipeline_batch_size is not None)
    if recipe in PAPER and recipe != "vit_cifar10":  # the paper reports no CIFAR-10 run
        assert cfg.paper.setup is not None and cfg.paper.epochs == cfg.train.epochs


@pytest.mark.parametrize("recipe", sorted(PAPER_RECIPES))
def test_a_paper_recipe_header_shows_the_two_machine_override_which_composes(recipe, tmp_path):
    """The header's two-machine line, with a local path for each input, composes for two machines."""
    header = [line for line in (RECIPE_DIR / f"{recipe}.yaml").read_text().splitlines() if line.startswith("#")]
    override = next(line.split(f"recipe={recipe} ")[1] for line in header if "launcher.nnodes=2" in line).split()
    assert override == ["launcher.nnodes=2", "launcher.rdzv_endpoint=NODE0:29400", "launcher.rdzv_id=ID"]
    cfg = compose_config(
        [
            f"recipe={recipe}",
            f"data.path={tmp_path}",
            f"model.pretrained={tmp_path}",
            "launcher.nnodes=2",
            "launcher.rdzv_endpoint=node0.example:29400",
            "launcher.rdzv_id=ID",
        ],
        tmp_path,
    )
    assert cfg.launcher.nnodes == "2"
    if cfg.train.pipeline_batch_size:  # two machines are a known world: the launcher fills the global batch
        world = 2 * workers_per_node(cfg.launcher)
        assert cfg.train.global_batch_size == cfg.train.pipeline_batch_size * data_parallel_width(cfg.pipe, world)


def test_a_per_pipeline_batch_makes_the_global_batch_of_the_layout(tmp_path):
    """The paper's batch per pipeline: on one machine the start fills the global batch for the layout's width;
    giving a global batch beside it is refused."""
    from ptrun.compose import for_this_machine, resolve

    base = [
        "recipe=digits_vit",
        "train.global_batch_size=null",
        "train.pipeline_batch_size=8",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    assert for_this_machine(resolve([*base, "pipe.length=1"])).cfg.train.global_batch_size == 16  # DP 2
    assert for_this_machine(resolve([*base, "pipe.length=2"])).cfg.train.global_batch_size == 8  # DP 1
    with pytest.raises(
        ConfigError,
        match=r"^train.global_batch_size=16 is not allowed: null while "
        r"train.pipeline_batch_size=8 gives the batch",
    ):
        resolve([*base[:1], *base[2:]])


def test_nproc_per_node_auto_is_one_worker_per_gpu_else_two(tmp_path):
    import torch

    cfg = compose_config(["launcher.nproc_per_node=auto"], tmp_path)
    assert cfg.launcher.nproc_per_node == "auto"
    assert workers_per_node(cfg.launcher) == (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    gloo = compose_config(["launcher.nproc_per_node=auto", "launcher.backend=gloo"], tmp_path)
    assert workers_per_node(gloo.launcher) == 2  # gloo workers run on the CPU even where there is a GPU
    assert workers_per_node(compose_config(["launcher.nproc_per_node=3", "pipe.length=3"], tmp_path).launcher) == 3


def test_threads_per_worker_auto_shares_the_cores_among_a_machines_workers(tmp_path, monkeypatch):
    from ptrun.config.launcher import worker_threads

    assert compose_config([], tmp_path).launcher.threads_per_worker == "auto"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))  # an 8-core machine
    assert [worker_threads("auto", n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert worker_threads(3, 8) == 3  # an explicit count is kept


def test_the_validation_tables_match_the_data_sources():
    """The config's table of sources (`DATA_SOURCE_SPECS`: validation must not import the data stack, which
    would slow every start) holds their default image sizes and token lengths: the sources use them."""
    from ptrun.data import cifar, images, sources
    from ptrun.data.packaged_text import PACKAGED_TEXT

    assert SOURCE_IMAGES["imagefolder"][0] == images.DEFAULT_IMAGE_SIZE
    assert SOURCE_IMAGES["cifar10"][0] == SOURCE_IMAGES["cifar100"][0] == cifar.CIFAR_SIZE
    from ptrun.config import DataConfig

    digits = sources.build_datasets(DataConfig(name="digits"))
    assert SOURCE_IMAGES["digits"] == (digits.image_size, digits.in_chans)
    assert all(TEXT_MAX_LENGTH[name] == spec.max_length for name, spec in PACKAGED_TEXT.items())


VIT_NAMES = [
    "vit_tiny_patch16_224",
    "vit_base_patch16_224.augreg_in21k",
    "deit_tiny_patch16_224",
    "vit_base_r50_s16_224",
    "deit_tiny_distilled_patch16_224",
    "vit_small_patch16_18x2_224",
    "vit_relpos_base_patch16_224",
    "resnet18",
    "vit_tiny_patch16_999",
]


def test_the_vit_name_check_agrees_with_the_model_builder():
    """The up-front check reads timm's source; the model builder builds the model (here on the meta device,
    so no memory is used) and checks its classes. Both must accept and refuse the same names."""
    import torch

    from ptrun.config import ConfigError, ModelConfig
    from ptrun.models.vit import build_vit

    for name in VIT_NAMES:
        try:
            with torch.device("meta"):
                build_vit(ModelConfig(name=name.split(".")[0], depth=2), num_classes=10, img_size=None, in_chans=None)
            built = True
        except (ConfigError, TypeError):  # TypeError: a timm model that takes no ViT arguments (resnet18)
            built = False
        assert (timm_vit_problem(name) is None) == built, (name, timm_vit_problem(name))


def test_recipes_lists_each_with_a_summary(tmp_path):
    out = ptrun("recipes", cwd=tmp_path)
    assert out.returncode == 0
    for name in recipe_summaries():
        line = next(printed for printed in out.stdout.splitlines() if printed.startswith(name))
        assert len(line.split(None, 1)[1]) > 10


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`ptrun recipes | head -1`, with the reader gone before ptrun writes (closed before it starts), so its
    write fails with EPIPE: it must end quietly, with 141 (128 + SIGPIPE) as Unix tools do."""
    import os

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    proc = subprocess.run(
        [sys.executable, "-m", "ptrun.cli", "recipes"],
        cwd=tmp_path,
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_cfg_job_prints_the_composed_config_with_overrides(tmp_path):
    out = ptrun("train", "--cfg", "job", "optim.lr=0.123", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "lr: 0.123" in out.stdout and "global_batch_size:" in out.stdout


@pytest.mark.slow
def test_help_lists_recipes_and_groups(tmp_path):
    out = ptrun("train", "--help", cwd=tmp_path)
    assert out.returncode == 0
    assert "digits_vit" in next(line for line in out.stdout.splitlines() if line.startswith("recipe: "))
    assert "optim: adamw, sgd" in out.stdout


def test_a_recipe_that_does_not_parse_is_named_in_one_line(tmp_path, monkeypatch):
    """The recipes are all registered before any composition, so a broken one is reported whichever is chosen."""
    import ptrun.compose

    (tmp_path / "broken.yaml").write_text("train: [1, 2\n")
    monkeypatch.setattr(ptrun.compose, "RECIPE_DIR", tmp_path)
    with pytest.raises(ptrun.compose.ConfigError, match=r"^recipe broken \(.*broken.yaml\) does not load: ") as e:
        ptrun.compose.compose_dict(["recipe=digits_vit"])
    assert len(str(e.value).splitlines()) == 1


BAD_INPUT = [
    (["train.epoch=3"], "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    (["adapter=lora", "adapter.r=0"], "adapter.r=0 is not allowed: an integer >= 1"),
    (
        ["adapter=lora", "adapter.targets=[qkv,query]"],
        "adapter.targets=['qkv', 'query'] is not allowed: names or dotted ends of a vit block's linear modules: "
        "attn.qkv, attn.proj, mlp.fc1, mlp.fc2 (query names none)",
    ),
    (
        ["adapter=lora", "adapter.merge=true", "train.export=false"],
        "adapter.merge=True is not allowed: false unless train.export=true",
    ),
    # Hydra's `+` adds a key without a word: a typo would train with the default
    (["+optim.lrr=1"], "unknown key 'optim.lrr'; did you mean 'optim.lr'?"),
    (["+foo=1"], "unknown key 'foo' (the config has: adapter, auto, cache, checkpoint, data,"),
    (["+train.epoch=3"], "unknown key 'train.epoch'; did you mean 'train.epochs'?"),
    (["++model.deph=3"], "unknown key 'model.deph'; did you mean 'model.depth'?"),
    (["+optim.lr=1"], "optim.lr is already a key: set it without '+' (optim.lr=VALUE)"),
    (
        ["auto.microbatch_table.4=2"],
        "unknown key 'auto.microbatch_table.4': auto.microbatch_table has no entry 4; "
        "add one with +auto.microbatch_table.4=VALUE",
    ),
    (["train.epochs=abc"], "train.epochs: Value 'abc'"),
    (["train.epochs=0"], "train.epochs=0 is not allowed"),
    (
        ["train.compile_mode=fast"],
        "train.compile_mode='fast' is not allowed: one of default, reduce-overhead, "
        "max-autotune, max-autotune-no-cudagraphs",
    ),
    (["train.compile=yes"], "train.compile='yes' is not allowed: auto, true or false"),
    (
        ["train.compile=true", "pipe.schedule=ZBVZeroBubble"],
        "train.compile='true' is not allowed: true only "
        "with a schedule whose stages run their backward pass whole, not with pipe.schedule=ZBVZeroBubble (it splits "
        "it); leave it auto (eager there) or choose 1F1B, GPipe, Interleaved1F1B, LoopedBFS or pipedream",
    ),
    (
        ["recipe=nope"],
        "unknown recipe 'nope' (available: bbc_news_bert, bbc_news_lora, bert_glue, bert_squad, bert_sst2, "
        "causal_lm, digits_vit",
    ),
    (["model=nope"], "unknown model 'nope'"),
    (["launcher.nproc_per_node=0"], "launcher.nproc_per_node=0 is not allowed: an integer >= 1 or auto"),
    (["launcher.nproc_per_node=many"], "launcher.nproc_per_node='many' is not allowed: an integer >= 1 or auto"),
    (
        ["launcher.nproc_per_node=2.5"],
        "launcher.nproc_per_node: Value '2.5' of type 'float' is not allowed: an integer >= 1 or auto",
    ),
    (
        ["launcher.nnodes=2"],
        "launcher.nnodes='2' is not allowed with launcher.rdzv_endpoint='localhost:0' (a loopback "
        "host and port 0: no other machine can join); set launcher.rdzv_endpoint=HOST:PORT that every machine reaches "
        "and run the same command on each, or launcher.nnodes=1 for one machine",
    ),
    (
        ["launcher.nnodes=2:4", "launcher.rdzv_endpoint=127.0.0.1:29400"],
        "launcher.nnodes='2:4' is not allowed with launcher.rdzv_endpoint='127.0.0.1:29400' (a loopback host: no other",
    ),
    (["launcher.nnodes=2", "launcher.rdzv_endpoint=node0.example:0"], "(port 0: no other machine can join)"),
    (
        ["recipe=bert_squad", "data.path=null", "model.pretrained=/tmp"],
        "data.path=None is not allowed: the local dataset directory for data.name=squad",
    ),
    (
        ["recipe=vit_imagenet", "train.global_batch_size=800"],
        "train.global_batch_size=800 is not allowed: null while train.pipeline_batch_size=400 gives the batch",
    ),
    (
        ["launcher.nnodes=2", "launcher.rdzv_endpoint=node0.example:29400"],
        "launcher.rdzv_id=None is not allowed: the same id on every machine of a launcher.nnodes='2' job",
    ),
    (["model.name=resnet18"], "model.name='resnet18' is not allowed: a timm ViT name (vit_* or deit_*"),
    (
        ["model.name=vit_tiny_patch16_999"],
        "model.name='vit_tiny_patch16_999' is not allowed: a timm "
        "VisionTransformer with pre-norm Blocks, e.g. vit_tiny_patch16_224 or vit_base_patch16_224 (timm has no such "
        "model)",
    ),
    (["model.name=deit_tiny_distilled_patch16_224"], "(a distilled DeiT (two heads))"),
    (["model.name=vit_small_patch16_18x2_224"], "(its blocks are not timm's pre-norm Block)"),
    (
        ["model.name=vit_relpos_base_patch16_224"],
        "(timm builds it in timm.models.vision_transformer_relpos, not as a VisionTransformer)",
    ),
    (
        ["model.img_size=16"],
        "model.img_size=16 is not allowed: 8, the side of the images data.name=digits produces "
        "(data.image_size=None), or null to follow the data",
    ),
    (["model.in_chans=3"], "model.in_chans=3 is not allowed: 1, the channels of data.name=digits's images"),
    (["model.num_heads=5"], "model.num_heads=5 is not allowed: a divisor of model.embed_dim=64"),
    (
        ["model=bert_base", "data=glue", "data.path=/tmp", "data.tokenizer=/tmp", "data.max_length=1024"],
        "data.max_length=1024 is not allowed: at most 512, the position table of model.name='bert-base'",
    ),
    (
        ["recipe=bert_glue", "data.task=sst-2"],
        "data.task='sst-2' is not allowed: one of cola, sst2, mrpc, qqp, stsb, mnli, "
        "qnli, rte, wnli for data.name=glue",
    ),
    (
        ["data.task=rte"],
        "data.task='rte' is not allowed: unset for data.name=digits (the GLUE task, for data.name=glue)",
    ),
    (
        ["recipe=bbc_news_bert", "data.max_length=1024"],
        "data.max_length=1024 is not allowed: at most 512, the position table of model.pretrained=",
    ),
    (["recipe=bbc_news_bert", "model.depth=3"], "model.depth=3 is not allowed: model.pretrained="),
    (["train.profile_step=-1"], "train.profile_step=-1 is not allowed: a step >= 0 or null"),
    (["launcher.nnodes=3:1"], "launcher.nnodes='3:1' is not allowed"),
    (["launcher.threads_per_worker=0"], "launcher.threads_per_worker=0 is not allowed: an integer >= 1 or auto"),
    (["model.attention=flash"], "model.attention='flash' is not allowed: sdpa or eager"),
    (["pipe.length=3"], "pipe.length=3 is not allowed: a divisor of the world size 2"),
    (
        ["pipe.length=1", "train.global_batch_size=33"],
        "train.global_batch_size=33 is not allowed: a multiple of the data-parallel width 2",
    ),
    (["optim.name=lamb"], "optim.name='lamb' is not allowed: one of adamw, sgd"),
    (["data.path=/does/not/exist"], "data.path='/does/not/exist': no such directory"),
    (["model.pretrained=/does/not/exist.safetensors"], "model.pretrained='/does/not/exist.safetensors': no such file"),
    (["train.epochs=[3"], "cannot parse the override 'train.epochs=[3'"),
    (["pipe.schedule=DualPipeV"], "pipe.stages_per_rank=1 is not allowed: 2 for DualPipeV"),
    (
        ["pipe.length=2", "pipe.schedule=Interleaved1F1B", "pipe.stages_per_rank=2", "pipe.microbatches=1"],
        "pipe.microbatches=1 is not allowed: a multiple of pipe.length=2 for Interleaved1F1B",
    ),
    (["pipe.length=2", "pipe.microbatches=1"], "pipe.microbatches=1 is not allowed: at least pipe.length=2"),
    (
        ["pipe.length=2", "pipe.schedule=ZBVZeroBubble", "pipe.stages_per_rank=2", "pipe.microbatches=2"],
        "pipe.microbatches=2 is not allowed: at least 2 x pipe.length=4",
    ),
    (
        ["pipe.length=1", "pipe.microbatches=3"],
        "pipe.microbatches=3 is not allowed: a divisor of the per-replica batch 8",
    ),
    (["pipe.microbatches=fast"], "pipe.microbatches='fast' is not allowed: an integer >= 1, auto, or unset"),
    (
        ["pipe.microbatches=2.5"],
        "pipe.microbatches: Value '2.5' of type 'float' is not allowed: an integer >= 1, auto or null",
    ),
    (["pipe.partition=explicit"], "pipe.stages=None is not allowed"),
    (["pipe.partition=greedy"], "pipe.partition='greedy' is not allowed: one of uniform, params"),
    (
        ["pipe.length=2", "pipe.partition=explicit", "pipe.stages=[[0,5],[6,14]]"],
        "is not allowed: contiguous non-empty [lo, hi) unit ranges",
    ),
    (["pipe.length=2", "pipe.partition=explicit", "pipe.stages=[[0,5],[5,12]]"], "from 0 to the model's 14"),
    (["pipe.length=2", "pipe.stages_per_rank=8"], "pipe.length=2 is not allowed: at most 14 stages"),
    (["pipe.length=fast"], "pipe.length='fast' is not allowed: an integer >= 1 or auto"),
    (
        ["pipe.partition=explicit", "pipe.stages=[[0,5],[5,14]]"],
        "pipe.length='auto' is not allowed: an integer with pipe.stages",
    ),
    (["device.memory=lots"], "device.memory='lots' is not allowed"),
    (["freeze.policy=fast"], "freeze.policy='fast' is not allowed: one of pipetransformer, alpha"),
    (["freeze.policy=schedule", "freeze.blocks=[1,2]"], "freeze.blocks=[1, 2] is not allowed: non-decreasing counts"),
    (["freeze.percentile=0"], "freeze.percentile=0.0 is not allowed: a percentile 0 < p <= 100 (50: the median)"),
    (["freeze.threshold=1"], "freeze.threshold=1.0 is not allowed: a share of the block's peak plasticity, 0 < t < 1"),
    (["auto.batch=huge"], "auto.batch='huge' is not allowed: one of fixed_global, fixed_per_pipeline"),
    (["freeze.every=0"], "freeze.every=0.0 is not allowed: a number of epochs > 0"),
    (["freeze.every_steps=0"], "freeze.every_steps=0 is not allowed: an integer >= 1 or null"),
    (
        ["freeze.every=0.5", "freeze.every_steps=10"],
        "freeze.every=0.5 is not allowed: 1 when freeze.every_steps is set",
    ),
    (
        ["freeze.every=0.5", "auto.batch=fixed_per_pipeline"],
        "auto.batch='fixed_per_pipeline' is not allowed: fixed_global when freezing decides inside epochs",
    ),
    (
        ["freeze.every=0.25", "pipe.schedule=pipedream", "pipe.microbatches=1"],
        "freeze.every=0.25 is not allowed: whole epochs with pipe.schedule=pipedream",
    ),
    (["pipe.recompute=sometimes"], "pipe.recompute='sometimes' is not allowed: none, stage or every:N"),
    (["cache.dtype=int8"], "cache.dtype='int8' is not allowed: one of auto, float32, bfloat16, float16"),
    (["cache.max_memory=lots"], "cache.max_memory='lots' is not allowed: a share such as 50%"),
    (["cache.augment=random"], "cache.augment='random' is not allowed: one of fixed, off"),
    (["cache.min_frozen_units=0"], "cache.min_frozen_units=0 is not allowed: an integer >= 1 or null"),
    (["cache.dir=/etc/hostname"], "cache.dir='/etc/hostname' is not allowed: a directory"),
    (["train.precision=fp8"], "train.precision='fp8' is not allowed: one of fp32, bf16, fp16"),
    (["checkpoint.every_steps=-5"], "checkpoint.every_steps=-5 is not allowed: an integer >= 0 (0 = off)"),
    (["pipe.schedule=pipedream", "pipe.microbatches=2"], "pipe.microbatches=2 is not allowed: 1 for pipedream"),
    (
        ["pipe.schedule=pipedream", "pipe.microbatches=1", "train.precision=fp16"],
        "train.precision='fp16' is not allowed: fp32 or bf16 with pipe.schedule=pipedream",
    ),
    (
        ["pipe.vertical_sync=true", "pipe.weight_stashing=false"],
        "pipe.vertical_sync=True is not allowed: false unless pipe.weight_stashing=true",
    ),
    (["pipe.first_stage_replicas=0"], "pipe.first_stage_replicas=0 is not allowed: an integer >= 1"),
    (["pipe.first_stage_replicas=2"], "pipe.first_stage_replicas=2 is not allowed: 1 unless pipe.schedule=pipedream"),
    (
        ["pipe.schedule=pipedream", "pipe.microbatches=1", "pipe.first_stage_replicas=2"],
        "auto.pipe=True is not allowed: false with pipe.first_stage_replicas > 1",
    ),
    (
        [
            "pipe.schedule=pipedream",
            "pipe.microbatches=1",
            "pipe.first_stage_replicas=2",
            "auto.pipe=false",
            "auto.dp=false",
        ],
        "pipe.length='auto' is not allowed: an integer with pipe.first_stage_replicas > 1",
    ),
    (
        ["pipe.schedule=pipedream", "pipe.length=2", "pipe.first_stage_replicas=2", "auto.pipe=false", "auto.dp=false"],
        "launcher.nproc_per_node='auto' is not allowed: 3 workers for pipe.first_stage_replicas=2",
    ),
]


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


@pytest.mark.parametrize("as_script", [True, False])
def test_the_console_script_leaves_its_objects_to_the_exit_not_to_the_collector(as_script):
    """Run as the console script (`main()` with the command line's arguments), ptrun freezes its objects as it
    returns, so the interpreter's last collections skip them (0.5 s after a run); a caller that passes its own
    arguments goes on living, and its collector is left as it was."""
    call = "main()" if as_script else "main(['recipes'])"
    code = (
        "import gc, sys\nfrom ptrun.cli import main\nsys.argv = ['ptrun', 'recipes']\n"
        f"{call}\nprint(gc.get_freeze_count() > 0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(as_script)
