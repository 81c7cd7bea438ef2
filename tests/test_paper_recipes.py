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
"""vit_cifar100 at the stand-in's size, two short epochs (the paper's rule, alpha 1/3, freezes one of the two
blocks at the second)."""


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
    assert line == (
        f"ptrun: error: not in the Hugging Face cache ({empty_hub}) and HF_HUB_OFFLINE=1: "
        f"model.pretrained='{model}', data.path='{data}'; fetch them on a machine with access: "
        f"hf download {model}; hf download {data} --repo-type dataset"
        + ("; or set data.path to an image folder (train/<class>/*, val/<class>/*)" if recipe == "vit_imagenet" else "")
    )
    assert not (tmp_path / "run").exists()  # and `cli` fails any launch: no worker started


def test_cfg_job_shows_the_hub_ids_and_one_machine(tmp_path):
    out = run_ptrun("train", "recipe=vit_cifar100", "--cfg", "job", cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in (
        f"pretrained: {VIT_ID}",
        f"path: {CIFAR100_ID}",
        "nnodes: '1'",
        "nproc_per_node: auto",
        "length: auto",
        "pipeline_batch_size: 320",
        "speedup: 2.44",
    ):
        assert f"  {line}\n" in text, line


def test_the_ids_resolve_to_snapshots_and_the_sources_read_them(hub, tmp_path, capsys):
    """A paper recipe's ids become the snapshots the workers read: the weights file of the timm repo, the
    dataset's parquet, read by the built-in sources with the real columns, splits and label names (SST-2's
    test split, without labels, never fetched nor read)."""
    from ptrun.compose import resolve
    from ptrun.data.sources import build_datasets

    cfg = resolve(["recipe=vit_cifar100", *VIT_SIZE, f"hydra.run.dir={tmp_path / 'a'}"]).cfg
    assert (
        cfg.model.pretrained.endswith("model.safetensors")
        and f"models--{VIT_ID.replace('/', '--')}" in cfg.model.pretrained
    )
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
    from paper_hub import cifar100_files

    from ptrun.compose import resolve

    local = cifar100_files(tmp_path / "mine")
    cfg = resolve(["recipe=vit_cifar100", *VIT_SIZE, f"data.path={local}", f"hydra.run.dir={tmp_path / 'a'}"]).cfg
    assert cfg.data.path == str(local)


def test_a_snapshot_without_the_sources_files_is_one_line(hub, tmp_path):
    """A cached dataset snapshot that lacks what the source reads (here: GLUE without the task's files)."""
    from ptrun.compose import resolve
    from ptrun.config import ConfigError

    with pytest.raises(
        ConfigError,
        match=rf"^data.path='{GLUE_ID}': its snapshot .* lacks rte/train-\*.parquet, "
        rf"rte/validation-\*.parquet; fetch them on a machine with access: "
        rf"hf download {GLUE_ID} --repo-type dataset$",
    ):
        resolve(["recipe=bert_glue", "data.task=rte", "data.max_length=32", f"hydra.run.dir={tmp_path}"])


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
    off = run_ptrun(
        "train",
        "recipe=vit_cifar100",
        *VIT_QUICK,
        "auto.freeze=false",
        "auto.cache=false",
        f"hydra.run.dir={base}",
        cwd=tmp_path,
        env=env,
    )
    assert off.returncode == 0, off.stderr[-3000:]

    report = run_ptrun("report", str(run), cwd=tmp_path, timeout=120)
    assert report.returncode == 0, report.stderr
    paper = (
        "paper (ViT-B/16 on CIFAR-100, 2 machines x 8 GPUs, 10 epochs (PipeTransformer, ICML 2021, Table 1)): "
        "baseline top1 91.21 in 35m06s, PipeTransformer top1 91.33 in 12m23s, 2.44x"
    )
    final = run_events(run, "epoch")[-1]["eval"]["top1"]
    assert paper in report.stdout and f"this run (run): top1 {final:.2f} in " in report.stdout
    assert (
        "not the paper's setup, so not its experiment: 2 workers (the paper: 16 GPUs); 2 epochs (the paper: "
        "10); epochs cut to 4 steps (train.max_steps_per_epoch)"
    ) in report.stdout
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
    out = run_ptrun(
        "train",
        "recipe=bert_sst2",
        "data.max_length=32",
        "train.epochs=2",
        "train.max_steps_per_epoch=3",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert run_events(run, "start")[0]["world_size"] == 2 and run_events(run, "end")
    assert "accuracy" in run_events(run, "epoch")[-1]["eval"]
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}


def test_a_paper_recipe_on_a_cpu_names_the_keys_of_a_quick_try(hub, tmp_path):
    """At its full size a paper recipe takes hours on a CPU: the start names the keys that shrink it (and says
    nothing on a GPU machine, or once the epochs are cut short)."""
    from ptrun.compose import resolve
    from ptrun.config.paper import quick_try

    vit = resolve(["recipe=vit_cifar100", f"hydra.run.dir={tmp_path / 'a'}"]).cfg
    assert quick_try(vit, gpus=0) == (
        "ptrun: recipe vit_cifar100 trains at the paper's size, on this machine's CPU for hours or days; a quick try "
        "shrinks it: train.epochs=1 train.max_steps_per_epoch=20 train.pipeline_batch_size=16 data.image_size=64"
    )
    assert quick_try(vit, gpus=8) is None
    bert = resolve(["recipe=bert_sst2", "data.max_length=32", f"hydra.run.dir={tmp_path / 'b'}"]).cfg
    assert quick_try(bert, gpus=0).endswith("train.global_batch_size=16 data.max_length=64")
    short = resolve(
        ["recipe=bert_sst2", "data.max_length=32", "train.max_steps_per_epoch=3", f"hydra.run.dir={tmp_path / 'c'}"]
    ).cfg
    assert quick_try(short, gpus=0) is None
    digits = resolve(["recipe=digits_vit", f"hydra.run.dir={tmp_path / 'd'}"]).cfg
    assert quick_try(digits, gpus=0) is None  # not a paper recipe


def test_imagenet_and_squad_read_from_their_hub_parquet(hub, tmp_path):
    """ILSVRC/imagenet-1k (`data/train-*`, `data/validation-*`, image + ClassLabel; the test split never read)
    through the image-folder source, and rajpurkar/squad (`plain_text/*`) through the SQuAD source: the rows
    the official JSON would give."""
    from hf_families import save_tiny_bert
    from paper_hub import imagenet_files, squad_files, squad_rows
    from test_hub import MAIN, cache_repo

    from ptrun.compose import resolve
    from ptrun.data.sources import build_datasets
    from ptrun.data.squad import read_squad, read_squad_parquet

    cache_repo(hub, "ILSVRC/imagenet-1k", imagenet_files(tmp_path / "imagenet"), MAIN, repo_type="dataset")
    cfg = resolve(["recipe=vit_imagenet", *VIT_SIZE, f"hydra.run.dir={tmp_path / 'a'}"]).cfg
    images = build_datasets(cfg.data)
    assert images.class_names == ["tench", "goldfish", "great_white_shark"]
    assert (len(images.train), len(images.eval)) == (9, 6) and images.eval[:]["labels"].tolist() == [0, 1, 2] * 2
    assert tuple(images.train[0]["pixel_values"].shape) == (3, 32, 32)

    cache_repo(hub, "rajpurkar/squad", squad_files(tmp_path / "squad"), MAIN, repo_type="dataset")
    cache_repo(hub, "google-bert/bert-large-uncased", save_tiny_bert(tmp_path / "bert"), MAIN)
    cfg = resolve(
        ["recipe=bert_squad", "data.max_length=32", "data.doc_stride=8", f"hydra.run.dir={tmp_path / 'b'}"]
    ).cfg
    qa = build_datasets(cfg.data)
    assert qa.qa_eval.ids == ["q0", "q1", "q2", "q3"] and len(qa.train) == 6
    rows = squad_rows(2)
    official = tmp_path / "dev-v1.1.json"
    official.write_text(
        json.dumps(
            {
                "data": [
                    {
                        "title": "t",
                        "paragraphs": [
                            {
                                "context": rows["context"][0],
                                "qas": [
                                    {"id": i, "question": q, "answers": [{"text": "sport", "answer_start": 15}]}
                                    for i, q in zip(rows["id"], rows["question"], strict=True)
                                ],
                            }
                        ],
                    }
                ]
            }
        )
    )
    parquet = next((tmp_path / "squad" / "plain_text").glob("validation-*.parquet"))
    from_parquet = read_squad_parquet(parquet)
    assert {k: v[:2] for k, v in from_parquet.items()} == read_squad(official)


@pytest.fixture
def gated_hub(monkeypatch):
    """A local server answering as the hub does for a gated repo the token may not read (403 with the
    `X-Error-Code: GatedRepo` header): HF_ENDPOINT points at it, online."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Gated(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(403)
            self.send_header("X-Error-Code", "GatedRepo")
            self.send_header("X-Error-Message", "Access to this dataset is restricted.")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Gated)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    from huggingface_hub import constants  # it read HF_HUB_OFFLINE as it was imported (the tests' default: 1)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield
    server.shutdown()
    server.server_close()
    thread.join()


def test_gated_imagenet_without_access_names_both_ways_in_one_line(empty_hub, gated_hub, cli, tmp_path):
    weights = tmp_path / "vit.safetensors"
    weights.write_bytes(b"")  # a local path wins: only the data is asked of the hub
    out = cli("train", "recipe=vit_imagenet", f"model.pretrained={weights}", f"hydra.run.dir={tmp_path / 'run'}")
    assert assert_one_error_line(out) == (
        "ptrun: error: data.path='ILSVRC/imagenet-1k': gated on the Hugging Face hub and this machine has no access; "
        "accept its terms at https://huggingface.co/datasets/ILSVRC/imagenet-1k and log in (hf auth login, or set "
        "HF_TOKEN); or set data.path to an image folder (train/<class>/*, val/<class>/*)"
    )
    assert not (tmp_path / "run").exists()
