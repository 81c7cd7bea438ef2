"""The entry a result has on docs/results.md (`benchmarks.results_contents.TABLES` lists them all)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath


@dataclass(frozen=True)
class Table:
    """One result on the page; the prose around it is its template (`template`)."""

    file: str
    """Its JSON file in docs/results/."""
    module: str
    """The benchmark module whose `caption(result)` and `table(result)` format it."""
    title: str
    """Its heading on the page (and the anchor the page's contents link to)."""
    older: bool = False
    """Measured on code that has changed since: listed under the older results."""
    optional: bool = False
    """On the page only when its JSON is in docs/results/: a benchmark that has not been measured here yet."""

    @property
    def template(self) -> str:
        """Its prose in docs/results/templates/: what it measures (Markdown), `$result` where the command, date,
        machine, caption and table go, then what the table says."""
        return PurePath(self.file).stem + ".md"
