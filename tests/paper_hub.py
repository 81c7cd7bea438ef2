"""Tiny stand-ins for the paper recipes' hub repos, laid out in a Hugging Face cache under their real ids: each
dataset's real parquet files, columns, splits and label names (as the hub serves them: uoft-cs/cifar100's
`cifar100/train-00000-of-00001.parquet` with `img`, `fine_label`, `coarse_label`; nyu-mll/glue's
`sst2/{train,validation,test}-00000-of-00001.parquet` with `sentence`, `label`, `idx`), and a tiny model of the
real family under each model id (a timm ViT's state dict as model.safetensors, a BERT saved by
transformers). Only the sizes differ, which the tests give as overrides."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from hf_families import save_tiny_bert
from test_hub import MAIN, cache_repo

VIT_ID, CIFAR100_ID = "timm/vit_base_patch16_224.augreg_in21k", "uoft-cs/cifar100"
BERT_BASE_ID, GLUE_ID = "google-bert/bert-base-uncased", "nyu-mll/glue"
VIT_SIZE = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2", "model.patch_size=8", "data.image_size=32"]
"""The stand-in ViT's sizes, as the overrides a quick try on a CPU gives: 32 px images in 8 px patches."""
FINE = [f"fine_{i}" for i in range(100)]
"""CIFAR-100's 100 fine label names stand in (the real ones: apple, aquarium_fish, ...)."""


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def cifar100_files(folder: Path, train: int = 48, test: int = 16) -> Path:
    """uoft-cs/cifar100's parquet layout: 32x32 RGB images, 100 fine and 20 coarse ClassLabels, train + test;
    the images of a class share a colour, so the task is learnable."""
    import datasets

    features = datasets.Features(
        {
            "img": datasets.Image(),
            "fine_label": datasets.ClassLabel(names=FINE),
            "coarse_label": datasets.ClassLabel(names=[f"coarse_{i}" for i in range(20)]),
        }
    )
    rng = np.random.default_rng(0)
    for split, rows in (("train", train), ("test", test)):
        labels = [i % 4 for i in range(rows)]  # four classes present, the other 96 in the label names only
        images = [png(np.clip(rng.normal(60 * c + 40, 20, (32, 32, 3)), 0, 255).astype(np.uint8)) for c in labels]
        table = datasets.Dataset.from_dict(
            {
                "img": [{"bytes": b, "path": None} for b in images],
                "fine_label": labels,
                "coarse_label": [c % 20 for c in labels],
            },
            features=features,
        )
        (folder / "cifar100").mkdir(parents=True, exist_ok=True)
        table.to_parquet(folder / "cifar100" / f"{split}-00000-of-00001.parquet")
    return folder


def sst2_files(folder: Path, train: int = 32, validation: int = 16) -> Path:
    """nyu-mll/glue's sst2 parquet: `sentence`, ClassLabel `label` (negative, positive; -1 in test), `idx`."""
    import datasets

    features = datasets.Features(
        {
            "sentence": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["negative", "positive"]),
            "idx": datasets.Value("int32"),
        }
    )
    words = {0: "the film a b", 1: "the news sport c"}
    (folder / "sst2").mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("validation", validation), ("test", 8)):
        labels = [-1] * rows if split == "test" else [i % 2 for i in range(rows)]
        table = datasets.Dataset.from_dict(
            {"sentence": [words[max(label, 0)] for label in labels], "label": labels, "idx": list(range(rows))},
            features=features,
        )
        table.to_parquet(folder / "sst2" / f"{split}-00000-of-00001.parquet")
    return folder


def tiny_vit_files(folder: Path) -> Path:
    """A timm ViT of the stand-in sizes (`VIT_SIZE`) as timm's hub repo holds one: model.safetensors (timm's
    own state dict, the ImageNet-21k head of another class count) and config.json."""
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_base_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=21843,
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text('{"architecture": "vit_base_patch16_224", "num_classes": 21843}')
    return folder


def lay_out(cache: Path, work: Path) -> None:
    """Every stand-in in hub cache `cache` (built under `work`)."""
    cache_repo(cache, VIT_ID, tiny_vit_files(work / "vit"), MAIN)
    cache_repo(cache, CIFAR100_ID, cifar100_files(work / "cifar100"), MAIN, repo_type="dataset")
    cache_repo(cache, BERT_BASE_ID, save_tiny_bert(work / "bert"), MAIN)
    cache_repo(cache, GLUE_ID, sst2_files(work / "glue"), MAIN, repo_type="dataset")


def imagenet_files(folder: Path, classes: tuple[str, ...] = ("tench", "goldfish", "great_white_shark")) -> Path:
    """ILSVRC/imagenet-1k's parquet layout: `data/{train,validation,test}-00000-of-00001.parquet`, an `image`
    column and a ClassLabel `label` (-1 in test), images of other sizes than the model's."""
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(classes))})
    rng = np.random.default_rng(1)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", 9), ("validation", 6), ("test", 3)):
        labels = [-1] * rows if split == "test" else [i % len(classes) for i in range(rows)]
        images = [png(rng.integers(0, 255, (40 + i, 48, 3), dtype=np.uint8)) for i in range(rows)]
        table = datasets.Dataset.from_dict(
            {"image": [{"bytes": b, "path": None} for b in images], "label": labels}, features=features
        )
        table.to_parquet(folder / "data" / f"{split}-00000-of-00001.parquet")
    return folder


SQUAD_CONTEXT = "the news a b c sport the film"


def squad_rows(n: int) -> dict[str, list]:
    """SQuAD v1.1 rows as rajpurkar/squad holds them: id, title, context, question, answers {text, answer_start}."""
    return {
        "id": [f"q{i}" for i in range(n)],
        "title": ["t"] * n,
        "context": [SQUAD_CONTEXT] * n,
        "question": ["  the news"] * n,
        "answers": [{"text": ["sport"], "answer_start": [15]}] * n,
    }


def squad_files(folder: Path) -> Path:
    """rajpurkar/squad's parquet layout: `plain_text/{train,validation}-00000-of-00001.parquet`."""
    import datasets

    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "title": datasets.Value("string"),
            "context": datasets.Value("string"),
            "question": datasets.Value("string"),
            "answers": datasets.Sequence({"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}),
        }
    )
    (folder / "plain_text").mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", 6), ("validation", 4)):
        table = datasets.Dataset.from_dict(squad_rows(rows), features=features)
        table.to_parquet(folder / "plain_text" / f"{split}-00000-of-00001.parquet")
    return folder
