"""One worker process: read the resolved config, join the process group, train.

Started by torch.distributed.elastic (see launch.py), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT, and TORCHELASTIC_RESTART_COUNT after a restart; ptrun's agent adds how often the machine's
workers started before in this launch. After a restart or an earlier start the workers resume automatically.

The run has started once the trainer is built (data read, checkpoint resumed, layout placed): only then
does rank 0 write `config.yaml` and `train.log` into the run directory, so a start that fails on bad input
leaves an existing run directory exactly as it was.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import signal
import tempfile
import threading
import traceback
from datetime import timedelta
from logging.handlers import MemoryHandler
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.config import load_resolved
from ptrun.config.launcher import DeviceConfig, worker_threads
from ptrun.costs.from_config import costs_from_config
from ptrun.errors import ConfigError
from ptrun.launcher.lifeline import end_with_launcher
from ptrun.layout.fill import fit_memory
from ptrun.train import machine_faults, run_end
from ptrun.train.class_names import write_class_names
from ptrun.train.run_end import Diverged, ExitCode, Interrupted, OutOfSpace
from ptrun.train.stop import StopRequests

ENV_AT_IMPORT = dict(os.environ)
"""The environment this module was imported in: a spawned worker's before elastic added its variables, or
the forkserver's, which its children inherit, whatever the launcher's environment is now."""


def pick_device(backend: str) -> tuple[torch.device, str]:
    """One GPU per worker (from LOCAL_RANK) with nccl when CUDA is there; the CPU with gloo otherwise."""
    if backend in ("auto", "nccl") and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def use_gpu_switches(switches: DeviceConfig, device: torch.device) -> None:
    """`device.tf32` and `device.cudnn_benchmark` (`switches`, the config's `device`) for this process's kernels
    on a GPU: torch's default is full-precision float32 matmuls, several times slower on tensor-core GPUs than
    the TF32 a user's own loop usually turns on. Nothing on the CPU, where neither switch means anything."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = switches.tf32
    torch.backends.cudnn.benchmark = switches.cudnn_benchmark


def adopt_environment(launcher_env: dict[str, str]) -> None:
    """This worker's environment becomes the launcher's at launch time plus what elastic set for it (RANK,
    MASTER_ADDR, ...: whatever differs from the environment at import)."""
    from_elastic = {k: v for k, v in os.environ.items() if ENV_AT_IMPORT.get(k) != v}
    os.environ.clear()
    os.environ.update(launcher_env)
    os.environ.update(from_elastic)


def no_named_semaphores() -> None:
    """tqdm's bars (`datasets` draws them) lock with a thread lock in a worker: tqdm's default adds a
    multiprocessing lock, a named semaphore in /dev/shm that a killed worker would leave to the resource tracker
    (which warns about it on the terminal). A worker's bars are its own: no other process shares them."""
    try:
        from tqdm import tqdm  # inner import: optional library
    except ImportError:  # no library of the run draws bars
        return
    tqdm.set_lock(threading.RLock())


def run_worker(config_path: str, errors: str, launcher_env: dict[str, str], group_start: int = 0) -> dict:
    """Returns rank 0's final eval. `group_start` counts the earlier starts of this machine's workers in this
    launch (ptrun's agent passes it): after any of them, as after a restart, the workers resume.
    On Ctrl-C or SIGTERM the workers stop at a step they agree on, write a checkpoint there and exit with
    128 + the signal's number, as a shell reports a process the signal ended.
    When training diverges they stop at a step they agree on without a checkpoint, report it in `errors` and
    exit with `ExitCode.FAILED` (`ptrun.train.run_end` holds every way a run ends)."""
    end_with_launcher()  # first: a launcher killed meanwhile leaves no worker behind
    adopt_environment(launcher_env)
    no_named_semaphores()
    from ptrun.train.epoch_stats import StartClock  # inner import: spawned process

    start_clock = StartClock()
    stops = StopRequests()
    # First: a signal during the start is kept for the first step boundary. The handlers are back when the run
    # ends (a worker ends with it; a program that calls this in its own process goes on).
    with stops.installed():
        return _run_worker(config_path, errors, group_start, stops, start_clock)


def _run_worker(config_path: str, errors: str, group_start: int, stops, start_clock) -> dict:
    """`run_worker`'s run, with Ctrl-C and SIGTERM recorded by `stops` (a `ptrun.train.stop.StopRequests`)."""
    cfg = load_resolved(config_path)
    device, rank, world = join_job(cfg)
    start_clock.lap("process_group")
    stops.connect()

    # inner import: spawned process
    from ptrun.train.run_output import setup_logging
    from ptrun.train.trainer import Trainer

    log_file = Path(cfg.run_dir) / "train.log"
    log_existed = log_file.exists()
    setup_logging(cfg.run_dir, rank)
    held = _hold_file_log(log_file, log_existed) if rank == 0 else None
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 or group_start > 0
    resume = agree_to_resume(cfg.train.resume or restarted, device)
    trainer, stopped = None, 0
    try:
        trainer = Trainer(
            cfg,
            rank,
            world,
            device,
            resume=resume,
            stops=stops,
            start_clock=start_clock,
            unit_memory=planner_memory(cfg),
        )
        if rank == 0:
            _publish(Path(config_path), Path(cfg.run_dir) / "config.yaml")
            write_class_names(trainer.data.class_names, cfg.run_dir)
        if held is not None:
            _release_file_log(held)
        return trainer.fit()
    except Interrupted as e:
        trainer.stopped({"signal": signal.Signals(e.signum).name})
        stopped = run_end.stop_code(e.signum)
    except Diverged as e:
        # Every worker stops here, at the step they agreed on: the launcher prints one line from the report
        # (where, and the command that resumes from the newest checkpoint) and restarts nothing.
        report = stops.divergence.report(e.global_step)
        run_end.write_report(errors, "diverged", rank, report)
        with contextlib.suppress(Diverged):
            stops.settle()  # a stop all-reduce the step had started
        trainer.stopped({"diverged": report})
        stopped = ExitCode.FAILED
    except OutOfSpace as e:
        # Every worker stops here, at the step they agreed on (the partial checkpoint removed): the launcher
        # prints one line from the report and restarts nothing; a full disk stays full.
        run_end.write_report(errors, "fault", rank, e.report())
        with contextlib.suppress(Diverged, OutOfSpace):
            stops.settle()
        if trainer is not None:
            trainer.stopped({"no_space": e.what})
        stopped = ExitCode.FAILED
    except torch.OutOfMemoryError as e:
        # In the middle of a step or a transition: no collective can follow (the peers wait in another), so
        # the report is written and the worker ends; the peers' collectives fail on the lost connection.
        where = oom_place(e)
        plan = trainer.plan if trainer is not None and trainer.in_use.engine is not None else None
        run_end.write_report(errors, "fault", rank, machine_faults.memory_report(e, device, where, plan))
        stopped = ExitCode.FAILED
    except ConfigError as e:
        # A user-facing problem found only in a worker (a checkpoint of another model, a broken dataset file):
        # its one line goes to the launcher, which prints it once, and the exit code tells it not to restart.
        if held is not None:
            held.setTarget(None)  # a start that failed logs nothing (logging.shutdown would flush the records)
        run_end.write_report(errors, "bad_input", rank, str(e))
        raise SystemExit(ExitCode.BAD_INPUT) from None
    except Exception as e:
        # A failure before this attempt's first step is done that a restart would repeat (the launcher's agent
        # restarts nothing if every worker reports the same one): reported for the launcher's one line.
        if (trainer is not None and trainer.has_trained) or transient(e):
            raise
        report_start_failure(errors, rank, e)
        raise SystemExit(ExitCode.FAILED) from None
    finally:
        if trainer is not None:
            trainer.close()
        dist.destroy_process_group()
        remove_temporary_directories()
    # Reached only after a stop: fit() returns above. Not a return value after a signal either: the elastic agent
    # that sent it is shutting down and reads none (a worker that returned would wait for it until killed), it
    # waits for the workers to exit. Where the signal reached the workers alone, the agent takes the exit for a
    # failure and restarts the job, which resumes from the checkpoint just written.
    raise SystemExit(stopped)


def planner_memory(cfg):
    """The planner's per-unit memory for the run's model (`ptrun.layout.fill.fit_memory`), which the trainer
    checks a layout change against; None for a model the planner cannot size."""
    try:
        return fit_memory(costs_from_config(cfg.model, cfg.data), cfg)
    except Exception:  # the planner's stand-in does not know every model: no check then
        return None


def oom_place(error: BaseException) -> str:
    """Where an out-of-memory error arose, from its traceback: the cache, a transition, or a step."""
    frames = traceback.extract_tb(error.__traceback__)
    if any(Path(f.filename).name in ("autocache.py", "cache_store.py") for f in frames):
        return "cache"
    if any(f.name in ("_move_to", "switch_to") for f in frames):
        return "transition"
    return "evaluation" if any(f.name == "evaluate" for f in frames) else "step"


def remove_temporary_directories() -> None:
    """Remove the temporary directories this process's libraries made (wandb makes two on import, for media and
    artifacts): a normal interpreter exit would, but a worker ends the way multiprocessing ends its children,
    without the exit handlers that remove them. Called as the worker ends (about 0.1 s with torch loaded)."""
    for obj in gc.get_objects():
        if type(obj) is tempfile.TemporaryDirectory:  # not isinstance: some objects warn when asked their class
            obj.cleanup()


def join_job(cfg, timeout: timedelta = timedelta(minutes=10)) -> tuple[torch.device, int, int]:
    """This process's part of the job: its threads, its device and the job's process group; returns the
    device, the rank and the world size."""
    # elastic_launch, unlike torchrun, does not set OMP_NUM_THREADS: one intra-op thread per emulated device.
    torch.set_num_threads(worker_threads(cfg.launcher.threads_per_worker, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    # Late in training, tiny gradients and optimizer moments become denormal floats, which run tens of
    # times slower on x86 CPUs; flushing them to zero costs nothing in accuracy.
    torch.set_flush_denormal(True)
    device, backend = pick_device(cfg.launcher.backend)
    use_gpu_switches(cfg.device, device)
    dist.init_process_group(backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    return device, dist.get_rank(), dist.get_world_size()


def agree_to_resume(mine: bool, device: torch.device) -> bool:
    """Collective: whether the job resumes, the same on every worker: when any of them would. A machine that
    joins a running job starts its workers afresh, while the machines already there restart theirs; all of them
    must then continue from the newest checkpoint, or they would train different states in one job."""
    flag = torch.tensor([int(mine)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def transient(error: BaseException) -> bool:
    """A failure a restart may cure: the network or a peer (a lost machine, a killed worker's partners),
    a file system, a timeout; anything else at start-up is the same on the next attempt."""
    return isinstance(error, (OSError, TimeoutError, dist.DistError))


def report_start_failure(errors: str, rank: int, error: BaseException) -> None:
    """Write `error` for the launcher: one line (its type, message and the innermost frame that raised it)
    and the traceback, which the agent logs if it restarts after all."""
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" ({Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame else ""
    message = " ".join(str(error).split())
    line = f"{type(error).__name__}: {message}{where}" if message else f"{type(error).__name__}{where}"
    run_end.write_report(errors, "start", rank, {"line": line, "traceback": "".join(traceback.format_exception(error))})


def _publish(config_path: Path, target: Path) -> None:
    """The resolved config the launcher wrote becomes the run directory's `config.yaml` (atomically)."""
    if config_path.resolve() != target.resolve():
        tmp = target.with_name(".config.yaml.tmp")
        shutil.copyfile(config_path, tmp)
        os.replace(tmp, target)


def _hold_file_log(path: Path, existed: bool) -> MemoryHandler | None:
    """Keep rank 0's records for `path` (train.log, which `setup_logging` opened) in memory until the run
    has started; the file is removed again if opening it created it."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, logging.FileHandler)), None)
    if handler is None:
        return None
    handler.close()  # reopened (appending) by its first record, after the start
    if not existed:
        path.unlink(missing_ok=True)
    held = MemoryHandler(capacity=1 << 20, flushLevel=logging.CRITICAL + 1, target=handler, flushOnClose=False)
    root.removeHandler(handler)
    root.addHandler(held)
    return held


def _release_file_log(held: MemoryHandler) -> None:
    """The run has started: write the held records and log to the file directly from now on."""
    root = logging.getLogger()
    Path(held.target.baseFilename).touch()  # a started run has its log, even before the first record
    held.flush()
    root.removeHandler(held)
    root.addHandler(held.target)
