"""Real worker processes (gloo, elastic_launch on localhost) against a plain single-process reference."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from conftest import compose_config, final_params, run_events, run_workers, start_ptrun, worker_pids

from ptrun.data import EpochSampler, build_datasets
from ptrun.models import build_model
from ptrun.numerics.optim import build_optimizer, set_lr

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers


def reference_params(
    cfg, freeze_blocks: list[int] | None = None, interval_steps: int | None = None
) -> dict[str, torch.Tensor]:
    """Train in one process with a textbook loop: whole global batch, mean loss over the real samples,
    global-norm clip, the optimizer. With `freeze_blocks` (frozen block count per interval of
    `interval_steps` steps, an epoch by default), the embedding and that many blocks stop training at the
    interval's first step and leave the optimizer, which keeps the others' state. Shares no code with the
    pipeline engine."""
    data = build_datasets(cfg.data)
    torch.manual_seed(cfg.train.seed)
    layered = build_model(cfg.model, num_classes=data.num_classes, img_size=data.image_size, in_chans=data.in_chans)
    model = layered.model
    name_of = {id(p): n for n, p in model.named_parameters()}
    opt = build_optimizer(list(model.named_parameters()), cfg.optim)
    sampler = EpochSampler(len(data.train), cfg.train.global_batch_size, cfg.train.seed)
    steps_per_epoch = min(sampler.steps_per_epoch, cfg.train.max_steps_per_epoch or 10**9)
    total = cfg.train.epochs * steps_per_epoch
    interval_steps = interval_steps or steps_per_epoch
    for step in range(total):
        epoch, s = divmod(step, steps_per_epoch)
        blocks = freeze_blocks[min(step // interval_steps, len(freeze_blocks) - 1)] if freeze_blocks else 0
        if blocks and step % interval_steps == 0:
            frozen = {id(p) for u in layered.units[: 1 + 2 * blocks] for p in u.parameters()}
            for p in model.parameters():
                p.requires_grad_(id(p) not in frozen)
            state = {name_of[id(p)]: st for p, st in opt.state.items()}
            opt = build_optimizer([(n, p) for n, p in model.named_parameters() if p.requires_grad], cfg.optim)
            for group in opt.param_groups:
                for p in group["params"]:
                    opt.state[p] = state[name_of[id(p)]]
        idx, w = sampler.global_batch(epoch, s)
        batch = data.train[idx]
        set_lr(opt, step, total, cfg.optim)
        out = model(batch["pixel_values"])
        loss = (F.cross_entropy(out, batch["labels"], reduction="none") * w).sum() / w.sum()
        loss.backward()
        if cfg.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach() for n, p in model.named_parameters()}


def assert_params_close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=4e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("optim", ["adamw", "sgd"])
def test_two_workers_match_one_process(tmp_path, tiny, optim):
    """DP = 2 over real processes gives the parameters of a single-process run on the same global batch,
    across an epoch boundary (new permutation) and a padded last batch (1437 train samples, batch 16)."""
    overrides = tiny + [
        f"optim={optim}",
        "train.epochs=2",
        "train.max_steps_per_epoch=4",
        "train.grad_clip=0.5",
        "launcher.nproc_per_node=2",
    ]
    run_workers(overrides, tmp_path / "dp2")
    cfg = compose_config(overrides, tmp_path / "ref")
    assert_params_close(final_params(tmp_path / "dp2"), reference_params(cfg))


def test_padded_last_batch_matches_reference(tmp_path, tiny):
    """A full epoch ends in a batch padded with weight-0 samples; the result still equals the reference."""
    overrides = tiny + [
        "train.epochs=1",
        "train.global_batch_size=256",
        "launcher.nproc_per_node=2",
        "data.eval_fraction=0.5",
    ]  # 898 train samples: 3 full batches + 130 real in the last
    run_workers(overrides, tmp_path / "dp2")
    cfg = compose_config(overrides, tmp_path / "ref")
    epoch = run_events(tmp_path / "dp2", "epoch")[0]
    assert epoch["samples"] == 898 and epoch["steps"] == 4
    assert 0 <= epoch["eval"]["top1"] <= 100
    assert_params_close(final_params(tmp_path / "dp2"), reference_params(cfg))


def test_killed_worker_restarts_and_resumes(tmp_path, tiny):
    """SIGKILL one worker after the first checkpoint: the elastic agent restarts the group, the workers
    resume from the checkpoint, and the final parameters equal an uninterrupted run's."""
    overrides = tiny + [
        "train.epochs=4",
        "train.max_steps_per_epoch=30",
        "launcher.nproc_per_node=2",
        "launcher.max_restarts=2",
    ]
    run_dir = tmp_path / "killed"
    proc = start_ptrun(
        "train", *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 240
    killed = None
    while time.time() < deadline and proc.poll() is None:
        if (run_dir / "checkpoints").is_dir() and any(
            p.name.startswith("step_") for p in (run_dir / "checkpoints").iterdir()
        ):
            workers = worker_pids(proc.pid)
            if workers:
                killed = workers[-1]
                os.kill(killed, signal.SIGKILL)
                break
        time.sleep(0.05)
    assert killed is not None, "never saw a checkpoint and a worker to kill"
    proc.wait(timeout=240)
    reader.join(timeout=5)
    assert proc.returncode == 0, "".join(output)[-3000:]
    starts = run_events(run_dir, "start")
    assert len(starts) == 2 and starts[1]["resumed_from"], starts

    run_workers(overrides, tmp_path / "clean")
    assert_params_close(final_params(run_dir), final_params(tmp_path / "clean"))


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_two_stage_pipeline_matches_one_process(tmp_path, tiny, schedule):
    """K = 2 stages on 2 real processes, M = 4 micro-batches: the same parameters as the plain reference."""
    overrides = tiny + [
        "train.epochs=1",
        "train.max_steps_per_epoch=4",
        "train.grad_clip=0.5",
        "launcher.nproc_per_node=2",
        "pipe.length=2",
        "pipe.microbatches=4",
        f"pipe.schedule={schedule}",
    ]
    run_workers(overrides, tmp_path / "pp2")
    cfg = compose_config(overrides, tmp_path / "ref")
    assert_params_close(final_params(tmp_path / "pp2"), reference_params(cfg))


def test_pipeline_times_data_parallel_on_four_workers(tmp_path, tiny):
    """K = 2 stages x DP = 2 replicas (4 real processes): the same parameters as the plain reference."""
    overrides = tiny + [
        "train.epochs=1",
        "train.max_steps_per_epoch=3",
        "train.grad_clip=0.5",
        "launcher.nproc_per_node=4",
        "pipe.length=2",
        "pipe.microbatches=2",
        "pipe.schedule=1F1B",
    ]
    run_workers(overrides, tmp_path / "pp2dp2")
    cfg = compose_config(overrides, tmp_path / "ref")
    assert_params_close(final_params(tmp_path / "pp2dp2"), reference_params(cfg))
