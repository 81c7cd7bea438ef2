"""`logger=wandb` and `logger=mlflow` in real runs: what each tracker stored, read back with its own reader,
equals the run's `metrics.jsonl`, and a resumed run goes on in the same tracker run.

Nothing goes over the network: wandb runs offline (WANDB_MODE=offline) with its error reports off, and
MLflow writes the SQLite store in the run directory with its telemetry off. wandb's and MLflow's own
files outside the run directory go to the test's temporary directory, not the home directory.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY, closed_port, run_events, run_workers

from ptrun.config import ConfigError
from ptrun.installed import check_installed
from ptrun.report.tensorboard import event_scalars
from ptrun.report.trackers import STATE_FILE

# Two workers, two short epochs; the second freezes a block, so the layout differs between the epochs.
OVERRIDES = TINY + [
    "train.epochs=2",
    "train.max_steps_per_epoch=3",
    "launcher.nproc_per_node=2",
    "freeze.policy=schedule",
    "freeze.blocks=[0,1]",
    "freeze.max_fraction=1.0",
]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """The environment the launcher hands to its workers: trackers offline, quiet, and kept in tmp_path."""
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_ERROR_REPORTING": "false",  # no crash reports to wandb's Sentry
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("WANDB_PROJECT", "WANDB_API_KEY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # anything a library put into the current directory would show up here


def expected_scalars(events: list[dict]) -> dict[tuple[int, str], float]:
    """(step, tag) -> value for every scalar the events hold (the same mapping TensorBoard gets, which
    tests/test_report.py checks tag by tag)."""
    out = {}
    for e in events:
        step, values = event_scalars(e["event"], e)
        out.update({(step, tag): value for tag, value in values.items()})
    return out


def assert_named_metrics(stored: dict[tuple[int, str], float], events: list[dict]) -> None:
    """The metrics a reader looks for, straight from metrics.jsonl's fields."""
    epochs = [e for e in events if e["event"] == "epoch"]
    plans = [e for e in events if e["event"] == "plan"]
    assert [e["epoch"] for e in epochs] == [0, 1] and [p["epoch"] for p in plans] == [0, 1]
    for e in epochs:
        assert stored[e["epoch"] + 1, "train/loss"] == e["train_loss"]
        assert stored[e["epoch"] + 1, "train/lr"] == e["lr"]
        assert stored[e["epoch"] + 1, "eval/top1"] == e["eval"]["top1"]
        assert stored[e["epoch"] + 1, "eval/loss"] == e["eval"]["loss"]
    for p in plans:
        assert stored[p["epoch"] + 1, "layout/K"] == p["pp"]
        assert stored[p["epoch"] + 1, "layout/DP"] == p["dp"]
        assert stored[p["epoch"] + 1, "layout/frozen_units"] == p["frozen_units"]
    end = next(e for e in events if e["event"] == "end")
    assert stored[2, "run/total_time_s"] == end["total_time_s"]


# ---- wandb -----------------------------------------------------------------------------------------------
def wandb_records(path: Path) -> Iterator:
    """The records of an offline run's `.wandb` file, parsed with wandb's own protobuf `Record`. wandb 0.30
    has no Python reader of the file any more (its Go core writes and syncs it), so the framing is read
    here: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a
    7-byte header (crc32, length, type 1 full / 2 first / 3 middle / 4 last); a block's tail shorter than
    a chunk header is zero padding."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # preallocated, unwritten space
            break
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = Record()
            record.ParseFromString(parts)
            yield record
            parts = b""


def items(updates) -> dict:
    """wandb's key/value_json items (history rows, config and summary updates) as a dict."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in updates}


def wandb_history(offline_dir: Path) -> tuple[dict[tuple[int, str], float], list]:
    """(epoch, tag) -> value over the history rows of one offline run, and its records."""
    records = list(wandb_records(next(offline_dir.glob("run-*.wandb"))))
    stored = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = items(record.history.item)
            stored.update(
                {(row["epoch"], tag): v for tag, v in row.items() if not tag.startswith("_") and tag != "epoch"}
            )
    return stored, records


