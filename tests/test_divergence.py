"""A diverged run stops: the divergence watch over the global gradient norm, step by step (fp32 read on the host,
fp16's skips, the GPU's late copy read without waiting), the workers' agreement in the stop all-reduce of real
gloo processes, and the launcher's line. The runs that diverge for real are in test_divergence_dist.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ptrun.train.divergence import SKIPS_DIVERGED, DivergenceWatch, StepRecord
from ptrun.train.run_end import Diverged, diverged_line

NAN = torch.tensor(math.nan)
ONE = torch.tensor(1.0)


def record(g: int, epoch: int = 0) -> StepRecord:
    return StepRecord(epoch=epoch, step=g % 10, global_step=g, lr=0.01 * (g + 1))


def test_a_non_finite_norm_read_on_the_host_stops_at_that_step():
    """fp32 on the CPU: finite steps are forgotten; the first non-finite one raises at once, and the report
    names its epoch, step and learning rate."""
    watch = DivergenceWatch()
    for g in range(12):
        watch.observe(ONE, True, fp16=False, synchronous=True, record=record(g, epoch=g // 10))
    assert watch.records == {} and watch.flag == 0  # nothing left to report on
    with pytest.raises(Diverged) as stop:
        watch.observe(torch.tensor(math.inf), True, fp16=False, synchronous=True, record=record(12, epoch=1))
    assert stop.value.global_step == 12 and watch.flag == 13
    assert watch.report(12) == {
        "epoch": 1,
        "step": 2,
        "global_step": 12,
        "lr": 0.13,
        "why": "the training loss is not finite",
    }


def test_an_asynchronous_runtime_leaves_the_stop_to_the_agreement():
    """PipeDream's stages are at different steps: the host's word waits for the all-reduce (`flag`)."""
    watch = DivergenceWatch()
    watch.observe(NAN, True, fp16=False, synchronous=False, record=record(0))
    watch.observe(NAN, True, fp16=False, synchronous=False, record=record(1))
    assert watch.flag == 1  # the first step that diverged, not the latest


def test_fp16_skips_are_not_divergence_until_the_documented_count():
    """Skips with a step between them never add up; SKIPS_DIVERGED in a row stop the run, at the first of them."""
    watch = DivergenceWatch()
    g = 0
    for _ in range(3):  # runs of one short of the count, each ended by a step that went through
        for _ in range(SKIPS_DIVERGED - 1):
            watch.observe(NAN, False, fp16=True, synchronous=True, record=record(g))
            g += 1
        watch.observe(ONE, True, fp16=True, synchronous=True, record=record(g))
        g += 1
    assert watch.flag == 0 and watch.records == {}
    first = g
    for _ in range(SKIPS_DIVERGED - 1):
        watch.observe(NAN, False, fp16=True, synchronous=True, record=record(g))
        g += 1
    with pytest.raises(Diverged) as stop:
        watch.observe(NAN, False, fp16=True, synchronous=True, record=record(g))
    assert stop.value.global_step == first
    assert (
        watch.report(first)["why"] == f"fp16 overflowed {SKIPS_DIVERGED} steps in a row (each skipped, its loss "
        f"scale halved)"
    )


def test_the_device_word_is_read_late_without_waiting_and_now_where_the_host_waits():
    """The GPU's path (run here on CPU tensors): the device keeps the first non-finite step; the host reads the
    copy made at the step before, so it learns a step late and never raises itself; `read_now` (a checkpoint,
    an epoch's end) reads the device at once."""
    watch = DivergenceWatch()
    for g in range(5):
        watch.observe(ONE if g < 3 else NAN, True, fp16=False, synchronous=True, record=record(g), on_host=False)
        assert watch.flag == (4 if g == 4 else 0)
    assert sorted(watch.records) == [3, 4]  # steps 0-2 are known to be finite
    late = DivergenceWatch()
    for g in range(4):
        late.observe(ONE if g < 3 else NAN, True, fp16=False, synchronous=True, record=record(g), on_host=False)
    assert late.flag == 0
    late.read_now()
    assert late.flag == 4 and late.report(3)["step"] == 3


def test_the_line_names_the_step_the_learning_rate_and_the_newest_checkpoint(tmp_path):
    report = {"epoch": 1, "step": 4, "global_step": 14, "lr": 5e5, "why": "the training loss is not finite"}
    overrides = ["recipe=digits_vit", "optim.lr=1e6", f"hydra.run.dir={tmp_path}"]
    line = diverged_line(report, 1e6, tmp_path, overrides)
    assert line.startswith(
        "training diverged in epoch 2, step 5 (global step 15): the training loss is not "
        "finite, at optim.lr=1e+06 (the schedule's 5e+05 there)"
    )
    assert line.endswith(
        "no checkpoint was written before it: start again at a lower learning rate: ptrun train "
        "recipe=digits_vit optim.lr=100000"
    )
    ckpt = tmp_path / "checkpoints" / "step_00000010"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer.json").write_text(json.dumps({"epoch": 1, "step_in_epoch": 0}))
    (ckpt / "manifest.json").write_text(
        json.dumps(
            {
                "files": {
                    "trainer.json": {
                        "bytes": (ckpt / "trainer.json").stat().st_size,
                        "sha256": sha256(ckpt / "trainer.json"),
                    }
                }
            }
        )
    )
    line = diverged_line(report, 1e6, tmp_path, overrides)
    assert line.endswith(
        f"newest good checkpoint {ckpt} (before epoch 2); resume from it at a lower learning rate: "
        f"ptrun train recipe=digits_vit optim.lr=100000 train.resume=true hydra.run.dir={tmp_path}"
    )


def sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- the workers' agreement, in real processes --------------------------------------------------------------


def agree_worker(rank: int, out_dir: Path) -> None:
    """One of two gloo workers: rank 0's device sees step 3 diverge, rank 1's host never does (as if its copy
    had not arrived); both poll at every step boundary as the trainer does, then the same with a checkpoint's
    blocking agreement right after the step. Writes where each rank stopped."""
    from ptrun.train.stop import StopRequests

    stopped = {}
    for case in ("poll", "checkpoint"):
        stops = StopRequests()
        try:
            for g in range(10):
                norm = NAN if rank == 0 and g >= 3 else ONE
                stops.divergence.observe(norm, True, False, True, record(g), on_host=False)
                if case == "checkpoint" and g == 3:
                    stops.now()
                stops.poll()
            stopped[case] = None
        except Diverged as e:
            stopped[case] = [e.global_step, g]
        stops.settle()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(stopped))


@pytest.mark.dist
@pytest.mark.slow
def test_the_workers_stop_together_on_what_one_of_them_saw(tmp_path):
    """The word rides in the stop all-reduce: both ranks stop after the same step, on the step that diverged;
    before a checkpoint they agree at once, on the step itself."""
    from helpers import process_group

    process_group.launch(agree_worker, 2, "diverge", tmp_path)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]
    # read at step 4 (the copy made after step 3), shared by the all-reduce started there, read at step 5
    assert results[0]["poll"] == [3, 5]
    assert results[0]["checkpoint"] == [3, 3]
