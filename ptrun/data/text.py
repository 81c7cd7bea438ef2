"""What the text sources share: the model's input columns, a local tokenizer, tokenizing in chunks, and
compact Arrow columns (int32 tokens, int8 masks; the torch format returns int64 tensors). The sources: GLUE
(glue.py), SQuAD v1.1 (squad.py) and the packaged offline corpora (packaged_text.py). Every split is padded to
`data.max_length` so batches stack."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow as pa

from ptrun.config import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
"""The BERT inputs every text source produces, in the model's argument order."""
TOKENIZE_CHUNK = 4096
"""Examples tokenized per call: bounds the Python lists the tokenizer returns on 100k+ example tasks."""


def load_tokenizer(path: str | None, source: str) -> PreTrainedTokenizerBase:
    """A fast tokenizer from a local directory (`AutoTokenizer.from_pretrained`; never downloads)."""
    if path is None:
        raise ConfigError(
            f"data.tokenizer=None: data.name={source} needs a local tokenizer directory "
            f"(data.tokenizer, or model.pretrained as a Hugging Face directory)"
        )
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ConfigError(f"data.tokenizer={path!r}: no such directory (a saved Hugging Face tokenizer)")
    from transformers import AutoTokenizer  # inner import: optional library

    try:
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"data.tokenizer={path!r}: not a Hugging Face tokenizer directory ({' '.join(str(e).split())[:200]})"
        ) from e
    if not tok.is_fast:  # offsets and overflowing windows (SQuAD) need the Rust tokenizer
        raise ConfigError(f"data.tokenizer={path!r}: not a fast (tokenizers-backed) tokenizer")
    return tok


def chunks(n: int, size: int = TOKENIZE_CHUNK) -> Iterator[slice]:
    for lo in range(0, n, size):
        yield slice(lo, min(n, lo + size))


def tokenize_texts(
    tok: PreTrainedTokenizerBase, texts: Sequence[Sequence[str]], max_length: int
) -> dict[str, np.ndarray]:
    """Tokenize single sentences (`texts` = [sentences]) or pairs ([firsts, seconds]), truncated and padded to
    `max_length`: the three model inputs as [N, max_length] arrays."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in INPUT_NAMES}
    for part in chunks(len(texts[0])):
        enc = tok(
            *[list(t[part]) for t in texts],
            truncation=True,
            max_length=max_length,
            padding="max_length",
            return_token_type_ids=True,
        )
        for k in INPUT_NAMES:  # lists -> arrays here: transformers' return_tensors="np" is several times slower
            parts[k].append(np.asarray(enc[k]))
    return {k: compact(k, np.concatenate(v)) for k, v in parts.items()}


def compact(name: str, values: np.ndarray) -> np.ndarray:
    """Smallest integer type that holds a token column (ids need int32; masks and segments fit int8)."""
    return values.astype(np.int32 if name == "input_ids" else np.int8)


def arrow_columns(columns: dict[str, np.ndarray]) -> dict[str, pa.Array]:
    """Equal-length arrays as Arrow arrays, built from their buffers (not token by token as Python objects);
    2-D arrays become fixed-size list columns."""
    arrow = {}
    for name, values in columns.items():
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        arrow[name] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1]) if values.ndim == 2 else flat
    return arrow


def arrays_to_dataset(columns: dict[str, np.ndarray]) -> datasets.Dataset:
    """A torch-formatted Dataset from equal-length arrays; 2-D arrays become fixed-size list columns.

    Built from Arrow buffers directly: `Dataset.from_dict` would walk every token as a Python object."""
    return datasets.Dataset(pa.table(arrow_columns(columns))).with_format("torch")


# ---- SQuAD v1.1 --------------------------------------------------------------------------------------
