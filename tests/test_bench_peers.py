"""`benchmarks.peers` (its runs, `peer_runs`; their summary, `peer_summary`) and its plain peer,
`benchmarks.plain_loop`.

The peer under torchrun (2 processes, DDP) trains the same model as in one process: same global batches,
including an uneven last one. The benchmark's arithmetic (medians, ranges, speedups against the faster plain
peer of each round, time to target, the throughput checks) on synthetic rounds, and its README block. The
causal-LM path: the peer's loss equals ptrun's on the same weights and batch, the peer trains and evaluates a
decoder end to end, the benchmark's decoder is written offline, and perplexity (lower is better) sets the
target, the table and the results page.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import cli_env
from helpers.metrics import write_events
from hf_families import save_tiny_llama

from benchmarks import peer_runs, peer_summary, results_contents, results_page
from benchmarks import peers as bench_peers

PLAIN = ["-m", peer_runs.PLAIN]


@pytest.mark.slow
@pytest.mark.dist
def test_plain_ddp_matches_one_process(tmp_path):
    # Digits: 1,437 train samples. Batch 717 gives steps of 717, 717 and 3, split 359 / 358 and 2 / 1 across the
    # ranks, so the loss must be the global batch's mean (not the mean of the ranks' means, which moved the
    # parameters by 2e-3 here) to match.
    overrides = ["train.epochs=1", "train.global_batch_size=717"]
    args = ["--recipe=digits_vit", "--threads=1", *overrides]
    one = [sys.executable, *PLAIN, f"--out={tmp_path / 'one.json'}", f"--save-state={tmp_path / 'one.pt'}", *args]
    two = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--log-dir={os.devnull}",
        *PLAIN,
        f"--out={tmp_path / 'two.json'}",
        f"--save-state={tmp_path / 'two.pt'}",
        *args,
    ]
    procs = [
        subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in (one, two)
    ]  # side by side: most of each is start-up
    for p in procs:
        output = p.communicate(timeout=300)[0]
        assert p.returncode == 0, output[-3000:]
    results = [json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two")]
    assert [r["world_size"] for r in results] == [1, 2]
    assert [len(r["epochs"]) for r in results] == [1, 1]
    a, b = (torch.load(tmp_path / f"{n}.pt") for n in ("one", "two"))
    assert len(a["losses"]) == len(b["losses"]) == 3
    torch.testing.assert_close(b["losses"], a["losses"], rtol=1e-5, atol=1e-6)
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][name], value, rtol=1e-4, atol=1e-5, msg=name)
    # the same model, so the same held-out accuracy (a different prediction would need a near tie)
    assert results[0]["final_top1"] == pytest.approx(results[1]["final_top1"])


def test_the_plain_peer_is_a_module_of_the_benchmarks(tmp_path):
    """The peers run `python -m benchmarks.plain_loop` (under torchrun for DDP): the loop is a module of the
    benchmarks package, beside the peers' own modules."""
    import importlib.util

    origin = importlib.util.find_spec(peer_runs.PLAIN).origin
    assert origin == str(Path(peer_runs.__file__).with_name("plain_loop.py"))
    loop = peer_runs.command("plain loop", "digits_vit", tmp_path, ["train.epochs=1"])
    assert loop[1:3] == ["-m", peer_runs.PLAIN] and loop[-1] == "train.epochs=1"
    ddp = peer_runs.command("plain DDP", "digits_vit", tmp_path, [])
    assert ddp[1:3] == ["-m", "torch.distributed.run"] and ddp[ddp.index("-m", 3) + 1] == peer_runs.PLAIN
    assert peer_runs.shown(loop) == (
        f"python -m benchmarks.plain_loop --recipe=digits_vit --threads=2 "
        f"--out={tmp_path / 'plain.json'} train.epochs=1"
    )


def run(label: str, wall: float, train: float, samples_per_s: float, curve: list[list[float]]) -> dict:
    return {
        "label": label,
        "wall_s": wall,
        "train_time_s": train,
        "samples_per_s": samples_per_s,
        "final_top1": curve[-1][1],
        "curve": curve,
        "run_dir": "/x",
    }


A, B, C, D, E = peer_runs.LABELS


def rounds() -> list[list[dict]]:
    """Three rounds. The plain peers' best final top-1 (the target) is 96, 97, 96. In round 2 the faster
    plain peer by wall time (the loop) is not the faster one by training time (DDP)."""
    # a table of rounds, one row a run: alike in form, each with the numbers the docstring's claims rest on
    return [
        peer_summary.measure(r)
        for r in (
            [
                run(A, 30.0, 20.0, 100.0, [[10.0, 90.0], [20.0, 95.0]]),
                run(B, 25.0, 15.0, 130.0, [[7.5, 93.0], [15.0, 96.0]]),
                run(C, 40.0, 21.0, 97.0, [[10.5, 96.0], [21.0, 95.5]]),
                run(D, 30.0, 16.0, 128.0, [[8.0, 95.0], [16.0, 96.0 - 1e-9]]),  # 96 computed in another order
                run(E, 28.0, 10.0, 200.0, [[5.0, 94.0], [10.0, 96.5]]),
            ],
            [
                run(A, 24.0, 16.0, 110.0, [[8.0, 91.0], [16.0, 97.0]]),
                run(B, 26.0, 14.0, 140.0, [[7.0, 93.0], [14.0, 96.0]]),
                run(C, 35.0, 17.0, 99.0, [[8.5, 96.0], [17.0, 96.5]]),
                run(D, 33.0, 15.0, 126.0, [[7.5, 97.0], [15.0, 97.5]]),
                run(E, 30.0, 12.0, 180.0, [[6.0, 95.0], [12.0, 97.0]]),
            ],
            [
                run(A, 31.0, 21.0, 95.0, [[10.5, 90.0], [21.0, 95.0]]),
                run(B, 27.0, 16.0, 120.0, [[8.0, 94.0], [16.0, 96.0]]),
                run(C, 45.0, 22.0, 93.0, [[11.0, 93.0], [22.0, 94.0]]),
                run(D, 29.0, 17.0, 110.0, [[8.5, 95.0], [17.0, 95.5]]),
                run(E, 26.0, 11.0, 190.0, [[5.5, 96.0], [11.0, 96.5]]),
            ],
        )
    ]


