"""Shared fixtures and helpers: compose configs with Hydra's compose API, run real workers through
elastic_launch, run the `ptrun` command line (in a subprocess, or in this process through the same entry
point), and read a run's events back through `ptrun.report.runs`.

Tiers: `pytest -m "not slow"` is the inner loop (at most 5 minutes on 2 cores); `slow` marks set-up, the
wheel's install, soak and multi-node tests, every test that launches workers, and any other that takes seconds (a
subprocess that imports torch, a real measurement), which `bash scripts/test.sh` (all tests) runs too."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ptrun.launcher import leftovers
from ptrun.launcher.worker_server import user_cache_dir

# As `ptrun train` does, before anything imports torch._dynamo (its default cache is /tmp/torchinductor_USER).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_cache_dir() / "torchinductor"))
# The tests never reach the Hugging Face hub: a hub id resolves from a cache a test lays out, or is refused.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from benchmarks.processes import worker_pids  # noqa: E402,F401  (the tests import it from here)
from ptrun.compose import compose, for_launch
from ptrun.config import PtrunConfig

REPO = Path(__file__).resolve().parents[1]


TINY_MODEL = ["model.embed_dim=32", "model.depth=2", "model.num_heads=2"]
"""The tests' model size, whichever recipe's model: 2 blocks of width 32, 2 heads."""

# A tiny model and short epochs: multi-process tests pay ~6 s of start-up each, keep the rest small.
TINY = [
    *TINY_MODEL,
    "train.global_batch_size=16",
    "launcher.max_restarts=0",
    "checkpoint.keep=5",
    "freeze.policy=none",
    "pipe.length=1",
    "pipe.microbatches=1",
    "pipe.schedule=GPipe",
]


# The tests train the small digits ViT (the keys of TINY are its) unless they name a recipe: it is the fastest
# model, and the embedded default (a BERT fine-tune) would make every test a minute long.
TEST_RECIPE = "recipe=digits_vit"


def with_test_recipe(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """`overrides`, choosing TEST_RECIPE (last: a command line's flags come before its overrides) where they
    name no recipe."""
    named = any(o.startswith("recipe=") for o in overrides)
    return list(overrides) if named else [*overrides, TEST_RECIPE]


def compose_config(overrides: list[str], run_dir: Path) -> PtrunConfig:
    """The config `ptrun train` would launch: composed, its layout's `auto` values filled as the launcher fills
    them."""
    return for_launch(compose(with_test_recipe(overrides), run_dir=run_dir, recipe="test"))[0]


def write_config(cfg: PtrunConfig) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    return path


def run_workers(overrides: list[str], run_dir: Path) -> dict:
    """Launch real worker processes (gloo on localhost) through ptrun's own elastic launcher. A signal that
    stopped the launch (Ctrl-C or SIGTERM to the test session) goes on to the handler the session has for it,
    which the launch restored: Ctrl-C's KeyboardInterrupt ends the session, SIGTERM's default the process."""
    from ptrun.launcher.launch import launch
    from ptrun.train.run_end import Interrupted

    cfg = compose_config(overrides, run_dir)
    try:
        return launch(cfg, write_config(cfg))
    except Interrupted as e:
        signal.raise_signal(e.signum)
        raise


def run_killed(overrides: list[str], run_dir: Path, kills: list[dict], monkeypatch) -> dict:
    """`run_workers` with ptrun's fault hook killing workers as `kills` says (`PTRUN_KILL_AT`: each a rank, a
    point, a step), for this launch only."""
    monkeypatch.setenv("PTRUN_KILL_AT", json.dumps(kills))
    try:
        return run_workers(overrides, run_dir)
    finally:
        monkeypatch.delenv("PTRUN_KILL_AT")


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    from ptrun.train.checkpoint import lookup, store

    ckpt = lookup.latest_valid(run_dir)
    assert ckpt is not None, f"no checkpoint in {run_dir}"
    return store.load(ckpt)[0]


@pytest.fixture
def tiny() -> list[str]:
    return list(TINY)


LITTER = ("torchelastic_*", "ptrun-*", "torchinductor_*", "pytorch-errorfile-*")
"""What launches have left in the temp directory and /dev/shm (elastic's logs, ptrun's private files, the
AutoCache memory tier, torch's compile cache, the exceptions of workers that failed): a test session must
leave none of it, nor a named semaphore in /dev/shm that nobody holds (`SemaphoreWatch`)."""


def _litter() -> set[Path]:
    roots = [Path(tempfile.gettempdir()), Path("/dev/shm")]
    found = {path for root in roots if root.is_dir() for pattern in LITTER for path in root.glob(pattern)}
    return {path for path in found if not held_by_another_live_run(path)}


def held_by_another_live_run(path: Path) -> bool:
    """Whether `path` is the AutoCache memory tier of a run that still runs, launched by another process than
    this one: a `ptrun train` beside the test session (the session's own have ended when it looks)."""
    try:
        owner = json.loads((path / leftovers.OWNER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(owner, dict) and owner.get("pid") != os.getpid() and not leftovers.owner_gone(owner)


def semaphores() -> dict[int, Path]:
    """This user's POSIX named semaphores (/dev/shm/sem.*, multiprocessing's among them), by inode."""
    out = {}
    for path in Path("/dev/shm").glob("sem.*"):
        with contextlib.suppress(FileNotFoundError):
            info = path.stat()
            if info.st_uid == os.getuid():
                out[info.st_ino] = path
    return out


def mapped_shm_inodes(pids=None) -> set[int]:
    """The inodes of /dev/shm files that the processes `pids` (default: every process) have mapped: a process
    that opened a named semaphore maps it until it closes it or ends."""
    inodes = set()
    for pid in pids if pids is not None else (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()):
        with contextlib.suppress(OSError):  # ended meanwhile, or another user's
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                    inodes.add(int(fields[4]))
    return inodes


def _parents() -> dict[int, int]:
    """pid -> parent pid, of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):  # ended while being read
                out[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return out


class SemaphoreWatch:
    """Which named semaphores the processes of this test session held: this process and those it started (and
    theirs), looked at every `period` seconds in a thread. Other processes on the machine (another test
    session) create and remove semaphores all the time; only this session's count. Each semaphore is kept
    with the branches it was held in: the child of this process that the holder descends from (this
    process's own pid for itself)."""

    def __init__(self, period: float = 1.0):
        self._held_by: dict[int, set[int]] = {}  # inode -> branches
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._done.wait(period):
            self.look()

    def look(self) -> None:
        me, parents = os.getpid(), _parents()
        branch_of: dict[int, int | None] = {me: me}

        def branch(pid: int) -> int | None:
            chain = []
            while pid not in branch_of and pid in parents and pid > 1:
                chain.append(pid)
                if parents[pid] == me:
                    branch_of[pid] = pid
                    break
                pid = parents[pid]
            found = branch_of.get(pid)
            for step in chain:
                branch_of[step] = found
            return found

        for pid in parents:
            if (top := branch(pid)) is not None:
                for inode in mapped_shm_inodes([pid]):
                    with self._lock:
                        self._held_by.setdefault(inode, set()).add(top)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def leaked(self, before: set[Path], branches: set[int] | None = None) -> set[Path]:
        """The semaphores not in `before` that no process holds now, though processes of this session held them
        (of `branches` only, if given): their holders ended without unlinking them (SIGKILLed, with no
        resource tracker left to do it), so they stay until the machine reboots."""
        held = mapped_shm_inodes()
        with self._lock:
            ours = {inode for inode, seen in self._held_by.items() if branches is None or seen & branches}
        return {
            path for inode, path in semaphores().items() if inode in ours and inode not in held and path not in before
        }


def _wind_down_multiprocessing() -> None:
    """What the interpreter's exit does for multiprocessing, done now: the finalizers unlink the semaphores of
    this process's own queues (the in-process launches' agents), then the forkserver (the launches' workers
    were forked from it) and the resource tracker stop; the tracker unlinks what killed workers left to it.
    What it cleans up is not a leak. Private to multiprocessing, but what its own tests use."""
    import gc
    from multiprocessing import forkserver, resource_tracker, util

    gc.collect()
    util._run_finalizers(0)
    forkserver._forkserver._stop()
    resource_tracker._resource_tracker._stop()


_WATCH: SemaphoreWatch | None = None


def process_watch() -> SemaphoreWatch:
    """This process's one `SemaphoreWatch`, started on first use: the session's checks and the tests share it."""
    global _WATCH
    if _WATCH is None:
        _WATCH = SemaphoreWatch()
    return _WATCH


@pytest.fixture(scope="session")
def semaphore_watch() -> SemaphoreWatch:
    """The `SemaphoreWatch` of this test process (with pytest-xdist: of this worker and what it starts)."""
    return process_watch()


@pytest.fixture(scope="session", autouse=True)
def kept_compile_costs(tmp_path_factory):
    """The session's own kept compile measurements (`ptrun.compiling.kept_costs`), which every `ptrun` it
    starts inherits: what one test's run measured never decides another's `train.compile=auto`, nor the
    user's runs."""
    os.environ.setdefault("PTRUN_COMPILE_COSTS_DIR", str(tmp_path_factory.mktemp("compile_costs")))
    return os.environ["PTRUN_COMPILE_COSTS_DIR"]


WATCHED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, name)
)
"""The signals whose handlers a test must leave as it found them: Ctrl-C and SIGTERM must stop the test session
after any test (torch elastic's agent takes over all four while it runs)."""


def handler_name(handler) -> str:
    """A signal handler as a person reads it: its module and name, or SIG_DFL / SIG_IGN."""
    if isinstance(handler, signal.Handlers):
        return handler.name
    name = getattr(handler, "__qualname__", None)
    return f"{getattr(handler, '__module__', None) or ''}.{name}".lstrip(".") if name else repr(handler)


@pytest.fixture(autouse=True)
def signal_handlers_kept():
    """Fails the test that leaves a handler of `WATCHED_SIGNALS` other than it found (then puts it back, so that
    the next tests, and Ctrl-C, are not affected)."""
    found = {signum: signal.getsignal(signum) for signum in WATCHED_SIGNALS}
    yield
    left = {signum: (signal.getsignal(signum), handler) for signum, handler in found.items()}
    changed = {signum: pair for signum, pair in left.items() if pair[0] is not pair[1]}
    for signum, (_, handler) in changed.items():
        if handler is not None:  # None: not installed from Python, cannot be set again
            signal.signal(signum, handler)
    if changed:
        pytest.fail(
            "the test left signal handlers changed: "
            + ", ".join(f"{s.name} {handler_name(now)} (was {handler_name(was)})" for s, (now, was) in changed.items())
        )


def runs_tests_itself(config) -> bool:
    """Whether this pytest process runs the tests and no pytest-xdist worker does: a session without xdist. A
    worker (`workerinput`) runs some of them; the controller of workers, none."""
    return not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None) in (None, 0)


def process_tree(root: int) -> set[int]:
    """`root` and every process descended from it, from /proc."""
    parents, tree = _parents(), {root}
    grown = True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= children
        grown = bool(children)
    return tree


SESSION_BEFORE = pytest.StashKey[tuple[set[Path], set[Path]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """The whole test session's litter check starts in the process that sees it whole: pytest's own without
    pytest-xdist, the controller with it (each worker sees only its share, and the other workers' files as they
    run)."""
    if hasattr(session.config, "workerinput"):
        return
    process_watch()
    session.config.stash[SESSION_BEFORE] = (_litter(), set(semaphores().values()))


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which ends the workers
def pytest_sessionfinish(session, exitstatus):
    """The session fails if it left a file of `LITTER`, or a named semaphore nobody holds, that was not there when
    it started."""
    before = session.config.stash.get(SESSION_BEFORE, None)
    if before is None or exitstatus == pytest.ExitCode.INTERRUPTED:
        # a worker's share; or Ctrl-C: the session ends at once, without the checks (seconds of reading every
        # process's mappings, on a busy machine); its processes end with it, and multiprocessing's resource
        # tracker then removes the semaphores they registered.
        return
    litter_before, semaphores_before = before
    if runs_tests_itself(session.config):
        stopping = threading.Thread(target=_wind_down_multiprocessing, daemon=True)
        stopping.start()
        stopping.join(60)
    else:
        # the workers have ended; their resource trackers unlink what their killed workers left as they exit
        deadline = time.monotonic() + 60
        while process_tree(os.getpid()) != {os.getpid()} and time.monotonic() < deadline:
            time.sleep(0.1)
    left = sorted(str(p) for p in _litter() - litter_before)
    leaked = sorted(map(str, process_watch().leaked(semaphores_before)))
    problems = [f"the test session left these behind: {left}"] if left else []
    problems += [f"the test session left these semaphores behind: {leaked}"] if leaked else []
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in problems:
            reporter.write_line(f"FAILED (session end): {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    """The test session's process ends next: as `ptrun.cli.main` does, its last garbage collections are spared
    the objects torch and elastic made (seconds on a busy machine, after Ctrl-C too); exit handlers still run."""
    import gc

    gc.freeze()


# ---- trackers that cannot take a run ------------------------------------------------------------------------


def free_port() -> int:
    """A port nothing listens on, on any of this machine's addresses (bound, then released): free for a
    rendezvous store, on localhost or on the hostname, and a connection to it is refused at once."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


closed_port = free_port  # the name of the tests that connect to it, to see the connection refused


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch) -> Path:
    """A machine where nobody ran `wandb login`: no key or mode in the environment; a home directory, .netrc
    and wandb settings directory of the test's own (none of them holding a key). Returns the home directory."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DISABLED", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    return home


# ---- the command line ------------------------------------------------------------------------------------


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `ptrun` or benchmark subprocess: this one's, with this checkout first on PYTHONPATH
    (so the checkout's ptrun and its `benchmarks` run whichever environment and directory pytest runs in), and
    `extra` on top (TMPDIR, say)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def ptrun_command(*args: str) -> list[str]:
    """The command line of `ptrun ARGS`: the console script beside this interpreter (what a user runs), or
    `python -m ptrun.cli` where that interpreter has none."""
    script = Path(sys.executable).parent / "ptrun"
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", "ptrun.cli", *args]


def run_ptrun(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300, **kwargs
) -> subprocess.CompletedProcess:
    """`ptrun ARGS` in a fresh process, to its end: its exit code, stdout and stderr (as text). `env` adds
    to `cli_env()`; other keyword arguments go to subprocess.run (preexec_fn, stdout, ...)."""
    kwargs.setdefault("capture_output", "stdout" not in kwargs and "stderr" not in kwargs)
    return subprocess.run(
        ptrun_command(*command_args(args)), cwd=cwd, env=cli_env(**(env or {})), text=True, timeout=timeout, **kwargs
    )


def start_ptrun(*args: str, cwd: Path, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """`ptrun ARGS` started in a fresh process and left running (to signal or kill it); keyword arguments as
    for subprocess.Popen (stdout, stderr, start_new_session, ...)."""
    return subprocess.Popen(
        ptrun_command(*command_args(args)), cwd=cwd, env=cli_env(**(env or {})), text=True, **kwargs
    )


def command_args(args: tuple[str, ...]) -> list[str]:
    """A `ptrun` command line as the tests run it: `train` on TEST_RECIPE unless it names one."""
    return ["train", *with_test_recipe(args[1:])] if args and args[0] == "train" else list(args)


@dataclass
class CliResult:
    """How an in-process `ptrun.cli.main(argv)` ended: its exit code and what it wrote."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """`cli("train", *overrides, cwd=DIR)`: `ptrun.cli.main` called in this process, as the console script
    calls it, returning a CliResult. Only for starts that end before a worker would start: a launch would
    run elastic's agent inside pytest (a call that gets that far fails). What main changes globally is put
    back after each call: sys.argv, the working directory and the environment (the signal handlers main
    puts back itself: `signal_handlers_kept` checks it). Hydra clears its global instance itself when its
    compose API or its app ends; each call clears it before and after all the same, so one test's failure cannot
    reach the next."""
    from hydra.core.global_hydra import GlobalHydra

    import ptrun.cli
    import ptrun.launcher.launch

    def no_launch(*args, **kwargs):
        raise AssertionError("an in-process `ptrun train` got as far as starting workers")

    monkeypatch.setattr(ptrun.launcher.launch, "launch", no_launch)

    def call(*argv: str, cwd: Path | None = None) -> CliResult:
        GlobalHydra.instance().clear()
        environ, here = dict(os.environ), os.getcwd()
        argv = tuple(command_args(argv))
        monkeypatch.setattr(sys, "argv", ["ptrun", *argv])
        if cwd is not None:
            os.chdir(cwd)
        capsys.readouterr()
        try:
            ptrun.cli.main(list(argv))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            os.chdir(here)
            for key in set(os.environ) - set(environ):
                del os.environ[key]
            os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
            GlobalHydra.instance().clear()
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return call


@pytest.fixture
def one_rank_group(tmp_path):
    """A real one-rank gloo group for a trainer in this process (evaluation is a collective), with one
    intra-op thread as a worker has (two threads on two busy cores make a step ten times slower)."""
    import torch.distributed as dist

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def assert_one_error_line(out: subprocess.CompletedProcess | CliResult, code: int = 2) -> str:
    """The bad-input contract: exit `code`, one stderr line `ptrun: error: ...`, no traceback. Returns it."""
    assert out.returncode == code, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptrun: error: "), out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    return lines[0]


# ---- a run's events --------------------------------------------------------------------------------------


def run_events(run_dir: Path, kind: str | None = None, missing_ok: bool = False) -> list[dict]:
    """The events of `run_dir/metrics.jsonl` in the order written, as `ptrun report` reads them (each one
    checked for the fields the report needs; the torn last line of a run still writing is left out); only
    those of `kind` ("start", "plan", "epoch", ...) if given. With `missing_ok`, [] while there is no file
    yet (for polling a run that is starting)."""
    from ptrun.report.runs import read_events

    path = Path(run_dir) / "metrics.jsonl"
    if missing_ok and not path.exists():
        return []
    events = read_events(Path(run_dir))
    return events if kind is None else [e for e in events if e["event"] == kind]


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    """The tokenizer of the module's own `tokenizer_dir` fixture (each module trains one on its texts)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


# ---- tiny pretrained models and the hub cache ------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A tiny BERT with its tokenizer (`hf_families.save_tiny_bert`): a text recipe can resolve it, files and
    all. Shared: the tests read it, none writes into it."""
    from hf_families import save_tiny_bert

    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty hub cache under a fresh HF_HOME, offline; the cache directory."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # `org/name` is looked for on disk first: here, where it is not
    return tmp_path / "hf" / "hub"


def wordpiece_tokenizer(path, texts: list[str], vocab_size: int) -> str:
    """A tiny BERT WordPiece tokenizer trained offline on `texts` (no EOS token: BERT ends with SEP), saved as
    a Hugging Face directory at `path`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(texts * 3, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    BertTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    return str(path)
