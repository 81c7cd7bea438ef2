"""The entry a result has on docs/results.md (`ptrun.bench.readme.TABLES` lists them all)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    """One result on the page."""

    file: str
    """Its JSON file in docs/results/."""
    module: str
    """The benchmark module whose `caption(result)` and `table(result)` format it."""
    title: str
    measures: str
    """What it measures (Markdown), above the table."""
    notes: str = ""
    """What the table says (Markdown), below it."""
    older: bool = False
    """Measured on code that has changed since: listed under the older results."""
    optional: bool = False
    """On the page only when its JSON is in docs/results/: a benchmark that has not been measured here yet."""