def test_one_round_targets_overheads_and_speedups():
    first, second = rounds()[:2]
    by = {r["label"]: r for r in first}
    assert {r["target"] for r in first} == {96.0} and {r["target"] for r in second} == {97.0}
    assert by[A]["overhead_s"] == 10.0 and by[E]["overhead_s"] == 18.0
    # time to target: cumulative training time at the first epoch reaching it; None if never
    assert by[A]["time_to_target_s"] is None
    assert by[B]["time_to_target_s"] == 15.0
    assert by[C]["time_to_target_s"] == 10.5  # reached at epoch 1, though it ends below
    assert by[D]["time_to_target_s"] == 16.0  # within the tolerance
    assert by[E]["time_to_target_s"] == 10.0
    # against the faster plain peer of the round: DDP (25 s wall, 15 s training)
    assert by[E]["speedup_wall"] == pytest.approx(25 / 28) and by[E]["speedup_train"] == pytest.approx(15 / 10)
    assert by[A]["speedup_wall"] == pytest.approx(25 / 30) and by[B]["speedup_train"] == 1.0
    # round 2: the loop is faster by wall time (24 s), DDP by training time (14 s)
    by2 = {r["label"]: r for r in second}
    assert by2[E]["speedup_wall"] == pytest.approx(24 / 30) and by2[E]["speedup_train"] == pytest.approx(14 / 12)
    assert by2[A]["time_to_target_s"] == 16.0 and by2[D]["time_to_target_s"] == 7.5


def test_aggregate_medians_ranges_and_checks():
    result = peer_summary.aggregate(rounds())
    rows = {r["label"]: r for r in result["rows"]}
    assert [r["label"] for r in result["rows"]] == [A, B, C, D, E]
    assert [r["kind"] for r in result["rows"]] == ["plain", "plain", "ptrun", "ptrun", "ptrun"]
    assert result["target"] == 96.0  # median of 96, 97, 96
    e = rows[E]
    assert e["wall_s"] == 28.0 and e["wall_s_range"] == [26.0, 30.0]
    assert e["train_time_s"] == 11.0 and e["train_time_s_range"] == [10.0, 12.0]
    assert e["overhead_s"] == 18.0 and e["overhead_s_range"] == [15.0, 18.0]  # 18, 18, 15
    assert e["final_top1"] == 96.5 and e["final_top1_range"] == [96.5, 97.0]
    assert e["time_to_target_s"] == 10.0 and e["time_to_target_s_range"] == [5.5, 12.0]
    # per-round speedups 25/28, 24/30, 27/26 (wall) and 15/10, 14/12, 16/11 (training)
    assert e["speedup_wall"] == pytest.approx(25 / 28) and e["speedup_wall_range"] == pytest.approx([0.8, 27 / 26])
    assert e["speedup_train"] == pytest.approx(16 / 11) and e["speedup_train_range"] == pytest.approx([14 / 12, 1.5])
    # rounds that never reach the target do not count: the loop reaches it in round 2 only, the 1-worker run in 1
    assert rows[A]["time_to_target_s"] == 16.0 and rows[A]["time_to_target_s_range"] == [16.0, 16.0]
    assert rows[C]["time_to_target_s"] == 10.5 and rows[C]["time_to_target_s_range"] == [10.5, 10.5]
    assert len(rows[E]["runs"]) == 3
    checks = {c["ptrun"]: c for c in result["checks"]}
    one, two = checks[C], checks[D]
    assert one["peer"] == A and one["rounds"] == pytest.approx([0.97, 0.9, 93 / 95])
    assert one["ratio"] == pytest.approx(0.97) and one["ratio_range"] == pytest.approx([0.9, 93 / 95])
    assert one["passed"] is True
    assert two["peer"] == B and two["rounds"] == pytest.approx([128 / 130, 0.9, 110 / 120])
    assert two["ratio"] == pytest.approx(110 / 120) and two["passed"] is False


def test_without_plain_peers_there_is_no_target():
    only = [peer_summary.measure([run(E, 28.0, 10.0, 200.0, [[10.0, 96.5]])])]
    result = peer_summary.aggregate(only)
    row = result["rows"][0]
    assert result["target"] is None and result["checks"] == []
    assert row["time_to_target_s"] is None and row["speedup_wall"] is None and row["time_to_target_s_range"] is None
    assert "| ptrun default | 28.0 | 10.0 | 18.0 | 200 | 96.50 | - | - | - |" in peer_summary.table(
        {"recipe": "digits_vit", "repeats": 1, **result}
    )


def test_only_picks_labels_or_letters_in_order():
    assert peer_runs.pick(["e,a"]) == [A, E]
    assert peer_runs.pick([D, "plain DDP"]) == [B, D]  # a label with commas is one label
    with pytest.raises(ValueError, match="'f'"):
        peer_runs.pick(["a,f"])


