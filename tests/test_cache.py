"""AutoCache: the store's tiers and integrity, the prefix cache's exactness, and evaluation through it in a
trainer (single process; the 4-worker run is in test_controller_dist.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pipeline_cases as pc
import pytest
import torch
from conftest import TINY, compose_config
from test_cache_entries import DAMAGES, damage

from ptrun.auto.autocache import STAT_NAMES, AutoCache, default_min_units
from ptrun.auto.cache_store import HEADER_BYTES, ActivationStore, TensorSpec, entry_specs
from ptrun.config import CacheConfig, ConfigError, parse_memory
from ptrun.models.layered import run_units

B = 8  # samples per test batch


def make_cache(layered, tmp_path: Path, local: bool = False, speaks: bool = False, **cfg) -> AutoCache:
    return AutoCache(
        layered,
        CacheConfig(dir=str(tmp_path / "cache"), **cfg),
        tag="test",
        num_train=2 * B,
        num_eval=B,
        device=torch.device("cpu"),
        run_dir=tmp_path,
        local=local,
        speaks=speaks,
    )


def cached_model(kind: str, tmp_path: Path, local: bool):
    """The tiny model of `kind`, a cache of its prefix, one batch of it (ids and weights, the raw inputs)."""
    layered = pc.model(kind)
    return layered, make_cache(layered, tmp_path, local), *make_batch(kind)


STORES = pytest.mark.parametrize("local", [False, True], ids=["shared", "local"])
"""The node's shared store and a one-worker job's store on its own device: every entry behaves the same."""


def make_batch(kind: str, first_id: int = 0, padding: int = 0) -> tuple[dict, tuple[torch.Tensor, ...]]:
    b = pc.batch(kind, 0)
    raw = tuple(b[k][:B] for k in pc.model(kind).input_names)
    weight = torch.ones(B)
    if padding:
        weight[-padding:] = 0
    return {"index": torch.arange(first_id, first_id + B), "weight": weight}, raw


def prefix(layered, depth: int, raw) -> tuple[torch.Tensor, ...]:
    for unit in layered.units[:depth]:
        unit.eval()
    with torch.no_grad():
        out = run_units(layered.units[:depth], *raw)
    return out if isinstance(out, tuple) else (out,)


def inputs(cache: AutoCache, batch: dict, raw, split: str = "train"):
    return cache.inputs(split, dict(batch), raw)


@pytest.fixture(autouse=True)
def _remove_shared_memory(tmp_path):
    yield
    for cache_dir in (tmp_path / "cache",):
        # the memory tier lives in /dev/shm; remove it whatever a test left behind
        AutoCache(
            pc.model("vit"),
            CacheConfig(dir=str(cache_dir)),
            tag="",
            num_train=1,
            num_eval=0,
            device=torch.device("cpu"),
            run_dir=tmp_path,
        ).close(remove=True)


# The decoders carry (hidden, padding mask) between units, each attention half building its causal mask and
# positions from them: the entry must hold both. Qwen3's classification head reads the mask too.
DECODERS = ["llama_lm", "qwen3"]


@STORES
@pytest.mark.parametrize("kind", ["vit", "bert", *DECODERS])
def test_a_hit_equals_recomputing_the_prefix_exactly(tmp_path, kind, local):
    layered, cache, batch, raw = cached_model(kind, tmp_path, local)
    cache.set_depth(3, tuple(r[:1] for r in raw))
    want = prefix(layered, 3, raw)
    first = inputs(cache, batch, raw)
    assert cache.take_stats("train") == {"hits": 0, "advanced": 0, "computed": B, "corrupt": 0, "written": B}
    again = inputs(cache, batch, raw)
    assert cache.take_stats("train")["hits"] == B
    assert len(first) == len(again) == len(want)  # every tensor the next unit takes (a decoder's mask too)
    for a, b, w in zip(first, again, want, strict=True):
        assert torch.equal(a, w) and torch.equal(b, w)


# the same kinds and stores as the test above: each property over every model family and store
@STORES
@pytest.mark.parametrize("kind", ["vit", "bert", *DECODERS])
def test_the_incremental_update_equals_a_full_recompute(tmp_path, kind, local):
    layered, cache, batch, raw = cached_model(kind, tmp_path, local)
    probe = tuple(r[:1] for r in raw)
    cache.set_depth(3, probe)
    inputs(cache, batch, raw)
    cache.set_depth(5, probe)
    cache.take_stats("train")
    advanced = inputs(cache, batch, raw)
    assert cache.take_stats("train")["advanced"] == B  # units 3 and 4 only, on the cached depth-3 tensors
    assert len(advanced) == len(prefix(layered, 5, raw))
    for got, want in zip(advanced, prefix(layered, 5, raw), strict=True):
        assert torch.equal(got, want)
    inputs(cache, batch, raw)
    assert cache.take_stats("train")["hits"] == B  # the advanced entries were written back at depth 5


@pytest.mark.slow
def test_entries_written_by_one_process_are_read_by_another(tmp_path):
    specs = (TensorSpec((5, 4), torch.float32, torch.float32),)
    mem, disk = tmp_path / "mem", tmp_path / "disk"
    writer = textwrap.dedent(f"""
        import torch
        from ptrun.auto.cache_store import ActivationStore, TensorSpec
        store = ActivationStore({str(mem)!r}, {str(disk)!r}, (TensorSpec((5, 4), torch.float32, torch.float32),),
                                6, 3 * 1024)
        g = torch.Generator().manual_seed(7)
        for sample in range(6):
            store.write(sample, [torch.randn(5, 4, generator=g)], key=99)
    """)
    subprocess.run([sys.executable, "-c", writer], check=True, timeout=120)
    store = ActivationStore(mem, disk, specs, 6, 3 * 1024)
    found, (tensor,), corrupt = store.read(list(range(6)), {99})
    g = torch.Generator().manual_seed(7)
    assert found == [99] * 6 and corrupt == 0
    assert torch.equal(tensor, torch.stack([torch.randn(5, 4, generator=g) for _ in range(6)]))


def test_the_memory_budget_holds_and_overflow_goes_to_disk_and_reads_back_equal(tmp_path):
    specs = (TensorSpec((16,), torch.float32, torch.float32),)
    store = ActivationStore(tmp_path / "mem", tmp_path / "disk", specs, 10, max_memory=3 * 128 + 100)
    assert store.slot_bytes == 128  # 16-byte header + 64 bytes of data, rounded up to 64
    assert store.memory_slots == 3
    assert store.mem_path.stat().st_size == 3 * 128 <= 3 * 128 + 100  # within the budget
    assert store.disk_path.stat().st_size == 7 * 128
    values = torch.randn(10, 16)
    for sample in range(10):
        store.write(sample, [values[sample]], key=5)
    found, (got,), _ = store.read(list(range(10)), {5})
    assert found == [5] * 10 and torch.equal(got, values)
    # sample 7 lives in the disk file (slot 4 there): damage it there and only sample 7 goes bad
    with open(store.disk_path, "r+b") as f:
        f.seek(4 * 128 + HEADER_BYTES + 3)
        f.write(b"\xff")
    found, _, corrupt = store.read(list(range(10)), {5})
    assert corrupt == 1 and found == [5] * 7 + [0] + [5] * 2


def test_a_corrupted_entry_is_detected_and_recomputed(tmp_path):
    layered = pc.model("vit")
    cache = make_cache(layered, tmp_path)
    batch, raw = make_batch("vit")
    cache.set_depth(3, tuple(r[:1] for r in raw))
    inputs(cache, batch, raw)
    store = cache.store
    with open(store.mem_path, "r+b") as f:  # flip one byte in sample 2's data
        f.seek(2 * store.slot_bytes + HEADER_BYTES + 11)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    cache.take_stats("train")
    got = inputs(cache, batch, raw)
    assert cache.take_stats("train") == {"hits": B - 1, "advanced": 0, "computed": 1, "corrupt": 1, "written": 1}
    assert torch.equal(got[0], prefix(layered, 3, raw)[0])
    inputs(cache, batch, raw)
    assert cache.take_stats("train")["hits"] == B  # repaired


def test_a_torn_write_reads_as_a_miss(tmp_path):
    specs = (TensorSpec((4,), torch.float32, torch.float32),)
    store = ActivationStore(tmp_path / "m", tmp_path / "d", specs, 2, 1 << 20)
    store.write(0, [torch.ones(4)], key=3)
    store.write(1, [torch.ones(4)], key=3)
    # a writer killed between clearing the key and setting it again leaves key 0: empty, never read
    store._slot(1)[:8] = 0
    assert store.read([0, 1], {3})[0] == [3, 0]


def test_a_restart_revalidates_entries_by_the_frozen_weights(tmp_path):
    layered = pc.model("vit")
    batch, raw = make_batch("vit")
    probe = tuple(r[:1] for r in raw)
    cache = make_cache(layered, tmp_path)
    cache.set_depth(3, probe)
    inputs(cache, batch, raw)
    cache.close(remove=False)

    same = make_cache(layered, tmp_path)  # a restarted worker with the same weights: every entry is valid
    same.set_depth(3, probe)
    inputs(same, batch, raw)
    assert same.take_stats("train")["hits"] == B
    same.close(remove=False)

    with torch.no_grad():
        next(layered.units[1].parameters()).add_(1e-3)  # other frozen weights: nothing may be reused
    changed = make_cache(layered, tmp_path)
    changed.set_depth(3, probe)
    got = inputs(changed, batch, raw)
    assert changed.take_stats("train")["computed"] == B
    assert torch.equal(got[0], prefix(layered, 3, raw)[0])


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_disk_tier_is_recomputed_on_resume_in_one_line_to_the_same_inputs(
    tmp_path, caplog, one_rank_group, how
):
    """A resumed run (the same weights) finds the disk tier the killed run left with a slot's bytes flipped,
    cut short, or replaced by another store's file: one line naming it, the damaged entries computed again
    (the others still served), the first stage's inputs those of a clean cache, and the tier whole again."""
    from types import SimpleNamespace

    from ptrun.train.epoch_stats import cache_stats

    layered = pc.model("vit")
    batch, raw = make_batch("vit")
    probe = tuple(r[:1] for r in raw)
    expected = prefix(layered, 3, raw)
    first = make_cache(layered, tmp_path, max_memory="0", keep=True)  # every slot on disk
    first.set_depth(3, probe)
    inputs(first, batch, raw)
    store = first.store
    first.close(remove=False)
    if how == "flipped":  # sample 2's data, as a bad disk would
        with open(store.disk_path, "r+b") as f:
            f.seek(2 * store.slot_bytes + HEADER_BYTES + 11)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x40]))
    else:
        other = ActivationStore(
            tmp_path / "om", tmp_path / "od", (TensorSpec((7,), torch.float32, torch.float32),), 5, 0
        )
        damage(store.disk_path, how, other.disk_path)
    caplog.clear()

    resumed = make_cache(layered, tmp_path, max_memory="0", keep=True, speaks=True)
    resumed.set_depth(3, probe)
    got = inputs(resumed, batch, raw)
    counts = cache_stats(resumed, SimpleNamespace(cached_units=3), torch.device("cpu"))["cache"]
    lines = [r.getMessage() for r in caplog.records if str(store.disk_path) in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    if how == "flipped":
        assert (counts["hits"], counts["computed"], counts["corrupt"]) == (B - 1, 1, 1)
        assert lines[0].startswith(f"AutoCache: 1 cached entries in {store.disk_path} failed their checksum")
    else:
        assert (counts["hits"], counts["computed"], counts["corrupt"]) == (0, B, 0)
        assert lines[0].startswith(f"AutoCache's disk tier {store.disk_path} is unusable: it was ")
        assert lines[0].endswith("(truncated, or another store's file); its entries are computed again")
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    inputs(resumed, batch, raw)
    assert resumed.take_stats("train")["hits"] == B  # whole again
    assert not list(store.disk_path.parent.glob(".*.tmp"))
    resumed.close(remove=True)


@STORES
def test_padding_duplicates_are_not_written_and_eval_has_its_own_slots_and_keys(tmp_path, local):
    layered = pc.model("vit")
    cache = make_cache(layered, tmp_path, local)
    batch, raw = make_batch("vit", padding=3)
    cache.set_depth(3, tuple(r[:1] for r in raw))
    inputs(cache, batch, raw)
    assert cache.take_stats("train")["written"] == B - 3
    inputs(cache, batch, raw, split="eval")  # same ids, other split: slots 16.. are still empty
    assert cache.take_stats("eval") == {"hits": 0, "advanced": 0, "computed": B, "corrupt": 0, "written": B - 3}
    assert cache.take_stats("train")["computed"] == 0  # each split counts its own
    # An entry of the training transform is never served for an eval sample, even from an eval slot.
    assert cache.key["train"] != cache.key["eval"]
    cache.store.write(16, [t[0] for t in prefix(layered, 3, raw)], cache.key["train"])
    got = inputs(cache, batch, raw, split="eval")  # sample 0 is a miss, 1 .. 4 hits, the padding never stored
    assert cache.take_stats("eval") == {"hits": B - 4, "advanced": 0, "computed": 4, "corrupt": 0, "written": 1}
    assert torch.equal(got[0], prefix(layered, 3, raw)[0])


def test_without_eval_slots_evaluation_runs_the_prefix_and_stores_nothing(tmp_path):
    layered = pc.model("vit")
    cache = AutoCache(
        layered,
        CacheConfig(dir=str(tmp_path / "cache")),
        tag="test",
        num_train=2 * B,
        num_eval=0,
        device=torch.device("cpu"),
        run_dir=tmp_path,
    )
    batch, raw = make_batch("vit")
    cache.set_depth(3, tuple(r[:1] for r in raw))
    assert not cache.holds("eval") and cache.store.num_slots == 2 * B
    for _ in range(2):
        got = inputs(cache, batch, raw, split="eval")
        assert torch.equal(got[0], prefix(layered, 3, raw)[0])
        assert cache.take_stats("eval") == {"hits": 0, "advanced": 0, "computed": B, "corrupt": 0, "written": 0}
    assert cache.store.read(list(range(2 * B)), cache.keys["train"])[0] == [0] * (2 * B)


@STORES
def test_half_precision_storage_rounds_the_hidden_states_and_keeps_masks_exact(tmp_path, local):
    layered = pc.model("bert")
    cache = make_cache(layered, tmp_path, local, dtype="float16")
    batch, raw = make_batch("bert")
    cache.set_depth(3, tuple(r[:1] for r in raw))
    assert cache.store.specs[0].stored == torch.float16 and cache.store.specs[1].stored == torch.float32
    inputs(cache, batch, raw)
    hidden, mask = inputs(cache, batch, raw)
    want_hidden, want_mask = prefix(layered, 3, raw)
    assert torch.equal(mask, want_mask)  # -3.4e38 would be -inf in float16
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-3, atol=1e-3)
    assert not torch.equal(hidden, want_hidden)


