"""The config is resolved once (`ptrun.compose.resolve`: composed, SLURM's layout applied, validated, defaults
filled), then made for where it runs (`for_this_machine`: this machine's `auto` values; `for_cluster`: a
plan's cluster); `ptrun train` composes once and makes its run directory itself; the layout rules in one
place; each choice declared once; docs/config.md made from the schema."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from pathlib import Path

import pytest
from conftest import TINY, TINY_MODEL, run_ptrun

from ptrun.compose import compose, for_cluster, for_this_machine, resolve
from ptrun.config import (
    FREEZE_POLICIES,
    PARTITIONS,
    ConfigError,
    PtrunConfig,
    check_concrete,
    choices_of,
    workers_per_node,
)
from ptrun.config.docs import field_docs, keys, render
from ptrun.config.schema import load_resolved

DOCS = Path(__file__).resolve().parents[1] / "docs" / "config.md"
SRUN = {
    "SLURM_JOB_ID": "1234",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NTASKS_PER_NODE": "1",
}


def test_resolve_leaves_the_machine_to_its_own_step():
    """`resolve` reads nothing of the machine it runs on; `for_this_machine` fills `auto` with this machine's
    answers, which the workers read as they are."""
    resolved = resolve(["pipe.length=1", "launcher.nproc_per_node=auto"], {})
    lc = resolved.cfg.launcher
    assert (lc.nproc_per_node, lc.threads_per_worker) == ("auto", "auto")
    assert resolved.cfg.run_dir.startswith("runs/") and resolved.slurm_note is None
    here = for_this_machine(resolved).cfg.launcher
    assert here.nproc_per_node == workers_per_node(lc)
    assert isinstance(here.threads_per_worker, int) and here.threads_per_worker >= 1
    assert for_this_machine(resolved).cfg.pipe == resolved.cfg.pipe


def test_the_resolved_config_holds_the_tokenizer_a_text_source_uses():
    """A text source's `data.tokenizer` defaults to `model.pretrained`: filled by `resolve`, so the YAML the
    workers read (and the run directory's config.yaml) holds it; given, it stays; an image source has none."""
    text = resolve(["recipe=bbc_news_bert"]).cfg
    assert text.model.pretrained is not None and text.data.tokenizer == text.model.pretrained
    given = resolve(["recipe=bbc_news_bert", f"data.tokenizer={text.model.pretrained}/."]).cfg
    assert given.data.tokenizer == f"{text.model.pretrained}/."
    assert compose(["recipe=bbc_news_bert"], check=False).data.tokenizer == text.model.pretrained
    assert resolve(["recipe=digits_vit"]).cfg.data.tokenizer is None


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
        for_cluster(["pipe.length=3"], nodes=1, gpus_per_node=4)
    # several machines: the cluster's world size, which validation leaves to a start's workers
    with pytest.raises(ConfigError, match=r"^pipe.length=3 is not allowed: a divisor of the world size 8"):
        for_cluster(["recipe=digits_vit", "pipe.length=3"], nodes=2, gpus_per_node=4)
    # and the batch at that world size: the same rules as on one machine, not the length alone
    with pytest.raises(
        ConfigError,
        match=r"^train.global_batch_size=36 is not allowed: a multiple of the "
        r"data-parallel width 16",
    ):
        for_cluster(["recipe=digits_vit", "pipe.length=1", "train.global_batch_size=36"], nodes=2, gpus_per_node=8)
    cfg = for_cluster(["recipe=digits_vit", "pipe.length=4"], nodes=2, gpus_per_node=4)
    assert (cfg.launcher.nproc_per_node, cfg.launcher.nnodes, cfg.run_dir) == (4, "2", "")


def test_the_layout_rules_are_one_function():
    pipe = PtrunConfig(run_dir="").pipe
    check_concrete(replace(pipe, length=2, microbatches=2), world=4, global_batch=32)
    for changes, world, message in [
        (dict(length=3, microbatches=3), 4, "pipe.length=3 is not allowed: a divisor of the world size 4"),
        (dict(length=2, microbatches=2), 4, None),
        (
            dict(length=1, microbatches=1),
            3,
            "train.global_batch_size=32 is not allowed: a multiple of the data-parallel width 3",
        ),
        (dict(length=2, microbatches=3), 4, "pipe.microbatches=3 is not allowed: a divisor of the per-replica"),
        (dict(length=2, microbatches=1, schedule="1F1B"), 4, "pipe.microbatches=1 is not allowed: at least"),
        (
            dict(length=2, microbatches=1, first_stage_replicas=2, schedule="pipedream"),
            4,
            "pipe.first_stage_replicas=2 is not allowed: 3 with 4 workers",
        ),
    ]:
        if message is None:
            check_concrete(replace(pipe, **changes), world, 32)
            continue
        with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
            check_concrete(replace(pipe, **changes), world, 32)


def test_the_layouts_resolve_returns_a_layout_that_obeys_the_rules():
    from ptrun.layout.fill import Devices, resolve
    from ptrun.layout.fit import UnitMemory

    cfg = PtrunConfig(run_dir="")
    cfg = replace(cfg, train=replace(cfg.train, global_batch_size=30))
    memory = UnitMemory([1.0] * 10, [1.0] * 10)
    # K = 1 fits, but 30 samples do not split over 4 replicas
    with pytest.raises(
        ConfigError, match="train.global_batch_size=30 is not allowed: a multiple of the data-parallel width 4"
    ):
        resolve(cfg, 4, Devices(10**9, memory))
    good, choice = resolve(replace(cfg, train=replace(cfg.train, global_batch_size=32)), 4, Devices(10**9, memory))
    assert (good.pipe.length, good.pipe.microbatches, choice.length) == (1, 1, 1)


@pytest.mark.slow
def test_ptrun_train_finishes_its_workers_config_in_one_pass(tmp_path):
    """`ptrun.launcher.start.finished_config`, the one entry `ptrun train` calls: it returns the config the
    workers read (made for this machine, `pipe.length=auto` and the micro-batch count made numbers, the run
    directory absolute) and makes nothing, the run directory included, which the command makes after it; the
    first bad input is its one ConfigError."""
    from ptrun.launcher.start import finished_config
    from ptrun.launcher.worker_server import stop_worker_server

    run_dir = (tmp_path / "runs" / "a").resolve()
    args = ["recipe=digits_vit", *(o for o in TINY if not o.startswith("pipe.")), f"hydra.run.dir={run_dir}"]
    try:
        cfg = finished_config([*args, "pipe.length=auto", "launcher.nproc_per_node=2"], {})
        with pytest.raises(ConfigError, match=r"^train.resume=true: .* holds no checkpoint to resume from"):
            finished_config([*args, "train.resume=true"], {})
    finally:
        stop_worker_server()  # the start's pass started it; a command ends it as it ends
    assert isinstance(cfg.pipe.length, int) and isinstance(cfg.pipe.microbatches, int)
    assert (cfg.launcher.nproc_per_node, cfg.run_dir) == (2, str(run_dir))
    assert not (tmp_path / "runs").exists()


def test_one_function_says_whether_the_layouts_resolve_runs():
    """`ptrun.layout.needs_resolve`, which every caller of `resolve` asks: on devices, a K or M left to choose;
    on a world of one size, an integer K whose batch to fill and layout to check; else nothing."""
    import inspect

    import ptrun.compose
    import ptrun.sim.planning
    from ptrun.layout import needs_resolve

    pipe = PtrunConfig(run_dir="").pipe
    given, auto_k = replace(pipe, length=2, microbatches=2), replace(pipe, length="auto")
    unset_m = replace(pipe, length=2, microbatches=None)
    for layout, on_devices, fixed_world, runs in [
        (given, True, True, True),
        (given, True, False, False),  # nothing to choose, a world of several sizes: the workers' world check
        (given, False, True, True),
        (given, False, False, False),
        (auto_k, True, False, True),
        (auto_k, False, True, False),  # K waits for the devices
        (unset_m, True, False, True),
        (unset_m, False, True, True),
    ]:
        assert needs_resolve(layout, on_devices=on_devices, fixed_world=fixed_world) is runs
    # the callers ask it, and nothing else decides: no caller weighs `pipe.length=auto` itself
    for module in (ptrun.compose, ptrun.sim.planning):
        code = inspect.getsource(module)
        assert "needs_resolve(" in code and 'pipe.length == "auto"' not in code, module.__name__
        assert 'pipe.length != "auto"' not in code, module.__name__


def schema_fields(cls=PtrunConfig, prefix=""):
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else None
        if is_dataclass(default):
            yield from schema_fields(type(default), f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, f, cls


def test_every_choice_is_declared_beside_its_field_and_its_docstring_names_each_value():
    choices = {key: choices_of(f) for key, f, _ in schema_fields() if choices_of(f) is not None}
    assert {
        "pipe.schedule",
        "pipe.partition",
        "freeze.policy",
        "auto.batch",
        "model.task",
        "model.attention",
        "launcher.backend",
        "logger",
        "data.name",
        "train.precision",
        "optim.name",
    } <= set(choices)
    for key, f, cls in schema_fields():
        values = choices_of(f)
        if values is None:
            continue
        doc = field_docs(cls)[f.name]
        words = [str(v).lower() if isinstance(v, bool) else v for v in values if v is not None]  # as YAML spells them
        missing = [w for w in words if w not in doc]
        assert not missing, f"the docstring of {key} does not name {missing}"


def test_every_field_has_a_docstring():
    undocumented = [key for key, f, cls in schema_fields() if f.name not in field_docs(cls)]
    assert not undocumented, undocumented


def test_the_layers_above_take_the_names_from_the_config():
    from ptrun.freezing.policies import POLICIES, make_policy
    from ptrun.layout.partition import PARTITIONERS

    assert tuple(PARTITIONERS) == PARTITIONS
    assert tuple(POLICIES) == FREEZE_POLICIES
    assert all(make_policy(name, 6, total_epochs=3, blocks=[0]).name == name for name in FREEZE_POLICIES)


def test_a_bad_choice_names_every_allowed_value():
    with pytest.raises(ConfigError) as e:
        compose(["pipe.schedule=Zigzag"])
    assert str(e.value) == (
        "pipe.schedule='Zigzag' is not allowed: one of GPipe, 1F1B, Interleaved1F1B, LoopedBFS, "
        "InterleavedZeroBubble, ZBVZeroBubble, DualPipeV, pipedream"
    )


def test_docs_config_md_is_up_to_date():
    assert len(list(keys())) > 80
    assert DOCS.read_text() == render(), "regenerate it: python -m ptrun.config.docs > docs/config.md"


@pytest.mark.slow
def test_ptrun_train_composes_once_and_makes_the_run_directory_as_hydra_did(tmp_path):
    """A single run starts from the one config `resolve` made: no state held between two compositions, the
    run directory (`hydra.run.dir`, here its default under the working directory) made by the start with
    nothing of Hydra's in it (configs/train.yaml asks for no `.hydra/` and no job log), and its config.yaml
    the resolved config, run_dir the directory's absolute path."""
    import ptrun.cli
    import ptrun.cli_train

    # a sweep's jobs, for its closing summary, and nothing a single run hands from its check to its start
    assert {
        f"{module.__name__}.{name}"
        for module in (ptrun.cli, ptrun.cli_train)
        for name, value in vars(module).items()
        if isinstance(value, (list, dict)) and not name.startswith("__")
    } == {"ptrun.cli_train.SWEEP_JOBS"}
    out = run_ptrun(
        "train", *TINY, "train.epochs=1", "train.max_steps_per_epoch=2", "checkpoint.every_epochs=1", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["runs"]
    (run_dir,) = (tmp_path / "runs").iterdir()
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.yaml", "train.log", "checkpoints"} <= names and not any(n.startswith(".") for n in names)
    cfg = load_resolved(run_dir / "config.yaml")
    assert cfg.run_dir == str(run_dir.resolve()) and cfg.recipe == "digits_vit"
    assert cfg.launcher.nproc_per_node == 2 and cfg.train.epochs == 1


def test_ptrun_train_with_a_bad_key_exits_2_in_one_line_and_makes_no_run_directory(tmp_path, cli):
    for args in (["train.epoch=3"], ["train.epoch=3", f"hydra.run.dir={tmp_path / 'run'}"]):
        out = cli("train", *args, cwd=tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert out.stderr.startswith("ptrun: error: unknown key 'train.epoch'; did you mean 'train.epochs'?")
        assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_plus_adds_entries_to_the_free_form_mapping_and_nothing_elsewhere():
    """`auto.microbatch_table` is the schema's one free-form mapping: `+` adds an entry there, by its dotted key
    or as a mapping, an entry it holds is set without `+`, and a sweep's points do the same; anywhere else
    a key the schema lacks is refused, with or without `+`."""
    from ptrun.config import free_form_keys

    assert free_form_keys() == ["auto.microbatch_table"]
    table = compose(["recipe=digits_vit"]).auto.microbatch_table
    assert table == {2: 2, 1: 1}
    assert compose(["recipe=digits_vit", "+auto.microbatch_table.4=2"]).auto.microbatch_table == {**table, 4: 2}
    assert compose(["recipe=digits_vit", "++auto.microbatch_table.8=1"]).auto.microbatch_table == {**table, 8: 1}
    assert compose(["recipe=digits_vit", "+auto.microbatch_table={4: 2, 8: 2}"]).auto.microbatch_table == {
        **table,
        4: 2,
        8: 2,
    }
    assert compose(["recipe=digits_vit", "auto.microbatch_table.2=4"]).auto.microbatch_table == {2: 4, 1: 1}
    assert compose(["recipe=digits_vit", "++optim.lr=3e-4"]).optim.lr == 3e-4  # `++` sets a key the schema has
    for override in ("+optim.lrr=1", "++optim.lrr=1", "+foo=1", "+model.deph.x=1", "+auto.foo=1"):
        with pytest.raises(ConfigError, match="^unknown key '"):
            compose(["recipe=digits_vit", override])


def test_a_sweep_point_with_an_unknown_added_key_is_refused(tmp_path, cli):
    """Hydra's app composes each point of a `-m` sweep itself: `+` is checked there too."""
    out = cli("train", "-m", "+optim.lrr=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("ptrun: error: unknown key 'optim.lrr'; did you mean 'optim.lr'?")


@pytest.mark.slow
def test_a_group_chosen_on_the_command_line_is_what_trains():
    """`ptrun train [recipe=R] data=glue` trains GLUE: a recipe picks its model, data and optimizer as config
    group options, which the command line replaces, and sets only values on top of them. A recipe that set
    `data.name` itself would silently train its own data over the user's choice."""
    import yaml

    from ptrun.compose import composed

    root = Path(__file__).resolve().parents[1]
    # what names the option (a data source's own key included: data.task is GLUE's alone)
    identity = {"model": {"name", "family"}, "data": {"name", "task"}, "optim": {"name"}, "adapter": {"name"}}
    for recipe in sorted((root / "recipes").glob("*.yaml")):
        values = yaml.safe_load(recipe.read_text())
        for group, names in identity.items():
            assert not names & set(values.get(group) or {}), f"{recipe.name} sets {group}'s identity: choose an option"
    # what that gives: the default recipe with each group's options in turn
    for group, names in identity.items():
        for option in sorted((root / "configs" / group).glob("*.yaml")):
            chosen = yaml.safe_load(option.read_text())
            got = getattr(composed([f"{group}={option.stem}"]), group)
            assert {k: getattr(got, k) for k in names} == {k: chosen.get(k) for k in names}, f"{group}={option.stem}"


@pytest.mark.slow
def test_a_runs_config_holds_the_layout_the_launcher_filled(tmp_path):
    """`pipe.length=auto` and an unset micro-batch count reach the workers, and the run's config.yaml, as numbers:
    the launcher fills them before any worker starts, and says what it chose in the line before the run's first."""
    run_dir = tmp_path / "run"
    out = run_ptrun(
        "train",
        "recipe=digits_vit",
        *TINY_MODEL,
        "train.epochs=1",
        "train.max_steps_per_epoch=2",
        "train.export=false",
        "freeze.policy=none",
        "launcher.nproc_per_node=2",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    cfg = load_resolved(run_dir / "config.yaml")
    assert (cfg.pipe.length, cfg.pipe.microbatches) == (1, 1)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("pipe.length=auto: the model needs ~0.00 GiB per device") and "K = 1" in lines[0]
    assert lines[1].startswith("ptrun: vit_tiny_patch16_224 (6 units")
    assert not any("pipe.length" in line for line in lines[1:])


def test_no_config_group_option_restates_a_schema_default():
    """configs/GROUP/OPTION.yaml sets only what differs from the schema's defaults (`ptrun.config`, where each
    default is documented once): a value equal to the default says nothing and would hide a change to it. The
    key that names the option (`name`) may say it anyway."""
    import yaml
    from omegaconf import OmegaConf

    from ptrun.compose import CONFIG_DIR

    defaults = OmegaConf.to_container(OmegaConf.structured(PtrunConfig(run_dir="")))
    options = sorted(CONFIG_DIR.glob("*/*.yaml"))
    assert len(options) >= 15
    restated = [
        f"{path.parent.name}/{path.name}: {key}: {value!r}"
        for path in options
        for key, value in (yaml.safe_load(path.read_text()) or {}).items()
        if key != "name" and defaults[path.parent.name].get(key, object()) == value
    ]
    assert restated == []
