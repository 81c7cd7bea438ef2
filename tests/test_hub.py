"""Hugging Face hub ids as `model.pretrained` and `data.tokenizer`: resolved at the start
(`ptrun.compose.resolve`) to a snapshot in the hub cache, so the workers read local files. The cache here is
laid out under a temporary HF_HOME as huggingface_hub lays it out (`models--org--name/refs/REF`,
`snapshots/COMMIT/FILE` linking into `blobs/`), holding a tiny BERT saved with transformers; the hub is
never reached (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hf_families import LLAMA_3_8B, save_tiny_bert

from ptrun.compose import for_cluster, resolve
from ptrun.config import ConfigError
from ptrun.config.hub import parse_hub_id

MAIN, V1 = "a" * 40, "b" * 40
"""The commits `main` and the tag `v1` point at."""
TEXT = ["recipe=bbc_news_bert", "data.max_length=32"]
"""A text recipe (its data ship in a package) at the tiny BERT's length."""


def cache_repo(
    cache: Path, repo: str, files: Path, commit: str, refs: tuple[str, ...] = ("main",), repo_type: str = "model"
) -> Path:
    """Put the files under `files` into hub cache `cache` as revision `commit` of `repo` (a `model` or a
    `dataset` repo), which each of `refs` names; the snapshot directory."""
    storage = cache / f"{repo_type}s--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    for source in sorted(p for p in files.rglob("*") if p.is_file()):
        data = source.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / source.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (storage / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


def test_a_local_path_wins_and_only_names_can_be_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    assert parse_hub_id("org/tiny") is None  # it exists here
    assert parse_hub_id("org/other@v1.0").revision == "v1.0" and str(parse_hub_id("org/other@v1.0")) == "org/other@v1.0"
    assert parse_hub_id("timm/vit_base_patch16_224.augreg_in21k").repo == "timm/vit_base_patch16_224.augreg_in21k"
    assert all(parse_hub_id(v) is None for v in ("/abs/x.safetensors", "a/b/c", "~/x/y", "./x", "x.pt", None))
    assert parse_hub_id("name").repo == "name"  # a bare name is an id too (gpt2): tests/test_model_names.py


def test_a_cached_id_resolves_to_its_snapshot_in_a_full_start(hub, tiny_bert, capsys):
    snapshot = cache_repo(hub, "org/tiny-bert", tiny_bert, MAIN)
    cfg = resolve([*TEXT, "model.pretrained=org/tiny-bert"]).cfg
    assert cfg.model.pretrained == str(snapshot) and (snapshot / "model.safetensors").is_file()
    assert f"model.pretrained=org/tiny-bert -> {snapshot}" in capsys.readouterr().err
    # what the workers do with it: the model and its tokenizer, from the snapshot
    from safetensors.torch import load_file

    from ptrun.data.text import load_tokenizer
    from ptrun.models import build_model

    model = build_model(cfg.model, num_classes=2).model
    saved = load_file(str(snapshot / "model.safetensors"))
    assert model.config.num_hidden_layers == 2
    assert all(v.equal(saved[k]) for k, v in model.state_dict().items() if k in saved)
    assert load_tokenizer(cfg.model.pretrained, "bbc_news")("the news")["input_ids"] == [2, 5, 6, 3]  # [CLS] ... [SEP]


def test_a_revision_picks_the_named_ref_or_commit(hub, tiny_bert, tmp_path):
    cache_repo(hub, "org/tiny-bert", tiny_bert, MAIN)
    deeper = cache_repo(hub, "org/tiny-bert", save_tiny_bert(tmp_path / "three", layers=3), V1, refs=("v1",))
    for rev in ("v1", V1):
        cfg = resolve([*TEXT, f"model.pretrained=org/tiny-bert@{rev}"]).cfg
        assert cfg.model.pretrained == str(deeper)
    with pytest.raises(
        ConfigError,
        match=r"^model.pretrained='org/tiny-bert@v2': not in the Hugging Face "
        r"cache .* and HF_HUB_OFFLINE=1; fetch it on a machine "
        r"with access: hf download org/tiny-bert --revision v2$",
    ):
        resolve([*TEXT, "model.pretrained=org/tiny-bert@v2"])


def test_a_tokenizer_id_resolves_the_same_way(hub, tiny_bert, tmp_path):
    snapshot = cache_repo(hub, "org/tok", tiny_bert, MAIN)
    weights = tmp_path / "bert-weights"
    save_tiny_bert(weights)
    cfg = resolve([*TEXT, f"model.pretrained={weights}", "data.tokenizer=org/tok"]).cfg
    assert (cfg.model.pretrained, cfg.data.tokenizer) == (str(weights), str(snapshot))


def test_a_missing_id_is_one_line_and_no_start(hub, cli, tmp_path):
    out = cli("train", *TEXT, "model.pretrained=org/nothing", f"hydra.run.dir={tmp_path / 'run'}")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.strip() == (
        f"ptrun: error: model.pretrained='org/nothing': not in the Hugging Face cache "
        f"({hub}) and HF_HUB_OFFLINE=1; fetch it on a machine with access: "
        f"hf download org/nothing"
    )
    assert not (tmp_path / "run").exists()


def test_a_cached_snapshot_without_weights_is_one_line(hub, tiny_bert, tmp_path):
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_bytes((tiny_bert / "config.json").read_bytes())
    snapshot = cache_repo(hub, "org/sizes", config_only, MAIN)
    with pytest.raises(ConfigError) as e:
        resolve([*TEXT, "model.pretrained=org/sizes"])
    assert str(e.value) == (
        f"model.pretrained='org/sizes': its snapshot {snapshot} holds none of model.safetensors, "
        f"model.safetensors.index.json, pytorch_model.bin; fetch them on a machine with access: "
        f"hf download org/sizes"
    )


def test_plan_needs_only_the_config_json_of_an_id(hub, cli, tmp_path):
    """A Llama-3-8B-shaped model, planned by its id from its cached config.json alone."""
    import json

    sizes = tmp_path / "llama-sizes"
    sizes.mkdir()
    (sizes / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **LLAMA_3_8B}))
    snapshot = cache_repo(hub, "meta-llama/Meta-Llama-3-8B", sizes, MAIN)
    cfg = for_cluster([*TEXT, "model.pretrained=meta-llama/Meta-Llama-3-8B"], nodes=1, gpus_per_node=1)
    assert cfg.model.pretrained == str(snapshot)
    out = cli(
        "plan",
        *TEXT,
        "model.pretrained=meta-llama/Meta-Llama-3-8B",
        "cluster=paper",
        "pipe.length=16",
        "--samples",
        "2000",
    )
    assert out.returncode == 0, out.stderr
    assert f"model.pretrained=meta-llama/Meta-Llama-3-8B -> {snapshot}" in out.stderr
    assert "Table 1 (bbc_news_bert)" in out.stdout
    missing = cli("plan", *TEXT, "model.pretrained=meta-llama/Meta-Llama-3-70B", "cluster=paper")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert missing.stderr.strip().endswith(
        "config.json of meta-llama/Meta-Llama-3-70B is not in the Hugging Face cache "
        f"({hub}) and HF_HUB_OFFLINE=1; fetch it on a machine with access: hf download meta-llama/Meta-Llama-3-70B"
    )


