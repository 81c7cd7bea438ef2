"""fp16's loss scale (pure): the update rule all ranks apply to the verdict they share, and its state."""

from __future__ import annotations

import torch

from ptrun.numerics.precision import LossScaler, autocast, compute_dtype


def test_disabled_scaler_is_a_constant_one_that_never_skips():
    scaler = LossScaler(enabled=False)
    assert scaler.scale == 1.0
    assert scaler.update(finite=False) and scaler.scale == 1.0 and scaler.skipped == 0


def test_overflow_halves_the_scale_and_skips_then_growth_after_the_interval():
    scaler = LossScaler(enabled=True, init_scale=1024.0, growth_interval=3)
    assert scaler.update(finite=False) is False and scaler.scale == 512.0 and scaler.skipped == 1
    assert [scaler.update(finite=True) for _ in range(2)] == [True, True] and scaler.scale == 512.0
    assert scaler.update(finite=True) and scaler.scale == 1024.0  # the 3rd good step in a row doubles it
    scaler.update(finite=True)
    assert not scaler.update(finite=False) and scaler.scale == 512.0 and scaler.good_steps == 0


def test_state_round_trip_restores_scale_and_counters():
    a = LossScaler(enabled=True, init_scale=256.0, growth_interval=5)
    for finite in (True, False, True, True):
        a.update(finite)
    b = LossScaler(enabled=True, growth_interval=5)
    b.load_state_dict(a.state_dict())
    assert (b.scale, b.good_steps, b.skipped) == (128.0, 2, 1)
    assert [a.update(True) for _ in range(3)] == [b.update(True) for _ in range(3)] and a.scale == b.scale == 256.0


def test_autocast_runs_matmuls_in_the_compute_dtype_and_fp32_in_float32():
    x = torch.randn(4, 4)
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with autocast(torch.device("cpu"), compute_dtype(precision)):
            assert (x @ x).dtype == dtype