def test_compiled_runs_each_side_eager_and_compiled_cold_and_warm_and_check_like_against_like(tmp_path):
    """`--compiled` makes every chosen run three times: eager with `train.compile=false`, compiled with
    `train.compile=true` (the plain loop compiles its library model) on an empty inductor cache of its own and
    then on the cache that run filled; samples/s are checked eager against eager, cold against cold and warm
    against warm."""
    labels = peer_runs.twins([A, C])
    cold, warm = peer_runs.COLD, peer_runs.WARM
    assert labels == [f"{A}, eager", f"{A}{cold}", f"{A}{warm}", f"{C}, eager", f"{C}{cold}", f"{C}{warm}"]
    cmds = peer_runs.commands(labels, "digits_vit", ["train.epochs=1"])
    assert cmds[f"{A}{cold}"].startswith("python -m benchmarks.plain_loop --recipe=digits_vit")
    assert cmds[f"{A}{warm}"].endswith("train.epochs=1 train.compile=true")
    assert cmds[f"{C}, eager"].startswith("ptrun train") and cmds[f"{C}, eager"].endswith("train.compile=false")
    # one cache per run and round, the cold and the warm run's the same; none for an eager run
    here = tmp_path / "round0"
    assert peer_runs.inductor_cache(f"{A}{cold}", here / "a") == peer_runs.inductor_cache(f"{A}{warm}", here / "b")
    assert peer_runs.inductor_cache(f"{A}{cold}", here / "a") != peer_runs.inductor_cache(f"{C}{cold}", here / "c")
    assert peer_runs.inductor_cache(f"{A}, eager", here / "a") is None
    twin_rounds = [
        peer_summary.measure(
            [
                dict(r, label=r["label"] + suffix)
                for r in rnd
                if r["label"] in (A, C)
                for suffix in (peer_runs.EAGER, cold, warm)
            ]
        )
        for rnd in rounds()
    ]
    result = peer_summary.aggregate(twin_rounds)
    assert [r["kind"] for r in result["rows"]] == ["plain"] * 3 + ["ptrun"] * 3
    assert [(c["ptrun"], c["peer"]) for c in result["checks"]] == [
        (f"{C}, eager", f"{A}, eager"),
        (f"{C}{cold}", f"{A}{cold}"),
        (f"{C}{warm}", f"{A}{warm}"),
    ]


@pytest.mark.slow
def test_the_plain_loop_compiles_the_library_model_as_a_user_writes_it(tmp_path):
    """With `train.compile=true` the plain loop trains `torch.compile` of its library model to the same loss
    as eager (one process, a few steps)."""
    out = {}
    for mode in ("false", "true"):
        subprocess.run(
            [
                sys.executable,
                *PLAIN,
                "--recipe=digits_vit",
                "--threads=1",
                f"--out={tmp_path / mode}.json",
                "--save-state",
                str(tmp_path / f"{mode}.pt"),
                "train.epochs=1",
                "train.max_steps_per_epoch=4",
                "model.depth=2",
                f"train.compile={mode}",
            ],
            check=True,
            capture_output=True,
            cwd=tmp_path,
            env=cli_env(TMPDIR=str(tmp_path)),
        )  # a user's loop: torch's headers in its temp dir
        out[mode] = torch.load(tmp_path / f"{mode}.pt")
    assert out["true"]["losses"] == pytest.approx(out["false"]["losses"], rel=1e-4)


def test_variants_and_seeded_rounds():
    """A `--variant` is one more ptrun run with its overrides after the recipe's; with `--seeds` the table adds
    the mean final top-1 over the rounds."""
    label, overrides = peer_runs.variant("start 12: freeze.start=12 freeze.max_fraction=0.5")
    assert (label, overrides) == ("start 12", ["freeze.start=12", "freeze.max_fraction=0.5"])
    cmd = peer_runs.command(label, "digits_vit", Path("/r"), ["train.seed=3"], {label: overrides})
    assert peer_runs.shown(cmd) == (
        "ptrun train hydra.run.dir=/r recipe=digits_vit freeze.start=12 freeze.max_fraction=0.5 train.seed=3"
    )
    for bad in ("no label", f"{E}: auto.cache=false", ": freeze.start=1"):
        with pytest.raises(ValueError, match="--variant"):
            peer_runs.variant(bad)
    # an --engine run: the same command line, by another interpreter, which its `commands` entry names
    assert peer_runs.engine("before: /b/python auto.cache=false") == ("before", ["/b/python", "auto.cache=false"])
    for bad in ("before:", "no label /b/python", f"{E}: /b/python"):
        with pytest.raises(ValueError, match="--engine"):
            peer_runs.engine(bad)
    cmd = peer_runs.command("before", "digits_vit", Path("/r"), [], {"before": []}, {"before": "/b/python"})
    assert (
        cmd[:3] == ["/b/python", "-m", "ptrun.cli"]
        and cmd[3:] == peer_runs.command(E, "digits_vit", Path("/r"), [])[3:]
    )
    assert peer_runs.commands(
        ["before", E], "digits_vit", [], {**peer_runs.PTRUN, "before": []}, {"before": "/b/python"}
    ) == {
        "before": "ptrun train hydra.run.dir=RUN_DIR recipe=digits_vit  (by /b/python)",
        E: "ptrun train hydra.run.dir=RUN_DIR recipe=digits_vit",
    }
    result = {**result_json(rounds(), "digits_vit"), "seeds": True}
    rows = {r["label"]: r for r in result["rows"]}
    assert rows[E]["mean_top1"] == pytest.approx((96.5 + 97.0 + 96.5) / 3)
    assert rows[A]["mean_top1"] == pytest.approx((95.0 + 97.0 + 95.0) / 3)
    assert "| ptrun default | 28.0 (26.0-30.0) |" in peer_summary.table(result)
    assert peer_summary.table(result).splitlines()[0].endswith("| mean top-1 |")
    assert "; round r ran with train.seed=r;" in peer_summary.caption(result)