@pytest.mark.slow  # the mlflow run (with a resume) stays fast
@pytest.mark.dist
def test_wandb_offline_run_holds_every_epochs_metrics(tmp_path, offline):
    run_dir = tmp_path / "wandb_run"
    temporary = Path(tempfile.gettempdir())
    before = set(temporary.glob("tmp*wandb-*"))
    run_workers(OVERRIDES + ["logger=wandb"], run_dir)
    # the workers imported wandb, which makes temporary directories (tmp...wandb-media, tmp...wandb-artifacts)
    # that only a normal interpreter exit removes
    assert set(temporary.glob("tmp*wandb-*")) == before
    events = run_events(run_dir)
    run_id = json.loads((run_dir / STATE_FILE).read_text())["wandb"]
    assert run_id.startswith("wandb_run-")
    [offline_dir] = (run_dir / "wandb").glob("offline-run-*")
    stored, records = wandb_history(offline_dir)
    assert stored == expected_scalars(events)
    assert_named_metrics(stored, events)
    assert [stored[1, "layout/frozen_units"], stored[2, "layout/frozen_units"]] == [0, 3]  # epochs differ

    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.run_id, run.display_name, run.project) == (run_id, "wandb_run", "ptrun")
    config = items(run.config.update)
    assert config["train"]["epochs"] == 2 and config["logger"] == "wandb" and config["freeze"]["blocks"] == [0, 1]
    # every scalar is charted over the epoch, not over wandb's own step
    assert any(
        r.metric.glob_name == "*" and r.metric.step_metric == "epoch"
        for r in records
        if r.WhichOneof("record_type") == "metric"
    )
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update(items(r.summary.update))
    end = next(e for e in events if e["event"] == "end")
    assert summary["run/end"]["total_time_s"] == end["total_time_s"]
    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert len(exits) == 1 and exits[0].exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("wandb-")) == ["wandb_run"]


