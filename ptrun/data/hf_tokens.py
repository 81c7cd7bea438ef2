"""`data.name=hf`, the tokenizing half: each raw split tokenized once into an Arrow file of ptrun's cache,
keyed by a hash of everything that shapes its rows (the split's `datasets` fingerprint, which follows the
source files and the split's selection; the tokenizer's full definition; `max_length`; the columns; the
task and packing; the class names). A later run with the same key memory-maps the file and calls no
tokenizer. The directory is `$PTRUN_TOKENIZED_DIR`, else `$XDG_CACHE_HOME/ptrun/tokenized` (by default
`~/.cache/ptrun/tokenized`); the workers of a run share it, and a file lock lets one of them write an entry
while the others wait for it. The directory holds entries (`KEY.arrow`) and their checksums (`KEY.arrow.sum`),
verified on every read: an entry found damaged, truncated, half-written or another's is tokenized again, and
one line says so (`ptrun.cache_entries`). A lock file (`KEY.arrow.lock`) lives while its entry is being made
(and after an attempt that failed, until one succeeds), and a temporary file while it is being written.

Rows, all padded or cut to `max_length` T (the torch format returns int64 tensors):
- classification: what the tokenizer returns of `input_ids`, `attention_mask`, `token_type_ids` (its
  `model_input_names`), plus `labels` (class indices; float32 targets for a regression);
- causal LM, packed (`data.pack`): the documents' tokens, each document followed by the tokenizer's EOS
  token (else its SEP token), concatenated and cut into blocks of T; the last block is padded, so every
  token is kept. `attention_mask` is 1 on real tokens, `labels` the input ids with -100 on padding (not
  shifted: the loss shifts);
- causal LM, one document a row: its first T - 1 tokens and the EOS token, padded to T.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow as pa

from ptrun import cache_entries
from ptrun.config import ConfigError
from ptrun.data.hf_read import column_values
from ptrun.data.text import INPUT_NAMES, arrow_columns, chunks, compact

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DIR_ENV = "PTRUN_TOKENIZED_DIR"
FORMAT_VERSION = 1
"""Part of every key: a change to how rows are made must not reuse files made the old way."""
IGNORE_INDEX = -100
"""`labels` of padding positions: the loss leaves them out."""
LM_INPUT_NAMES = ("input_ids", "attention_mask")
WHAT = "tokenized-data cache entry"


def cache_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ptrun" / "tokenized"


def tokenizer_identity(tok: PreTrainedTokenizerBase) -> str:
    """A hash of the tokenizer's whole definition (vocabulary, normalizer, pre- and post-processing) and the
    settings that change its output here (special tokens, padding side)."""
    special = {k: str(v) for k, v in sorted(tok.special_tokens_map.items())}
    text = json.dumps(
        [type(tok).__name__, tok.backend_tokenizer.to_str(), special, tok.padding_side, list(tok.model_input_names)]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def content_fingerprint(texts: list[str], labels: np.ndarray) -> str:
    """A hash of rows held in memory (a packaged corpus's split): their texts and labels, in order."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode())
        h.update(b"\0")  # a boundary: ["ab", "c"] and ["a", "bc"] differ
    h.update(np.ascontiguousarray(labels).tobytes())
    return h.hexdigest()


def entry_key(fingerprint: str, tok_id: str, **settings) -> str:
    text = json.dumps({"version": FORMAT_VERSION, "rows": fingerprint, "tokenizer": tok_id, **settings}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_table(key: str, write_batches: Iterator[pa.RecordBatch]) -> datasets.Dataset:
    """The tokenized split stored under `key`: read (memory-mapped) when present and whole, else written from
    `write_batches` first. The batches are only drawn when the entry is missing or unusable (damaged,
    truncated, half-written or another entry's file: `ptrun.cache_entries`), which one line reports."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"{DIR_ENV}: cannot create the tokenized-data cache {str(folder)!r} ({e.strerror}); "
            f"point {DIR_ENV} at a writable directory"
        ) from e
    path = folder / f"{key}.arrow"
    try:
        cache_entries.ensure(path, lambda tmp: write_stream(tmp, write_batches), WHAT, "tokenizing it again")
    except OSError as e:  # a read-only or full cache directory: nothing a restart would cure
        raise ConfigError(
            f"{DIR_ENV}: cannot write the tokenized-data cache entry {str(path)!r} ({e.strerror}); free space "
            f"there or point {DIR_ENV} at a writable directory with room"
        ) from e
    return datasets.Dataset.from_file(str(path)).with_format("torch")


def write_stream(path: Path, batches: Iterator[pa.RecordBatch]) -> None:
    """`batches` written to an Arrow stream file at `path`."""
    writer = None
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(str(path), batch.schema)
        writer.write_batch(batch)
    if writer is None:
        raise ConfigError("data.path: the split yields no rows to train on")
    writer.close()


def record_batch(columns: dict[str, np.ndarray]) -> pa.RecordBatch:
    """Equal-length arrays as a record batch; 2-D arrays become fixed-size list columns."""
    return pa.RecordBatch.from_pydict(arrow_columns(columns))


def texts(rows: datasets.Dataset, column: str, part: slice) -> list[str]:
    """Rows `part` of a text column as strings (a missing value is an empty text)."""
    values = column_values(rows.select(range(part.start, part.stop)), column).to_pylist()
    return ["" if v is None else str(v) for v in values]


def model_inputs(tok: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The classification inputs this tokenizer returns, in the BERT argument order."""
    return tuple(k for k in INPUT_NAMES if k in tok.model_input_names)


def classification_batches(
    rows: datasets.Dataset,
    labels: np.ndarray,
    tok: PreTrainedTokenizerBase,
    text_column: str,
    pair_column: str | None,
    max_length: int,
) -> Iterator[pa.RecordBatch]:
    names = model_inputs(tok)
    if tok.pad_token is None:  # GPT-style tokenizers have none; padded positions are masked anyway
        tok.pad_token = tok.eos_token or tok.sep_token
    for part in chunks(len(rows)):
        args = [texts(rows, text_column, part)] + ([texts(rows, pair_column, part)] if pair_column else [])
        enc = tok(*args, truncation=True, max_length=max_length, padding="max_length")
        columns = {k: compact(k, np.asarray(enc[k])) for k in names}
        columns["labels"] = labels[part]
        yield record_batch(columns)


def end_and_pad(tok: PreTrainedTokenizerBase) -> tuple[int, int]:
    """The token that ends each document (EOS, else SEP) and the one that pads a row (the pad token, else
    that end token)."""
    token_id = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    if token_id is None:
        raise ConfigError(
            f"data.tokenizer: {type(tok).__name__} has neither an EOS nor a SEP token to end "
            f"documents with for model.task=causal_lm"
        )
    return int(token_id), (tok.pad_token_id if tok.pad_token_id is not None else int(token_id))


def lm_rows(ids: np.ndarray, real: np.ndarray) -> pa.RecordBatch:
    """[B, T] token ids and real-token mask -> the causal-LM columns."""
    return record_batch(
        {
            "input_ids": ids.astype(np.int32),
            "attention_mask": real.astype(np.int8),
            "labels": np.where(real, ids, IGNORE_INDEX).astype(np.int32),
        }
    )


def packed_batches(
    rows: datasets.Dataset, tok: PreTrainedTokenizerBase, column: str, block: int
) -> Iterator[pa.RecordBatch]:
    """Documents + EOS, concatenated and cut into blocks of `block` tokens (the last one padded)."""
    eos, pad = end_and_pad(tok)
    carry = np.zeros(0, dtype=np.int64)
    for part in chunks(len(rows)):
        # verbose=False: a document longer than the model's positions is expected here (it spans blocks)
        docs = tok(texts(rows, column, part), add_special_tokens=False, verbose=False)["input_ids"]
        stream = np.concatenate([carry] + [np.asarray(d + [eos], dtype=np.int64) for d in docs])
        full = len(stream) // block * block
        if full:
            yield lm_rows(stream[:full].reshape(-1, block), np.ones((full // block, block), dtype=bool))
        carry = stream[full:]
    if len(carry):
        ids = np.full(block, pad, dtype=np.int64)
        ids[: len(carry)] = carry
        yield lm_rows(ids[None], (np.arange(block) < len(carry))[None])


def document_batches(
    rows: datasets.Dataset, tok: PreTrainedTokenizerBase, column: str, length: int
) -> Iterator[pa.RecordBatch]:
    """One document a row: its first `length - 1` tokens and EOS, padded to `length`."""
    eos, pad = end_and_pad(tok)
    for part in chunks(len(rows)):
        docs = tok(texts(rows, column, part), add_special_tokens=False, truncation=True, max_length=length - 1)[
            "input_ids"
        ]
        ids = np.full((len(docs), length), pad, dtype=np.int64)
        sizes = np.array([len(d) + 1 for d in docs])
        for i, d in enumerate(docs):
            ids[i, : sizes[i]] = d + [eos]
        yield lm_rows(ids, np.arange(length)[None, :] < sizes[:, None])