def result_json(repeats_rounds: list[list[dict]], recipe: str, metric=peer_runs.TOP1) -> dict:
    return {
        "command": f"python -m benchmarks.peers --recipe {recipe} --repeats 3 --out /tmp/p",
        "recipe": recipe,
        "overrides": [],
        "repeats": len(repeats_rounds),
        **peer_summary.aggregate(repeats_rounds, metric),
    }


def test_table_and_caption():
    result = result_json(rounds(), "digits_vit")
    text = peer_summary.table(result)
    assert (
        "| ptrun default | 28.0 (26.0-30.0) | 11.0 (10.0-12.0) | 18.0 (15.0-18.0) | 190 (180-200) "
        "| 96.50 (96.50-97.00) | 10.0 (5.5-12.0) | 0.89x (0.80-1.04) | 1.45x (1.17-1.50) |"
    ) in text
    assert "| plain loop | 30.0 (24.0-31.0) |" in text
    assert "| ptrun, freezing off, 1 worker / plain loop | 0.97x (0.90-0.98) | 0.95x: yes |" in text
    assert "| ptrun, freezing off, 2 workers / plain DDP | 0.92x (0.90-0.98) | 0.95x: **no** |" in text
    assert peer_summary.caption(result) == (
        "digits_vit: 3 round(s) of 5 runs, interleaved; medians (min-max over the rounds); speedups against the "
        "faster plain peer of each round; target = the best plain peer's final top-1 (median 96.00)"
    )
    json.dumps(result)  # what publish() writes


def test_results_page_sections(tmp_path):
    """The peer benchmark's sections of docs/results.md, generated by the results page from `benchmarks.peers`' own
    caption and table, with the command and date of each JSON."""
    results = tmp_path / "results"
    results.mkdir()
    for recipe in ("digits_vit", "bbc_news_bert"):
        (results / f"bench_peers_{recipe}.json").write_text(
            json.dumps({**result_json(rounds()[:1], recipe), "date": "2026-11-25"})
        )
    entries = {e.file: e for e in results_contents.TABLES if e.module == "benchmarks.peers"}
    assert set(entries) == {
        "bench_peers_digits_vit.json",
        "bench_peers_bbc_news_bert.json",
        "bench_peers_digits_vit_seeds.json",
        "bench_peers_bbc_news_bert_seeds.json",
        "bench_peers_bbc_news_bert_policies.json",
        "bench_peers_causal_lm.json",
        "bench_peers_digits_vit_engine.json",
        "bench_peers_bbc_news_lora.json",
        "bench_peers_bbc_news_lora_cache_depth.json",
        "bench_peers_bbc_news_lora_cache_2_blocks.json",
        "bench_peers_bbc_news_lora_seeds.json",
        "bench_peers_bbc_news_lora_5_epochs.json",
        "bench_peers_causal_lm_lora.json",
        # scripts/gpu_check.sh's jobs on one GPU
        "bench_peers_bbc_news_bert_gpu.json",
        "bench_peers_bbc_news_bert_512_gpu.json",
        "bench_peers_digits_vit_gpu.json",
        "bench_peers_causal_lm_gpu.json",
    }
    text = results_page.section(results, entries["bench_peers_bbc_news_bert.json"])
    assert "- command: `python -m benchmarks.peers --recipe bbc_news_bert --repeats 3 --out /tmp/p`" in text
    assert "- measured: 2026-11-25" in text
    assert "bbc_news_bert: 1 round(s)" in text
    assert "| ptrun default | 28.0 | 10.0 | 18.0 | 200 | 96.50 | 10.0 | 0.89x | 1.50x |" in text
    assert "| ptrun, freezing off, 2 workers / plain DDP | 0.98x | 0.95x: yes |" in text


