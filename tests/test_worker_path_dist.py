"""The workers import what the launcher imports: `ptrun train` started from a directory that holds a package
named like one the workers import (here `datasets`, which the workers' server preloads with the trainer and
every data source reads) trains with the installed one, as the launcher itself would."""

from __future__ import annotations

import pytest
from conftest import TINY, run_ptrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # launches workers


def test_workers_do_not_import_from_the_current_directory(tmp_path):
    here = tmp_path / "project"
    shadow = here / "datasets"
    shadow.mkdir(parents=True)
    marker = tmp_path / "imported"
    (shadow / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('not datasets')\n")
    done = run_ptrun(
        "train", *TINY, "train.epochs=1", "train.max_steps_per_epoch=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=here
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not marker.exists()  # no process of the run imported the directory's package
