"""`benchmarks.results_page`: docs/results.md and the README's measured number come from the benchmark JSON,
and a hand edit fails; every path the README and docs name exists; none of them names internal work items.

No training: part of the JSON here is synthetic (small, with numbers chosen so each formatted cell can be
told apart), the rest is copied from docs/results/; then the real README and page are checked against it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import results_contents, results_page

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"

README = """# title

Hand-written prose before.

<!-- results:headline -->
stale text
<!-- /results:headline -->

Prose after.
"""


def speedup_run(name: str, time_s: float, speedup: float, final: float, ideal: float, tta: float | None) -> dict:
    return {
        "combination": name,
        "train_time_s": time_s,
        "speedup": speedup,
        "time_to_target_s": tta,
        "speedup_to_target": None if tta is None else 40.0 / tta,
        "final": final,
        "metric": "top1",
        "target": 95.5,
        "mean_samples_per_s": 400.0,
        "ideal_speedup": ideal,
        "share_of_ideal": speedup / ideal if ideal > 1 else None,
        "paper_speedup": None,
        "run_dir": "/x",
    }


def speedup_json() -> dict:
    base = speedup_run("baseline", 80.04, 1.0, 95.5, 1.0, 40.0)
    frozen = speedup_run("all four", 61.56, 1.3001, 96.125, 1.625, None)
    rows = [
        dict(base, speedup_range=[1.0, 1.0], runs=[base]),
        dict(frozen, speedup_range=[1.2, 1.4], paper_speedup=2.83, runs=[frozen]),
    ]
    return {
        "command": "python -m benchmarks.speedup --repeats 1 --out /tmp/b",
        "recipe": "digits_vit",
        "overrides": [],
        "repeats": 1,
        "rows": rows,
    }


def alpha_json() -> dict:
    def row(alpha, blocks, time_s, speedup, final, delta, paper):
        run = {"target": 95.5, "run_dir": "/x"}
        return {
            "combination": "baseline" if alpha is None else f"alpha {alpha}",
            "alpha": alpha,
            "frozen_blocks": blocks,
            "train_time_s": time_s,
            "speedup": speedup,
            "speedup_range": [speedup, speedup],
            "ideal_speedup": 1.0 if alpha is None else 1.75,
            "final": final,
            "final_vs_baseline": delta,
            "metric": "top1",
            "paper_speedup": paper[0],
            "paper_final": paper[1],
            "runs": [run],
        }

    return {
        "command": "python -m benchmarks.sweep_alpha --out /tmp/a freeze.max_fraction=1.0",
        "recipe": "digits_vit",
        "overrides": ["freeze.max_fraction=1.0"],
        "repeats": 1,
        "policy": "alpha",
        "alphas": ["1/2"],
        "rows": [
            row(None, [0, 0, 0, 0], 70.0, 1.0, 95.5, 0.0, (1.0, 91.21)),
            row("1/2", [0, 0, 3, 5], 50.25, 1.393, 94.75, -0.75, (3.86, 89.84)),
        ],
    }


def microbatch_json() -> dict:
    def row(k, m, step):
        return {
            "K": k,
            "M": m,
            "dp": 2 // k,
            "step_s": step,
            "samples_per_s": 120 / step,
            "samples_per_s_median": 120 / step,
            "step_s_rounds": [step],
        }

    rows = [row(1, 1, 0.5), row(1, 2, 0.4), row(2, 2, 0.6), row(2, 4, 0.8)]
    for r in rows:
        r["vs_m_equals_k"] = r["samples_per_s"] / next(b for b in rows if b["K"] == r["K"])["samples_per_s"]
    return {
        "command": "python -m benchmarks.sweep_microbatches --out /tmp/m",
        "args": {"batch": 120, "steps": 8, "warmup": 2, "repeats": 1, "schedule": "1F1B", "depth": 8, "dim": 128},
        "skipped": [{"K": 1, "M": 5}],
        "rows": rows,
    }


def pipedream_json() -> dict:
    def row(schedule, time_s, tta, final, k2, stash):
        run = speedup_run(schedule, time_s, 90.0 / time_s, final, 1.0, tta)
        return dict(
            run,
            setting="no freezing",
            speedup_range=[1.0, 1.0],
            runs=[run],
            k2_epochs=20,
            k2_samples_per_s=k2,
            stash_bytes_peak=stash,
        )

    return {
        "command": "python -m benchmarks.pipedream --repeats 1 --out /tmp/p",
        "recipe": "digits_vit",
        "repeats": 1,
        "rows": [row("1F1B", 90.0, 45.0, 95.75, 171.6, 0), row("pipedream", 60.0, None, 93.25, 332.4, 815104)],
    }


def placement_json() -> dict:
    def row(name, workers, rate, time_s, final):
        run = speedup_run(name, time_s, 1.0, final, 1.0, None)
        return dict(
            run,
            speedup_range=[1.0, 1.0],
            runs=[dict(run, mean_samples_per_s=rate)],
            workers=workers,
            samples_per_s=rate,
        )

    return {
        "command": "python -m benchmarks.pipedream --placements --repeats 1 --out /tmp/p",
        "kind": "placements",
        "recipe": "digits_vit",
        "repeats": 1,
        "rows": [row("K = 2", 2, 300.0, 80.0, 93.0), row("2-1 (first stage replicated)", 3, 450.6, 55.55, 93.5)],
    }


def cache_json() -> dict:
    def row(blocks, off, first, read, mib, top1):
        return {
            "frozen_blocks": blocks,
            "frozen_units": 1 + 2 * blocks if blocks else 0,
            "epoch_s_off": off,
            "epoch_s_on_first": first,
            "epoch_s_on_read": read,
            "speedup_read": off / read,
            "cache_mib": mib,
            "top1_off": top1,
            "top1_on": top1,
        }

    return {
        "command": "python -m benchmarks.cache --out /tmp/c",
        "recipe": "digits_vit",
        "pp": 1,
        "dp": 2,
        "rows": [row(0, 4.013, 3.736, 3.624, 0.0, 60.0), row(6, 2.208, 1.041, 0.7433, 7.5679, 96.389)],
        "total_s_off": 41.94,
        "total_s_on": 32.06,
        "hold": 2,
        "overrides": [],
    }


def pipeline_json() -> dict:
    def row(schedule, m, step, bubble):
        return {"schedule": schedule, "K": 2, "M": m, "step_s": step, "bubble": bubble, "ideal": 1 / (m + 1)}

    return {
        "command": "python -m benchmarks.pipeline --out /tmp/pl.json",
        "args": {"steps": 8, "warmup": 2, "batch": 32, "depth": 8, "dim": 128},
        "bubble": [row("GPipe", 1, 0.4604, 0.5512), row("1F1B", 4, 0.3316, 0.3849)],
        "dp": {"ptrun": 100.4, "ddp": 105.2},
    }


SYNTHETIC = {
    "bench_speedup": speedup_json,
    "sweep_alpha": alpha_json,
    "sweep_microbatches": microbatch_json,
    "bench_pipedream": pipedream_json,
    "bench_pipedream_placement": placement_json,
    "bench_cache": cache_json,
    "bench_pipeline": pipeline_json,
}


@pytest.fixture
def tree(tmp_path):
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    for path in RESULTS.glob("*.json"):  # the real results, then the synthetic ones over some of them
        shutil.copy(path, results / path.name)
    for name, make in SYNTHETIC.items():
        (results / f"{name}.json").write_text(json.dumps(make()))
    bert = dict(
        speedup_json(),
        recipe="bbc_news_bert",
        command="python -m benchmarks.speedup --recipe bbc_news_bert --only 'all four' --out /tmp/bb",
    )
    (results / "bench_speedup_bert.json").write_text(json.dumps(bert))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    return readme, tmp_path / "docs" / "results.md", results


def run(tree, *flags: str) -> int:
    readme, page, results = tree
    return results_page.main(["--readme", str(readme), "--page", str(page), "--results", str(results), *flags])


def test_page_comes_from_the_json(tree):
    readme, page, results = tree
    assert run(tree) == 0
    text = page.read_text()
    # Each cell formatted from the synthetic values above (one decimal for seconds, two for ratios).
    assert "| baseline | 80.0 | 1.00x | 40.0 | 1.00x | 95.50 | 1.00x | - | - |" in text
    assert "| all four | 61.6 | 1.30x | - | - | 96.12 | 1.62x | 80% | 2.83x |" in text
    assert "| 1/2 | 3 (3), 5 (4) | 50.2 | 1.39x | 1.75x | 94.75 | -0.75 | 3.86x, 89.84 |" in text
    assert "| 1 | 2 | 2 | 400 | 300 | 1.25 |" in text and "| 2 | 1 | 12 | - | - | - |" in text
    assert "| no freezing | pipedream | 332 (20 epochs) | 60.0 | - | - | 93.25 | 796 |" in text
    assert "| 2-1 (first stage replicated) | 3 | 451 | 150 | 55.5 | 93.50 |" in text
    assert "| 6 (13) | 2.21 | 1.04 | 0.74 | 2.97x | 7.6 |" in text
    assert "| 1F1B | 2 | 4 | 332 | 0.38 | 0.20 |\n\n| K = 1, DP = 2 | samples/s | vs DDP |" in text
    # Each table with its command, its date (recorded in the generator) and its machine.
    for _name, make in SYNTHETIC.items():
        assert f"- command: `{make()['command']}`" in text
    assert "- command: `python -m benchmarks.speedup --recipe bbc_news_bert --only 'all four' --out /tmp/bb`" in text
    for filename, _date in results_contents.MEASURED.items():
        assert filename in text
    assert text.count("- measured: 2026-11-22") == 7 and "- machine: " + results_contents.MACHINE in text
    # The current results first, the older ones under their own heading, then the simulator's files.
    current, older = text.split("## Older measurements")
    assert "### ptrun against plain PyTorch: bbc_news_bert" in current and "bench_speedup.json" not in current
    assert "### Speedup breakdown, digits_vit" in older and older.startswith("\n\nMeasured before `pipe.length=auto`")
    # The README: its block rewritten from the peers' JSON, the prose around it untouched.
    body = readme.read_text()
    assert "stale text" not in body and "**2.54x faster**" in body
    assert "98.27% top-1 against 98.20% (means over 3 seeds)" in body
    assert "Measured 2026-11-27 on " in body and "[docs/results.md](docs/results.md)" in body
    for prose in ("Hand-written prose before.", "Prose after."):
        assert body.count(prose) == 1


def test_a_date_in_the_json_wins(tree):
    readme, page, results = tree
    path = results / "bench_cache.json"
    path.write_text(json.dumps(dict(json.loads(path.read_text()), date="2030-01-02 03:04:05")))
    assert run(tree) == 0
    assert "- measured: 2030-01-02\n" in page.read_text()


def test_idempotent_and_check(tree):
    readme, page, results = tree
    assert run(tree, "--check") == 1  # the README's stale block, and no page yet
    assert readme.read_text() == README and not page.exists()  # --check writes nothing
    assert run(tree) == 0
    once_readme, once_page = readme.read_text(), page.read_text()
    assert run(tree) == 0
    assert (readme.read_text(), page.read_text()) == (once_readme, once_page)
    assert run(tree, "--check") == 0
    page.write_text(once_page.replace("| 61.6 |", "| 60.0 |"))  # a hand edit of a generated cell
    assert run(tree, "--check") == 1
    page.write_text(once_page + "\nA hand-written line.\n")  # the page is generated whole
    assert run(tree, "--check") == 1
    page.write_text(once_page)
    readme.write_text(once_readme.replace("2.54x", "2.00x"))
    assert run(tree, "--check") == 1


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{not json", "invalid JSON"),
        (json.dumps({"command": "python x.py", "recipe": "r", "repeats": 1}), "invalid sweep_alpha result"),
        (json.dumps({"recipe": "r"}), "no 'command'"),
        (None, "missing"),
    ],
)
def test_bad_json_is_one_line_naming_the_file(tree, capsys, content, reason):
    readme, page, results = tree
    path = results / "sweep_alpha.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    assert run(tree) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sweep_alpha.json" in err and reason in err
    assert readme.read_text() == README and not page.exists()  # nothing written


def test_a_result_without_a_date_or_a_place_is_named(tree, capsys, monkeypatch):
    readme, page, results = tree
    monkeypatch.delitem(results_contents.MEASURED, "bench_memory.json")
    assert run(tree) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench_memory.json: no date" in err
    monkeypatch.undo()
    (results / "bench_new.json").write_text(json.dumps({"command": "python -m benchmarks.new"}))
    assert run(tree) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench_new.json: not on the results page" in err


def test_the_prose_comes_from_the_templates(tree, tmp_path, capsys, monkeypatch):
    """Each result's prose is its template, the page's own prose page.md; a missing template is one line naming it."""
    readme, page, results = tree
    templates = tmp_path / "templates"
    shutil.copytree(results_page.TEMPLATES, templates)
    monkeypatch.setattr(results_page, "TEMPLATES", templates)
    cache = templates / "bench_cache.md"
    cache.write_text(cache.read_text().replace("$result", "Edited measures.\n\n$result", 1))
    page_md = templates / "page.md"
    page_md.write_text(page_md.read_text().replace("## Other result files", "## Other files, edited", 1))
    assert run(tree) == 0
    text = page.read_text()
    section = text.split("### AutoCache\n\n")[1].split("\n### ")[0]
    assert "Edited measures.\n\n- command: `" in section and "## Other files, edited\n" in text
    cache.unlink()
    page.unlink()
    assert run(tree) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench_cache.md: missing" in err and not page.exists()


def test_every_result_has_a_template_and_every_template_a_use():
    """docs/results/templates/ holds the prose of every result on the page and the page's own, nothing else."""
    names = {path.name for path in results_page.TEMPLATES.glob("*")}
    entries = {entry.template for entry in results_contents.TABLES}
    assert names == entries | {"page.md", "result.md", "readme_headline.md"}