def test_interval_sweep_rows_against_the_plain_loop(tmp_path):
    """sweep_interval: speedups against the plain loop of the same round, medians and ranges over rounds,
    and the ideal weighting each layout by the share of the run it trained (changes inside epochs)."""
    from benchmarks import sweep_interval

    def run(label, wall, train, top1, ideal=None):
        return {
            "label": label,
            "wall_s": wall,
            "train_time_s": train,
            "final_top1": top1,
            "ideal": ideal,
            "curve": [[train, top1]],
            "samples_per_s": 1.0,
        }

    peer, quarter = sweep_interval.PEER, "ptrun, every 1/4 epoch"
    rounds = [
        peer_summary.measure([run(peer, 200.0, 180.0, 98.0), run(quarter, 100.0, 80.0, 98.0, 1.9)]),
        peer_summary.measure([run(peer, 240.0, 200.0, 98.0), run(quarter, 100.0, 90.0, 97.5, 1.9)]),
    ]
    result = dict(sweep_interval.aggregate(rounds), command="python x", recipe="bbc_news_bert", repeats=2)
    rows = {r["label"]: r for r in result["rows"]}
    assert rows[quarter]["speedup_wall"] == pytest.approx(2.2) and rows[quarter]["speedup_wall_range"] == [2.0, 2.4]
    assert rows[quarter]["time_to_target_s"] == 80.0  # the second round never reached 98.0
    text = sweep_interval.table(result)
    assert (
        "| ptrun, every 1/4 epoch | 100.0 (100.0-100.0) | 85.0 (80.0-90.0) | 97.75 (97.50-98.00) | 80.0 "
        "(80.0-80.0) | 2.20x (2.00-2.40) | 1.90x (1.90-1.90) |" in text
    )
    json.dumps(result)

    # The ideal: half of epoch 0 with everything training, then 2 of 4 equal units frozen for 1.5 epochs.
    from benchmarks.harness import ideal_speedup

    events = [
        {"event": "start", "time": 0.0},
        {"event": "plan", "time": 1.0, "epoch": 0, "step": 0, "frozen_units": 0},
        {"event": "plan", "time": 2.0, "epoch": 0, "step": 5, "frozen_units": 2},
        {
            "event": "epoch",
            "time": 3.0,
            "epoch": 0,
            "steps": 10,
            "train_loss": 1.0,
            "samples_per_s": 1.0,
            "epoch_time_s": 1.0,
        },
        {"event": "plan", "time": 4.0, "epoch": 1, "step": 0, "frozen_units": 2},
        {
            "event": "epoch",
            "time": 5.0,
            "epoch": 1,
            "steps": 10,
            "train_loss": 1.0,
            "samples_per_s": 1.0,
            "epoch_time_s": 1.0,
        },
    ]
    for e in events:
        if e["event"] == "plan":
            e.update(pp=1, dp=1, microbatches=1, stage_bounds=[[0, 4]])
    write_events(tmp_path, events)
    from conftest import compose_config
    from omegaconf import OmegaConf

    cfg = compose_config(["model.embed_dim=32", "model.depth=1", "model.num_heads=2"], tmp_path)
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    from ptrun.config import load_resolved
    from ptrun.costs.from_config import costs_from_config

    resolved = load_resolved(tmp_path / "config.yaml")
    flops = costs_from_config(resolved.model, resolved.data).fwd_flops
    want = 2 * sum(flops) / (0.5 * sum(flops) + 1.5 * sum(flops[2:]))
    assert ideal_speedup(tmp_path) == pytest.approx(want)


# ---- the causal-LM path ------------------------------------------------------------------------------------


def lm_batch() -> dict[str, torch.Tensor]:
    """Three blocks of 12 tokens as ptrun's packer stores them (`hf_tokens.lm_rows`): the last one padded
    after 5 real tokens, its labels -100 there."""
    import datasets
    import numpy as np
    import pyarrow as pa

    from ptrun.data.hf_tokens import lm_rows

    ids = np.random.default_rng(0).integers(1, 64, size=(3, 12))
    real = np.ones((3, 12), dtype=bool)
    real[2, 5:] = False
    ids[~real] = 0
    rows = datasets.Dataset(pa.Table.from_batches([lm_rows(ids, real)])).with_format("torch")
    return {k: v.long() for k, v in rows[:].items()}


def test_the_plain_loops_causal_lm_loss_equals_ptruns(tmp_path):
    """Same weights, same batch: the peer's loss (transformers' own, from the `labels` with -100 on padding)
    equals ptrun's (its layered decoder and WeightedLoss over the global batch's predicted tokens): the
    token mean over the real tokens, shifted. Split in two shares over DDP's two ranks, it is the same loss."""
    from benchmarks import plain_loop
    from ptrun.config import ModelConfig
    from ptrun.models import build_model
    from ptrun.models.losses import WeightedLoss, loss_weight, make_target

    path = save_tiny_llama(tmp_path / "llama", vocab_size=64)
    model_cfg = ModelConfig(name="llama", pretrained=str(path), task="causal_lm")
    b = lm_batch()
    tokens = plain_loop.predicted_tokens(b["labels"])
    assert tokens.tolist() == [11, 11, 4]  # every real token after the first of its block

    peer = plain_loop.build_model(model_cfg, None).eval()
    with torch.no_grad():
        plain = plain_loop.summed_loss(peer, b, "causal_lm", tokens.sum())
        shares = [
            plain_loop.summed_loss(peer, {k: v[rows] for k, v in b.items()}, "causal_lm", tokens.sum() / 2)
            for rows in (slice(0, 2), slice(2, 3))
        ]  # each rank's share; DDP averages the two
        layered = build_model(model_cfg, num_classes=0).eval()
        target = make_target({"labels": b["labels"], "weight": torch.ones(3)}, "causal_lm")
        denominator = float(loss_weight(target, "causal_lm"))
        ours = WeightedLoss("causal_lm")(layered(b["input_ids"], b["attention_mask"]), target, denominator=denominator)
    assert denominator == tokens.sum().item() == 26
    torch.testing.assert_close(plain, ours, rtol=1e-6, atol=0)
    torch.testing.assert_close(sum(shares) / 2, plain, rtol=1e-6, atol=0)