def test_close_removes_both_tiers_unless_kept(tmp_path):
    layered = pc.model("vit")
    batch, raw = make_batch("vit")
    kept = make_cache(layered, tmp_path, keep=True)
    kept.set_depth(3, tuple(r[:1] for r in raw))
    files = [kept.store.mem_path, kept.store.disk_path]
    kept.close(remove=False)
    assert all(f.exists() for f in files)
    removed = make_cache(layered, tmp_path)
    removed.close(remove=True)
    assert not any(f.exists() for f in files) and not removed.mem_dir.exists()


def test_an_unusable_cache_dir_is_one_clear_error(tmp_path):
    (tmp_path / "a_file").write_text("")
    specs = (TensorSpec((4,), torch.float32, torch.float32),)
    with pytest.raises(ConfigError, match=r"cache.dir: cannot create the directory .*a_file/sub"):
        ActivationStore(tmp_path / "m", tmp_path / "a_file" / "sub", specs, 4, 0)


def test_a_one_worker_job_keeps_entries_on_its_device_unless_they_do_not_fit_or_are_kept(tmp_path):
    from ptrun.auto.cache_store import LocalStore

    layered = pc.model("vit")
    batch, raw = make_batch("vit")
    probe = tuple(r[:1] for r in raw)
    for local, cfg, kind in (
        (True, {}, LocalStore),
        (False, {}, ActivationStore),
        (True, {"keep": True}, ActivationStore),  # kept for a later run: files
        (True, {"max_memory": "1KB"}, ActivationStore),
    ):  # over the budget: the tiers
        cache = make_cache(layered, tmp_path, local, **cfg)
        cache.set_depth(3, probe)
        assert type(cache.store) is kind, (local, cfg)
        cache.close(remove=True)


