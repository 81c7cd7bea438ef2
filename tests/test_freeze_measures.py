"""What the trainer measures for a freeze policy (`ptrun.freezing.measures`): the blocks a rank holds, the mean
gradient norms and the plasticity of the weights (relative change per unit of learning rate against a
bfloat16 copy), on real tensors and a real tiny ViT."""

from __future__ import annotations

import math

import pytest
import torch
from pipeline_cases import model

from ptrun.auto.autodp import set_frozen
from ptrun.config import FREEZE_POLICIES
from ptrun.freezing.counts import frozen_units_for_blocks
from ptrun.freezing.measures import (
    MEASUREMENTS,
    GradNorms,
    HeldBlocks,
    NoMeasure,
    WeightChange,
    held_blocks,
    make_measurement,
    plasticity,
)
from ptrun.freezing.policies import POLICIES
from ptrun.freezing.policy import MEASURES
from ptrun.train.step import Update

CPU = torch.device("cpu")


def alone(t: torch.Tensor) -> torch.Tensor:
    """The sum over the ranks of a job of one."""
    return t


def step(lr: float, stepped: bool = True, norms=None) -> Update:
    return Update(lr=lr, stepped=stepped, block_norms=norms)


def weights(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(0.05 * torch.randn(*s, generator=g)) for s in shapes]


def moved(params, by: float, seed: int = 1) -> float:
    """Move `params` in place by `by` times a random unit-rms direction; returns ||change|| / ||before||."""
    g = torch.Generator().manual_seed(seed)
    change_sq = before_sq = 0.0
    with torch.no_grad():
        for p in params:
            d = by * torch.randn(p.shape, generator=g)
            before_sq += float(p.double().square().sum())
            change_sq += float(d.double().square().sum())
            p += d
    return math.sqrt(change_sq / before_sq)


def test_every_policy_measure_has_a_measurement():
    assert set(MEASUREMENTS) == {None, *MEASURES}
    for name in FREEZE_POLICIES:
        measure = POLICIES[name].measure
        assert type(make_measurement(measure, 4, CPU)) is MEASUREMENTS[measure]
    assert {n: POLICIES[n].measure for n in FREEZE_POLICIES if POLICIES[n].measure} == {
        "pipetransformer": "grad_norms",
        "autofreeze": "grad_norms",
        "plasticity": "weight_change",
    }


def test_held_blocks_are_the_active_blocks_trainable_parameters():
    layered = model("vit")  # 4 blocks: units 0 (embedding), 1..8 (halves), 9 (head)
    set_frozen(layered, frozen_units_for_blocks(1))
    held = held_blocks(layered, range(4, 10), first_replica=True)  # a second stage: block 1's MLP half onwards
    assert sorted(held.params) == [1, 2, 3]
    assert {id(p) for p in held.params[1]} == {id(p) for p in layered.units[4].parameters()}
    assert {id(p) for p in held.params[2]} == {id(p) for u in (5, 6) for p in layered.units[u].parameters()}
    assert set(held.block_of.values()) == {1, 2, 3} and len(held.block_of) == sum(map(len, held.params.values()))
    whole = held_blocks(layered, range(10), first_replica=True)
    assert sorted(whole.params) == [1, 2, 3]  # block 0 is frozen, the embedding and head are no block
    assert held_blocks(layered, range(10), first_replica=False) == HeldBlocks()


def test_gradient_norms_are_averaged_over_the_interval_and_carried_by_a_checkpoint():
    g = GradNorms(3, CPU)
    g.hold(HeldBlocks({0: weights((2,))}))
    assert g.grad_norms_of is not None and NoMeasure(3, CPU).grad_norms_of is None
    g.begin()
    g.after_step(step(0.1, norms=torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)))
    g.after_step(step(0.1, stepped=False))  # skipped: no norms
    g.after_step(step(0.1, norms=torch.tensor([3.0, 2.0, 0.0], dtype=torch.float64)))
    assert g.measure(alone, 2) == [2.0, 2.0, 0.0]
    resumed = GradNorms(3, CPU)
    resumed.resume(g.progress(alone))
    assert resumed.measure(alone, 2) == [2.0, 2.0, 0.0]
    assert g.measure(alone, 0) is None
    g.begin()
    assert g.measure(alone, 2) == [0.0, 0.0, 0.0]


