"""The workers' server and environment: the forkserver the workers start from, which imports their modules once
while the launcher checks the config and forms the rendezvous; the modules it imports; the environment the workers
need; ptrun's cache directory."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
from multiprocessing import util
from pathlib import Path

from ptrun.config import PtrunConfig
from ptrun.config.adapter import ADAPTER_SPECS
from ptrun.config.model import FAMILY_SPECS, model_family


def user_cache_dir() -> Path:
    """ptrun's directory for caches that outlive a run: $XDG_CACHE_HOME/ptrun, by default ~/.cache/ptrun."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ptrun"


WORKER_MODULES = ["ptrun.launcher.worker", "ptrun.train.trainer"]
"""What every worker imports before it can start: torch and ptrun's trainer; `worker_modules` adds the model's
library. (Not scikit-learn: the split and the digits are read without it.)"""


def worker_modules(cfg: PtrunConfig) -> list[str]:
    """`WORKER_MODULES`, the library that builds `cfg.model` (`Family.preload`) and the adapter's
    (`AdapterKind.preload`)."""
    return [*WORKER_MODULES, *FAMILY_SPECS[model_family(cfg.model)].preload, *ADAPTER_SPECS[cfg.adapter.name].preload]


def worker_environment() -> None:
    """What the workers' environment needs before the first of them (or the forkserver) starts."""
    # torch 2.13/2.14: restarted gloo workers fail in connectFullMesh when the agent shares its TCP store
    # with them (the store still holds the previous attempt's addresses); a separate store fixes restarts.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Importing torch._dynamo (timm and the pipelining schedules do) creates torch's compile cache, by
    # default /tmp/torchinductor_USER; a cache that should outlive the run belongs with the user's caches.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_cache_dir() / "torchinductor"))


@contextlib.contextmanager
def launchers_import_path():
    """The forkserver started inside imports what the launcher would. It starts as `python -c ...`, which
    puts the current directory first on its sys.path, and (CPython 3.11 and 3.12) does not take the
    launcher's sys.path, as a spawned process does. Unless the launcher has the directory on its own path
    (`python -m` there), PYTHONSAFEPATH keeps it out: otherwise the workers, forked from the server, would
    import what the directory holds before the installed packages (another ptrun checkout, a folder named
    like a library)."""
    keep_out = not {"", os.getcwd()} & set(sys.path) and "PYTHONSAFEPATH" not in os.environ
    if keep_out:
        os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        if keep_out:
            del os.environ["PYTHONSAFEPATH"]


SOCKET_PATH_MAX = 107
"""The characters a Unix socket's path may have on Linux (108 bytes with its NUL)."""
SOCKET_NAME = len("/pymp-abcdefgh/listener-abcdefgh")
"""What multiprocessing adds to the temp directory for the forkserver's socket: its own directory and the name."""


def give_the_socket_room() -> None:
    """The forkserver listens on a Unix socket in multiprocessing's temp directory, which it makes in TMPDIR on
    first use. Where TMPDIR's path leaves no room for a socket's (a scheduler's per-job directory, a test's), that
    directory is made in /tmp instead, as Python 3.13's multiprocessing does itself, so the workers still start
    from the forkserver rather than each importing torch again. Nothing changes where it was made already."""
    if len(tempfile.gettempdir()) + SOCKET_NAME <= SOCKET_PATH_MAX or not os.access("/tmp", os.W_OK | os.X_OK):
        return
    kept, tempfile.tempdir = tempfile.tempdir, "/tmp"  # read by `get_temp_dir`'s mkdtemp, this once
    try:
        util.get_temp_dir()
    finally:
        tempfile.tempdir = kept


def start_worker_server(cfg: PtrunConfig) -> str:
    """The workers' start method, with their server started now: `ptrun train` calls this as soon as the
    config is checked, so the server imports `worker_modules` while the launcher reads the data file it
    checks, imports elastic and forms the rendezvous (seconds of every start); `launch_config` calls it again
    (then it is running); `ptrun train` stops it as it ends (`stop_worker_server`).

    Workers are forked from a forkserver that imported the modules once; spawned where the platform has no
    forkserver. Not forked from the launcher: forked workers failed elastic restarts in the full test suite
    (a re-formed job never came up); the forkserver is a fresh single-threaded process that only imported
    modules (no CUDA, no threads, no process group), so its children start as clean as spawned ones. Every
    restart and every later launch here (a test session's) reuses it, with the modules of the first."""
    worker_environment()
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    # inner import: start-up (a refused `ptrun train` imports this module)
    from multiprocessing import forkserver

    from ptrun.launcher.lifeline import quiet_tracker, server_parent

    # ptrun.launcher.lifeline first: the server dies with the launcher (a SIGKILLed one included)
    multiprocessing.set_forkserver_preload(["ptrun.launcher.lifeline", *worker_modules(cfg)])
    give_the_socket_room()
    try:
        with launchers_import_path(), server_parent(), quiet_tracker():
            forkserver.ensure_running()
    except OSError:  # no socket (multiprocessing's temp directory made elsewhere first, with a path too long)
        return "spawn"
    return "forkserver"


def stop_worker_server() -> None:
    """End the workers' server this process started, at once (its workers have ended, or none started), where
    closing its pipe would have it finish what it is importing, then tear its libraries down first; nothing
    without one."""
    from multiprocessing import forkserver  # inner import: start-up

    server = forkserver._forkserver  # the module's instance, which `ensure_running` started
    if getattr(server, "_forkserver_pid", None) is None:
        return
    os.kill(server._forkserver_pid, signal.SIGKILL)
    server._stop()  # reaps it and removes its socket file
