"""Experiment trackers fed the `metrics.jsonl` events as a run goes: `logger=wandb` (`WandbLog`, Weights &
Biases) and `logger=mlflow` (`MlflowLog`, MLflow). Both mirror `MetricsLog.write(event, **fields)` like
`TensorBoardLog` and show the same tags at the same steps (`event_scalars`): train/loss, eval/top1,
layout/K, ... at the 1-based epoch, run/total_time_s at the last; the start and end events whole.

Only rank 0 writes (the trainer makes a `MetricsLog` there alone). The run directory remembers the tracker's
run in `trackers.json`, so a resumed run (`train.resume=true`, or a worker restart) goes on in the same
tracker run:

  wandb   files under RUN_DIR/wandb; run name = the run directory's name, id = that name plus a random
          suffix (resumed with `resume="allow"`); project $WANDB_PROJECT or `ptrun`; the mode is wandb's
          own setting: `WANDB_MODE=offline` writes RUN_DIR/wandb/offline-run-*/ for a later `wandb sync`
          and sends nothing. The config goes into the run's config.
  mlflow  $MLFLOW_TRACKING_URI, or the SQLite store RUN_DIR/mlflow.db (`mlflow ui --backend-store-uri
          sqlite:///RUN_DIR/mlflow.db`); experiment $MLFLOW_EXPERIMENT_NAME or `ptrun`; run name = the run
          directory's name. The config becomes params (`train.epochs`, ...); start and end are the tags
          run/start and run/end (JSON).

The libraries come with `pip install 'ptrun[trackers]'`; `ptrun.installed.check_installed` refuses a logger whose
package is missing while the config is validated, before any worker starts.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from ptrun.report.tensorboard import TEXT_EVENTS, event_scalars

STATE_FILE = "trackers.json"
"""In the run directory: {"wandb": run id} / {"mlflow": {"run_id", "tracking_uri"}}, the tracker run to resume."""
DEFAULT_PROJECT = "ptrun"


def config_dict(config: Any) -> dict[str, Any]:
    """The run's config (a PtrunConfig, DictConfig or dict) as plain nested dicts."""
    return {} if config is None else OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


def _flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _load_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_state(run_dir: Path, key: str, value: Any) -> None:
    state = {**_load_state(run_dir), key: value}
    tmp = run_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    os.replace(tmp, run_dir / STATE_FILE)  # a crash mid-write leaves the previous file, not half of one


class WandbLog:
    def __init__(self, run_dir: str | Path, config: Any = None):
        import wandb  # inner import: optional library

        self.run_dir = Path(run_dir)
        run_id = _load_state(self.run_dir).get("wandb")
        if run_id is None:
            # The name says which run it is; the suffix keeps two run directories of the same name (on two
            # machines, or a deleted and recreated one) from resuming each other's run in a shared project.
            run_id = f"{re.sub(r'[^A-Za-z0-9_.-]', '-', self.run_dir.name)[:48]}-{uuid.uuid4().hex[:8]}"
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
            name=self.run_dir.name,
            id=run_id,
            resume="allow",
            dir=self.run_dir,
            config=config_dict(config),
        )
        _save_state(self.run_dir, "wandb", run_id)
        # Charts over the epoch, not over wandb's own step (one per log call): a plan and its epoch are
        # two calls at the same epoch, and a resumed run repeats epochs, which a step could not.
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")
        self.ended = False

    def write(self, event: str, **fields: Any) -> None:
        step, values = event_scalars(event, fields)
        if values:
            self.run.log({**values, "epoch": step})
        if event in TEXT_EVENTS:
            self.run.summary[TEXT_EVENTS[event]] = fields
        self.ended |= event == "end"

    def close(self) -> None:
        # Without an end event the run stopped early (an error, a signal): wandb marks it failed.
        self.run.finish(exit_code=0 if self.ended else 1)


class MlflowLog:
    def __init__(self, run_dir: str | Path, config: Any = None):
        # inner import: optional library
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.run_dir = Path(run_dir)
        # A database store: MLflow 3.17 refuses a new file store (./mlruns) unless MLFLOW_ALLOW_FILE_STORE is set.
        in_run_dir = not os.environ.get("MLFLOW_TRACKING_URI")
        uri = f"sqlite:///{(self.run_dir / 'mlflow.db').resolve()}" if in_run_dir else os.environ["MLFLOW_TRACKING_URI"]
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = (_load_state(self.run_dir).get("mlflow") or {}).get("run_id")
        logged: dict[str, str] = {}
        if self.run_id is not None:
            try:
                logged = self.client.get_run(self.run_id).data.params
                self.client.update_run(self.run_id, status="RUNNING")
            except MlflowException:  # another store than the run began in: start a run there
                self.run_id = None
        if self.run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
            experiment = self.client.get_experiment_by_name(name)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            else:
                # Artifacts of the store in the run directory stay there too, not in the current directory.
                location = (self.run_dir / "mlartifacts").resolve().as_uri() if in_run_dir else None
                experiment_id = self.client.create_experiment(name, location)
            self.run_id = self.client.create_run(
                experiment_id, run_name=self.run_dir.name, tags={"ptrun.run_dir": str(self.run_dir.resolve())}
            ).info.run_id
            _save_state(self.run_dir, "mlflow", {"run_id": self.run_id, "tracking_uri": uri})
        self._log_config(config, logged)
        self.ended = False

    def _log_config(self, config: Any, logged: dict[str, str]) -> None:
        """The config as params; a resumed run's changed values (MLflow keeps a param's first value) as tags
        `resumed.KEY`."""
        # inner import: optional library
        from mlflow.entities import Param, RunTag
        from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

        flat = {key: str(value) for key, value in _flatten(config_dict(config))}
        params = [Param(k, v) for k, v in flat.items() if k not in logged]
        tags = [RunTag(f"resumed.{k}", v) for k, v in flat.items() if k in logged and logged[k] != v]
        for i in range(0, max(len(params), len(tags)), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(
                self.run_id,
                params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH],
                tags=tags[i : i + MAX_PARAMS_TAGS_PER_BATCH],
            )

    def write(self, event: str, **fields: Any) -> None:
        from mlflow.entities import Metric, RunTag  # inner import: optional library

        step, values = event_scalars(event, fields)
        ms = int(fields.get("time", time.time()) * 1000)
        metrics = [Metric(tag, float(value), ms, step) for tag, value in values.items()]
        tags = [RunTag(TEXT_EVENTS[event], json.dumps(fields))] if event in TEXT_EVENTS else []
        if metrics or tags:
            self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
        self.ended |= event == "end"

    def close(self) -> None:
        # KILLED: stopped before its end event (an error or a signal); a resume sets it RUNNING again.
        self.client.set_terminated(self.run_id, "FINISHED" if self.ended else "KILLED")