def test_plasticity_is_the_relative_change_per_unit_of_learning_rate():
    params = weights((64, 32), (32,))
    w = WeightChange(2, CPU)
    w.hold(HeldBlocks({1: params}))
    w.begin()
    true = moved(params, 2e-4)  # ~0.004 relative: near bfloat16's rounding, which must not count
    for _ in range(4):
        w.after_step(step(1e-3))
    got = w.measure(alone, 4)
    assert got[0] == 0.0  # not held: not measured
    assert got[1] == pytest.approx(true / 1e-3, rel=0.05)
    # the same change under half the learning rate is twice the plasticity
    half = WeightChange(2, CPU)
    again = weights((64, 32), (32,))
    half.hold(HeldBlocks({1: again}))
    half.begin()
    moved(again, 2e-4)
    for _ in range(4):
        half.after_step(step(0.5e-3))
    assert half.measure(alone, 4)[1] == pytest.approx(2 * got[1], rel=1e-12)
    # a step fp16 skipped moved nothing: it counts as learning rate 0 in the mean
    skipped = WeightChange(2, CPU)
    third = weights((64, 32), (32,))
    skipped.hold(HeldBlocks({1: third}))
    skipped.begin()
    moved(third, 2e-4)
    for s in (True, True, False, False):
        skipped.after_step(step(1e-3, stepped=s))
    assert skipped.measure(alone, 4)[1] == pytest.approx(2 * got[1], rel=1e-12)


def test_weights_that_did_not_move_read_zero_whatever_the_rounding_of_the_copy():
    w = WeightChange(1, CPU)
    w.hold(HeldBlocks({0: weights((16, 16))}))  # float32 values bfloat16 cannot hold
    w.begin()
    w.after_step(step(1e-3))
    assert w.measure(alone, 1) == [0.0]


def test_plasticity_sums_the_squares_of_a_block_split_over_stages():
    """A block's attention half on one stage and its MLP half on the next: the squares are summed over the
    ranks before the ratio, so the two ranks measure what one rank holding the whole block would."""
    whole = weights((8, 8), (8,), (16, 8))
    first, second = WeightChange(1, CPU), WeightChange(1, CPU)
    one = WeightChange(1, CPU)
    copies = [torch.nn.Parameter(p.detach().clone()) for p in whole]
    first.hold(HeldBlocks({0: whole[:1]}))
    second.hold(HeldBlocks({0: whole[1:]}))
    one.hold(HeldBlocks({0: copies}))
    for w in (first, second, one):
        w.begin()
    moved(whole, 1e-3)
    moved(copies, 1e-3)
    for w in (first, second, one):
        w.after_step(step(1e-3))
    seen = []
    second.measure(lambda t: seen.append(t) or t, 1)
    split = first.measure(lambda t: t + seen[0], 1)
    assert split == pytest.approx(one.measure(alone, 1), rel=1e-12)


def test_no_reference_no_measurement():
    w = WeightChange(2, CPU)
    w.hold(HeldBlocks({0: weights((4,))}))
    w.after_step(step(1e-3))
    assert w.measure(alone, 1) is None  # a resume mid-interval: the copy was not checkpointed
    assert w.progress(alone) == {}
    w.begin()
    w.hold(HeldBlocks({0: weights((4,))}))  # a layout change drops the copy: the blocks may have moved
    w.after_step(step(1e-3))
    assert w.measure(alone, 1) is None
    w.begin()
    assert w.measure(alone, 0) is None  # no step
    w.after_step(step(0.0))
    assert w.measure(alone, 1) is None  # a learning rate of 0 throughout: nothing to divide by
    # replicas other than the first hold nothing, yet take part in the sum
    other = WeightChange(2, CPU)
    other.hold(HeldBlocks())
    other.begin()
    other.after_step(step(1e-3))
    assert other.measure(alone, 1) == [0.0, 0.0]


def test_plasticity_of_zero_and_empty_references():
    assert plasticity(0.0, 0.0, 1e-3) == 0.0
    assert plasticity(1.0, 0.0, 1e-3) == math.inf
    assert plasticity(4.0, 100.0, 0.5) == pytest.approx(0.4)