# ---- mlflow ----------------------------------------------------------------------------------------------
@pytest.mark.dist
@pytest.mark.slow
def test_mlflow_store_in_the_run_directory_holds_every_epochs_metrics_and_a_resume_continues(tmp_path, offline):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "mlflow_run"
    run_workers(OVERRIDES + ["logger=mlflow", "train.epochs=1"], run_dir)
    state = json.loads((run_dir / STATE_FILE).read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{run_dir / 'mlflow.db'}"
    run_workers(OVERRIDES + ["logger=mlflow", "train.resume=true"], run_dir)  # on to epoch 2
    assert json.loads((run_dir / STATE_FILE).read_text())["mlflow"] == state

    events = run_events(run_dir)
    assert [e["event"] for e in events if e["event"] in ("start", "end")] == ["start", "end", "start", "end"]
    client = MlflowClient(state["tracking_uri"])
    experiment = client.get_experiment_by_name("ptrun")
    [run] = client.search_runs([experiment.experiment_id])  # one run, continued by the resume
    assert run.info.run_id == state["run_id"] and run.info.run_name == "mlflow_run"
    assert run.info.status == "FINISHED"
    assert experiment.artifact_location == (run_dir / "mlartifacts").as_uri()
    stored = {}
    for tag in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, tag)
        stored.update({(m.step, tag): m.value for m in history})
    # the first attempt's end (run/total_time_s at step 1) stays; the last value per (step, tag) is compared
    assert stored == expected_scalars(events)
    assert_named_metrics(stored, [e for e in events if e["event"] != "end"] + [events[-1]])
    assert [m.timestamp for m in client.get_metric_history(run.info.run_id, "train/loss")] == [
        int(e["time"] * 1000) for e in events if e["event"] == "epoch"
    ]

    # the config as params, as the run began; what the resume changed as tags
    assert run.data.params["train.epochs"] == "1" and run.data.params["logger"] == "mlflow"
    assert run.data.params["freeze.blocks"] == "[0, 1]" and run.data.params["train.resume"] == "False"
    assert run.data.tags["resumed.train.epochs"] == "2" and run.data.tags["resumed.train.resume"] == "True"
    assert json.loads(run.data.tags["run/end"])["epochs"] == 2
    assert json.loads(run.data.tags["run/start"])["resumed_from"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow_run"]


# ---- a missing package -----------------------------------------------------------------------------------
def test_a_missing_tracker_package_is_one_line_naming_the_extra():
    """Checked with a module that is not installed anywhere: the real packages are installed here."""
    with pytest.raises(ConfigError) as err:
        check_installed("wandb", ["ptrun_no_such_module"])
    assert str(err.value) == "logger=wandb needs the ptrun_no_such_module package: pip install 'ptrun[trackers]'"
    check_installed("wandb")
    check_installed("mlflow")  # with the SQLite store: mlflow, sqlalchemy and alembic are all found


def test_mlflow_with_a_tracking_server_needs_no_sqlalchemy(monkeypatch):
    from ptrun.installed import required_modules

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert required_modules("mlflow") == ["mlflow", "sqlalchemy", "alembic"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert required_modules("mlflow") == ["mlflow"]
    assert required_modules("wandb") == ["wandb"] and required_modules("tensorboard") == []


# ---- a tracker that cannot take the run ------------------------------------------------------------------
def test_wandb_online_without_a_login_is_refused_and_any_login_or_offline_mode_passes(no_wandb_login, monkeypatch):
    from ptrun.installed import NO_WANDB_LOGIN, check_tracker_ready

    with pytest.raises(ConfigError) as err:
        check_tracker_ready("wandb")
    assert (
        str(err.value) == NO_WANDB_LOGIN == ("logger=wandb: no W&B login; run `wandb login`, or set WANDB_MODE=offline")
    )
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(ConfigError):
        check_tracker_ready("wandb")
    for mode in ("offline", "disabled"):  # nothing is sent: no login needed
        monkeypatch.setenv("WANDB_MODE", mode)
        check_tracker_ready("wandb")
    monkeypatch.delenv("WANDB_MODE")
    # a .netrc entry for W&B's host, as `wandb login` writes it (a key is 40 characters or more)
    (no_wandb_login / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {'k' * 40}\n")
    check_tracker_ready("wandb")
    (no_wandb_login / ".netrc").write_text(f"machine example.com\n  login user\n  password {'k' * 40}\n")
    with pytest.raises(ConfigError):
        check_tracker_ready("wandb")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_tracker_ready("wandb")


def test_mlflow_with_a_server_that_does_not_answer_is_refused_naming_it(monkeypatch):
    from ptrun.installed import check_tracker_ready

    uri = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(ConfigError) as err:
        check_tracker_ready("mlflow")
    assert str(err.value) == (
        f"logger=mlflow: MLFLOW_TRACKING_URI={uri} is not reachable (Connection refused); "
        f"start the tracking server, or unset MLFLOW_TRACKING_URI to log into "
        f"RUN_DIR/mlflow.db"
    )
    for store in ("sqlite:///runs/mlflow.db", "file:///tmp/mlruns", "./mlruns"):  # local stores: nothing to reach
        monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
        check_tracker_ready("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    check_tracker_ready("mlflow")
    check_tracker_ready("jsonl")


def test_a_server_that_never_answers_is_refused_in_bounded_time(monkeypatch):
    """A name lookup or a connection that hangs (a firewall that drops packets) ends after the timeout."""
    import socket
    import threading

    import ptrun.installed

    release = threading.Event()

    def hang(*args, **kwargs):
        release.wait()
        raise ConnectionRefusedError(111, "too late")

    monkeypatch.setattr(socket, "create_connection", hang)
    monkeypatch.setattr(ptrun.installed, "TRACKER_TIMEOUT_S", 0.1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://mlflow.example.com")
    try:
        with pytest.raises(
            ConfigError,
            match=r"^logger=mlflow: MLFLOW_TRACKING_URI=https://mlflow.example.com is "
            r"not reachable \(no answer in 0.1 s\); ",
        ):
            ptrun.installed.check_tracker_ready("mlflow")
    finally:
        release.set()
