"""scripts/readme_results.py: the README's result tables come from the benchmark JSON, and a hand edit fails.

No training: the JSON here is synthetic (small, with numbers chosen so each formatted cell can be told
apart), plus one check of the real README against the JSON in docs/results/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

from ptrun.bench import readme as readme_results

README = """# title

Hand-written prose before.

<!-- results:speedup -->
stale text
<!-- /results:speedup -->

<!-- results:speedup-bert -->
<!-- /results:speedup-bert -->

Prose between.

<!-- results:sweep-alpha -->
<!-- /results:sweep-alpha -->

<!-- results:sweep-microbatches -->
| old | table |
<!-- /results:sweep-microbatches -->

<!-- results:pipedream -->
<!-- /results:pipedream -->

<!-- results:pipedream-placement -->
<!-- /results:pipedream-placement -->

<!-- results:autocache -->
<!-- /results:autocache -->

<!-- results:pipeline -->
<!-- /results:pipeline -->

<!-- results:peers_digits_vit -->
<!-- /results:peers_digits_vit -->

<!-- results:peers_bbc_news_bert -->
<!-- /results:peers_bbc_news_bert -->

<!-- results:sweep-interval_bbc_news_bert -->
<!-- /results:sweep-interval_bbc_news_bert -->

<!-- results:sweep-interval_digits_vit -->
<!-- /results:sweep-interval_digits_vit -->

<!-- results:memory -->
<!-- /results:memory -->

