"""Compiled units (`train.compile`): compiled and eager training agree, identical units share their compiled
code, a freeze compiles its new variants in the transition and none after it, frozen units get no gradient and
run no backward graph, a unit kind that cannot compile runs eager with one line, and the start says what
compiling cost. One process on a real one-rank gloo group; the pipelines run in test_compiled_dist.py.

Compiling is slow on 2 CPU cores (about a minute a model with a cold cache): these tests are `slow`, use the
smallest models, and share inductor's on-disk cache (~/.cache/ptrun/torchinductor) with every other run."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace

import pipeline_cases as pc
import pytest
import torch
from conftest import TINY, compose_config, final_params, run_ptrun, write_config

from ptrun.auto.autodp import Builder, build_engine, change_engine
from ptrun.compiling.compiler import UnitCompiler
from ptrun.layout.plan import Plan
from ptrun.models.losses import WeightedLoss, make_target

STEPS, FREEZE_AT, FROZEN = 20, 10, 3  # the embedding and the first block freeze in place at step 10


def train(kind: str, compiled: bool, steps: int = STEPS, profile_step: int | None = None):
    """`steps` AdamW steps of `kind` at K = 1 on one rank, the first FROZEN units frozen in place before step
    FREEZE_AT. Returns the losses, the compiler (None eager), its counts before and after the transition, the
    frozen parameters' gradients after every step from the freeze on, and the profiler of `profile_step`."""
    layered = pc.model(kind)
    name_of = {id(p): n for n, p in layered.model.named_parameters()}
    compiler = UnitCompiler("default", layered) if compiled else None
    builder = Builder(
        layered, 0, torch.device("cpu"), WeightedLoss(pc.task(kind)), pc.OPTIM, name_of, compiler=compiler
    )
    n = len(layered.units)
    plan = Plan(num_units=n, frozen_units=0, pp=1, dp=1, stage_bounds=((0, n),), microbatches=1, schedule="GPipe")
    layout = build_engine(builder, plan)
    losses, frozen_grads, counts, prof = [], [], [], None
    for step in range(steps):
        if step == FREEZE_AT:
            counts.append(compiler.counts.snapshot() if compiler else None)
            layout = change_engine(builder, layout, replace(plan, frozen_units=FROZEN))
            counts.append(compiler.counts.snapshot() if compiler else None)
        b = pc.batch(kind, step)
        inputs = tuple(b[k] for k in layered.input_names if k in b)
        with torch.profiler.profile() if step == profile_step else contextlib.nullcontext() as profiler:
            loss = layout.runtime.forward_backward(inputs, make_target(b, pc.task(kind)), float(b["weight"].sum()))
        prof = profiler or prof
        if step >= FREEZE_AT:
            frozen_grads += [p.grad for u in layered.units[:FROZEN] for p in u.parameters()]
        layout.runtime.sync_and_clip(pc.CLIP)
        layout.optimizer.step()
        layout.runtime.zero_grad()
        losses.append(loss.item())
    return losses, compiler, counts, frozen_grads, prof


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bert", "vit", "llama_lm"], ids=["encoder", "vit", "decoder"])
def test_compiled_and_eager_losses_agree_and_a_freeze_recompiles_nothing_after_it(kind, one_rank_group):
    """20 steps with a freeze in place at step 10: compiled and eager losses agree within 1e-4 relative at
    every step; the frozen parameters never get a gradient; the first layout of the 4-block model compiled
    fewer graphs than it has units (identical units share theirs, whatever the depth), the freeze's transition
    compiled its new variants (at most a no-grad one a unit shape, and one for the first trained unit), and no
    step after it compiled anything."""
    eager, _, _, _, _ = train(kind, compiled=False)
    losses, compiler, (before, after), frozen_grads, _ = train(kind, compiled=True)
    assert losses == pytest.approx(eager, rel=1e-4), (losses, eager)
    assert frozen_grads and all(g is None for g in frozen_grads)
    assert compiler.kinds and not compiler.eager_kinds
    assert 0 < before["compiles"] < len(compiler.layered.units), before
    assert after["compiles"] > before["compiles"]  # the frozen variants, compiled in the transition
    assert compiler.counts.snapshot() == after  # the steps after the transition compiled nothing
    # Each unit shape (a class, and for a half which of its blocks' parts it runs; the first-token tail's halves
    # their own) compiled its trained variant in the first layout; after the freeze it has at most a no-grad one
    # more (frozen units, evaluation), and the first trained unit one whose input takes no gradient.
    assert after["compiles"] <= 2 * before["compiles"] + 1, (before, after)


