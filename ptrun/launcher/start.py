"""`ptrun train`'s one pass from the command line to the workers' config: `finished_config` composes, resolves and
checks it, in order, for this machine or for a job of several machines (SLURM's, or `launcher.nnodes` above 1),
and returns the config the workers read, or raises ConfigError, one line naming the key or file, at the first
problem. The run directory is not made before the last check has passed: the command makes it after this."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ptrun.compose import for_launch, for_this_machine, resolve, settle
from ptrun.config import ConfigError, PtrunConfig
from ptrun.config.adapter import adapter_settings
from ptrun.config.launcher import visible_gpus
from ptrun.config.paper import quick_try
from ptrun.launcher.worker_server import start_worker_server
from ptrun.train.class_names import check_resumed_classes


def finished_config(overrides: list[str], env: Mapping[str, str], job: PtrunConfig | None = None) -> PtrunConfig:
    """The config `ptrun train OVERRIDES` starts its workers on, with `run_dir` made absolute; every step in
    the order it runs:

    1. composed and resolved (`ptrun.compose.resolve`: Hydra's composition, SLURM's layout from `env`, hub ids
       made local, validated, the defaults that follow other keys filled), or `job` resolved (`settle`: what
       Hydra composed for one job of a `-m` sweep);
    2. made for this machine (`for_this_machine`: the machines, the GPUs, the compiler and the tracker checked,
       its `auto` worker and thread counts filled);
    3. the run directory: one the start can make (`check_run_dir_path`), its checkpoints against
       `train.resume` (`check_run_dir`), after SLURM's layout is said in one line;
    4. the quick try a paper recipe on a CPU gets, said in one line; the workers' server started, which imports
       their modules while the steps below read files (a refused start ends it with the command: no worker has
       started); an `hf` source's columns and labels, and a resume's classes, read before any worker starts;
    5. the rendezvous endpoint (the first step to import torch);
    6. the layout's `auto` values made numbers on this machine's devices (`ptrun.compose.for_launch`), and the
       length chosen said in one line.

    On several machines the workers check the layout against the world the rendezvous counts
    (`ptrun.compose.for_world`), the one value a launch cannot know."""
    resolved = resolve(overrides, env) if job is None else settle(job, overrides, env)
    cfg = for_this_machine(resolved).cfg
    check_run_dir_path(cfg.run_dir)
    cfg = replace(cfg, run_dir=str(Path(cfg.run_dir).resolve()))
    if resolved.slurm_note is not None:
        print(resolved.slurm_note, flush=True)
    check_run_dir(Path(cfg.run_dir), cfg.train.resume, adapter_settings(cfg.adapter))
    hint = quick_try(cfg, visible_gpus(cfg.launcher))
    if hint:
        print(hint, file=sys.stderr, flush=True)
    start_worker_server(cfg)
    if cfg.data.name == "hf":  # its columns and labels, read before any worker starts
        from ptrun.data.hf_source import check_hf_source  # inner import: start-up

        class_names = check_hf_source(cfg.data, cfg.model.task)
        if cfg.train.resume:
            check_resumed_classes(class_names, cfg.run_dir)
    from ptrun.launcher.rendezvous import check_rendezvous  # inner import: start-up

    check_rendezvous(cfg.launcher)
    # The layout's `auto` values made numbers, for the workers and config.yaml (torch is imported by now).
    cfg, choice = for_launch(cfg)
    if choice is not None:
        print(choice.summary(), flush=True)
    return cfg


def check_run_dir_path(path: str) -> None:
    """The start creates the run directory and its missing parents: the nearest of them that exists must be a
    directory we may write into (making it would otherwise fail with a traceback). Permission bits do not tell
    (root passes them, and /proc or a read-only mount refuse anyway), so a directory of a name of its own is made
    where the first missing one would go, and removed again: a probe that leaves nothing behind and never
    touches the run directory itself, which the agent of another machine sharing it may be making now."""
    target = Path(path).expanduser()
    chain = (target, *target.parents)
    nearest = next(p for p in chain if p.exists())  # "/" or "." at the latest
    problem = f"{nearest} is a file" if not nearest.is_dir() else None
    if problem is None and not os.access(nearest, os.W_OK | os.X_OK):
        problem = f"{nearest} is not writable"
    if problem is None and nearest != target:
        first_missing = chain[chain.index(nearest) - 1]
        try:
            os.rmdir(tempfile.mkdtemp(prefix=f".{first_missing.name}.probe-", dir=nearest))
        except OSError as e:
            problem = f"{first_missing} cannot be created: {e.strerror}"
    if problem is not None:
        raise ConfigError(f"hydra.run.dir={path!r} is not allowed: a directory to create or write into ({problem})")


def check_run_dir(run_dir: Path, resume: bool, adapter: dict | None = None) -> None:
    """Never start over an existing run by accident, and never resume from nothing or from broken checkpoints
    alone."""
    from ptrun.train.checkpoint import lookup  # inner import: start-up

    existing = lookup.list_checkpoints(run_dir)
    if existing and not resume:
        raise ConfigError(
            f"run directory {run_dir} already holds a run; continue it with train.resume=true "
            f"or choose another hydra.run.dir"
        )
    # An explicit resume needs something to resume (a restart after a failure, by contrast, may find no
    # checkpoint yet and starts over: the worker decides that).
    if resume and not existing:
        raise ConfigError(
            f"train.resume=true: {run_dir} holds no checkpoint to resume from; leave train.resume "
            f"off to start a new run, or set hydra.run.dir to the run to continue"
        )
    if resume and all(lookup.verify(c) is not None for c in existing):
        raise ConfigError(
            f"train.resume=true: no valid checkpoint to resume from: {lookup.verify(existing[-1])}; "
            f"restore it, or start a new run in another hydra.run.dir"
        )
    newest = lookup.latest_valid(run_dir) if resume else None
    problem = lookup.adapter_problem(newest, adapter or {"name": "none"}) if newest is not None else None
    if problem is not None:
        raise ConfigError(problem)
