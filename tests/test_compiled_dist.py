"""Compiled units in real pipelines (2 gloo processes, tests/compiled_cases.py): the schedules that run a
stage's backward pass whole, at K = 2 (1F1B in fp32, bf16, fp16 and with recomputation; GPipe; Interleaved1F1B
with two stages a rank), each with a freeze in place halfway, and PipeDream's asynchronous 1F1B train to the
same losses compiled as eager, the frozen units get no gradient, and the steps after the freeze compile
nothing. One launch covers every case; compiled code is shared through inductor's on-disk cache."""

from __future__ import annotations

import compiled_cases as cc
import pytest
import torch
from helpers.process_group import load_rank

CASES = [
    cc.Case("1F1B", c, precision, recompute)
    for precision, recompute in (("fp32", "none"), ("bf16", "none"), ("fp32", "every:1"))
    for c in (False, True)
]
CASES += [
    cc.Case(schedule, c, precision)
    for schedule, precision in (("GPipe", "fp32"), ("Interleaved1F1B", "fp32"), ("1F1B", "fp16"))
    for c in (False, True)
]
CASES += [cc.Case("pipedream", c, freeze=False) for c in (False, True)]
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-3}
"""Relative loss agreement: fp32 within 1e-4; bf16 and fp16 round where inductor fuses differently from eager."""


@pytest.mark.slow
def test_compiled_pipelines_train_as_eager(tmp_path):
    cc.launch(CASES, tmp_path)
    for case in [c for c in CASES if c.compiled]:
        eager = load_rank(tmp_path, replace_compiled(case).name, 0)
        for rank in (0, 1):
            got = load_rank(tmp_path, case.name, rank)
            assert got["losses"] == pytest.approx(eager["losses"], rel=TOLERANCE[case.precision]), case.name
            assert not got["eager_kinds"], case.name  # every unit kind ran compiled
            if case.freeze:
                assert all(got["frozen_grads"]), case.name  # no frozen parameter ever had a gradient
                assert got["compiles_after_freeze"] == 0, case.name


def replace_compiled(case: cc.Case) -> cc.Case:
    from dataclasses import replace

    return replace(case, compiled=False)


@pytest.mark.slow
def test_checkpoints_cross_between_compiled_and_eager_runs_in_another_layout(tmp_path):
    """A compiled run (two workers, data parallel) resumes eager as a 2-stage 1F1B pipeline, and that one
    compiled again as data parallelism: every epoch ran, the checkpoints hold the library model's names (no
    `_orig_mod.`), each run trained on from the last one's checkpoint, and the export loads with timm
    alone, in a process that never imports ptrun."""
    import subprocess
    import sys

    from conftest import TINY, final_params, run_events, run_workers

    run = tmp_path / "run"
    base = [o for o in TINY if not o.startswith("pipe.")] + ["launcher.nproc_per_node=2", "train.max_steps_per_epoch=4"]
    data_parallel = ["pipe.length=1", "pipe.microbatches=1", "pipe.schedule=GPipe"]
    run_workers([*base, *data_parallel, "train.compile=true", "train.epochs=1"], run)
    first = final_params(run)
    run_workers(
        [
            *base,
            "pipe.length=2",
            "pipe.microbatches=2",
            "pipe.schedule=1F1B",
            "train.compile=false",
            "train.epochs=2",
            "train.resume=true",
        ],
        run,
    )
    second = final_params(run)
    run_workers([*base, *data_parallel, "train.compile=true", "train.epochs=3", "train.resume=true"], run)
    third = final_params(run)
    assert [e["epoch"] for e in run_events(run, "epoch")] == [0, 1, 2]
    assert first.keys() == second.keys() == third.keys() and not any("_orig_mod" in n for n in third)
    assert any(not torch.equal(first[n], second[n]) for n in first)  # each resumed run trained on
    assert any(not torch.equal(second[n], third[n]) for n in first)
    compiled = [e["compile"] for e in run_events(run, "epoch") if "compile" in e]
    assert len(compiled) == 2  # the compiled runs' epochs count what they compiled; the eager one has none
    load = (
        "import json, sys, timm\nfrom safetensors.torch import load_file\n"
        f"cfg = json.load(open({str(run / 'model' / 'config.json')!r}))\n"
        "vit = timm.create_model(pretrained=False, **cfg)\n"
        f"vit.load_state_dict(load_file({str(run / 'model' / 'model.safetensors')!r}))\n"
        "assert not any(m.startswith('ptrun') for m in sys.modules)\nprint(sum(p.numel() for p in vit.parameters()))"
    )
    out = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == sum(t.numel() for t in third.values())
