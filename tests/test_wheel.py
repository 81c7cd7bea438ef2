"""The package as a user who installs the wheel meets it: no clone anywhere, `configs/` and `recipes/` come
from inside the installed package, `ptrun recipes` lists the same recipes, the benchmarks find their plain peer
and a one-epoch job runs."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("ptrun", "configs", "recipes", "setup.py", "pyproject.toml", "README.md")
"""What the wheel is built from (a copy, so no earlier build/ directory of the clone can leak into it)."""


def run(*args, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    # PYTHONPATH could name the clone; the installed package must do without it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out


def dependency_site_packages() -> list[str]:
    """Where the dependencies are installed: a fresh venv sees them through a .pth file of plain paths, as
    scripts/setup.sh links each clone's venv to the shared one (a plain path runs none of that directory's
    own .pth files, so an editable install of a clone in it stays invisible)."""
    return sorted({str(Path(importlib.util.find_spec(m).origin).parents[1]) for m in ("torch", "hydra", "timm")})


@pytest.mark.slow
def test_the_wheel_runs_recipes_and_a_job_outside_the_repository(tmp_path):
    src, work = tmp_path / "src", tmp_path / "work"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(REPO / name, src / name)
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        tmp_path / "dist",
        src,
        cwd=tmp_path,
    )
    wheel = next((tmp_path / "dist").glob("ptrun-*.whl"))
    shutil.rmtree(src)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(run(python, "-c", purelib, cwd=tmp_path).stdout.strip())
    (site / "_ptrun_dependencies.pth").write_text("\n".join(dependency_site_packages()) + "\n")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", wheel, cwd=tmp_path)

    work.mkdir()
    where = run(
        python, "-c", "import ptrun.compose as c; print(c.__file__); print(c.CONFIG_DIR); print(c.RECIPE_DIR)", cwd=work
    ).stdout.split()
    assert where == [
        str(site / "ptrun" / "compose.py"),
        str(site / "ptrun" / "configs"),
        str(site / "ptrun" / "recipes"),
    ]

    # The benchmarks' plain peer ships in the package: `benchmarks.peers` runs it as a module, no clone needed.
    peer = "import importlib.util, benchmarks.peer_runs as p; print(importlib.util.find_spec(p.PLAIN).origin)"
    assert run(python, "-c", peer, cwd=work).stdout.split() == [str(site / "ptrun" / "bench" / "plain_loop.py")]
    assert "--threads" in run(python, "-m", "benchmarks.plain_loop", "--help", cwd=work).stdout

    listed = run(venv / "bin" / "ptrun", "recipes", cwd=work).stdout
    assert listed == run(sys.executable, "-m", "ptrun.cli", "recipes", cwd=REPO).stdout  # the clone's
    assert "digits_vit " in listed

    run(
        venv / "bin" / "ptrun",
        "train",
        "recipe=digits_vit",
        "train.epochs=1",
        "train.max_steps_per_epoch=10",
        "launcher.nproc_per_node=1",
        "hydra.run.dir=run",
        cwd=work,
        timeout=300,
    )
    events = [json.loads(line) for line in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and events[0]["recipe"] == "digits_vit"
    assert events[-1]["event"] == "end" and events[-1]["epochs"] == 1
