"""`ptrun report` and the TensorBoard writer, on hand-made `metrics.jsonl` files in the documented format.

The runs below are small enough to compute every expected number by hand:
  "base": 4 epochs, never changes layout (one plan event only), top-1 50/70/80/90 at 10/20/30/40 s.
  "fast": freezes before epochs 2 and 3 (K 2 -> 1, DP 1 -> 2), top-1 60/85/92/93 at 10/18/24/30 s; it
          first reaches the baseline's final 90 at epoch 3, 24 s in: speedup 40 / 24.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_ptrun
from helpers import metrics
from helpers.metrics import write_run
from PIL import Image

from ptrun.report import ReportError, find_runs, load_run, write_report
from ptrun.report.figures import (
    layout_figure,
    loss_figure,
    samples_per_s_figure,
    time_to_accuracy_figure,
    timeline_figure,
)
from ptrun.report.summary import _spans, layouts, markdown, summarize, time_to_accuracy, transitions
from ptrun.report.tensorboard import TensorBoardLog


def start(t, **kw):
    return metrics.start(t, num_units=14, **kw)


def plan(t, epoch, frozen, pp, dp, m, transition_s=0.0):
    return metrics.plan(t, epoch, 14, frozen, pp, dp, m, transition_s, schedule="1F1B")


def epoch(t, e, loss, sps, secs, top1):
    evaluation = {"top1": top1, "loss": loss * 1.5} if top1 is not None else {}
    lr, uses = 1e-3 / (e + 1), dict(sample_uses_min=1, sample_uses_max=1)
    return metrics.epoch(t, e, loss, sps, secs, 90, 1437, evaluation, lr=lr, **uses)


BASE = [
    start(1000.0),
    plan(1000.0, 0, 0, 2, 1, 2),
    epoch(1010.0, 0, 2.0, 300.0, 9.0, 50.0),
    epoch(1020.0, 1, 1.0, 320.0, 9.0, 70.0),
    epoch(1030.0, 2, 0.5, 310.0, 9.0, 80.0),
    epoch(1040.0, 3, 0.25, 330.0, 9.0, 90.0),
    {
        "event": "end",
        "time": 1041.0,
        "epochs": 4,
        "total_time_s": 41.0,
        "final_eval": {"top1": 90.0},
        "best_eval": {"top1": 90.0, "epoch": 3},
    },
]
FAST = [
    start(2000.0),
    plan(2000.0, 0, 0, 2, 1, 2),
    epoch(2010.0, 0, 1.8, 300.0, 9.0, 60.0),
    plan(2010.5, 1, 4, 2, 1, 2, transition_s=0.5),
    epoch(2018.0, 1, 0.9, 400.0, 7.0, 85.0),
    plan(2018.25, 2, 8, 1, 2, 1, transition_s=0.25),
    epoch(2024.0, 2, 0.4, 600.0, 5.0, 92.0),
    plan(2024.0, 3, 8, 1, 2, 1),
    epoch(2030.0, 3, 0.2, 640.0, 3.0, 93.0),
    {
        "event": "end",
        "time": 2031.0,
        "epochs": 4,
        "total_time_s": 31.0,
        "final_eval": {"top1": 93.0},
        "best_eval": {"top1": 93.0, "epoch": 3},
    },
]


@pytest.fixture
def two_runs(tmp_path):
    return find_runs([write_run(tmp_path / "base", BASE), write_run(tmp_path / "fast", FAST)])


def lines_by_label(ax) -> dict[str, tuple[list, list]]:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


# ---- reading runs ----------------------------------------------------------------------------------------
def test_load_run_takes_wall_time_from_the_start_event(two_runs):
    base, fast = two_runs
    assert [r.label for r in two_runs] == ["base", "fast"]
    assert [e["wall_s"] for e in base.epochs] == [10.0, 20.0, 30.0, 40.0]
    assert [e["wall_s"] for e in fast.epochs] == [10.0, 18.0, 24.0, 30.0]
    assert base.total_wall_s == 41.0 and base.end is not None
    assert base.plan_for(3)["pp"] == 2 and fast.plan_for(3)["frozen_units"] == 8
    assert base.metric == ("top1", True)


def test_a_resumed_run_counts_both_segments_and_keeps_the_repeated_epoch(tmp_path):
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 2, 1, 2),
        epoch(1010.0, 0, 2.0, 300.0, 9.0, 50.0),
        plan(1010.0, 1, 0, 2, 1, 2),
        epoch(1020.0, 1, 1.5, 100.0, 9.0, 55.0),  # lost: died before its checkpoint
        start(1100.0, resumed_from="step_90"),
        plan(1100.0, 1, 0, 2, 1, 2),
        epoch(1112.0, 1, 1.0, 320.0, 11.0, 70.0),
        {"event": "end", "time": 1113.0, "epochs": 2, "total_time_s": 13.0, "final_eval": {}, "best_eval": {}},
    ]
    run = load_run(write_run(tmp_path / "r", events))
    assert [e["epoch"] for e in run.epochs] == [0, 1]
    assert run.epochs[1]["samples_per_s"] == 320.0
    assert run.epochs[1]["wall_s"] == 20.0 + 12.0  # the first segment ran 20 s, the resumed one 12 s so far
    assert run.total_wall_s == 33.0 and run.segments == 2
    assert summarize(run)["resumes"] == 1


def test_a_torn_last_line_is_skipped_but_other_bad_input_is_an_error(tmp_path):
    run = load_run(write_run(tmp_path / "torn", BASE[:3], tail='{"event": "epo'))
    assert len(run.epochs) == 1 and run.end is None
    bad = write_run(tmp_path / "bad", BASE[:2], tail="not json\n" + json.dumps(BASE[2]) + "\n")
    with pytest.raises(ReportError, match=r"metrics.jsonl:3: not a JSON object"):
        load_run(bad)
    short = write_run(tmp_path / "short", [*BASE[:2], {k: v for k, v in BASE[2].items() if k != "samples_per_s"}])
    with pytest.raises(ReportError, match=r"metrics.jsonl:3: a 'epoch' event without samples_per_s"):
        load_run(short)
    with pytest.raises(ReportError, match=r"a 'plan' event before any 'start' event"):
        load_run(write_run(tmp_path / "headless", BASE[1:]))
    with pytest.raises(ReportError, match=r"no 'start' event"):
        load_run(write_run(tmp_path / "empty", []))


def test_a_sweep_dir_expands_to_its_jobs_in_numeric_order(tmp_path):
    for job in ("0", "1", "2", "10"):
        write_run(tmp_path / "sweep" / job, BASE)
    (tmp_path / "sweep" / "multirun.yaml").write_text("{}\n")
    assert [r.label for r in find_runs([tmp_path / "sweep"])] == ["sweep/0", "sweep/1", "sweep/2", "sweep/10"]


def test_missing_dirs_and_dirs_without_metrics_are_report_errors(tmp_path):
    with pytest.raises(ReportError, match="no such run directory: .*nope"):
        find_runs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no metrics.jsonl in .*empty"):
        find_runs([tmp_path / "empty"])


# ---- summaries -------------------------------------------------------------------------------------------
def test_layouts_and_transitions_follow_the_plan_events(two_runs):
    base, fast = two_runs
    assert [(row.pp, row.dp, row.frozen_units, row.epochs, row.mean_samples_per_s) for row in layouts(fast)] == [
        (2, 1, 0, [1], 300.0),
        (2, 1, 4, [2], 400.0),
        (1, 2, 8, [3, 4], 620.0),
    ]
    assert [(row.epochs, row.mean_samples_per_s) for row in layouts(base)] == [([1, 2, 3, 4], 315.0)]
    tr = transitions(fast)
    assert [(t["epoch"], t["transition_s"]) for t in tr] == [(2, 0.5), (3, 0.25)]
    assert tr[0]["share"] == pytest.approx(0.5 / 6.0)  # mean epoch (9 + 7 + 5 + 3) / 4 = 6 s
    assert transitions(base) == []


def test_a_layout_that_comes_back_lists_its_epoch_spans():
    assert _spans([1, 2, 3, 7]) == "1-3, 7" and _spans([4]) == "4" and _spans([2, 4, 5]) == "2, 4-5"


def test_time_to_accuracy_speedup_against_the_first_run(two_runs):
    tta = time_to_accuracy(two_runs)
    assert tta["metric"] == "top1" and tta["target"] == 90.0
    base, fast = tta["runs"]
    assert (base["epoch"], base["time_s"], base["speedup"]) == (4, 40.0, 1.0)
    assert (fast["epoch"], fast["time_s"]) == (3, 24.0)
    assert fast["speedup"] == pytest.approx(40.0 / 24.0)
    # The other way round: the freezing run's final 93 is never reached by the plain one.
    assert time_to_accuracy(two_runs[::-1])["runs"][1]["speedup"] is None


def test_the_compared_metric_is_the_loss_when_nothing_else_is_logged(tmp_path):
    # Lower is better for the loss: the target is reached at or below it.
    slow = [start(0.0), plan(0.0, 0, 0, 2, 1, 2)] + [
        {**epoch(10.0 * (e + 1), e, 1.0, 300.0, 9.0, None), "eval": {"loss": v}} for e, v in enumerate([3.0, 2.0, 1.0])
    ]
    quick = [start(0.0), plan(0.0, 0, 0, 2, 1, 2)] + [
        {**epoch(5.0 * (e + 1), e, 1.0, 600.0, 4.0, None), "eval": {"loss": v}} for e, v in enumerate([2.5, 0.9])
    ]
    runs = find_runs([write_run(tmp_path / "slow", slow), write_run(tmp_path / "quick", quick)])
    tta = time_to_accuracy(runs)
    assert (tta["metric"], tta["higher_is_better"], tta["target"]) == ("loss", False, 1.0)
    assert [(r["time_s"], r["speedup"]) for r in tta["runs"]] == [(30.0, 1.0), (10.0, 3.0)]


def test_a_glue_score_is_preferred_to_the_loss(tmp_path):
    events = [
        start(0.0),
        plan(0.0, 0, 0, 2, 1, 2),
        {**epoch(10.0, 0, 1.0, 300.0, 9.0, None), "eval": {"loss": 0.5, "accuracy": 80.0, "score": 78.0}},
    ]
    assert load_run(write_run(tmp_path / "glue", events)).metric == ("score", True)


def test_a_change_of_the_cached_prefix_alone_is_a_transition(tmp_path):
    events = [
        start(0.0),
        plan(0.0, 0, 4, 2, 1, 2),
        epoch(10.0, 0, 1.0, 300.0, 9.0, 50.0),
        {**plan(10.2, 1, 4, 2, 1, 2, transition_s=0.2), "cached_units": 3},
        epoch(15.0, 1, 0.5, 500.0, 4.0, 60.0),
    ]
    run = load_run(write_run(tmp_path / "r", events))
    assert [(t["epoch"], t["transition_s"]) for t in transitions(run)] == [(2, 0.2)]
    assert "| K=2 DP=1 M=2 frozen 4 cached 3 | 2 (1) | 500.0 |" in markdown([run], {}, tmp_path)


def test_markdown_has_the_runs_numbers(two_runs, tmp_path):
    text = markdown(two_runs, {}, tmp_path)
    assert "| base | digits_vit | 2 | 4 | top1 90.00 | top1 90.00 (4) | 41.0 | 36.0 | 315.0 | 0: 0.000 |" in text
    assert "| fast | digits_vit | 2 | 4 | top1 93.00 | top1 93.00 (4) | 31.0 | 24.0 | 485.0 | 2: 0.750 |" in text
    assert "| K=1 DP=2 M=1 frozen 8 | 3-4 (2) | 620.0 |" in text
    assert "| 2 | K=2 DP=1 M=2 frozen 0 | K=2 DP=1 M=2 frozen 4 | 0.500 | 8.33% |" in text
    assert "final top1 90.00" in text
    assert "| fast | 3 | 24.0 | 1.67 |" in text and "| base | 4 | 40.0 | 1.00 |" in text


# ---- figures ---------------------------------------------------------------------------------------------
def test_samples_per_s_figure_plots_the_logged_values(two_runs, tmp_path):
    fig = samples_per_s_figure(two_runs, tmp_path / "sps.png")
    lines = lines_by_label(fig.axes[0])
    assert lines["base"] == ([1, 2, 3, 4], [300.0, 320.0, 310.0, 330.0])
    assert lines["fast"] == ([1, 2, 3, 4], [300.0, 400.0, 600.0, 640.0])


def test_layout_figure_follows_the_plan_events(two_runs, tmp_path):
    fig = layout_figure(two_runs, tmp_path / "layout.png")
    top, bottom = (lines_by_label(ax) for ax in fig.axes)
    # x: epochs trained; each layout from its plan event on, the last held to the end of epoch 4
    assert top["fast: frozen units"] == ([0.0, 1.0, 2.0, 3.0, 4.0], [0, 4, 8, 8, 8])
    assert bottom["fast: K"] == ([0.0, 1.0, 2.0, 3.0, 4.0], [2, 2, 1, 1, 1])
    assert bottom["fast: DP"][1] == [1, 1, 2, 2, 2]
    assert bottom["base: K"] == ([0.0, 4.0], [2, 2])  # one plan event holds until the end


def test_layout_figure_draws_changes_inside_an_epoch_where_they_happened(tmp_path):
    """Freezes of 3, 5 and 7 units at steps 30, 45 and 60 of 90 in the first epoch: drawn there, not as 0
    throughout the epoch; the frozen-unit axis ticks whole units."""
    events = [
        start(0.0),
        plan(0.0, 0, 0, 1, 2, 1),
        {**plan(1.0, 0, 3, 1, 2, 1), "step": 30},
        {**plan(2.0, 0, 5, 1, 2, 1), "step": 45},
        {**plan(3.0, 0, 7, 1, 2, 1), "step": 60},
        epoch(5.0, 0, 1.0, 300.0, 5.0, 80.0),
        plan(5.0, 1, 7, 1, 2, 1),
        epoch(9.0, 1, 0.5, 400.0, 4.0, 90.0),
    ]
    run = load_run(write_run(tmp_path / "r", events))
    fig = layout_figure([run], tmp_path / "layout.png")
    top = fig.axes[0]
    xs, ys = lines_by_label(top)["r: frozen units"]
    assert xs == pytest.approx([0.0, 1 / 3, 0.5, 2 / 3, 1.0, 2.0]) and ys == [0, 3, 5, 7, 7, 7]
    assert top.get_lines()[0].get_drawstyle() == "steps-post"
    ticks = [t for t in top.get_yticks() if 0 <= t <= 14]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_loss_figure_plots_train_loss_and_eval(two_runs, tmp_path):
    fig = loss_figure(two_runs, tmp_path / "loss.png")
    left, right = (lines_by_label(ax) for ax in fig.axes)
    assert left["fast"] == ([1, 2, 3, 4], [1.8, 0.9, 0.4, 0.2])
    assert right["base: eval top1"] == ([1, 2, 3, 4], [50.0, 70.0, 80.0, 90.0])


def test_eval_only_at_evaluated_epochs(tmp_path):
    events = [
        start(0.0),
        plan(0.0, 0, 0, 2, 1, 2),
        epoch(5.0, 0, 2.0, 300.0, 5.0, None),
        epoch(10.0, 1, 1.0, 300.0, 5.0, 75.0),
    ]
    run = load_run(write_run(tmp_path / "r", events))
    right = lines_by_label(loss_figure([run], tmp_path / "loss.png").axes[1])
    assert right["r: eval top1"] == ([2], [75.0])


def test_time_to_accuracy_figure_plots_eval_against_wall_time(two_runs, tmp_path):
    fig = time_to_accuracy_figure(two_runs, tmp_path / "tta.png")
    lines = lines_by_label(fig.axes[0])
    assert lines["base (baseline)"] == ([10.0, 20.0, 30.0, 40.0], [50.0, 70.0, 80.0, 90.0])
    assert lines["fast, 1.67x"] == ([10.0, 18.0, 24.0, 30.0], [60.0, 85.0, 92.0, 93.0])


def test_write_report_writes_valid_pngs_and_the_markdown(two_runs, tmp_path):
    written = write_report([tmp_path / "base", tmp_path / "fast"], tmp_path / "out")
    assert set(written) == {"report", "Training throughput", "Layout", "Loss and evaluation", "Time to accuracy"}
    for _title, path in written.items():
        if path.suffix == ".png":
            with Image.open(path) as im:
                im.verify()
            with Image.open(path) as im:
                assert im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100
    text = written["report"].read_text()
    assert "![Time to accuracy](time_to_accuracy.png)" in text and "| fast | 3 | 24.0 | 1.67 |" in text


def test_one_run_has_no_time_to_accuracy_figure(two_runs, tmp_path):
    written = write_report([tmp_path / "base"], tmp_path / "out")
    assert "Time to accuracy" not in written and not (tmp_path / "out" / "time_to_accuracy.png").exists()
    assert "## Time to accuracy" not in written["report"].read_text()


TIMELINE = [  # 2 stages, 2 micro-batches, GPipe-like: all forwards, then all backwards
    {"stage": 0, "microbatch": 0, "kind": "F", "start_s": 100.0, "end_s": 100.1},
    {"stage": 0, "microbatch": 1, "kind": "F", "start_s": 100.1, "end_s": 100.2},
    {"stage": 1, "microbatch": 0, "kind": "F", "start_s": 100.15, "end_s": 100.25},
    {"stage": 1, "microbatch": 0, "kind": "B", "start_s": 100.35, "end_s": 100.55},
    {"stage": 0, "microbatch": 0, "kind": "B", "start_s": 100.6, "end_s": 100.8},
]


def test_timeline_figure_draws_a_bar_per_pass(tmp_path):
    fig = timeline_figure(TIMELINE, tmp_path / "timeline.png")
    bars = fig.axes[0].patches
    assert len(bars) == len(TIMELINE)
    for bar, ev in zip(bars, TIMELINE, strict=True):
        assert bar.get_x() == pytest.approx(ev["start_s"] - 100.0)
        assert bar.get_width() == pytest.approx(ev["end_s"] - ev["start_s"])
        assert bar.get_y() + bar.get_height() / 2 == ev["stage"]
    assert bars[0].get_facecolor() != bars[3].get_facecolor()  # forward and backward look different
    with Image.open(tmp_path / "timeline.png") as im:
        assert im.format == "PNG"


def test_timeline_figure_rejects_bad_events(tmp_path):
    with pytest.raises(ValueError, match="kind must be one of F, B, W"):
        timeline_figure([{**TIMELINE[0], "kind": "X"}], tmp_path / "t.png")
    with pytest.raises(ValueError, match="at least one event"):
        timeline_figure([], tmp_path / "t.png")


# ---- the command line ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: d / "nonexistent", "ptrun: error: no such run directory: {path}"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "ptrun: error: no metrics.jsonl in {path}"),
    ],
    ids=["missing", "no-metrics"],
)
def test_report_cli_errors_are_one_line_exit_2(make, message, tmp_path):
    path = make(tmp_path)
    out = run_ptrun("report", str(path), cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith(message.format(path=path))


@pytest.mark.slow
def test_report_cli_writes_into_the_first_runs_report_dir(tmp_path):
    write_run(tmp_path / "base", BASE)
    write_run(tmp_path / "fast", FAST)
    out = run_ptrun("report", "base", "fast", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == str(Path("base") / "report" / "report.md")
    assert (tmp_path / "base" / "report" / "time_to_accuracy.png").is_file()
    out = run_ptrun("report", "fast", "--out", "elsewhere", cwd=tmp_path)
    assert out.returncode == 0 and (tmp_path / "elsewhere" / "report.md").is_file()
    assert "| fast | digits_vit | 2 | 4 |" in (tmp_path / "elsewhere" / "report.md").read_text()
    (tmp_path / "a_file").write_text("")
    out = run_ptrun("report", "fast", "--out", "a_file", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("ptrun: error: cannot write the report to a_file")
    assert len(out.stderr.splitlines()) == 1


# ---- TensorBoard -----------------------------------------------------------------------------------------
def test_tensorboard_scalars_read_back_equal_the_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = [
        {**e, "cache": {"hits": 10 * e["epoch"], "cached_units": 3}} if e["event"] == "epoch" else e for e in FAST
    ]
    with TensorBoardLog(tmp_path) as tb:
        for ev in events:
            tb.write(ev["event"], **{k: v for k, v in ev.items() if k != "event"})
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()

    def series(tag):  # (steps, values); TensorBoard stores float32, so values compare approximately
        return [s.step for s in acc.Scalars(tag)], pytest.approx([s.value for s in acc.Scalars(tag)], rel=1e-6)

    assert series("train/loss") == ([1, 2, 3, 4], [1.8, 0.9, 0.4, 0.2])
    assert series("train/samples_per_s") == ([1, 2, 3, 4], [300.0, 400.0, 600.0, 640.0])
    assert series("train/lr") == ([1, 2, 3, 4], [1e-3, 1e-3 / 2, 1e-3 / 3, 1e-3 / 4])
    assert series("eval/top1") == ([1, 2, 3, 4], [60.0, 85.0, 92.0, 93.0])
    assert series("eval/loss") == ([1, 2, 3, 4], [2.7, 1.35, 0.6, 0.3])
    assert series("layout/K") == ([1, 2, 3, 4], [2, 2, 1, 1])
    assert series("layout/DP") == ([1, 2, 3, 4], [1, 1, 2, 2])
    assert series("layout/frozen_units") == ([1, 2, 3, 4], [0, 4, 8, 8])
    assert series("layout/transition_s") == ([1, 2, 3, 4], [0.0, 0.5, 0.25, 0.0])
    assert series("cache/hits") == ([1, 2, 3, 4], [0, 10, 20, 30])
    assert series("run/total_time_s") == ([4], [31.0])
    assert [s.wall_time for s in acc.Scalars("train/loss")] == [2010.0, 2018.0, 2024.0, 2030.0]


# ---- the paper beside the run --------------------------------------------------------------------------------

PAPER = {
    "setup": "ViT-B/16 on CIFAR-100 (Table 1)",
    "metric": "top1",
    "baseline": 91.21,
    "result": 91.33,
    "baseline_time": "35m06s",
    "time": "12m23s",
    "speedup": 2.44,
    "gpus": 16,
    "epochs": 10,
}


def with_config(run_dir: Path, freeze: bool, paper: dict | None = PAPER) -> Path:
    import yaml

    config = {"recipe": "vit_cifar100", "auto": {"freeze": freeze}, "train": {"epochs": 4, "max_steps_per_epoch": None}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**config, "paper": paper or {}}))
    return run_dir


def test_a_paper_run_is_set_beside_the_papers_numbers_and_a_freezing_off_run(tmp_path):
    from ptrun.report.paper import paper_lines

    fast = with_config(write_run(tmp_path / "fast", FAST), freeze=True)
    base = with_config(write_run(tmp_path / "base", BASE), freeze=False)
    alone = paper_lines(find_runs([fast]))
    assert alone == [
        "paper (ViT-B/16 on CIFAR-100 (Table 1)): baseline top1 91.21 in 35m06s, PipeTransformer top1 "
        "91.33 in 12m23s, 2.44x",
        "this run (fast): top1 93.00 in 31s wall time",
        "not the paper's setup, so not its experiment: 2 workers (the paper: 16 GPUs); 4 epochs (the paper: 10)",
    ]
    for order in ([fast, base], [base, fast]):  # the freezing-off run is found by its config, in either place
        lines = paper_lines(find_runs(order))
        assert (
            lines[2]
            == ("speedup over the freezing-off run (base: 41s, top1 90.00): 1.32x in wall time (the paper: 2.44x)")
            and len(lines) == 4
        )
    assert "## The paper" in markdown(find_runs([fast, base]), {}, tmp_path)
    assert paper_lines(find_runs([with_config(write_run(tmp_path / "own", FAST), True, paper=None)])) == []
