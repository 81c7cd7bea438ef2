"""Compiled units in real pipelines (2 gloo processes, tests/compiled_cases.py): a 1F1B pipeline (K = 2, a
freeze in place halfway, in fp32, bf16 and with recomputation) and PipeDream's asynchronous 1F1B train to the
same losses compiled as eager, the frozen units get no gradient, and the steps after the freeze compile
nothing. One launch covers every case; compiled code is shared through inductor's on-disk cache."""

from __future__ import annotations

import pytest
import torch

import compiled_cases as cc

CASES = [cc.Case("1F1B", c, precision, recompute) for precision, recompute in
         (("fp32", "none"), ("bf16", "none"), ("fp32", "every:1")) for c in (False, True)]
CASES += [cc.Case("pipedream", c, freeze=False) for c in (False, True)]
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
"""Relative loss agreement: fp32 within 1e-4; bf16 rounds where inductor fuses differently from eager."""


@pytest.mark.slow
def test_compiled_pipelines_train_as_eager(tmp_path):
    cc.launch(CASES, tmp_path)
    for case in [c for c in CASES if c.compiled]:
        eager = torch.load(tmp_path / f"{replace_compiled(case).name}.rank0.pt")
        for rank in (0, 1):
            got = torch.load(tmp_path / f"{case.name}.rank{rank}.pt")
            assert got["losses"] == pytest.approx(eager["losses"], rel=TOLERANCE[case.precision]), case.name
            assert not got["eager_kinds"], case.name  # every unit kind ran compiled
            if case.freeze:
                assert all(got["frozen_grads"]), case.name  # no frozen parameter ever had a gradient
                assert got["compiles_after_freeze"] == 0, case.name


def replace_compiled(case: cc.Case) -> cc.Case:
    from dataclasses import replace

    return replace(case, compiled=False)