@pytest.mark.slow
def test_the_plain_loop_trains_a_causal_lm(tmp_path):
    """The peer end to end on a tiny Llama and a JSONL of text (packed by ptrun's data layer): its result
    has the eval loss and its perplexity per epoch, and the loss falls on repeated text."""
    from conftest import wordpiece_tokenizer

    lines = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine"]
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"text": lines[i % 2]}) + "\n" for i in range(64)))
    tok = wordpiece_tokenizer(tmp_path / "llama", lines, vocab_size=64)
    from transformers import AutoTokenizer

    save_tiny_llama(tmp_path / "llama", vocab_size=len(AutoTokenizer.from_pretrained(tok)))
    out = tmp_path / "plain.json"
    cmd = [
        sys.executable,
        *PLAIN,
        "--recipe=causal_lm",
        f"--out={out}",
        f"model.pretrained={tmp_path / 'llama'}",
        f"data.path={text}",
        "data.max_length=16",
        "train.epochs=2",
        "train.global_batch_size=4",
        "optim.lr=3e-3",
        "optim.warmup_fraction=0",
    ]
    env = cli_env(PTRUN_TOKENIZED_DIR=str(tmp_path / "tokenized"), HF_HOME=str(tmp_path / "hf_home"))
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    first, last = result["epochs"]
    assert last["loss"] < first["loss"]
    assert result["final_eval_loss"] == last["loss"] and "final_top1" not in result
    assert result["final_perplexity"] == pytest.approx(math.exp(last["loss"]))
    assert "perplexity" in done.stdout