def test_a_timm_hub_id_resolves_to_its_weights_file(hub, tmp_path):
    """timm's hub repos (`timm/NAME.TAG`) hold timm's own state dict as model.safetensors: the id is the
    name with its tag, and the ViT loader reads the file it resolves to."""
    import torch
    from safetensors.torch import save_file

    from ptrun.models import build_model

    name = "vit_tiny_patch16_224.augreg_in21k"
    overrides = ["recipe=digits_vit", f"model.name={name}"]
    torch.manual_seed(0)
    source = build_model(resolve(overrides).cfg.model, num_classes=10, img_size=8, in_chans=1)
    repo = tmp_path / "timm-repo"
    repo.mkdir()
    save_file({k: v.contiguous() for k, v in source.model.state_dict().items()}, str(repo / "model.safetensors"))
    (repo / "config.json").write_text('{"architecture": "vit_tiny_patch16_224", "num_classes": 10}')
    snapshot = cache_repo(hub, f"timm/{name}", repo, MAIN)
    cfg = resolve([*overrides, f"model.pretrained=timm/{name}"]).cfg
    assert cfg.model.pretrained == str(snapshot / "model.safetensors")
    torch.manual_seed(1)
    loaded = build_model(cfg.model, num_classes=10, img_size=8, in_chans=1)
    want = source.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in loaded.model.state_dict().items())


def test_an_unreachable_hub_falls_back_to_the_cache(hub, tiny_bert, monkeypatch):
    """Online, but the hub does not answer (a closed local port): a cached id still resolves, another is one
    line saying so."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    snapshot = cache_repo(hub, "org/tiny-bert", tiny_bert, MAIN)
    assert resolve([*TEXT, "model.pretrained=org/tiny-bert"]).cfg.model.pretrained == str(snapshot)
    with pytest.raises(
        ConfigError,
        match=r"^model.pretrained='org/nothing': not in the Hugging Face cache"
        r" .* and the hub cannot be reached; fetch it on a machine "
        r"with access: hf download org/nothing$",
    ):
        resolve([*TEXT, "model.pretrained=org/nothing"])


def test_the_messages_are_in_the_catalogue():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    for part in (
        "'org/name': not in the Hugging Face cache (…/hub) and HF_HUB_OFFLINE=1; fetch it on a machine "
        "with access: hf download org/name",
        "config.json of org/name is not in the Hugging Face cache",
        "holds none of model.safetensors, model.safetensors.index.json, "
        "pytorch_model.bin; fetch them on a machine with access: hf download org/name",
    ):
        assert part in doc