def test_a_deeper_prefix_hashes_only_the_units_it_adds(tmp_path, monkeypatch):
    layered = pc.model("vit")
    cache = make_cache(layered, tmp_path)
    batch, raw = make_batch("vit")
    probe = tuple(r[:1] for r in raw)
    hashed = []
    for u, unit in enumerate(layered.units):
        monkeypatch.setattr(
            unit, "state_dict", lambda *a, _u=u, _f=unit.state_dict, **k: hashed.append(_u) or _f(*a, **k)
        )
    cache.set_depth(3, probe)
    cache.set_depth(5, probe)
    assert hashed == [0, 1, 2, 3, 4]
    # the keys are those of hashing the whole prefix at once (a new cache, as after a restart)
    fresh = make_cache(layered, tmp_path)
    fresh.set_depth(5, probe)
    assert fresh.keys == cache.keys and fresh.key == cache.key


def test_defaults_and_memory_sizes():
    assert default_min_units(12) == 7 and default_min_units(24) == 13 and default_min_units(6) == 5
    assert parse_memory("50%", total=1000) == 500
    assert parse_memory("2GB") == 2 << 30 and parse_memory("512MB") == 512 << 20 and parse_memory("4096") == 4096
    for bad in ("0%", "150%", "lots", "-1GB"):
        with pytest.raises(ConfigError, match="cache.max_memory"):
            parse_memory(bad)
    specs = entry_specs((torch.zeros(3, 4), torch.zeros(1, 1, 3)), torch.bfloat16)
    assert [s.stored for s in specs] == [torch.bfloat16, torch.float32]