Prose after.
"""


def speedup_run(name: str, time_s: float, speedup: float, final: float, ideal: float, tta: float | None) -> dict:
    return {"combination": name, "train_time_s": time_s, "speedup": speedup, "time_to_target_s": tta,
            "speedup_to_target": None if tta is None else 40.0 / tta, "final": final, "metric": "top1",
            "target": 95.5, "mean_samples_per_s": 400.0, "ideal_speedup": ideal,
            "share_of_ideal": speedup / ideal if ideal > 1 else None, "paper_speedup": None, "run_dir": "/x"}


def speedup_json() -> dict:
    base = speedup_run("baseline", 80.04, 1.0, 95.5, 1.0, 40.0)
    frozen = speedup_run("all four", 61.56, 1.3001, 96.125, 1.625, None)
    rows = [dict(base, speedup_range=[1.0, 1.0], runs=[base]),
            dict(frozen, speedup_range=[1.2, 1.4], paper_speedup=2.83, runs=[frozen])]
    return {"command": "python scripts/bench_speedup.py --repeats 1 --out /tmp/b", "recipe": "digits_vit",
            "overrides": [], "repeats": 1, "rows": rows}


def alpha_json() -> dict:
    def row(alpha, blocks, time_s, speedup, final, delta, paper):
        run = {"target": 95.5, "run_dir": "/x"}
        return {"combination": "baseline" if alpha is None else f"alpha {alpha}", "alpha": alpha,
                "frozen_blocks": blocks, "train_time_s": time_s, "speedup": speedup,
                "speedup_range": [speedup, speedup], "ideal_speedup": 1.0 if alpha is None else 1.75, "final": final, "final_vs_baseline": delta,
                "metric": "top1", "paper_speedup": paper[0], "paper_final": paper[1], "runs": [run]}

    return {"command": "python scripts/sweep_alpha.py --out /tmp/a freeze.max_fraction=1.0", "recipe": "digits_vit",
            "overrides": ["freeze.max_fraction=1.0"], "repeats": 1, "policy": "alpha", "alphas": ["1/2"],
            "rows": [row(None, [0, 0, 0, 0], 70.0, 1.0, 95.5, 0.0, (1.0, 91.21)),
                     row("1/2", [0, 0, 3, 5], 50.25, 1.393, 94.75, -0.75, (3.86, 89.84))]}


def microbatch_json() -> dict:
    def row(k, m, step):
        return {"K": k, "M": m, "dp": 2 // k, "step_s": step, "samples_per_s": 120 / step,
                "samples_per_s_median": 120 / step, "step_s_rounds": [step]}

    rows = [row(1, 1, 0.5), row(1, 2, 0.4), row(2, 2, 0.6), row(2, 4, 0.8)]
    for r in rows:
        r["vs_m_equals_k"] = r["samples_per_s"] / next(b for b in rows if b["K"] == r["K"])["samples_per_s"]
    return {"command": "python scripts/sweep_microbatches.py --out /tmp/m",
            "args": {"batch": 120, "steps": 8, "warmup": 2, "repeats": 1, "schedule": "1F1B", "depth": 8, "dim": 128},
            "skipped": [{"K": 1, "M": 5}], "rows": rows}


def pipedream_json() -> dict:
    def row(schedule, time_s, tta, final, k2, stash):
        run = speedup_run(schedule, time_s, 90.0 / time_s, final, 1.0, tta)
        return dict(run, setting="no freezing", speedup_range=[1.0, 1.0], runs=[run], k2_epochs=20,
                    k2_samples_per_s=k2, stash_bytes_peak=stash)

    return {"command": "python scripts/bench_pipedream.py --repeats 1 --out /tmp/p", "recipe": "digits_vit",
            "repeats": 1, "rows": [row("1F1B", 90.0, 45.0, 95.75, 171.6, 0),
                                   row("pipedream", 60.0, None, 93.25, 332.4, 815104)]}


def placement_json() -> dict:
    def row(name, workers, rate, time_s, final):
        run = speedup_run(name, time_s, 1.0, final, 1.0, None)
        return dict(run, speedup_range=[1.0, 1.0], runs=[dict(run, mean_samples_per_s=rate)], workers=workers,
                    samples_per_s=rate)

    return {"command": "python scripts/bench_pipedream.py --placements --repeats 1 --out /tmp/p",
            "kind": "placements", "recipe": "digits_vit", "repeats": 1,
            "rows": [row("K = 2", 2, 300.0, 80.0, 93.0), row("2-1 (first stage replicated)", 3, 450.6, 55.55, 93.5)]}


def cache_json() -> dict:
    def row(blocks, off, first, read, mib, top1):
        return {"frozen_blocks": blocks, "frozen_units": 1 + 2 * blocks if blocks else 0, "epoch_s_off": off,
                "epoch_s_on_first": first, "epoch_s_on_read": read, "speedup_read": off / read, "cache_mib": mib,
                "top1_off": top1, "top1_on": top1}

    return {"command": "python scripts/bench_cache.py --out /tmp/c", "recipe": "digits_vit", "pp": 1, "dp": 2,
            "rows": [row(0, 4.013, 3.736, 3.624, 0.0, 60.0), row(6, 2.208, 1.041, 0.7433, 7.5679, 96.389)],
            "total_s_off": 41.94, "total_s_on": 32.06, "hold": 2, "overrides": []}


def pipeline_json() -> dict:
    def row(schedule, m, step, bubble):
        return {"schedule": schedule, "K": 2, "M": m, "step_s": step, "bubble": bubble, "ideal": 1 / (m + 1)}

    return {"command": "python scripts/bench_pipeline.py --out /tmp/pl.json",
            "args": {"steps": 8, "warmup": 2, "batch": 32, "depth": 8, "dim": 128},
            "bubble": [row("GPipe", 1, 0.4604, 0.5512), row("1F1B", 4, 0.3316, 0.3849)],
            "dp": {"ptrun": 100.4, "ddp": 105.2}}


@pytest.fixture
def tree(tmp_path):
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    bert = dict(speedup_json(), recipe="bbc_news_bert",
                command="python scripts/bench_speedup.py --recipe bbc_news_bert --only 'all four' --out /tmp/bb")
    (results / "bench_speedup_bert.json").write_text(json.dumps(bert))
    for name, data in (("bench_speedup", speedup_json()), ("sweep_alpha", alpha_json()),
                       ("sweep_microbatches", microbatch_json()), ("bench_pipedream", pipedream_json()),
                       ("bench_pipedream_placement", placement_json()), ("bench_cache", cache_json()),
                       ("bench_pipeline", pipeline_json())):
        (results / f"{name}.json").write_text(json.dumps(data))
    for recipe in ("digits_vit", "bbc_news_bert"):  # the real peer results: their format is tested elsewhere
        for name in (f"bench_peers_{recipe}.json", f"sweep_interval_{recipe}.json"):
            (results / name).write_text((REPO / "docs" / "results" / name).read_text())
    (results / "bench_memory.json").write_text((REPO / "docs" / "results" / "bench_memory.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text(README)
    return readme, results


def run(readme: Path, results: Path, *flags: str) -> int:
    return readme_results.main(["--readme", str(readme), "--results", str(results), *flags])


def test_tables_come_from_the_json(tree):
    readme, results = tree
    assert run(readme, results) == 0
    text = readme.read_text()
    # Each cell formatted from the synthetic values above (one decimal for seconds, two for ratios).
    assert "| baseline | 80.0 | 1.00x | 40.0 | 1.00x | 95.50 | 1.00x | - | - |" in text
    assert "| all four | 61.6 | 1.30x | - | - | 96.12 | 1.62x | 80% | 2.83x |" in text
    assert "| 1/2 | 3 (3), 5 (4) | 50.2 | 1.39x | 1.75x | 94.75 | -0.75 | 3.86x, 89.84 |" in text
    assert "| baseline | none | 70.0 | 1.00x | 1.00x | 95.50 | +0.00 | 1.00x, 91.21 |" in text
    # K = 1 at M = 1 and 2 (240, 300 samples/s), K = 2 at M = 2 and 4 (200, 150); the rest was not measured.
    assert "| 1 | 2 | 1 | 500 | 240 | 1.00 |" in text
    assert "| 1 | 2 | 2 | 400 | 300 | 1.25 |" in text
    assert "| 2 | 1 | 4 | 800 | 150 | 0.75 |" in text
    assert "| 1 | 2 | 5 | - | - | - |" in text and "| 2 | 1 | 12 | - | - | - |" in text
    # the BERT recipe's block: its own command and recipe, and as many runs as it has rows
    assert ("`python scripts/bench_speedup.py --recipe bbc_news_bert --only 'all four' --out /tmp/bb`; "
            "bbc_news_bert: 1 round(s) of 2 runs") in text
    # PipeDream: the schedules side by side (KiB of stashed weights), and the placements (rate per worker)
    assert "| no freezing | 1F1B | 172 (20 epochs) | 90.0 | 45.0 | 0.89x | 95.75 | 0 |" in text
    assert "| no freezing | pipedream | 332 (20 epochs) | 60.0 | - | - | 93.25 | 796 |" in text
    assert "| 2-1 (first stage replicated) | 3 | 451 | 150 | 55.5 | 93.50 |" in text
    # AutoCache: epoch times to 0.01 s, read vs no cache as a ratio, MiB to 0.1; totals and top-1 in the caption.
    assert "| 0 (0) | 4.01 | 3.74 | 3.62 | 1.11x | 0.0 |" in text
    assert "| 6 (13) | 2.21 | 1.04 | 0.74 | 2.97x | 7.6 |" in text
    assert "training time: 41.9s without the cache, 32.1s with it (1.31x); final top-1 96.39 vs 96.39." in text
    # Pipeline: the bubble table (step in ms), then the DP table, a blank line apart.
    assert "| GPipe | 2 | 1 | 460 | 0.55 | 0.50 |" in text
    assert "| 1F1B | 2 | 4 | 332 | 0.38 | 0.20 |\n\n| K = 1, DP = 2 | samples/s | vs DDP |" in text
    assert "| ptrun (K = 1: the stage in DDP) | 100 | 0.95 |" in text
    # The command that wrote each JSON, and the prose outside the markers, untouched.
    for command in ("python scripts/bench_speedup.py --repeats 1 --out /tmp/b",
                    "python scripts/sweep_alpha.py --out /tmp/a freeze.max_fraction=1.0",
                    "python scripts/sweep_microbatches.py --out /tmp/m",
                    "python scripts/bench_cache.py --out /tmp/c",
                    "python scripts/bench_pipeline.py --out /tmp/pl.json"):
        assert f"`{command}`" in text
    assert "stale text" not in text and "| old | table |" not in text
    for prose in ("Hand-written prose before.", "Prose between.", "Prose after."):
        assert text.count(prose) == 1


def test_idempotent_and_check(tree, capsys):
    readme, results = tree
    assert run(readme, results, "--check") == 1  # the stale blocks differ from the JSON
    assert readme.read_text() == README  # --check writes nothing
    assert run(readme, results) == 0
    once = readme.read_text()
    assert run(readme, results) == 0
    assert readme.read_text() == once
    assert run(readme, results, "--check") == 0
    readme.write_text(once.replace("| 61.6 |", "| 60.0 |"))  # a hand edit of a generated cell
    assert run(readme, results, "--check") == 1


@pytest.mark.parametrize("content, reason", [
    ("{not json", "invalid JSON"),
    (json.dumps({"command": "python x.py", "recipe": "r", "repeats": 1}), "invalid sweep_alpha result"),
    (None, "missing"),
])
def test_bad_json_is_one_line_naming_the_file(tree, capsys, content, reason):
    readme, results = tree
    path = results / "sweep_alpha.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    assert run(readme, results) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep_alpha.json" in err and reason in err
    assert readme.read_text() == README  # nothing written


def test_missing_markers_are_named(tree, capsys):
    readme, results = tree
    readme.write_text(README.replace("<!-- /results:sweep-alpha -->\n", ""))
    assert run(readme, results) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results:sweep-alpha" in err


def test_real_readme_matches_docs_results():
    """The README's generated tables are what docs/results/*.json give: a hand edit fails here."""
    assert readme_results.main(["--check"]) == 0
