"""The set-up, as a user with several clones meets it: each clone's `.venv` runs that clone's ptrun, and
deleting one clone leaves the others working (the dependencies' venv is shared and reused, not rebuilt)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # set-up: two clones, each with its own venv

REPO = Path(__file__).resolve().parents[1]


def setup(clone: Path) -> Path:
    out = subprocess.run(
        ["bash", str(clone / "scripts" / "setup.sh")], capture_output=True, text=True, timeout=900, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def ptrun_location(venv: Path) -> Path:
    # run from elsewhere: `python -c` puts the working directory first on sys.path
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ptrun; print(ptrun.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=venv.parent.parent,
    )
    return Path(out.stdout.strip()).parent.parent


def test_each_clone_runs_its_own_code_and_survives_the_others(tmp_path):
    clones = [tmp_path / "a", tmp_path / "b"]
    for clone in clones:
        subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", f"file://{REPO}", str(clone)], check=True, timeout=120
        )
        # this checkout's set-up and dependency files (its uncommitted edits too), so the shared venv that
        # runs these tests is reused
        for name in (
            "scripts/setup.sh",
            "pyproject.toml",
            "requirements/constraints.txt",
            "requirements/packaged-data.txt",
        ):
            shutil.copyfile(REPO / name, clone / name)
    venvs = [setup(clone) for clone in clones]
    assert venvs == [clone / ".venv" for clone in clones]
    assert [ptrun_location(v) for v in venvs] == clones
    recipes = subprocess.run([str(venvs[1] / "bin" / "ptrun"), "recipes"], capture_output=True, text=True, timeout=120)
    assert recipes.returncode == 0 and "digits_vit" in recipes.stdout, recipes.stderr
    shutil.rmtree(clones[0])
    assert ptrun_location(venvs[1]) == clones[1]
    again = subprocess.run([str(venvs[1] / "bin" / "ptrun"), "recipes"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == recipes.stdout, again.stderr