@pytest.mark.slow
def test_frozen_units_run_no_backward_graph(one_rank_group):
    """A profiled step after the freeze runs one compiled backward graph per trained unit: none for the
    frozen units (before it, one per unit)."""
    *_, before = train("bert", compiled=True, steps=FREEZE_AT, profile_step=FREEZE_AT - 1)
    *_, after = train("bert", compiled=True, steps=FREEZE_AT + 2, profile_step=FREEZE_AT + 1)
    units = len(pc.model("bert").units)

    def backward_graphs(prof) -> int:
        return sum(e.count for e in prof.key_averages() if e.key == "CompiledFunctionBackward")

    assert backward_graphs(before) == units
    assert backward_graphs(after) == units - FROZEN


@pytest.mark.slow
def test_a_unit_kind_past_the_recompile_limit_runs_eager_with_one_line(one_rank_group, caplog):
    """With dynamo's recompile limit at 1, the attention half's second variant (the classification tail's one
    row) cannot compile: one line names the unit, its kind runs eager, and training goes on to the same
    losses as eager."""
    import torch._dynamo

    eager, _, _, _, _ = train("bert", compiled=False, steps=3)
    torch._dynamo.reset()  # the other tests' variants of these units would count against the limit
    try:
        with (
            torch._dynamo.config.patch(recompile_limit=1),
            caplog.at_level(logging.WARNING, "ptrun.compiling.compiler"),
        ):
            losses, compiler, _, _, _ = train("bert", compiled=True, steps=3)
    finally:
        torch._dynamo.reset()
    lines = [r.getMessage() for r in caplog.records if r.name == "ptrun.compiling.compiler"]
    assert any(
        line.startswith(
            "train.compile: unit block.3.attn (AttnHalf) hit dynamo's recompile limit; "
            "AttnHalf units run eager from here"
        )
        for line in lines
    ), lines
    assert "AttnHalf" in compiler.eager_kinds
    assert losses == pytest.approx(eager, rel=1e-4)


@pytest.mark.slow
def test_a_compiled_trainer_says_what_compiling_cost_and_counts_it_per_epoch(tmp_path, one_rank_group, capsys):
    """A trainer with `train.compile=true` compiles its first layout before its first step and says so after
    the start line (`compiled N unit kinds in X s (Y of Z graphs from cache)`); a freeze's transition (with
    AutoCache serving the frozen prefix) says what compiling its variants cost, and the epoch event counts what
    each epoch compiled: nothing in the epoch and the evaluation after that transition. `train.profile_step`
    profiles compiled steps; checkpoint keys are the library model's, as without compiling."""
    from ptrun.train.trainer import Trainer

    # a one-rank trainer's overrides, spelled out like every in-process trainer's (test_cache.py's too)
    cfg = compose_config(
        TINY
        + [
            "launcher.nproc_per_node=1",
            "train.compile=true",
            "train.max_steps_per_epoch=4",
            "train.epochs=2",
            "auto.cache=true",
            "train.profile_step=1",
        ],
        tmp_path / "run",
    )
    write_config(cfg)  # the run directory the metrics go to
    trainer = Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)
    try:
        trainer.record.announce(
            trainer.layered, trainer.data, 1, trainer.device, trainer.plan, trainer.in_use.builder.compiler
        )
        shown = capsys.readouterr().out
        kinds = len({type(unit) for unit in trainer.layered.units})  # ViT: embedding, block half, head
        assert f"compiled {kinds} unit kinds in " in shown and " graphs from cache)" in shown, shown
        assert trainer.train_epoch()["steps"] == 4
        trainer.evaluate()
        trainer._move_to(replace(trainer.plan, frozen_units=3, cached_units=3), 0, announce=False)
        assert ", compiling " in capsys.readouterr().out
        assert trainer.in_use.engine.compiled["compile_s"] > 0 and trainer.in_use.engine.compiled["recompiles"] > 0
        trainer.in_use.builder.compiler.epoch_fields()  # the counts start again here
        trainer.train_epoch()
        trainer.evaluate()
        assert trainer.in_use.builder.compiler.epoch_fields()["compile"]["compiles"] == 0
        served = trainer.cache.take_stats("train")
        assert served["hits"] + served["computed"] > 0, served  # the steps read the cached prefix's output
        trainer.save_checkpoint()
        trainer.record.traces.close()
    finally:
        trainer._release_cache()
        trainer.close()
    assert (tmp_path / "run" / "profile" / "rank0.txt").is_file()  # train.profile_step, compiled
    names = final_params(tmp_path / "run").keys()
    assert names == dict(trainer.layered.model.named_parameters()).keys()
    assert not any("_orig_mod" in n for n in names)