def test_missing_markers_are_named(tree, capsys):
    readme, page, results = tree
    readme.write_text(README.replace("<!-- /results:headline -->\n", ""))
    assert run(tree) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results:headline" in err


def test_real_readme_and_page_match_docs_results():
    """README.md's number and docs/results.md are what docs/results/*.json give: a hand edit fails here."""
    assert results_page.main(["--check"]) == 0


COMMAND_LINE = re.compile(r'^[+-]\s*"[^"]+": "(python|bash) ')
"""A line of a result's JSON that records a command (its `command`, or one of its `commands`)."""


def last_measured(path: str) -> str:
    """The date of the last commit that changed `path`'s measurement: a commit that only rewrote the commands it
    records (a benchmark moved or renamed) measured nothing."""
    log = subprocess.run(
        ["git", "-C", str(REPO), "log", "--format=%H %ad", "--date=short", "--", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    for sha, _, day in (line.partition(" ") for line in log if line):
        diff = subprocess.run(
            ["git", "-C", str(REPO), "show", "--format=", "-U0", sha, "--", path],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        changed = [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]
        if not all(COMMAND_LINE.match(line) for line in changed):
            return day
    return ""  # a shallow clone that lacks the commit


def test_recorded_dates_are_the_json_files_last_commits():
    """MEASURED holds, for each JSON without a date, the date of the last commit that changed its measurement."""
    try:
        tracked = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "docs/results"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history here")
    for filename, date in results_contents.MEASURED.items():
        path = f"docs/results/{filename}"
        if path not in tracked:
            continue
        if json.loads((RESULTS / filename).read_text()).get("date"):
            continue
        changed = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD", "--", path]).returncode
        if changed:  # re-measured and not committed yet: its date is today's commit
            continue
        last = last_measured(path)
        if last:  # empty in a shallow clone that lacks the commit
            assert date == last, f"{filename}: MEASURED says {date}, git log says {last}"


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w./-])((?:scripts|benchmarks|docs|configs|recipes)/[\w./*<>-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_named_exists(doc):
    """Every scripts/, benchmarks/, docs/, configs/ or recipes/ path the README and docs name, and every relative
    link, exists."""
    text = doc.read_text()
    missing = []
    for name in PATH.findall(text):
        name = name.rstrip(".")
        if any(c in name for c in "*<>") or "NAME" in name:  # a pattern, not a path
            continue
        if not (REPO / name).exists():
            missing.append(name)
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or "://" in target or target.startswith("mailto:"):
            continue
        if not (doc.parent / target).exists():
            missing.append(target)
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"


INTERNAL = re.compile(
    r"\bsession \d+|\bsessions? \d|\bissue \d+|\bissue #\d+|\bthis session\b|\bwork items?\b|"
    r"\bSPEC\b|shared/PLATFORM",
    re.IGNORECASE,
)


@pytest.mark.parametrize(
    "path",
    [
        *DOCS,
        *sorted((REPO / "configs").rglob("*.yaml")),
        *sorted((REPO / "recipes").glob("*.yaml")),
        Path(results_contents.__file__),
        *sorted(results_page.TEMPLATES.glob("*.md")),
    ],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_internal_work_items(path):
    """User-facing text speaks of ptrun, not of how it was developed."""
    hits = [line.strip() for line in path.read_text().splitlines() if INTERNAL.search(line)]
    assert not hits, f"{path.relative_to(REPO)}: {hits}"


def test_the_code_names_no_internal_work_items():
    """The package, its benchmarks and its scripts speak of ptrun too (comments and docstrings included)."""
    code = [p for d in ("ptrun", "benchmarks", "scripts") for p in sorted((REPO / d).rglob("*.py"))]
    # `spec` is a common word in code: only the capitalised SPEC (the project's own design notes) counts there.
    internal = re.compile(INTERNAL.pattern.replace(r"|\bSPEC\b", ""), re.IGNORECASE)
    hits = [
        f"{p.relative_to(REPO)}: {line.strip()}"
        for p in code
        for line in p.read_text().splitlines()
        if internal.search(line) or re.search(r"\bSPEC\b", line)
    ]
    assert not hits, hits


def test_the_readme_reads_in_two_minutes():
    """At most 150 lines: what, set-up, first run, own model and data, several machines; the rest is in docs/."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move detail to docs/"