def test_the_benchmarks_decoder_is_written_offline(tmp_path):
    """`python -m benchmarks.tiny_decoder DIR`: BBC News text as JSONL and a Llama whose tokenizer was trained on
    it, with [SEP] as EOS (it ends the packed documents) and [PAD] as padding, the model's ids the same."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks import tiny_decoder

    tiny_decoder.main([str(tmp_path), "--documents=20", "--hidden=64", "--layers=1", "--vocab=500"])
    texts = [json.loads(line)["text"] for line in (tmp_path / "news.jsonl").read_text().splitlines()]
    assert len(texts) == 20 and all(len(t.split()) > 50 for t in texts)
    tok = AutoTokenizer.from_pretrained(tmp_path / "llama")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "llama")
    assert len(tok) == model.config.vocab_size <= 500
    assert tok.eos_token == "[SEP]" and tok.pad_token == "[PAD]"
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert (model.config.model_type, model.config.num_hidden_layers, model.config.hidden_size) == ("llama", 1, 64)


def test_causal_lm_command_lines_and_metric(tmp_path):
    """The one documented command: --only a,c runs the plain loop and ptrun without freezing on one worker,
    each with the decoder's overrides; the recipe's task picks perplexity."""
    assert peer_runs.pick(["a,c"]) == [A, C]
    lm = [f"model.pretrained={tmp_path}/llama", f"data.path={tmp_path}/news.jsonl"]
    assert peer_runs.shown(peer_runs.command(A, "causal_lm", Path("/r"), lm)) == (
        f"python -m benchmarks.plain_loop --recipe=causal_lm --threads=2 --out=/r/plain.json {' '.join(lm)}"
    )
    assert peer_runs.shown(peer_runs.command(C, "causal_lm", Path("/r"), lm)) == (
        "ptrun train hydra.run.dir=/r recipe=causal_lm auto.freeze=false auto.cache=false "
        f"launcher.nproc_per_node=1 {' '.join(lm)}"
    )
    assert peer_runs.metric_of("causal_lm", lm) is peer_runs.PERPLEXITY
    assert peer_runs.metric_of("digits_vit", []) is peer_runs.TOP1
    with pytest.raises(ValueError, match="model.task='qa'; the plain peer trains classification, causal_lm"):
        peer_runs.metric_of("bert_squad", ["data.path=/x", "model.pretrained=null"])
    assert "--only a,c model.pretrained=/tmp/lm/llama data.path=/tmp/lm/news.jsonl" in bench_peers.__doc__


def lm_run(label: str, wall: float, train: float, samples_per_s: float, curve: list[list[float]]) -> dict:
    return {
        "label": label,
        "wall_s": wall,
        "train_time_s": train,
        "samples_per_s": samples_per_s,
        "final_perplexity": curve[-1][1],
        "curve": curve,
        "run_dir": "/x",
    }


def lm_rounds() -> list[list[dict]]:
    """Two rounds of the plain loop and ptrun without freezing, on perplexity: the target is the plain loop's
    (the only peer), and lower reaches it."""
    ppl = peer_runs.PERPLEXITY
    return [
        peer_summary.measure(r, ppl)
        for r in (
            [
                lm_run(A, 60.0, 50.0, 20.0, [[25.0, 300.0], [50.0, 200.0]]),
                lm_run(C, 58.0, 49.0, 20.4, [[24.5, 199.0], [49.0, 180.0]]),
            ],
            [
                lm_run(A, 62.0, 52.0, 19.0, [[26.0, 310.0], [52.0, 210.0]]),
                lm_run(C, 66.0, 56.0, 17.5, [[28.0, 250.0], [56.0, 210.0 * (1 + 1e-9)]]),
            ],  # 210 summed in another order
        )
    ]


def test_perplexity_targets_and_times_compare_lower_is_better():
    first, second = lm_rounds()
    assert {r["target"] for r in first} == {200.0} and {r["target"] for r in second} == {210.0}
    by, by2 = ({r["label"]: r for r in rnd} for rnd in (first, second))
    assert by[A]["time_to_target_s"] == 50.0 and by[C]["time_to_target_s"] == 24.5  # 199 <= 200 at epoch 1
    assert by2[C]["time_to_target_s"] == 56.0  # within the relative tolerance
    # a peer with the higher perplexity is not the target, even when it comes first
    worse = peer_summary.measure(
        [lm_run(A, 1.0, 1.0, 1.0, [[1.0, 150.0]]), lm_run(B, 1.0, 1.0, 1.0, [[1.0, 120.0]])], peer_runs.PERPLEXITY
    )
    assert worse[0]["target"] == 120.0 and worse[0]["time_to_target_s"] is None


def test_perplexity_aggregate_table_and_caption():
    result = {**result_json(lm_rounds(), "causal_lm", peer_runs.PERPLEXITY), "seeds": True}
    assert result["metric"] == "perplexity" and result["target"] == 205.0
    rows = {r["label"]: r for r in result["rows"]}
    assert rows[C]["final_perplexity"] == pytest.approx((180.0 + 210.0 * (1 + 1e-9)) / 2)
    assert rows[C]["mean_perplexity"] == rows[C]["final_perplexity"] and "final_top1" not in rows[C]
    check = result["checks"][0]
    assert (check["ptrun"], check["peer"]) == (C, A)
    assert check["rounds"] == pytest.approx([20.4 / 20.0, 17.5 / 19.0]) and check["passed"] is True  # median 0.97
    text = peer_summary.table(result)
    assert text.splitlines()[0] == (
        "| run | wall (s) | training (s) | outside training (s) | samples/s | final "
        "perplexity | time to target (s) | speedup, wall | speedup, training | mean "
        "perplexity |"
    )
    # samples/s with two decimals: a causal LM trains a few blocks a second
    assert (
        "| ptrun, freezing off, 1 worker | 62.0 (58.0-66.0) | 52.5 (49.0-56.0) | 9.5 (9.0-10.0) "
        "| 18.95 (17.50-20.40) | 195.00 (180.00-210.00) | 40.2 (24.5-56.0) |"
    ) in text
    assert "| ptrun, freezing off, 1 worker / plain loop | 0.97x (0.92-1.02) | 0.95x: yes |" in text
    assert peer_summary.caption(result) == (
        "causal_lm: 2 round(s) of 2 runs, interleaved; medians (min-max over the rounds); round r ran with "
        "train.seed=r; speedups against the faster plain peer of each round; target = the plain peers' lowest "
        "final perplexity (median 205.00)"
    )
    json.dumps(result)


def test_results_page_shows_a_causal_lm_result_once_there_is_one(tmp_path):
    """bench_peers_causal_lm.json is on the results page when docs/results/ has it, and only then."""
    results = tmp_path / "results"
    shutil.copytree(Path(results_contents.__file__).parents[1] / "docs" / "results", results)
    title = "### ptrun against plain PyTorch: causal_lm"
    (results / "bench_peers_causal_lm.json").unlink(missing_ok=True)  # the published one, if any: absent first
    assert title not in results_page.page(results)
    (results / "bench_peers_causal_lm.json").write_text(
        json.dumps(
            {
                **result_json(lm_rounds()[:1], "causal_lm", peer_runs.PERPLEXITY),
                "date": "2026-11-26",
                "command": "python -m benchmarks.peers --recipe causal_lm --only a,c model.pretrained=/tmp/lm/llama",
            }
        )
    )
    page = results_page.page(results)
    assert page.count(title) == 1 and "](#ptrun-against-plain-pytorch-causal_lm)" in page
    section = page.split(title)[1].split("\n### ")[0]
    assert "- command: `python -m benchmarks.peers --recipe causal_lm --only a,c" in section
    assert "target = the plain peers' lowest final perplexity (median 200.00)." in section
    assert "| ptrun, freezing off, 1 worker | 58.0 | 49.0 | 9.0 | 20.40 | 180.00 | 24.5 | 1.03x | 1.02x |" in section
    assert "| ptrun, freezing off, 1 worker / plain loop | 1.02x | 0.95x: yes |" in section


def test_a_ptrun_runs_measure_share_is_read_and_tabled(tmp_path):
    """The host time a run's rank 0 spent taking the freeze policy's measure, over its training time, from
    the epoch events: a table of its own under the runs (not for runs that do not record it)."""
    events = [
        {"event": "epoch", "epoch": e, "epoch_time_s": 2.0, "samples": 100, "measure_s": s, "eval": {"top1": 90.0 + e}}
        for e, s in enumerate([0.02, 0.06])
    ]
    events.append({"event": "end", "total_time_s": 4.5})
    write_events(tmp_path, events)
    run = peer_runs.read_ptrun(tmp_path)
    assert run["measure_share"] == pytest.approx(0.08 / 4.0) and run["samples_per_s"] == pytest.approx(50.0)
    rows = [
        dict(run, label=E, wall_s=6.0),
        {
            "label": A,
            "wall_s": 8.0,
            "train_time_s": 6.0,
            "samples_per_s": 33.0,
            "final_top1": 91.0,
            "curve": [[6.0, 91.0]],
        },
    ]
    result = {**peer_summary.aggregate([peer_summary.measure(rows)]), "repeats": 1, "recipe": "digits_vit"}
    text = peer_summary.table(result)
    assert f"| {E} | 2.00% |" in text and f"| {A} | " not in text.split("freeze policy's measure")[1]
    # a result recorded before the measure had its name (`signal_share`) tables the same
    renamed = [{("signal_share" if k == "measure_share" else k): v for k, v in r.items()} for r in rows]
    old = {**peer_summary.aggregate([peer_summary.measure(renamed)]), "repeats": 1, "recipe": "digits_vit"}
    assert f"| {E} | 2.00% |" in peer_summary.table(old)


def test_the_time_outside_training_is_split_into_start_up_evaluation_and_the_rest():
    """From the spawn to the first step, the evaluations, and what is left of the wall time; tabled under the
    runs for the runs that recorded them (a result written before they were has no such table)."""
    timed = dict(run(A, 30.0, 20.0, 100.0, [[20.0, 95.0]]), first_step_time=1005.5, eval_s=2.5)
    assert peer_runs.outside_training(timed, spawned=1000.0) == {"to_first_step_s": 5.5, "rest_s": 2.0}
    assert peer_runs.outside_training(timed, spawned=None) == {}
    assert peer_runs.outside_training(dict(timed, eval_s=None), spawned=1000.0) == {}
    ptrun_run = dict(run(E, 20.0, 10.0, 200.0, [[10.0, 96.0]]), first_step_time=2004.0, eval_s=1.0)
    # a ptrun run's worker began at 2003.2: the launcher's share of its 4 s to the first step
    assert peer_runs.outside_training(dict(ptrun_run, worker_start_time=2003.2), 2000.0) == pytest.approx(
        {"to_first_step_s": 4.0, "rest_s": 5.0, "to_worker_s": 3.2}
    )
    rows = [
        dict(timed, **peer_runs.outside_training(timed, 1000.0)),
        dict(ptrun_run, **peer_runs.outside_training(ptrun_run, 2000.0)),
    ]
    result = {**peer_summary.aggregate([peer_summary.measure(rows)]), "repeats": 1, "recipe": "digits_vit"}
    text = peer_summary.table(result)
    assert f"| {A} | 5.5 | 2.5 | 2.0 |" in text and f"| {E} | 4.0 | 1.0 | 5.0 |" in text
    old = {
        **peer_summary.aggregate([peer_summary.measure([run(A, 30.0, 20.0, 100.0, [[20.0, 95.0]])])]),
        "repeats": 1,
        "recipe": "digits_vit",
    }
    assert "to the first step" not in peer_summary.table(old)


@pytest.mark.parametrize(
    "recipe,sizes",
    [
        ("digits_vit", ["model.embed_dim=32", "model.depth=2", "model.num_heads=2"]),
        ("digits_vit", ["model.embed_dim=32", "model.depth=3", "model.num_heads=2", "adapter.layers=[0,2]"]),
        ("bbc_news_lora", []),
        ("bbc_news_lora", ["adapter.layers=top:2"]),
        ("bbc_news_lora", ["adapter.targets=[attention.output.dense,query]", "adapter.dora=true"]),
        ("bbc_news_lora", ["adapter.targets='.*layer\\.[0-2]\\..*value'"]),
        ("bbc_news_lora", ["adapter.targets='.*layer\\.[0-2]\\..*value'", "adapter.layers=[1,2,3]"]),
    ],
)
def test_the_plain_peft_loop_wraps_the_modules_ptrun_wraps(recipe, sizes):
    """With `adapter=lora` the plain loop is the plain peft loop: `get_peft_model` on the library model, its
    regex wrapping exactly the block linears ptrun's units carry adapters on (not a pooler's `dense`; only in
    the blocks `adapter.layers` names), and the same parameters train (the adapters and the classifier)."""
    from types import SimpleNamespace

    from benchmarks.plain_loop import build_model as plain_model
    from benchmarks.plain_loop import recipe_config, with_adapter
    from ptrun.models import build_model

    cfg = recipe_config(recipe, [*sizes, "adapter=lora"])
    facts = SimpleNamespace(num_classes=5, image_size=8, in_chans=1)  # the data's facts the models are sized by
    peer = with_adapter(plain_model(cfg.model, facts), cfg)
    wrapped = {n.removeprefix("base_model.model.") for n, m in peer.named_modules() if hasattr(m, "lora_A")}
    torch.manual_seed(0)
    ours = build_model(
        cfg.model, num_classes=5, img_size=8, in_chans=1, vocab_size=30522, units=(), adapter=cfg.adapter
    )
    assert wrapped == {n.split(".lora_")[0] for n in ours.adapters}
    trained = {n for n, p in peer.named_parameters() if p.requires_grad}
    assert sum(peer.get_parameter(n).numel() for n in trained) == sum(
        s.numel() for n, s in ours.param_shapes.items() if n not in ours.fixed
    )


def test_the_trainer_peer_is_a_plain_peer_of_its_own():
    """`--trainer` adds the HF Trainer run (`benchmarks.hf_trainer`), read and compared as a plain peer."""
    cmd = peer_runs.command(peer_runs.TRAINER, "bbc_news_lora", Path("RUN"), ["train.epochs=1"])
    assert cmd[1:3] == ["-m", "benchmarks.hf_trainer"] and "--recipe=bbc_news_lora" in cmd
    assert cmd[-1] == "train.epochs=1" and f"--out={Path('RUN') / 'plain.json'}" in cmd
    assert peer_runs.is_peer(peer_runs.TRAINER) and not peer_runs.is_peer("ptrun default")


@pytest.mark.skipif(sys.platform != "linux", reason="the child's stop rides on Linux's prctl")
def test_a_benchmark_killed_mid_run_leaves_no_run_behind(tmp_path):
    """A benchmark's runs (`harness.run_to_end`) stop with it: SIGKILL the benchmark's process while its child
    runs, and the child is gone too, not left training beside whatever runs next."""
    import time

    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    bench = f"import sys\nfrom benchmarks.harness import run_to_end\nrun_to_end([sys.executable, '-c', {child!r}])"
    parent = subprocess.Popen([sys.executable, "-c", bench], env=cli_env())
    try:
        deadline = time.monotonic() + 120
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None, "the child never started"
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        assert running(pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 30
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(pid), "the child outlived the benchmark"


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie that nothing reaped has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