def test_the_loader_reads_raw_inputs_only_for_samples_the_cache_cannot_serve(tmp_path):
    """With class folders (decoded and transformed on access), a batch served by the cache carries no raw
    pixels at all; a miss gets exactly the pixels the plain loader would give it."""
    from PIL import Image

    from ptrun.config import DataConfig
    from ptrun.data import build_datasets

    rng = torch.Generator().manual_seed(3)
    for c in ("cat", "dog"):
        (tmp_path / "img" / c).mkdir(parents=True)
        for i in range(4):
            pixels = (torch.rand(16, 16, 3, generator=rng) * 255).byte().numpy()
            Image.fromarray(pixels).save(tmp_path / "img" / c / f"{i}.png")
    data = build_datasets(DataConfig(name="imagefolder", path=str(tmp_path / "img"), image_size=16, eval_fraction=0.25))
    layered = pc.model("vit")
    cache = make_cache(layered, tmp_path)
    ids = torch.arange(len(data.train))
    plain = dict(data.train[ids.tolist()])
    cache.set_depth(3, (plain["pixel_values"][:1],))

    cold = cache.fetch("train", data.train, ids, ("pixel_values",), ("labels",))
    assert torch.equal(cold["pixel_values"], plain["pixel_values"]) and torch.equal(cold["labels"], plain["labels"])
    cold["weight"] = torch.ones(len(ids))
    first = cache.inputs("train", cold, (cold["pixel_values"],))

    warm = cache.fetch("train", data.train, ids, ("pixel_values",), ("labels",))
    assert "pixel_values" not in warm and torch.equal(warm["labels"], plain["labels"])
    warm["weight"] = torch.ones(len(ids))
    assert torch.equal(cache.inputs("train", warm, ())[0], first[0])


