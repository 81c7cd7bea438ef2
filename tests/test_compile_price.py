"""`train.compile=auto` decides by what compiling saves against what it costs: the pure decision on stubbed
step and compile timings (a long run compiles, a short one does not, a warm cache is cheap, `true` and
`false` force it, the line names its figures), the measurements kept on disk that feed it, the variants a
layout needs, and a real run whose decision line matches what it did."""

from __future__ import annotations

import json
from dataclasses import replace

import pipeline_cases as pc
import pytest
from conftest import run_events, run_ptrun
from test_cache_entries import DAMAGES, damage, said

from ptrun.compiling.compiler import variants
from ptrun.compiling.kept_costs import KEPT_STEPS, KeptCosts
from ptrun.compiling.price import DEFAULT_GRAPH_S, DEFAULT_SAVING, MARGIN, CompileFigures, decide
from ptrun.layout.plan import Plan

# A 70 ms eager step that compiling makes 20% faster; 15 graphs at 2 s cold and 0.2 s warm: 30 s cold, 3 s warm.
STUB = CompileFigures(steps=0, step_s=0.07, graphs=15, cached=0, cold_s=2.0, warm_s=0.2, saving=0.2)


def test_auto_compiles_a_long_run_and_skips_a_short_one():
    """At 14 ms saved a step, 30 s of cold compiling pays after ~2,100 steps; with the margin, from ~3,200."""
    short, long = replace(STUB, steps=100), replace(STUB, steps=10_000)
    assert not decide("auto", short).compile
    assert decide("auto", long).compile
    threshold = MARGIN * 30.0 / (0.07 * 0.2)
    assert not decide("auto", replace(STUB, steps=int(threshold) - 10)).compile
    assert decide("auto", replace(STUB, steps=int(threshold) + 10)).compile


def test_a_warm_cache_is_cheap():
    """The same 500 steps (7 s saved) do not pay for 15 cold graphs (30 s) but do for 15 cached ones (3 s);
    with part of them cached, only the rest cost a build."""
    run = replace(STUB, steps=2500)
    assert not decide("auto", run).compile
    warm = decide("auto", replace(run, cached=15))
    assert warm.compile and warm.figures.compile_s == pytest.approx(3.0)
    assert replace(run, cached=10).compile_s == pytest.approx(5 * 2.0 + 10 * 0.2)


def test_the_decision_line_names_its_figures():
    assert decide("auto", replace(STUB, steps=100)).line == (
        "compile: off (trains ~7 s, saves ~1.4 s at the default rate; 15 cold graphs ~30 s)"
    )
    measured = replace(STUB, steps=10_000, cached=15, saving_measured=True)
    assert decide("auto", measured).line == "compile: on (trains ~700 s, saves ~140 s; 15 cached graphs ~3 s)"
    assert decide("auto", replace(STUB, steps=2500, cached=10)).line == (
        "compile: on (trains ~175 s, saves ~35 s at the default rate; 15 graphs, 10 cached, ~12 s)"
    )
    waiting = decide("auto", replace(STUB, steps=10_000, step_s=None))
    assert not waiting.compile and waiting.line == "compile: off until the first steps are timed (15 cold graphs ~30 s)"
    nothing = decide("auto", replace(STUB, steps=10_000, step_s=None, saving=0.0))  # no step time would pay
    assert nothing.line == "compile: off (a compiled step saves nothing at the default rate; 15 cold graphs ~30 s)"


def test_true_and_false_force_it_and_auto_obeys_what_rules_compiling_out():
    """`true` compiles a run it would not pay for (a short one, a CPU's zero saving), `false` skips one it
    would; `auto` stays eager where compiling is ruled out, whatever it would save."""
    short = replace(STUB, steps=10, saving=0.0)
    forced = decide(True, short)
    assert forced.compile and forced.forced and forced.line == "compile: on (train.compile=true; 15 cold graphs ~30 s)"
    assert not decide(False, replace(STUB, steps=10**6)).compile
    ruled = decide("auto", replace(STUB, steps=10**6), why_not="no C compiler for inductor")
    assert not ruled.compile and ruled.line == "compile: off (no C compiler for inductor)"
    slower = replace(STUB, steps=10**6, saving=-0.05, cached=15, saving_measured=True)  # never worth it
    assert decide("auto", slower).line == (
        "compile: off (trains ~70000 s, compiled steps take ~3500 s more; 15 cached graphs ~3 s)"
    )


