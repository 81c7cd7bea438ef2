"""The Runtime protocol is the whole contract between the trainer and a rank's stages: every runtime kind has
each of its members with the declared signature, every member the trainer and its parts use on a runtime is
declared, and a step through the trainer's update (`ptrun.train.step.train_step`) trains each kind.
One process on a real one-rank gloo group, tiny ViT."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pipeline_cases as pc
import pytest
import torch

from ptrun.auto.autodp import Builder, build_engine
from ptrun.models.losses import WeightedLoss, loss_weight, make_target
from ptrun.numerics.precision import LossScaler
from ptrun.parallel.flushing import LocalRuntime, PipelineRuntime
from ptrun.parallel.pipedream import AsyncPipelineRuntime
from ptrun.parallel.pipeline import Runtime, Step
from ptrun.train.state import Due, TrainState
from ptrun.train.step import StepParts, train_step

ROOT = Path(__file__).resolve().parent.parent

KINDS = {  # schedule, stages per rank, micro-batches: one plan per runtime kind, all on one rank
    LocalRuntime: ("GPipe", 1, 2),
    PipelineRuntime: ("LoopedBFS", 2, 2),
    AsyncPipelineRuntime: ("pipedream", 1, 1),
}


def protocol_members() -> dict[str, object]:
    """The protocol's attributes (name -> None) and methods (name -> function)."""
    members: dict[str, object] = dict.fromkeys(Runtime.__annotations__)
    members.update({n: f for n, f in vars(Runtime).items() if inspect.isfunction(f) and not n.startswith("_")})
    return members


def runtime_uses(path: Path) -> set[str]:
    """The attributes a module reads on a runtime: `runtime.X` and `<anything>.runtime.X`."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "runtime") or (
                isinstance(owner, ast.Attribute) and owner.attr == "runtime"
            ):
                used.add(node.attr)
    return used


def test_the_protocol_declares_everything_the_trainer_and_the_step_use_on_a_runtime():
    used = {p.name: runtime_uses(p) for p in sorted((ROOT / "ptrun" / "train").glob("*.py"))}
    everything = set().union(*used.values())
    # The test reads what it claims to read: the step's and the loop's calls are among the uses found.
    assert {"run_step", "sync_and_clip", "zero_grad", "asynchronous", "pause"} <= everything
    assert used["step.py"] and used["trainer.py"]
    undeclared = {name: sorted(attrs - set(protocol_members())) for name, attrs in used.items()}
    assert {name: attrs for name, attrs in undeclared.items() if attrs} == {}


def build(kind, layered) -> object:
    schedule, per_rank, m = KINDS[kind]
    plan = pc.even_plan(len(layered.units), 1, 1, m, schedule, per_rank)
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    builder = Builder(layered, 0, torch.device("cpu"), WeightedLoss(pc.task("vit")), pc.OPTIM, name_of)
    return build_engine(builder, plan)


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.__name__)
def test_every_runtime_kind_has_the_protocols_members_and_trains_through_the_step(kind, one_rank_group):
    layered = pc.model("vit")
    layout = build(kind, layered)
    runtime = layout.runtime
    assert type(runtime) is kind
    for name, declared in protocol_members().items():
        assert hasattr(runtime, name), name
        if declared is not None:
            theirs = list(inspect.signature(getattr(runtime, name)).parameters)
            assert theirs == list(inspect.signature(declared).parameters)[1:], name

    # Each unit is a block of the freeze signal: the step returns each one's gradient norm before the clip.
    block_of = {id(p): u for u in runtime.unit_indices for p in layered.units[u].parameters()}
    scaler = LossScaler.for_precision("fp32")
    parts = StepParts(runtime, layout.optimizer, scaler, pc.OPTIM, pc.CLIP, 4, block_of, len(layered.units))
    before = {n: p.detach().clone() for n, p in layered.model.named_parameters()}
    state, updated, losses = TrainState(), [], []

    def apply_update(item: Step, loss: torch.Tensor | None) -> None:
        nonlocal state
        grads = [[p.grad.double().norm() for p in unit.parameters() if p.grad is not None] for unit in layered.units]
        state, done = train_step(state, item.step / 4, parts, item.step)
        updated.append(item.step)
        losses.append(loss.item())
        assert done.stepped
        torch.testing.assert_close(
            done.block_norms, torch.stack([torch.stack(g).norm() for g in grads]), rtol=1e-6, atol=0
        )

    for t in range(3):
        b = pc.batch("vit", t)
        target = make_target(b, "classification")
        step = Step(t, tuple(b[k] for k in layered.input_names), target, float(loss_weight(target, "classification")))
        assert runtime.run_step(step, apply_update, 1.0, drain=t == 2) is None  # nothing to iterate
    runtime.pause()
    # One update per step, in order, each with its loss; the weights moved.
    assert updated == [0, 1, 2] and state.global_step == 3
    assert all(loss > 0 for loss in losses)
    after = dict(layered.model.named_parameters())
    assert all(not torch.equal(before[n], after[n]) for n in before if after[n].requires_grad)
    assert runtime.take_stash_peak() == (0 if kind is AsyncPipelineRuntime else None)
    layout.groups.destroy()


@pytest.mark.parametrize("segment_ends", [False, True])
@pytest.mark.parametrize("checkpoint", [False, True])
def test_what_falls_after_a_step_is_one_of_four_values_made_once(segment_ends, checkpoint):
    """The loop asks for a step's `Due` before every step: it gets one of four values made at import (no step
    allocates one), which says when the runtime drains and when the checkpoint is written."""
    due = Due.of(segment_ends, checkpoint)
    assert due is Due.of(segment_ends, checkpoint)
    assert (due.segment_ends, due.checkpoint) == (segment_ends, checkpoint)
    assert due.drain == (segment_ends or checkpoint)  # an asynchronous pipeline drains before either
    assert due.checkpoint_now == (checkpoint and not segment_ends)  # at a segment's end: after the decision
