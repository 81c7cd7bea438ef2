"""The package as a user who installs the wheel meets it: the wheel holds ptrun and what ptrun imports, and
nothing of the clone's benchmarks, tests or scripts; no clone anywhere, `configs/` and `recipes/` come from
inside the installed package, `ptrun recipes` lists the same recipes and a one-epoch job runs."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.util import resolve_name
from pathlib import Path, PurePosixPath

import pytest

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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from a copy of the clone's sources (about a second of CPU: no dependency is built)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
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
        "--no-index",
        "--disable-pip-version-check",
        "-w",
        tmp / "dist",
        src,
        cwd=tmp,
    )
    shutil.rmtree(src)
    return next((tmp / "dist").glob("ptrun-*.whl"))


def module_of(path: PurePosixPath) -> str:
    """`ptrun/a/b.py` -> `ptrun.a.b`, `ptrun/a/__init__.py` -> `ptrun.a`."""
    parts = path.with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(module: str, is_package: bool, source: str) -> tuple[set[str], set[str]]:
    """What `source` imports, inside functions too (relative imports made absolute): the modules it names
    (`import X`, the `X` of `from X import y`), and the names that are a module or an attribute of one (the
    `X.y` of `from X import y`, and every string that reads as one of ptrun's module paths: `"-m",
    "ptrun.launcher.lifeline"`, a lazily imported module)."""
    package = module if is_package else module.rpartition(".")[0]
    modules, names = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_name("." * node.level + (node.module or ""), package)
            modules.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.fullmatch(r"ptrun(\.\w+)+", node.value):
                names.add(node.value)
    return modules, names


def test_the_wheel_holds_the_package_and_no_benchmark(wheel):
    """The wheel holds every module of `ptrun/` with the yaml beside it, and nothing else of the clone: no
    benchmark, test or script. Every module ptrun's code imports is in it (a module of ptrun) or comes from
    outside the clone (a dependency, the standard library): none is one of the clone's own top-level modules."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sources = {PurePosixPath(n): z.read(n).decode() for n in names if n.endswith(".py")}
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ptrun", next(t for t in tops if t.endswith(".dist-info"))}, sorted(tops)
    assert not [n for n in names if "benchmarks" in n.split("/")], "a benchmark in the wheel"

    shipped = {module_of(p) for p in sources}
    in_clone = {module_of(p.relative_to(REPO)) for p in (REPO / "ptrun").rglob("*.py")}
    assert shipped == in_clone
    shipped |= {".".join(p.parent.parts) for p in sources}  # the packages, `__init__.py` or not (namespace)
    yaml = {f"ptrun/{p.relative_to(REPO)}" for d in ("configs", "recipes") for p in (REPO / d).rglob("*.yaml")}
    assert yaml and yaml <= set(names)
    assert "ptrun = ptrun.cli:main" in entry_points and "ptrun.cli" in shipped

    # the clone's own top-level modules and packages besides ptrun: benchmarks, the tests' helpers, scripts
    clone_only = {p.stem for p in (*REPO.glob("*.py"), *(REPO / "tests").glob("*.py"))} | {
        p.name for p in REPO.iterdir() if p.is_dir() and p.name != "ptrun" and not p.name.startswith(".")
    }
    from_clone, missing = [], []
    for path, source in sources.items():
        modules, attributes = imported(module_of(path), path.name == "__init__.py", source)
        for name in modules | attributes:
            if name.split(".")[0] in clone_only:
                from_clone.append(f"{path}: {name}")
        for name in modules:
            if name.split(".")[0] == "ptrun" and name not in shipped:
                missing.append(f"{path}: {name}")
        for name in attributes:
            if name.split(".")[0] == "ptrun" and name not in shipped and name.rpartition(".")[0] not in shipped:
                missing.append(f"{path}: {name}")
    assert not from_clone and not missing, (from_clone, missing)


@pytest.mark.slow
@pytest.mark.dist
def test_the_wheel_runs_recipes_and_a_job_outside_the_repository(wheel, tmp_path):
    work = tmp_path / "work"
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
