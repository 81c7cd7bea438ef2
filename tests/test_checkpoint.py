"""Checkpoint files: atomic, checksummed, the newest broken one skipped, resume refused on broken ones."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import assert_one_error_line

from ptrun.train.checkpoint import lookup, store


@pytest.fixture
def one_rank_group(tmp_path):
    """A real (single-rank) gloo process group: store.save is a collective."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _save(run_dir, step, value):
    params = {"w": torch.full((3,), float(value))}
    optim = {"w": {"exp_avg": torch.full((3,), value / 10), "step": torch.tensor(float(step))}}
    return store.save(
        run_dir,
        global_step=step,
        named_params=params,
        optim_state=optim,
        writer=True,
        stage=0,
        trainer_state={"epoch": step, "global_step": step},
        keep=2,
    )


def test_round_trip_keep_and_corruption_fallback(tmp_path, one_rank_group):
    run_dir = tmp_path / "run"
    for step in (1, 2, 3):
        _save(run_dir, step, step)
    assert [p.name for p in lookup.list_checkpoints(run_dir)] == ["step_00000002", "step_00000003"]
    assert not list((run_dir / "checkpoints").glob(".tmp*"))
    params, optim, state = store.load(lookup.latest_valid(run_dir))
    assert torch.equal(params["w"], torch.full((3,), 3.0)) and state["global_step"] == 3
    assert torch.equal(optim["w"]["exp_avg"], torch.full((3,), 0.3))

    newest = lookup.list_checkpoints(run_dir)[-1] / "params-stage0.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF  # flip one bit of the tensor data
    newest.write_bytes(bytes(data))
    assert "does not match its checksum" in lookup.verify(newest.parent)
    assert lookup.latest_valid(run_dir).name == "step_00000002"


def test_resume_from_only_broken_checkpoints_is_refused(tmp_path, one_rank_group, cli):
    run_dir = tmp_path / "run"
    ckpt = _save(run_dir, 1, 1.0)
    (ckpt / "optim-stage0.pt").write_bytes(b"not a checkpoint")
    before = sorted((p.name, p.stat().st_size) for p in run_dir.rglob("*"))
    line = assert_one_error_line(cli("train", "train.resume=true", f"hydra.run.dir={run_dir}", cwd=tmp_path))
    assert "no valid checkpoint to resume from" in line and "optim-stage0.pt" in line
    assert sorted((p.name, p.stat().st_size) for p in run_dir.rglob("*")) == before


def test_the_position_is_one_value_whose_tensors_travel_beside_its_json():
    """A TrainState is the run's whole position: its JSON part and its tensors (a mid-epoch epoch's sums, the
    open interval's measurements) give it back whole; a checkpoint from before the global batch was saved
    takes the one its plan implies."""
    import json

    import torch

    from ptrun.train.state import TrainState

    state = TrainState(
        epoch=2,
        step_in_epoch=7,
        global_step=47,
        interval=5,
        interval_steps=3,
        global_batch=32,
        best_eval={"top1": 90.0, "epoch": 1},
        progress={"seen": torch.arange(4.0)},
    )
    saved = json.loads(json.dumps(state.to_dict()))  # as trainer.json holds it
    assert "progress" not in saved
    back = TrainState.from_dict(saved, {k: v.clone() for k, v in state.progress.items()})
    assert back.to_dict() == {**state.to_dict(), "last_checkpoint_step": 47}
    assert torch.equal(back.progress["seen"], state.progress["seen"])
    older = {k: v for k, v in saved.items() if k not in ("global_batch", "interval")}
    legacy = TrainState.from_dict(older, None, interval=4, global_batch=16)
    assert (legacy.global_batch, legacy.interval, legacy.progress) == (16, 4, {})


def test_the_position_is_a_value_that_nothing_changes_in_place():
    """A TrainState handed to a checkpoint or a record stays as it was: each change makes a new one (its eval
    remembered too), and no module of ptrun assigns to a field of one."""
    import ast
    from dataclasses import fields
    from pathlib import Path

    import ptrun
    from ptrun.train.state import TrainState

    state = TrainState(epoch=1)
    better = state.remembered({"top1": 50.0})
    assert (state.last_eval, state.best_eval) == ({}, {}) and better.best_eval == {"top1": 50.0, "epoch": 1}
    assert better.remembered({"top1": 40.0}).best_eval == better.best_eval and better.remembered({}) is better
    names = {f.name for f in fields(TrainState)}
    changed = []
    for path in sorted(Path(ptrun.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            else:
                continue
            changed += [
                f"{path.name}:{node.lineno}"
                for target in targets
                for t in ast.walk(target)
                if isinstance(t, ast.Attribute) and t.attr in names and ast.unparse(t.value).endswith("state")
            ]
    assert changed == []