# ---- evaluation through the cache, in a real trainer on one rank ---------------------------------------------


@pytest.mark.slow
def test_evaluation_through_the_cache_equals_evaluation_without_it_across_a_depth_change(tmp_path, one_rank_group):
    """A trainer with AutoCache trains an epoch and evaluates at 3 cached units (every eval entry computed and
    written), at 5 (advanced by units 3 and 4 only) and at 5 again (read); each evaluation has the loss and
    top-1 of a trainer without the cache holding the same weights at the same frozen prefix."""
    from ptrun.train.trainer import Trainer

    def trainer(name: str, *extra: str) -> Trainer:
        cfg = compose_config(
            TINY
            + [
                "launcher.nproc_per_node=1",
                "data.eval_fraction=0.1",
                "optim.lr=0.01",
                "optim.schedule=constant",
                "optim.warmup_fraction=0",
                *extra,
            ],
            tmp_path / name,
        )
        return Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)

    cached, plain = trainer("cached", "auto.cache=true"), trainer("plain", "auto.cache=false")
    try:
        cached.train_epoch()  # nothing frozen yet: a model whose predictions depend on each sample's features
        n = len(cached.data.eval)
        padding = -n % cached.in_use.eval_sampler.global_batch_size  # the last batch's weight-0 repeats of samples 0 ..
        zero = dict.fromkeys(STAT_NAMES, 0)
        expected = [
            (3, {**zero, "computed": n, "written": n, "hits": padding}),
            (5, {**zero, "advanced": n, "written": n, "hits": padding}),
            (5, {**zero, "hits": n + padding}),
        ]
        metrics = []
        for depth, counts in expected:
            cached.in_use.switch_to(replace(cached.plan, frozen_units=depth, cached_units=depth), 0)
            cached.train_epoch()  # the active units change; the frozen ones, which key the entries, do not
            plain.in_use.switch_to(replace(plain.plan, frozen_units=depth), 0)
            plain.layered.model.load_state_dict(cached.layered.model.state_dict())
            got, want = cached.evaluate(), plain.evaluate()
            assert cached.cache.take_stats("eval") == counts, depth
            assert got.keys() == want.keys() == {"loss", "top1"}
            assert got == pytest.approx(want, rel=0, abs=1e-6), depth
            metrics.append(got)
        assert metrics[0]["top1"] > 20 and metrics[0] != metrics[1] != metrics[2]  # trained on between evaluations
    finally:
        for t in (cached, plain):
            t._release_cache()
            t.close()


