"""The tokenized-data cache heals under real `ptrun train` runs of two workers: a damaged entry is tokenized
again, said in one line on the terminal, and the run trains to the result of a run on a clean cache; two runs
started together on one new data file both finish, and the cache holds one good entry per split."""

from __future__ import annotations

import subprocess

import pytest
import torch
from conftest import final_params, run_events, run_ptrun, start_ptrun, wordpiece_tokenizer
from test_cache_entries import damage
from test_hf_data import TOY_EVAL, TOY_TRAIN, listing, write_source
from test_hf_train_dist import TINY_BERT

from ptrun import cache_entries

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # `ptrun train` runs of two workers

SAID = "tokenized-data cache entry"


def setup(tmp_path):
    """A new data file and tokenizer; the arguments of a short run on them; the environment that points the
    runs at the test's own tokenized-data and `datasets` caches."""
    source = write_source("csv", tmp_path / "news", TOY_TRAIN, TOY_EVAL)
    tokenizer = wordpiece_tokenizer(tmp_path / "tokenizer", [t for t, _ in TOY_TRAIN], vocab_size=200)
    args = [*TINY_BERT, f"data.path={source}", f"data.tokenizer={tokenizer}", "train.epochs=1", "train.export=false"]
    env = {"PTRUN_TOKENIZED_DIR": str(tmp_path / "tokenized"), "HF_HOME": str(tmp_path / "hf_home")}
    return args, env


def the_same_training(a, b) -> None:
    assert [e["eval"]["loss"] for e in run_events(a, "epoch")] == pytest.approx(
        [e["eval"]["loss"] for e in run_events(b, "epoch")], rel=1e-6
    )
    ours, theirs = final_params(a), final_params(b)
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        assert torch.allclose(value, theirs[name], atol=1e-6), name


def test_a_damaged_entry_is_tokenized_again_in_one_line_and_trains_as_a_clean_cache_does(tmp_path):
    args, env = setup(tmp_path)
    clean = run_ptrun("train", *args, f"hydra.run.dir={tmp_path / 'clean'}", cwd=tmp_path, env=env)
    assert clean.returncode == 0, clean.stderr
    assert SAID not in clean.stderr  # a first build is no news
    eval_entry, train_entry = sorted(listing(tmp_path / "tokenized"), key=lambda p: p.stat().st_size)
    damage(train_entry, "flipped")

    healed = run_ptrun("train", *args, f"hydra.run.dir={tmp_path / 'healed'}", cwd=tmp_path, env=env)
    assert healed.returncode == 0, healed.stderr
    lines = [line for line in healed.stderr.splitlines() if "cache entry" in line or str(train_entry) in line]
    assert len(lines) == 1 and f"{SAID} {train_entry} is unusable: its bytes differ from its checksum" in lines[0]
    assert lines[0].endswith("; tokenizing it again"), lines
    assert "Traceback" not in healed.stderr
    assert cache_entries.fault(train_entry) is None and cache_entries.fault(eval_entry) is None
    the_same_training(tmp_path / "healed", tmp_path / "clean")


def test_two_runs_started_together_on_a_new_data_file_both_finish_and_leave_one_good_entry(tmp_path):
    args, env = setup(tmp_path)
    runs = [
        start_ptrun(
            "train",
            *args,
            f"hydra.run.dir={tmp_path / name}",
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name in ("a", "b")
    ]
    outs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err for _, err in outs]
    assert all(SAID not in err for _, err in outs)
    entries = listing(tmp_path / "tokenized")  # each beside its checksum, no lock or temporary file
    assert len(entries) == 2 and all(cache_entries.fault(e) is None for e in entries)
    the_same_training(tmp_path / "a", tmp_path / "b")