def test_kept_costs_replace_the_defaults_and_count_the_cache_entries_still_there(tmp_path):
    """A run's compile (all cold) gives the per-graph seconds and the model's graphs and entries; its step
    times (eager, then compiled) the measured saving; the next read of the file gives them back, and counts as
    cached the share of the entries inductor's cache still holds."""
    import torch

    cpu = torch.device("cpu")
    kept = KeptCosts(cpu, "default", root=tmp_path)
    fresh = kept.figures("m", steps=100, step_s=0.1, graphs=12, present=set())
    assert (fresh.cold_s, fresh.warm_s) == DEFAULT_GRAPH_S["cpu"] and fresh.saving == DEFAULT_SAVING["cpu"]
    assert fresh.graphs == 12 and fresh.cached == 0 and not fresh.saving_measured
    entries = {f"ab/ab{i}" for i in range(10)}
    kept.learn_compile("m", {"graphs": 10, "graphs_from_cache": 0, "compile_s": 25.0}, entries)
    kept.learn_step("m", compiled=False, step_s=0.1)
    kept.learn_step("m", compiled=True, step_s=0.08)
    kept.save()

    again = KeptCosts(cpu, "default", root=tmp_path)
    figures = again.figures("m", steps=100, step_s=None, graphs=12, present=entries)
    assert figures.graphs == 10 and figures.cached == 10 and figures.cold_s == pytest.approx(2.5)
    assert figures.step_s == pytest.approx(0.1)  # the kept eager step, where the run knows none yet
    assert figures.saving == pytest.approx(0.2) and figures.saving_measured
    assert again.figures("m", 100, 0.1, 12, present=set(list(entries)[:4])).cached == 4  # 6 evicted
    assert again.figures("other", 100, 0.1, 12, present=entries).cached == 0  # another model's graphs
    again.learn_compile("m", {"graphs": 10, "graphs_from_cache": 10, "compile_s": 3.0}, set())
    assert again.graph_s() == (pytest.approx(2.5), pytest.approx(0.3))
    # mostly built, one found in the cache (another worker's): that one at the warm figure
    again.learn_compile("m", {"graphs": 10, "graphs_from_cache": 1, "compile_s": 18.3}, set())
    assert again.graph_s() == (pytest.approx(2.0), pytest.approx(0.3))
    # mostly cached, two built at the cold figure
    again.learn_compile("m", {"graphs": 10, "graphs_from_cache": 8, "compile_s": 5.6}, set())
    assert again.graph_s() == (pytest.approx(2.0), pytest.approx(0.2))
    (tmp_path / again.path.name).write_text("{not json")
    assert KeptCosts(cpu, "default", root=tmp_path).graph_s() == DEFAULT_GRAPH_S["cpu"]  # unusable: defaults


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_costs_file_is_reported_in_one_line_and_relearned_as_from_a_clean_cache(tmp_path, caplog, how):
    """A file with bytes flipped, cut short, or replaced by another compile mode's file: one line naming it,
    the defaults a clean cache gives, and after the run's measurements the same file a clean cache ends with."""
    import torch

    cpu = torch.device("cpu")

    def one_run(root):
        kept = KeptCosts(cpu, "default", root=root)
        figures = kept.figures("m", steps=100, step_s=0.1, graphs=12, present=set())
        kept.learn_compile("m", {"graphs": 10, "graphs_from_cache": 0, "compile_s": 25.0}, {"ab/ab1"})
        kept.learn_step("m", compiled=False, step_s=0.1)
        kept.save()
        return figures, json.loads(kept.path.read_text())

    clean = one_run(tmp_path / "clean")
    damaged = tmp_path / "damaged"
    one_run(damaged)
    other = KeptCosts(cpu, "max-autotune", root=damaged)
    other.learn_step("m", compiled=True, step_s=0.5)
    other.save()
    path = KeptCosts(cpu, "default", root=damaged).path
    damage(path, how, other.path)
    caplog.clear()
    assert one_run(damaged) == clean
    (line,) = said(caplog, path)
    assert line.startswith(f"compile costs {path} is unusable: ")
    assert line.endswith("; starting from the defaults, measured again by this run")
    caplog.clear()
    assert KeptCosts(cpu, "default", root=damaged).model("m") == clean[1]["models"]["m"]  # whole again
    assert said(caplog, path) == []


