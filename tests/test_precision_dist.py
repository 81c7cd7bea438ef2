"""Mixed precision on real worker processes (gloo, elastic_launch on localhost).

- bf16 under a 2-stage pipeline matches a single-process bf16 autocast reference within a bf16 tolerance
  (and differs from the float32 reference, so autocast really ran); activations cross the stage boundary in
  bfloat16; master weights and optimizer state stay float32.
- fp16: one rank's injected overflow makes every rank of a K = 2 x DP = 2 job skip the step and halve the
  scale; the steps before and after go ahead on every rank. A scale too large for fp16 (2^32) overflows for
  real and is lowered until steps go through, with every weight finite.
- fp32 is unchanged: the pipeline equivalence tests (test_pipeline_dist.py) hold it to rtol 1e-5.
"""

from __future__ import annotations

import pipeline_cases as pc
import precision_cases as prc
import pytest
import torch
from helpers.process_group import load_ranks

from ptrun.numerics.optim import build_optimizer

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # two launches of the precision matrix: ~50 s


@pytest.fixture(scope="module")
def bf16_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16")
    prc.launch("bf16", 2, out)
    return out


@pytest.fixture(scope="module")
def fp16_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fp16")
    prc.launch("fp16", 4, out)
    return load_ranks(out, "fp16", 4, weights_only=False)


def reference(kind: str, dtype: torch.dtype | None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Two textbook steps of the library model in one process, under autocast to `dtype` (None: float32)."""
    net = pc.model(kind).model
    net.train()
    optimizer = build_optimizer(list(net.named_parameters()), prc.SGD)
    losses = []
    for step in range(pc.STEPS):
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = pc.textbook_loss(net, kind, pc.batch(kind, step))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), pc.CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, {n: p.detach() for n, p in net.named_parameters()}


@pytest.mark.parametrize("kind", ["vit", "bert"])
def test_bf16_pipeline_matches_single_process_bf16(bf16_results, kind):
    ranks = load_ranks(bf16_results, f"bf16-{kind}", 2, weights_only=False)
    ref_losses, ref_params = reference(kind, torch.bfloat16)
    fp32_losses, _ = reference(kind, None)
    losses = ranks[0]["losses"]
    assert losses == pytest.approx(ref_losses, rel=2e-2)  # bf16 keeps 8 significant bits
    assert losses != pytest.approx(fp32_losses, rel=1e-6, abs=0)  # autocast did run
    held = {**ranks[0]["params"], **ranks[1]["params"]}
    assert set(held) == set(ref_params)
    init = dict(pc.model(kind).model.named_parameters())
    for name, value in held.items():
        # Each tensor's two-step update agrees with the reference's to bf16's few significant bits.
        moved, ref_moved = value - init[name].detach(), ref_params[name] - init[name].detach()
        error = (moved - ref_moved).norm() / ref_moved.norm().clamp_min(1e-6)
        assert error < 0.05, f"{name}: the update differs by {error:.3f} of its size"
    assert ranks[1]["received"] == ["torch.bfloat16"]  # half the bytes cross the stage boundary
    for r in ranks:
        assert r["param_dtypes"] == ["torch.float32"] and r["state_dtypes"] == ["torch.float32"]


def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(fp16_results):
    for r, result in enumerate(fp16_results):
        rows = result["rows"]
        assert [row["stepped"] for row in rows] == [True, False, True], f"rank {r}"
        assert [row["scale"] for row in rows] == [2.0**16, 2.0**15, 2.0**15], f"rank {r}"
        before, skipped, after = (row["params"] for row in rows)
        for name in before:
            assert torch.equal(before[name], skipped[name]), f"rank {r} stepped on the overflowed step: {name}"
        assert any(not torch.equal(skipped[n], after[n]) for n in after), f"rank {r} did not step afterwards"
    # Replicas of a stage hold identical weights throughout (ranks 0/2 and 1/3 share stages 0 and 1).
    for a, b in ((0, 2), (1, 3)):
        for row_a, row_b in zip(fp16_results[a]["rows"], fp16_results[b]["rows"], strict=True):
            for name in row_a["params"]:
                assert torch.equal(row_a["params"][name], row_b["params"][name])


def test_fp16_real_overflow_lowers_the_scale_until_steps_go_through(fp16_results):
    verdicts = [r["verdicts"] for r in fp16_results]
    assert all(v == verdicts[0] for v in verdicts)  # every rank agreed on every step
    first_step = verdicts[0].index(True)
    assert first_step >= 1 and all(verdicts[0][first_step:])  # it overflowed, then it fitted
    assert fp16_results[0]["final_scale"] == 2.0 ** (32 - first_step)
    assert all(r["finite"] for r in fp16_results)
