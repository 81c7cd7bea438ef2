"""The export check's interpreter (`benchmarks.export_check.without_ptrun`) is what it claims: torch,
transformers and peft import there, ptrun does not, so `benchmarks/without_ptrun/load_export.py` loads an export as a
user without ptrun would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.export_check import LOADER, without_ptrun


@pytest.mark.slow
def test_the_check_runs_where_the_libraries_import_and_ptrun_does_not(tmp_path):
    python = without_ptrun(tmp_path / "venv")
    probe = "import importlib.util as u; print([u.find_spec(m) is not None for m in ('torch', 'transformers', 'peft', "
    probe += "'ptrun')])"
    found = subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert found.stdout.strip() == "[True, True, True, False]"
    # and the loader refuses an interpreter where ptrun imports (this one), so a check cannot pass by accident
    refused = subprocess.run(
        [sys.executable, str(LOADER), "merged", str(tmp_path), "--eval", str(tmp_path / "none.jsonl")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert refused.returncode != 0 and "ptrun is importable" in refused.stderr
