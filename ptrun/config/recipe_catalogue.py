"""Which recipes fit a model: each recipe's inputs (images or text) and task, read from `recipes/*.yaml` and
the config groups they choose, so that a refusal of a model its recipe cannot train names the recipes that
can (`cross.check_model_fits_recipe`) without a list of recipe names kept by hand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ptrun.config.data import PACKAGED_TEXT_SOURCES, SOURCE_IMAGES, DataConfig
from ptrun.config.model import DECODER_TASKS, DECODER_TYPES, ENCODER_TASKS, ModelConfig, generic_family

SHIPPED_DATA = ("digits",) + PACKAGED_TEXT_SOURCES
"""Data sources that ship with the package: a recipe reading one runs as it is, so it is named first."""


@dataclass(frozen=True)
class Recipe:
    """What a recipe trains, as far as choosing a model goes."""

    name: str
    data: str
    """Its `data.name`."""
    task: str
    """Its `model.task`."""
    family: str | None
    """Its `model.family` (`transformers`: a Hugging Face model of your own, any family)."""

    @property
    def inputs(self) -> str:
        """`images` or `text`."""
        return "images" if self.data in SOURCE_IMAGES else "text"

    def takes_timm(self) -> bool:
        """A timm image model (a ViT) fits it."""
        return self.inputs == "images"

    def takes_text_model(self, model_type: str) -> bool:
        """A Hugging Face text model of `model_type` fits it: text, and a task that family does."""
        tasks = DECODER_TASKS if model_type in DECODER_TYPES else ENCODER_TASKS
        return self.inputs == "text" and self.task in tasks


def _yaml(path: Path) -> dict:
    """A yaml file as plain containers, interpolations left as written (`${package_dir:...}` needs a
    resolver this module does not register); {} when it is missing."""
    from omegaconf import OmegaConf  # inner import: start-up

    if not path.is_file():
        return {}
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}


def _choices(defaults: list) -> dict[str, str]:
    """The group options a defaults list chooses (`model: vit_digits`, `override /data: glue`)."""
    chosen = {}
    for entry in defaults:
        if isinstance(entry, dict):
            for key, option in entry.items():
                chosen[key.removeprefix("override").strip().lstrip("/")] = option
    return chosen


def _read_recipe(path: Path, config_dir: Path, base: dict[str, str]) -> Recipe:
    """Recipe `path` over the primary config's group choices `base`: its own keys win over its groups'."""
    node = _yaml(path)
    groups = {**base, **_choices(node.get("defaults", []))}
    model = {**_yaml(config_dir / "model" / f"{groups.get('model')}.yaml"), **(node.get("model") or {})}
    data = {**_yaml(config_dir / "data" / f"{groups.get('data')}.yaml"), **(node.get("data") or {})}
    return Recipe(
        path.stem, data.get("name", DataConfig.name), model.get("task", ModelConfig.task), model.get("family")
    )


def _yaml_root() -> Path:
    """Where `configs/` and `recipes/` are: inside the package when installed from a wheel, else the clone
    (an editable install runs the clone's `ptrun/`, with no copy in it). The packaged copy is looked for first
    because the directory above an installed package is site-packages, where another distribution may have
    put a top-level `configs` or `recipes` (torchtune ships a `recipes` package)."""
    package = Path(__file__).resolve().parents[1]
    return package if (package / "configs" / "train.yaml").is_file() else package.parent


CONFIG_DIR = _yaml_root() / "configs"
"""The config groups and the primary `train.yaml`."""
RECIPE_DIR = CONFIG_DIR.parent / "recipes"
"""The recipes, `recipes/NAME.yaml`."""


@lru_cache(maxsize=1)
def recipe_catalogue() -> tuple[Recipe, ...]:
    """Every recipe `recipe=NAME` chooses, in the order a refusal suggests them: the generic ones first (a
    model of your own: `model=transformers`), then those whose data ship with the package, then by name."""
    base = _choices(_yaml(CONFIG_DIR / "train.yaml").get("defaults", []))
    recipes = [_read_recipe(path, CONFIG_DIR, base) for path in RECIPE_DIR.glob("*.yaml")]
    return tuple(sorted(recipes, key=lambda r: (not generic_family(r.family), r.data not in SHIPPED_DATA, r.name)))


def recipe_named(name: str | None) -> Recipe | None:
    """The catalogue's recipe `name`, or None (a config composed without one, or a test's own name)."""
    return next((r for r in recipe_catalogue() if r.name == name), None)


def use_recipe(fits: Callable[[Recipe], bool], current: str | None) -> str:
    """`use recipe=A (or another that fits: B, C)`: the recipes other than `current` that `fits` accepts."""
    names = [r.name for r in recipe_catalogue() if fits(r) and r.name != current]
    if not names:
        return "no recipe fits it (ptrun recipes lists them)"
    others = f" (or another that fits: {', '.join(names[1:])})" if names[1:] else ""
    return f"use recipe={names[0]}{others}"
