"""The config is resolved once (`ptrun.compose.resolve`): composed, SLURM's layout applied, validated, this
machine's `auto` values filled; the layout rules in one place; each choice declared once; docs/config.md
made from the schema."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from pathlib import Path

import pytest

import ptrun.compose
from ptrun.compose import compose, resolve
from ptrun.config import (FREEZE_POLICIES, PARTITIONS, ConfigError, PtrunConfig, check_concrete, choices_of,
                          workers_per_node)
from ptrun.config.docs import field_docs, keys, render

DOCS = Path(__file__).resolve().parents[1] / "docs" / "config.md"
SRUN = {"SLURM_JOB_ID": "1234", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_NTASKS_PER_NODE": "1"}


def counted(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: (calls.append(a), original(*a, **k))[1])
    return calls


def test_a_start_is_validated_once_and_its_machine_checked_once(monkeypatch):
    validations = counted(monkeypatch, ptrun.compose, "validate")
    machines = counted(monkeypatch, ptrun.compose, "check_machines")
    resolved = resolve(["pipe.length=1", "launcher.nproc_per_node=auto"], {}, machine=True)
    assert len(validations) == 1 and len(machines) == 1
    # this machine's answers to `auto`, which the workers read as they are
    lc = resolved.cfg.launcher
    assert lc.nproc_per_node == workers_per_node(replace(lc, nproc_per_node="auto"))
    assert isinstance(lc.threads_per_worker, int) and lc.threads_per_worker >= 1
    assert resolved.run_dir.startswith("runs/") and resolved.slurm_note is None


def test_compose_is_resolve_without_the_machine():
    cfg = compose(["launcher.nproc_per_node=auto"], run_dir="/tmp/r", recipe="mine")
    assert (cfg.launcher.nproc_per_node, cfg.launcher.threads_per_worker) == ("auto", "auto")
    assert (cfg.recipe, cfg.run_dir) == ("mine", "/tmp/r")


def test_slurm_is_applied_from_the_environment_given_and_the_command_line_wins():
    resolved = resolve(["launcher.rdzv_endpoint=head:5000"], SRUN)
    lc = resolved.cfg.launcher
    assert (lc.nnodes, lc.rdzv_endpoint, lc.rdzv_id) == ("2", "head:5000", "slurm-1234")
    assert "SLURM job 1234: node 0 of 2" in resolved.slurm_note
    assert resolve([]).cfg.launcher.nnodes == "1"  # no environment given: none is read


def test_plan_sizes_the_launcher_before_the_checks():
    with pytest.raises(ConfigError, match=r"^pipe.length=3 is not allowed: a divisor of the world size 4"):
        resolve(["pipe.length=3"], paths=False, launcher={"nproc_per_node": 4})


def test_the_layout_rules_are_one_function():
    pipe = PtrunConfig(run_dir="").pipe
    check_concrete(replace(pipe, length=2, microbatches=2), world=4, global_batch=32)
    for changes, world, message in [
        (dict(length=3, microbatches=3), 4, "pipe.length=3 is not allowed: a divisor of the world size 4"),
        (dict(length=2, microbatches=2), 4, None),
        (dict(length=1, microbatches=1), 3, "train.global_batch_size=32 is not allowed: a multiple of the "
                                            "data-parallel width 3"),
        (dict(length=2, microbatches=3), 4, "pipe.microbatches=3 is not allowed: a divisor of the per-replica"),
        (dict(length=2, microbatches=1, schedule="1F1B"), 4, "pipe.microbatches=1 is not allowed: at least"),
        (dict(length=2, microbatches=1, first_stage_replicas=2, schedule="pipedream"), 4,
         "pipe.first_stage_replicas=2 is not allowed: 3 with 4 workers"),
    ]:
        if message is None:
            check_concrete(replace(pipe, **changes), world, 32)
            continue
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
            check_concrete(replace(pipe, **changes), world, 32)


def test_resolve_length_returns_a_layout_that_obeys_the_rules():
    from ptrun.parallel.fit import UnitMemory, resolve_length

    cfg = PtrunConfig(run_dir="")
    cfg = replace(cfg, train=replace(cfg.train, global_batch_size=30))
    memory = UnitMemory([1.0] * 10, [1.0] * 10)
    # K = 1 fits, but 30 samples do not split over 4 replicas
    with pytest.raises(ConfigError, match="train.global_batch_size=30 is not allowed: a multiple of the "
                                          "data-parallel width 4"):
        resolve_length(cfg, None, (), 4, 10**9, memory=memory)
    good, choice = resolve_length(replace(cfg, train=replace(cfg.train, global_batch_size=32)), None, (), 4, 10**9,
                                  memory=memory)
    assert (good.pipe.length, good.pipe.microbatches, choice.length) == (1, 1, 1)


def schema_fields(cls=PtrunConfig, prefix=""):
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else None
        if is_dataclass(default):
            yield from schema_fields(type(default), f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, cls


def test_every_choice_is_declared_beside_its_field_and_its_docstring_names_each_value():
    choices = {key: choices_of(f) for key, f, _ in schema_fields() if choices_of(f) is not None}
    assert {"pipe.schedule", "pipe.partition", "freeze.policy", "auto.batch", "model.task", "model.attention",
            "launcher.backend", "logger", "data.name", "train.precision", "optim.name"} <= set(choices)
    for key, f, cls in schema_fields():
        values = choices_of(f)
        if values is None:
            continue
        doc = field_docs(cls)[f.name]
        missing = [v for v in values if v is not None and v not in doc]
        assert not missing, f"the docstring of {key} does not name {missing}"


def test_every_field_has_a_docstring():
    undocumented = [key for key, f, cls in schema_fields() if f.name not in field_docs(cls)]
    assert not undocumented, undocumented


def test_the_layers_above_take_the_names_from_the_config():
    from ptrun.auto.freeze import POLICIES, make_policy
    from ptrun.parallel.partition import PARTITIONERS

    assert PARTITIONERS == PARTITIONS
    assert tuple(POLICIES) == FREEZE_POLICIES
    assert all(make_policy(name, 6, total_epochs=3, blocks=[0]).name == name for name in FREEZE_POLICIES)


def test_a_bad_choice_names_every_allowed_value():
    with pytest.raises(ConfigError) as e:
        compose(["pipe.schedule=Zigzag"])
    assert str(e.value) == ("pipe.schedule='Zigzag' is not allowed: one of GPipe, 1F1B, Interleaved1F1B, LoopedBFS, "
                            "InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, pipedream")


def test_docs_config_md_is_up_to_date():
    assert len(list(keys())) > 80
    assert DOCS.read_text() == render(), "regenerate it: python -m ptrun.config.docs > docs/config.md"


def test_ptrun_train_resolves_once_and_its_hydra_job_starts_that(monkeypatch, tmp_path):
    """`ptrun train`: the pre-flight resolves the config; the Hydra job (which creates the run directory)
    launches that config as it is, validated and machine-checked once."""
    import ptrun.cli
    import ptrun.launch

    validations = counted(monkeypatch, ptrun.compose, "validate")
    machines = counted(monkeypatch, ptrun.compose, "check_machines")
    launched = []
    monkeypatch.setattr(ptrun.launch, "launch", lambda cfg, path: launched.append((cfg, path.read_text())) or {})
    monkeypatch.setattr("sys.argv", ["ptrun"])
    run_dir = tmp_path / "run"
    ptrun.cli.run_train(["pipe.length=1", "train.epochs=2", f"hydra.run.dir={run_dir}"])
    assert len(validations) == 1 and len(machines) == 1
    (cfg, text), = launched
    assert cfg.run_dir == str(run_dir) and cfg.train.epochs == 2 and "nproc_per_node: 2" in text