def test_a_cache_slower_than_recomputing_is_switched_off_in_one_line(tmp_path, one_rank_group, capsys):
    """A trainer whose cache reads its entries more slowly than the frozen prefix computes them (the store
    made slow here) turns the cache off at the epoch's end, says so in one line, and trains on in the same
    layout without a cached prefix; a cache that reads fast stays on. Both sides are slowed by known amounts
    (each frozen unit by 20 ms a batch, ~4 ms a sample for the three; the slow store by 200 ms a batch, ~12 ms
    a sample), so each comparison holds by a wide margin however busy the machine is."""
    import time as _time

    from ptrun.train.trainer import Trainer

    cfg = compose_config(
        TINY + ["launcher.nproc_per_node=1", "auto.cache=true", "train.max_steps_per_epoch=6"], tmp_path / "run"
    )
    trainer = Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)
    try:
        trainer.in_use.switch_to(replace(trainer.plan, frozen_units=3, cached_units=3), 0)
        for unit in trainer.cache.layered.units[:3]:
            unit.register_forward_pre_hook(lambda *_: _time.sleep(0.02))
        trainer.train_epoch()  # fills the entries, timing the frozen prefix on every row
        trainer.train_epoch()  # reads them
        assert trainer._stop_caching_if_slower() == {} and trainer.plan.cached_units == 3  # reading pays
        read = trainer.cache.store.read
        trainer.cache.store.read = lambda *a, **k: (_time.sleep(0.2), read(*a, **k))[1]
        trainer.train_epoch()
        moved = trainer._stop_caching_if_slower()
        assert moved["transition_s"] >= 0 and trainer.plan.cached_units == 0 and trainer.plan.frozen_units == 3
        assert not trainer.controller.caching and trainer.controller.cached_units_for(5) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("AutoCache off")]
        assert len(lines) == 1 and "recomputing its 3 frozen units" in lines[0], lines
        trainer.cache.take_stats("train")
        trainer.train_epoch()  # the prefix runs in the stage: the cache serves nothing
        assert trainer.cache.take_stats("train") == dict.fromkeys(STAT_NAMES, 0)
    finally:
        trainer.close()