def test_compile_true_without_a_c_compiler_is_one_line_before_any_worker(tmp_path):
    """Inductor builds with a C++ compiler: `train.compile=true` on a machine without one is refused; `auto`
    there runs eager (checked by the rule itself: no worker is started for it)."""
    import sys
    from pathlib import Path

    from ptrun.config.training import c_compiler

    bare = {"PATH": str(Path(sys.executable).parent), "CXX": "", "CC": ""}
    out = run_ptrun("train", "train.compile=true", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=bare)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "ptrun: error: train.compile='true' is not allowed: true only where inductor can build, and no C compiler "
        "was found ($CXX, $CC, g++, c++, clang++, gcc, cc, clang): install one, or leave it auto"
    ], out.stderr
    assert not (tmp_path / "run").exists()
    assert c_compiler(bare) is None and c_compiler() is not None


def test_the_compile_benchmark_tables_medians_and_ratios_against_eager():
    """`benchmarks.compiled`: per workload, the eager, cold and warm runs' medians over the rounds, each
    ratio against its own round's eager run, in one table per workload under one caption."""
    from benchmarks import compiled as bench
    from benchmarks.harness import label_rows

    def rnd(eager: float, cold: float, warm: float) -> list[dict]:
        rows = [
            {"label": label, "wall_s": wall, "train_time_s": wall - 10, "compile_s": wall - eager, "final_top1": 95.0}
            for label, wall in zip(bench.RUNS, (eager, cold, warm), strict=True)
        ]
        for row in rows:
            row["wall_ratio"] = rows[0]["wall_s"] / row["wall_s"]
            row["train_ratio"] = rows[0]["train_time_s"] / row["train_time_s"]
        return rows

    rows = label_rows([rnd(40.0, 80.0, 50.0), rnd(44.0, 88.0, 44.0)], bench.KEYS)
    assert [r["label"] for r in rows] == ["eager", "compiled, cold cache", "compiled, warm cache"]
    assert rows[1]["wall_ratio"] == pytest.approx(0.5) and rows[2]["wall_ratio_range"] == pytest.approx([0.8, 1.0])
    result = {"machine": "2 CPU cores", "repeats": {"digits_vit": 2}, "workloads": {"digits_vit": rows}}
    assert bench.caption(result).startswith(
        "Compiled units against eager, 2 CPU cores: rounds per workload (digits_vit 2)"
    )
    table = bench.table(result).splitlines()
    assert table[0].startswith("| digits_vit | wall (s) | training (s) | compiling (s) |")
    assert table[3].startswith("| compiled, cold cache | 84.0 (80.0-88.0) |") and "0.50x (0.50-0.50)" in table[3]