def test_a_saving_counts_only_where_every_pair_of_kept_step_times_shows_it(tmp_path):
    """Step times of the same layout from different runs on a shared machine differ by up to a tenth: the
    saving kept is the least any eager and compiled pair shows. These are the figures two rounds of the
    benchmark measured for digits_vit on 2 CPU cores: the second round's pair alone showed a 12% saving (and its
    auto run compiled, to train 13% slower); with the first round's pair as well none shows, and a 30-epoch run
    stays eager. A layout whose compiled steps are faster in every pair compiles; only the last `KEPT_STEPS`
    of each kind count."""
    import torch

    kept = KeptCosts(torch.device("cpu"), "default", root=tmp_path)
    kept.data["graph_s"] = {"cold": 4.0, "warm": 0.3}
    for eager, compiled in ((0.02604, 0.02869), (0.0284, 0.02498)):
        kept.learn_step("vit", compiled=False, step_s=eager)
        kept.learn_step("vit", compiled=True, step_s=compiled)
    figures = kept.figures("vit", steps=2700, step_s=None, graphs=12, present=set())
    assert figures.saving == pytest.approx(1 - 0.02869 / 0.02604) and figures.saving_measured
    assert figures.step_s == pytest.approx((0.02604 + 0.0284) / 2)  # the kept eager steps' median
    assert not decide("auto", replace(figures, cached=12)).compile
    kept.data["models"]["vit"] = {}
    kept.learn_step("vit", compiled=False, step_s=0.0284)
    kept.learn_step("vit", compiled=True, step_s=0.02498)
    assert kept.saving("vit") == (pytest.approx(1 - 0.02498 / 0.0284), True)  # the one pair, as it stands

    for i in range(KEPT_STEPS + 2):
        kept.learn_step("bert", compiled=False, step_s=0.1 + i)
        kept.learn_step("bert", compiled=True, step_s=0.05 + i * 1e-3)
    steps = kept.model("bert")
    assert len(steps["eager_steps_s"]) == len(steps["compiled_steps_s"]) == KEPT_STEPS
    assert min(steps["eager_steps_s"]) == pytest.approx(2.1)  # the two oldest are gone
    fast = kept.figures("bert", steps=10_000, step_s=0.1, graphs=12, present=set())
    assert fast.saving == pytest.approx(1 - 0.056 / 2.1) and decide("auto", fast).compile


def test_a_layout_needs_a_trained_variant_a_unit_shape_and_a_freeze_adds_few():
    """The 4-block ViT: four unit shapes (embedding, attention half, MLP half, head), each trained (forward
    and backward) and no-grad (evaluation): 12 graphs; freezing 3 units adds only the first trained unit's
    variant (its input takes no gradient), 2 graphs, and a cached prefix runs none of its own."""
    layered = pc.model("vit")
    n = len(layered.units)
    plan = Plan(num_units=n, frozen_units=0, pp=1, dp=1, stage_bounds=((0, n),), microbatches=1, schedule="GPipe")
    first = variants(layered, plan)
    assert sum(first.values()) == 12 and len({shape for shape, _ in first}) == 4
    frozen = variants(layered, replace(plan, frozen_units=3))
    assert sum(g for v, g in frozen.items() if v not in first) == 2
    cached = variants(layered, replace(plan, frozen_units=3, cached_units=3))
    assert set(cached) <= set(frozen)


