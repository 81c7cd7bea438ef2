"""EpochSampler: exact coverage per epoch under any data-parallel width, fixed shapes, determinism."""

import pytest
import torch

from ptrun.data import EpochSampler

SIZES = [1, 7, 100, 101]
BATCHES = [1, 4, 8, 12]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def epoch_ids(sampler: EpochSampler, epoch: int, dp: int) -> tuple[list[int], int]:
    """(ids of weight 1, count of weight 0) over every step and replica of one epoch."""
    real, padding = [], 0
    for step in range(sampler.steps_per_epoch):
        for replica in range(dp):
            ids, weight = sampler.replica_batch(epoch, step, replica, dp)
            assert ids.dtype == torch.int64 and weight.dtype == torch.float32
            assert ids.shape == weight.shape == (sampler.global_batch_size // dp,)
            assert set(weight.tolist()) <= {0.0, 1.0}
            real += ids[weight == 1].tolist()
            padding += int((weight == 0).sum())
    return real, padding


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES)
def test_every_sample_weighs_one_exactly_once_per_epoch(n, batch):
    sampler = EpochSampler(n, batch, seed=3)
    assert sampler.steps_per_epoch == -(-n // batch)
    for dp in divisors(batch):
        real, padding = epoch_ids(sampler, epoch=0, dp=dp)
        assert sorted(real) == list(range(n))
        assert padding == sampler.steps_per_epoch * batch - n


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch", BATCHES)
def test_replica_slices_concatenate_to_the_global_batch(n, batch):
    sampler = EpochSampler(n, batch, seed=0)
    for dp in divisors(batch):
        for step in range(sampler.steps_per_epoch):
            ids, weight = sampler.global_batch(1, step)
            shares = [sampler.replica_batch(1, step, r, dp) for r in range(dp)]
            assert torch.equal(torch.cat([s[0] for s in shares]), ids)
            assert torch.equal(torch.cat([s[1] for s in shares]), weight)


def test_padding_repeats_the_start_of_the_same_permutation():
    sampler = EpochSampler(10, 4, seed=5)
    order = torch.cat([sampler.global_batch(2, s)[0] for s in range(3)])
    assert torch.equal(order[10:], order[:2])
    assert sampler.global_batch(2, 2)[1].tolist() == [1, 1, 0, 0]
    tiny = EpochSampler(1, 4, seed=5)  # padding longer than the data wraps around
    ids, weight = tiny.global_batch(0, 0)
    assert ids.tolist() == [0, 0, 0, 0] and weight.tolist() == [1, 0, 0, 0]


def test_permutation_depends_only_on_seed_and_epoch():
    a, b = EpochSampler(100, 8, seed=1), EpochSampler(100, 8, seed=1)
    full = lambda s, e: torch.cat([s.global_batch(e, i)[0] for i in range(s.steps_per_epoch)])  # noqa: E731
    assert torch.equal(full(a, 0), full(b, 0))
    assert torch.equal(full(a, 4), full(b, 4))
    assert not torch.equal(full(a, 0), full(a, 1))
    assert not torch.equal(full(a, 0), full(EpochSampler(100, 8, seed=2), 0))


def test_changing_dp_between_epochs_still_covers_exactly():
    sampler = EpochSampler(101, 12, seed=7)
    for epoch, dp in enumerate([1, 4, 2, 12, 3]):
        real, _ = epoch_ids(sampler, epoch, dp)
        assert sorted(real) == list(range(101))


def test_changing_dp_mid_epoch_still_covers_exactly():
    """A restart at step 5 with another width continues the same global order."""
    sampler = EpochSampler(101, 12, seed=7)
    real = []
    for step in range(sampler.steps_per_epoch):
        dp = 2 if step < 5 else 6
        for replica in range(dp):
            ids, weight = sampler.replica_batch(0, step, replica, dp)
            real += ids[weight == 1].tolist()
    assert sorted(real) == list(range(101))


def test_no_shuffle_is_the_natural_order():
    sampler = EpochSampler(10, 4, seed=9, shuffle=False)
    for epoch in (0, 3):
        ids = torch.cat([sampler.global_batch(epoch, s)[0] for s in range(3)])
        assert ids.tolist() == list(range(10)) + [0, 1]


def test_invalid_layouts_raise():
    sampler = EpochSampler(10, 4, seed=0)
    with pytest.raises(ValueError, match="divisible"):
        sampler.replica_batch(0, 0, 0, 3)
    with pytest.raises(ValueError):
        sampler.replica_batch(0, 0, 2, 2)
    with pytest.raises(IndexError):
        sampler.global_batch(0, 3)
    with pytest.raises(ValueError):
        EpochSampler(0, 4, seed=0)
