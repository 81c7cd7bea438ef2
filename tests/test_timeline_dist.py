"""A profiled step's pipeline timeline: real passes recorded on each stage and drawn as a Gantt chart; and the
same run's torch.profiler trace of its steps (`train.profile_step`), per rank."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, run_workers
from PIL import Image

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers


def test_a_profiled_1f1b_step_records_each_pass_in_causal_order_and_is_drawn(tmp_path):
    run = tmp_path / "run"
    run_workers(
        [
            *TINY,
            "pipe.length=2",
            "pipe.microbatches=4",
            "pipe.schedule=1F1B",
            "train.epochs=1",
            "train.max_steps_per_epoch=3",
            "train.timeline_step=1",
            "train.profile_step=1",
            "checkpoint.every_epochs=0",
            "train.export=false",
        ],
        run,
    )
    # The profile: steps 1-2 (the run ends before a third), each stage's own operators and what it sends to and
    # receives from the other stage (activations one way, their gradients the other).
    # The table's first line counts the trace's reads of a value on the host (on a GPU, each a wait for it).
    for rank in (0, 1):
        header = (run / "profile" / f"rank{rank}.txt").read_text().splitlines()[0]
        events = json.loads((run / "profile" / f"rank{rank}.json").read_text())["traceEvents"]
        names = {e.get("name") for e in events}
        assert {"aten::mm", "c10d::send", "c10d::recv_"} <= names, sorted(n for n in names if n and "c10d" in n)
        reads = sum(e.get("name") == "aten::_local_scalar_dense" for e in events)
        assert header.startswith(f"steps 1-2, rank {rank}, by ")
        assert header.endswith(f"; {reads} host reads of a tensor's value ({reads / 2:.1f} a step)"), header
    record = json.loads((run / "timeline.json").read_text())
    assert record["step"] == 1 and record["plan"]["pp"] == 2
    passes = {(e["stage"], e["kind"], e["microbatch"]): e for e in record["events"]}
    assert sorted(passes) == sorted((s, k, m) for s in (0, 1) for k in "FB" for m in range(4))
    for m in range(4):
        # a micro-batch reaches stage 1 after stage 0 has run it, and its gradient flows back the same way
        assert passes[(1, "F", m)]["start_s"] >= passes[(0, "F", m)]["end_s"]
        assert passes[(0, "B", m)]["start_s"] >= passes[(1, "B", m)]["end_s"]
        assert passes[(1, "B", m)]["start_s"] >= passes[(1, "F", m)]["end_s"]
    # 1F1B on the last stage: micro-batch 0's backward runs before micro-batch 1's forward
    assert passes[(1, "B", 0)]["end_s"] <= passes[(1, "F", 1)]["start_s"]

    from ptrun.report import write_report

    written = write_report([run], tmp_path / "report")
    chart = written["Pipeline timeline (run)"]
    with Image.open(chart) as image:
        assert image.width > 100 and image.height > 50
    assert "timeline.png" in (tmp_path / "report" / "report.md").read_text()
