"""The paper's recipes in one command: hub ids for their weights and data by default, fetched once at the start
into the Hugging Face cache (here a cache under a temporary HF_HOME holding tiny stand-ins laid out under the
real ids, `paper_hub.py`; the hub is never reached), one machine by default, and the paper's numbers beside
the run's in `ptrun report`."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import assert_one_error_line, run_events, run_ptrun
from paper_hub import BERT_BASE_ID, CIFAR100_ID, FINE, GLUE_ID, VIT_ID, VIT_SIZE, lay_out

IDS = {  # recipe -> (model id, dataset id)
    "vit_imagenet": ("timm/vit_base_patch16_224.augreg_in21k", "ILSVRC/imagenet-1k"),
    "vit_cifar100": ("timm/vit_base_patch16_224.augreg_in21k", "uoft-cs/cifar100"),
    "vit_cifar10": ("timm/vit_base_patch16_224.augreg_in21k", "uoft-cs/cifar10"),
    "bert_squad": ("google-bert/bert-large-uncased", "rajpurkar/squad"),
    "bert_sst2": ("google-bert/bert-base-uncased", "nyu-mll/glue"),
    "bert_glue": ("google-bert/bert-base-uncased", "nyu-mll/glue"),
}
VIT_QUICK = [*VIT_SIZE, "train.epochs=2", "train.pipeline_batch_size=8", "train.max_steps_per_epoch=4"]
"""vit_cifar100 at the stand-in's size, two short epochs (the paper's rule freezes 4 of 12... of 2 blocks
here at the second)."""


@pytest.fixture
def empty_hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache under a fresh HF_HOME, offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # `org/name` is looked for on disk first: here, where it is not
    return tmp_path / "hf" / "hub"


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """HF_HOME with the stand-ins cached under the real ids (built once for the module)."""
    home = tmp_path_factory.mktemp("hf")
    lay_out(home / "hub", tmp_path_factory.mktemp("stand-ins"))
    return home


@pytest.fixture
def hub(stand_ins, empty_hub, monkeypatch):
    """The stand-ins' cache, offline; the cache directory."""
    monkeypatch.setenv("HF_HOME", str(stand_ins))
    return stand_ins / "hub"


@pytest.mark.parametrize("recipe", sorted(IDS))
def test_an_empty_cache_names_every_id_in_one_line_and_starts_nothing(recipe, empty_hub, cli, tmp_path):
    out = cli("train", f"recipe={recipe}", f"hydra.run.dir={tmp_path / 'run'}")
    line = assert_one_error_line(out)
    model, data = IDS[recipe]
    assert line == (f"ptrun: error: not in the Hugging Face cache ({empty_hub}) and HF_HUB_OFFLINE=1: "
                    f"model.pretrained='{model}', data.path='{data}'; fetch them on a machine with access: "
                    f"hf download {model}; hf download {data} --repo-type dataset"
                    + ("; or set data.path to an image folder (train/<class>/*, val/<class>/*)"
                       if recipe == "vit_imagenet" else ""))
    assert not (tmp_path / "run").exists()  # and `cli` fails any launch: no worker started