@pytest.mark.slow  # two whole `ptrun train` runs
def test_a_run_says_its_decision_and_does_what_it_says(tmp_path):
    """`train.compile=auto` on the CPU, where a compiled step saves nothing by default: the run decides at its
    start, with no step time known, and says so; the `compile` event carries the same decision, no unit was
    compiled, and the eager step time it measured is kept, so the next run of the model prices its training
    too."""
    costs = tmp_path / "costs"
    args = ["train.max_steps_per_epoch=16", "train.epochs=2", "launcher.nproc_per_node=1", "train.export=false"]
    env = {"PTRUN_COMPILE_COSTS_DIR": str(costs)}
    out = run_ptrun("train", *args, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("compile: ")]
    assert lines == ["compile: off (a compiled step saves nothing at the default rate; 12 cold graphs ~28 s)"]
    assert "unit kinds in" not in out.stdout  # nothing compiled
    decisions = [e["compile_decision"] for e in run_events(tmp_path / "run", "compile")]
    assert [d["compile"] for d in decisions] == [False] and decisions[0]["step_s"] is None
    assert decisions[0]["steps"] == 32 and decisions[0]["graphs"] == 12
    kept = [json.loads(p.read_text()) for p in costs.glob("*.json")]
    assert len(kept) == 1 and [len(m["eager_steps_s"]) for m in kept[0]["models"].values()] == [1]

    again = run_ptrun("train", *args, f"hydra.run.dir={tmp_path / 'again'}", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    lines = [line for line in again.stdout.splitlines() if line.startswith("compile: ")]
    assert len(lines) == 1 and lines[0].startswith("compile: off (trains ~") and "saves ~0.0 s at the" in lines[0]
    decisions = [e["compile_decision"] for e in run_events(tmp_path / "again", "compile")]
    assert decisions[0]["step_s"] == pytest.approx(next(iter(kept[0]["models"].values()))["eager_steps_s"][0])


def test_the_auto_benchmark_sets_auto_against_the_better_of_false_and_true_on_its_cache_state():
    """`benchmarks.compile_auto`: per round and cache state, auto's wall time over the better of false and true;
    medians over the rounds in one table per workload, with what auto chose; the verdict per cache state."""
    from benchmarks import compile_auto as bench
    from benchmarks.harness import label_rows

    def rnd(walls: dict[tuple[str, str], float], chose: str) -> list[dict]:
        rows = [
            {"label": f"{state}, {setting}", "state": state, "setting": setting, "wall_s": wall, "train_time_s": 10.0}
            for (state, setting), wall in walls.items()
        ]
        for row in rows:
            row.update({"compile_s": 0.0, "final_top1": 90.0}, **({"chose": chose} if row["setting"] == "auto" else {}))
        return bench.against_best(rows)

    walls = {
        (s, x): w
        for s, ws in (("cold", (40.0, 80.0, 41.0)), ("warm", (40.0, 36.0, 37.0)))
        for x, w in zip(bench.SETTINGS, ws, strict=True)
    }
    first = rnd(walls, "off")
    assert first[2]["auto_vs_best"] == pytest.approx(41.0 / 40.0)  # cold: eager was the better one
    assert first[5]["auto_vs_best"] == pytest.approx(37.0 / 36.0)  # warm: compiled was
    second = rnd({**walls, ("warm", "auto"): 40.0}, "on at epoch 2, step 1")
    rows = label_rows([first, second], bench.KEYS)
    for row in rows:
        row["state"] = row["runs"][0]["state"]
    result = {"machine": "2 CPU cores", "repeats": {"digits_vit": 2}, "workloads": {"digits_vit": rows}}
    assert bench.verdicts(result["workloads"]) == {"digits_vit, cold": True, "digits_vit, warm": False}
    table = bench.table(result).splitlines()
    assert table[0].startswith("| digits_vit | wall (s) | training (s) | compiling (s) | final top-1 | auto chose |")
    warm_auto = next(line for line in table if line.startswith("| warm, auto |"))
    assert "| off, on at epoch 2, step 1 |" in warm_auto and "1.069x (1.028-1.111)" in warm_auto
    assert bench.caption(result).startswith("train.compile=auto against false and true, 2 CPU cores")


@pytest.mark.slow
def test_auto_that_waited_for_its_first_steps_compiles_its_layout_in_place_where_it_pays(
    tmp_path, one_rank_group, monkeypatch, capsys
):
    """A run of `auto` that knows no step time starts eager (here at a GPU's default saving: a compiled step
    saving nothing, as on the CPU, is decided at once); where this machine has measured a compiled step
    and a graph as all but free, its first timed steps price compiling as paying, and at the next decision
    point (after its first 10 steps, mid-epoch) the layout is built again compiled and says so: the steps from
    there run compiled units, to the losses of an eager run (the optimizer's state and every value kept), and
    once they are timed their step time and what the compile took are kept for the next run. A freeze's
    transition then prices only its new variant (the first trained unit's, 2 graphs) at the saving measured:
    compiled on where graphs are cheap, the next one's new layout eager where they are not."""
    import torch
    from conftest import TINY, compose_config, write_config

    from ptrun.train.trainer import Trainer

    monkeypatch.setitem(DEFAULT_SAVING, "cpu", DEFAULT_SAVING["cuda"])

    def run(setting: str):
        monkeypatch.setenv("PTRUN_COMPILE_COSTS_DIR", str(tmp_path / setting / "costs"))  # the eager run's its own
        overrides = [f"train.compile={setting}", "train.max_steps_per_epoch=16", "train.epochs=3"]
        cfg = compose_config(TINY + ["launcher.nproc_per_node=1", "train.export=false", *overrides], tmp_path / setting)
        write_config(cfg)
        trainer = Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)
        try:
            compiling = trainer.in_use.compiling
            if setting == "auto":
                assert compiling.pending and trainer.in_use.builder.compiler is None
                compiling.kept.data["graph_s"] = {"cold": 1e-4, "warm": 1e-4}
                compiling.kept.data["models"][compiling.key(trainer.plan)] = {"compiled_steps_s": [1e-6]}
            trainer.fit()
            losses = [e["train_loss"] for e in run_events(tmp_path / setting, "epoch")]
            return losses, trainer, run_events(tmp_path / setting, "compile")
        finally:
            trainer.close()

    eager, _, none = run("false")
    losses, trainer, decisions = run("auto")
    compiler = trainer.in_use.builder.compiler
    assert none == [] and [d["compile_decision"]["compile"] for d in decisions] == [False, True]
    assert (decisions[1]["epoch"], decisions[1]["step"]) == (0, 10) and decisions[1]["compiled_s"] > 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("compile: ")]
    assert lines[0].startswith("compile: off until the first steps are timed (12 cold graphs ~28 s)"), lines
    assert lines[1].startswith("compile: on (trains ~") and "; 12 cold graphs ~0.0 s); compiled in " in lines[1]
    assert compiler is not None and compiler.kinds and not compiler.eager_kinds
    assert losses == pytest.approx(eager, rel=1e-4)
    compiling = trainer.in_use.compiling
    kept = compiling.kept.model(compiling.key(trainer.plan))
    assert kept["compiled_steps_s"][-1] > 1e-6 and kept["eager_steps_s"][-1] > 0 and kept["graphs"] > 0, kept

    frozen = replace(trainer.plan, frozen_units=3)
    builder, priced = compiling.at_transition(trainer.in_use.builder, frozen, 10_000, 0.05)
    assert priced.compile and builder.compiler is compiler and (priced.figures.graphs, priced.figures.cached) == (2, 0)
    compiling.kept.data["graph_s"] = {"cold": 1e6, "warm": 1e6}  # the next freeze's new variant: the MLP half's
    builder, priced = compiling.at_transition(builder, replace(frozen, frozen_units=4), 10_000, 0.05)
    assert not priced.compile and builder.compiler is None
    assert priced.line.startswith("compile: off (trains ~") and priced.line.endswith("; 2 cold graphs ~2000000 s)")