def test_cfg_job_shows_the_hub_ids_and_one_machine(tmp_path):
    out = run_ptrun("train", "recipe=vit_cifar100", "--cfg", "job", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in (f"pretrained: {VIT_ID}", f"path: {CIFAR100_ID}", "nnodes: '1'", "nproc_per_node: auto",
                 "length: auto", "pipeline_batch_size: 320", "speedup: 2.44"):
        assert f"  {line}\n" in text, line


def test_the_ids_resolve_to_snapshots_and_the_sources_read_them(hub, tmp_path, capsys):
    """A paper recipe's ids become the snapshots the workers read: the weights file of the timm repo, the
    dataset's parquet, read by the built-in sources with the real columns, splits and label names (SST-2's
    test split, without labels, never fetched nor read)."""
    from ptrun.compose import resolve
    from ptrun.data.sources import build_datasets

    cfg = resolve(["recipe=vit_cifar100", *VIT_SIZE, f"hydra.run.dir={tmp_path / 'a'}"]).cfg
    assert cfg.model.pretrained.endswith("model.safetensors") and f"models--{VIT_ID.replace('/', '--')}" in \
        cfg.model.pretrained
    assert f"datasets--{CIFAR100_ID.replace('/', '--')}" in cfg.data.path
    err = capsys.readouterr().err
    assert f"model.pretrained={VIT_ID} -> " in err and f"data.path={CIFAR100_ID} -> {cfg.data.path}" in err
    images = build_datasets(cfg.data)
    assert (images.num_classes, images.class_names, len(images.train), len(images.eval)) == (100, FINE, 48, 16)
    assert tuple(images.train[0]["pixel_values"].shape) == (3, 32, 32)

    text = resolve(["recipe=bert_sst2", "data.max_length=32", f"hydra.run.dir={tmp_path / 'b'}"]).cfg
    assert f"models--{BERT_BASE_ID.replace('/', '--')}" in text.model.pretrained == text.data.tokenizer
    sst2 = build_datasets(text.data)
    assert sst2.class_names == ["negative", "positive"] and (len(sst2.train), len(sst2.eval)) == (32, 16)
    assert sorted(set(sst2.eval[:]["labels"].tolist())) == [0, 1]


def test_a_local_path_given_wins_over_the_recipes_id(hub, tmp_path):
    from ptrun.compose import resolve
    from paper_hub import cifar100_files

    local = cifar100_files(tmp_path / "mine")
    cfg = resolve(["recipe=vit_cifar100", *VIT_SIZE, f"data.path={local}", f"hydra.run.dir={tmp_path / 'a'}"]).cfg
    assert cfg.data.path == str(local)


def test_a_snapshot_without_the_sources_files_is_one_line(hub, tmp_path):
    """A cached dataset snapshot that lacks what the source reads (here: GLUE without the task's files)."""
    from ptrun.compose import resolve
    from ptrun.config import ConfigError

    with pytest.raises(ConfigError, match=r"^data.path='nyu-mll/glue': its snapshot .* lacks rte/train-\*.parquet, "
                                          r"rte/validation-\*.parquet; fetch them on a machine with access: "
                                          r"hf download nyu-mll/glue --repo-type dataset$"):
        resolve(["recipe=bert_glue", "data.task=rte", "data.max_length=32", f"hydra.run.dir={tmp_path}"])
    assert GLUE_ID == "nyu-mll/glue"


# ---- the recipes run to the end, offline, on one machine ----------------------------------------------------

@pytest.mark.slow
def test_vit_cifar100_runs_offline_and_its_report_sets_the_paper_beside_it(stand_ins, tmp_path):
    env = {"HF_HOME": str(stand_ins), "HF_HUB_OFFLINE": "1"}
    run, base = tmp_path / "run", tmp_path / "base"
    out = run_ptrun("train", "recipe=vit_cifar100", *VIT_QUICK, f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    start = run_events(run, "start")[0]
    assert start["world_size"] == 2 and run_events(run, "end")  # one machine, its two emulated devices
    assert max(p["frozen_units"] for p in run_events(run, "plan")) > 0  # the paper's rule froze
    assert (run / "model" / "model.safetensors").is_file()
    off = run_ptrun("train", "recipe=vit_cifar100", *VIT_QUICK, "auto.freeze=false", "auto.cache=false",
                    f"hydra.run.dir={base}", cwd=tmp_path, env=env)
    assert off.returncode == 0, off.stderr[-3000:]

    report = run_ptrun("report", str(run), cwd=tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr
    paper = ("paper (ViT-B/16 on CIFAR-100, 2 machines x 8 GPUs, 10 epochs (PipeTransformer, ICML 2021, Table 1)): "
             "baseline top1 91.21 in 35m06s, PipeTransformer top1 91.33 in 12m23s, 2.44x")
    final = run_events(run, "epoch")[-1]["eval"]["top1"]
    assert paper in report.stdout and f"this run (run): top1 {final:.2f} in " in report.stdout
    assert ("not the paper's setup, so not its experiment: 2 workers (the paper: 16 GPUs); 2 epochs (the paper: "
            "10); epochs cut to 4 steps (train.max_steps_per_epoch)") in report.stdout
    assert "speedup over" not in report.stdout  # no freezing-off run given
    both = run_ptrun("report", str(run), str(base), "--out", str(tmp_path / "both"), cwd=tmp_path, timeout=120)
    assert both.returncode == 0, both.stderr
    line = next(x for x in both.stdout.splitlines() if x.startswith("speedup over the freezing-off run (base: "))
    assert line.endswith("x in wall time (the paper: 2.44x)"), line
    assert "## The paper" in (tmp_path / "both" / "report.md").read_text()
    shutil.rmtree(tmp_path / "both")


@pytest.mark.slow
def test_bert_sst2_runs_offline_to_the_end(stand_ins, tmp_path):
    env = {"HF_HOME": str(stand_ins), "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"
    out = run_ptrun("train", "recipe=bert_sst2", "data.max_length=32", "train.epochs=2", "train.max_steps_per_epoch=3",
                    f"hydra.run.dir={run}", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert run_events(run, "start")[0]["world_size"] == 2 and run_events(run, "end")
    assert "accuracy" in run_events(run, "epoch")[-1]["eval"]
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
