"""Hugging Face hub ids as `model.pretrained`, `data.tokenizer` and a built-in source's `data.path`, turned into
local directories and files.

A value that exists on disk is a path, whatever it looks like. Otherwise one of the form `org/name` or
`org/name@revision` (a branch, a tag or a commit) is a hub id, and so is a bare `name[@revision]` (`gpt2`,
`bert-base-uncased`: the hub's oldest models have no org) that does not end like a file (`.safetensors`, `.pt`): it is
looked up in the Hugging Face cache and, unless `HF_HUB_OFFLINE` is set, the files ptrun reads are fetched into it once
(never the whole repo). The start does this on each machine, before any worker (`ptrun.compose.resolve`), and hands the
workers the snapshot directory (or, for a timm ViT, its weights file): the weights loader, the tokenizer and the
simulator only ever see local paths. `ptrun plan` fetches only a model's config.json (the sizes it reads). A dataset id
in `data.path` (the paper's recipes: `uoft-cs/cifar100`, `nyu-mll/glue`, ...) is fetched the same way, as a dataset repo
and only the parquet files its source reads (`DATASET_FILES`); `data.name=hf` reads its hub ids through `datasets`
instead (`ptrun.data.hf_read`). Offline, every id the cache lacks is named in one line with the command that fetches it.

The cache is the one `huggingface_hub` uses, read from the environment at each call (`HF_HUB_CACHE`, else
`HF_HOME/hub`, else `~/.cache/huggingface/hub`; `HF_HUB_OFFLINE` and `HF_ENDPOINT` too) rather than from
its constants, fixed when it was imported.
`huggingface_hub` itself is imported only when a value is a hub id.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatch
from pathlib import Path

from ptrun.config.cross import check_model_fits_recipe
from ptrun.config.model import HF_MODEL_TYPES, family_spec
from ptrun.errors import ConfigError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
"""`org/name` with an optional `@revision`: what a value that is not on disk must look like to be a hub id
(each part starting with a letter or digit, as the hub's do: `./x` and `../x` are paths)."""
BARE_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
"""`name[@revision]` without an org, as users type the oldest hub models (`bert-base-uncased`, `gpt2`,
`roberta-base`): no slash, nor a leading `.` or `~` (a path)."""
FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".pkl", ".json", ".npz", ".h5", ".msgpack")
"""Endings that make a bare name a missing file rather than a hub id (hub names may hold dots: Qwen2.5-0.5B)."""
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
"""Weight files of a Hugging Face directory that the weights loader reads (the first found wins)."""
FETCHED_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
"""The weight files fetched: safetensors, whole or sharded (a repo's other formats are left on the hub)."""
TOKENIZER = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
)
"""What `AutoTokenizer.from_pretrained` reads from a tokenizer's directory."""
TIMM_WEIGHTS = "model.safetensors"
"""A timm hub repo's (`timm/NAME.TAG`) weights: timm's own state dict, which ptrun's ViT loader reads."""


DATASET_FILES = {
    "cifar10": lambda d: ("*train-*.parquet", "*test-*.parquet"),
    "cifar100": lambda d: ("*train-*.parquet", "*test-*.parquet"),
    "glue": lambda d: (
        f"{d.task}/train-*.parquet",
        f"{d.task}/validation{'_matched' if d.task == 'mnli' else ''}-*.parquet",
    ),
    "squad": lambda d: ("*train-*.parquet", "*validation-*.parquet"),
    "imagefolder": lambda d: ("*train-*.parquet", "*validation-*.parquet"),
}
"""The files of a hub dataset repo each built-in source reads from its snapshot (the hub's parquet layout:
`cifar100/train-00000-of-00001.parquet`, `sst2/validation-...`, `data/train-...` for ImageNet), by
`data.name`; a test split without labels is never fetched."""
GATED_IMAGES = "or set data.path to an image folder (train/<class>/*, val/<class>/*)"
"""What a `data.name=imagefolder` run can take instead of a gated hub dataset it cannot have (ImageNet)."""


@dataclass(frozen=True)
class HubId:
    repo: str
    revision: str | None
    """A branch, tag or commit; None = the repo's default branch (`main`)."""
    repo_type: str = "model"
    """`model` or `dataset` (a built-in source's `data.path`)."""

    def __str__(self) -> str:
        return self.repo + (f"@{self.revision}" if self.revision else "")

    def fetch_command(self) -> str:
        return (
            f"hf download {self.repo}"
            + (f" --revision {self.revision}" if self.revision else "")
            + (" --repo-type dataset" if self.repo_type == "dataset" else "")
        )


class NotCached(ConfigError):
    """A hub id the cache lacks where the hub cannot be had (offline or unreachable): `resolve_hub_ids` names
    every such id of a config in one line (`_not_cached`)."""

    def __init__(self, message: str, key: str, hub_id: HubId, why: str, cache: Path, extra: str = "") -> None:
        super().__init__(message)
        self.key, self.hub_id, self.why, self.cache, self.extra = key, hub_id, why, cache, extra


def parse_hub_id(value: str | None, repo_type: str = "model") -> HubId | None:
    """The hub id `value` names, or None when it is unset, exists on disk, or does not look like one."""
    if value is None or Path(value).expanduser().exists() or not (HUB_ID.match(value) or is_bare_hub_id(value)):
        return None
    repo, _, revision = value.partition("@")
    return HubId(repo, revision or None, repo_type)


def data_hub_id(cfg) -> HubId | None:
    """The hub dataset `data.path` names for a built-in source that reads the hub's parquet layout
    (`DATASET_FILES`); None for a local path, and for `data.name=hf` (read through `datasets`)."""
    d = cfg.data
    if d.name not in DATASET_FILES or d.path is None or "/" not in d.path:  # datasets have an org
        return None
    return parse_hub_id(d.path, "dataset")


def is_bare_hub_id(value: str) -> bool:
    """`value` reads as a hub id without an org (`gpt2`, `bert-base-uncased@main`), not as a file name."""
    return bool(BARE_HUB_ID.match(value)) and not value.partition("@")[0].lower().endswith(FILE_SUFFIXES)


def hub_cache(env: Mapping[str, str]) -> Path:
    """The hub cache `huggingface_hub` would use in environment `env` (its own precedence of variables)."""
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(cache)).expanduser()


def hub_offline(env: Mapping[str, str]) -> bool:
    """`HF_HUB_OFFLINE` (or transformers' `TRANSFORMERS_OFFLINE`) set to a true value."""
    value = env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def resolve_hub_ids(cfg, *, full: bool = True, env: Mapping[str, str] | None = None):
    """`cfg` with a hub id in `model.pretrained`, `data.tokenizer` or a built-in source's `data.path` replaced
    by its local snapshot (a timm ViT's: the weights file in it); `cfg` itself when none is one. `full=False`
    (`ptrun plan`) fetches only the config.json of a model the simulator sizes from it, no tokenizer and no
    data. Says each replacement in one line on stderr; ConfigError, one line, when an id cannot be had: every
    id the cache lacks is named in it, with the commands that fetch them."""
    env = os.environ if env is None else env
    missing: list[NotCached] = []
    resolvers = (_resolve_model, _resolve_tokenizer, _resolve_data, _resolve_adapter) if full else (_resolve_model,)
    for resolver in resolvers:
        try:
            cfg = resolver(cfg, full, env)
        except NotCached as e:
            missing.append(e)
    if len(missing) == 1:
        raise missing[0]
    if missing:
        raise ConfigError(_not_cached(missing))
    return cfg


def _resolve_model(cfg, full: bool, env: Mapping[str, str]):
    m = cfg.model
    model_id = parse_hub_id(m.pretrained)
    if model_id is None:
        return cfg
    family = family_spec(m)
    vit = family is not None and family.reads_images
    if vit and full:
        text_dir = _text_model_dir("model.pretrained", model_id, env)
        if text_dir is not None:  # a text model where a ViT was expected: refused before its weights come
            check_model_fits_recipe(replace(cfg, model=replace(m, pretrained=text_dir)), shown=str(model_id))
            vit = False  # not refused (model.family=vit over a label of its own): fetched as the text model
    if not full and vit:  # plan sizes a ViT from its name: nothing to fetch
        return cfg
    key = "model.pretrained"
    if not full:
        local = str(Path(_fetch_file(key, model_id, "config.json", env)).parent)
    elif vit:  # a ViT takes a weights file
        local = str(Path(_fetch(key, model_id, ("config.json", TIMM_WEIGHTS), (TIMM_WEIGHTS,), env)) / TIMM_WEIGHTS)
    else:
        local = _fetch(key, model_id, ("config.json", *FETCHED_WEIGHTS, *TOKENIZER), WEIGHTS, env)
    _say(key, model_id, local)
    return replace(cfg, model=replace(m, pretrained=local))


def _resolve_tokenizer(cfg, full: bool, env: Mapping[str, str]):
    tokenizer_id = parse_hub_id(cfg.data.tokenizer)
    if tokenizer_id is None:
        return cfg
    local = _fetch("data.tokenizer", tokenizer_id, ("config.json", *TOKENIZER), TOKENIZER, env)
    _say("data.tokenizer", tokenizer_id, local)
    return replace(cfg, data=replace(cfg.data, tokenizer=local))


def _resolve_data(cfg, full: bool, env: Mapping[str, str]):
    """A built-in source's hub dataset: the parquet files it reads (`DATASET_FILES`), fetched into the hub
    cache once, `data.path` made the snapshot directory they lie in."""
    data_id = parse_hub_id(cfg.data.path, "dataset") if data_hub_id(cfg) is not None else None
    if data_id is None:
        return cfg
    patterns = DATASET_FILES[cfg.data.name](cfg.data)
    extra = GATED_IMAGES if cfg.data.name == "imagefolder" else ""
    local = _fetch("data.path", data_id, patterns, patterns, env, extra=extra)
    _say("data.path", data_id, local)
    return replace(cfg, data=replace(cfg.data, path=local))


def _resolve_adapter(cfg, full: bool, env: Mapping[str, str]):
    """A hub adapter in `adapter.pretrained`: its peft files fetched, the key made their snapshot directory."""
    adapter_id = parse_hub_id(cfg.adapter.pretrained)
    if adapter_id is None:
        return cfg
    files = ("adapter_config.json", "adapter_model.safetensors")
    local = _fetch("adapter.pretrained", adapter_id, files, files[:1], env)
    _say("adapter.pretrained", adapter_id, local)
    return replace(cfg, adapter=replace(cfg.adapter, pretrained=local))


def _not_cached(missing: list[NotCached]) -> str:
    """The one line naming every id the cache lacks, each with the command that fetches it."""
    first = missing[0]
    ids = ", ".join(f"{e.key}={str(e.hub_id)!r}" for e in missing)
    commands = "; ".join(e.hub_id.fetch_command() for e in missing)
    extra = "".join(f"; {e.extra}" for e in missing if e.extra)
    return (
        f"not in the Hugging Face cache ({first.cache}) and {first.why}: {ids}; fetch them on a machine "
        f"with access: {commands}{extra}"
    )


def _text_model_dir(key: str, hub_id: HubId, env: Mapping[str, str]) -> str | None:
    """The snapshot directory of `hub_id`, its config.json alone fetched, when that names a Hugging Face
    text model (a `model_type` ptrun splits; timm's config.json names an `architecture`); else None."""
    try:
        config = Path(_fetch_file(key, hub_id, "config.json", env))
        kind = json.loads(config.read_text()).get("model_type")
    except (ConfigError, OSError, ValueError, AttributeError):
        return None  # no config.json, or none readable: the weights' fetch says what is wrong
    return str(config.parent) if kind in HF_MODEL_TYPES else None


def _say(key: str, hub_id: HubId, local: str) -> None:
    print(f"{key}={hub_id} -> {local}", file=sys.stderr, flush=True)


def _fetch(
    key: str, hub_id: HubId, patterns: tuple[str, ...], needed: tuple[str, ...], env: Mapping[str, str], extra: str = ""
) -> str:
    """The snapshot directory of `hub_id` with the files matching `patterns` fetched (from the cache alone
    when offline; huggingface_hub's progress bars show a download); ConfigError unless it holds one of
    `needed` (file names or globs; a dataset: every one of them). `extra`: what else the user may do, said
    after a refusal."""
    # inner import: optional library (only a hub id fetches)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError

    offline = hub_offline(env)
    try:
        snapshot = snapshot_download(
            hub_id.repo,
            repo_type=hub_id.repo_type,
            revision=hub_id.revision,
            cache_dir=hub_cache(env),
            endpoint=env.get("HF_ENDPOINT"),
            allow_patterns=list(patterns),
            local_files_only=offline,
        )
    except IncompleteSnapshotError as e:  # files the repo has beyond what was fetched: `needed` decides
        snapshot = e.snapshot_path
    except Exception as e:
        raise _problem(key, hub_id, e, env, extra=extra) from None
    found = [any(_glob(snapshot, name)) for name in needed]
    if not (all(found) if hub_id.repo_type == "dataset" else any(found)):
        where = (
            "fetch them on a machine with access: " + hub_id.fetch_command()
            if offline
            else f"the repo on the hub has none of them as ptrun fetches them ({', '.join(patterns)})"
        )
        what = "lacks" if hub_id.repo_type == "dataset" else "holds none of"
        lacking = [n for n, f in zip(needed, found, strict=True) if not f] if hub_id.repo_type == "dataset" else needed
        raise ConfigError(
            f"{key}={str(hub_id)!r}: its snapshot {snapshot} {what} {', '.join(lacking)}; {where}"
            + (f"; {extra}" if extra else "")
        )
    return snapshot


def _glob(snapshot: str, pattern: str):
    """The files of `snapshot` matching `pattern` as huggingface_hub matches `allow_patterns` (fnmatch: `*`
    crosses folders)."""
    root = Path(snapshot)
    return (p for p in root.rglob("*") if fnmatch(p.relative_to(root).as_posix(), pattern))


def _fetch_file(key: str, hub_id: HubId, name: str, env: Mapping[str, str]) -> str:
    """The local path of file `name` of `hub_id`'s snapshot, fetched into the cache unless offline."""
    from huggingface_hub import hf_hub_download  # inner import: optional library

    try:
        return hf_hub_download(
            hub_id.repo,
            name,
            revision=hub_id.revision,
            cache_dir=hub_cache(env),
            endpoint=env.get("HF_ENDPOINT"),
            local_files_only=hub_offline(env),
        )
    except Exception as e:
        raise _problem(key, hub_id, e, env, name) from None


def _problem(
    key: str, hub_id: HubId, error: Exception, env: Mapping[str, str], name: str = "", extra: str = ""
) -> ConfigError:
    """One line saying why `hub_id` could not be had, and what to do (then `extra`, what else may be done)."""
    from huggingface_hub.errors import (  # inner import: optional library
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    head = f"{key}={str(hub_id)!r}: no such file or directory"
    what = f"{name} of {hub_id} is not" if name else "not"
    tail = f"; {extra}" if extra else ""
    if isinstance(error, HFValidationError):
        return ConfigError(f"{head}, nor a valid Hugging Face hub id ({' '.join(str(error).split())[:160]})")
    if isinstance(error, LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE=1" if hub_offline(env) else "the hub cannot be reached"
        # a bare name may as well be a directory the user mistyped: say it is neither
        what = f"no such file or directory, and {what}" if "/" not in hub_id.repo else what
        return NotCached(
            f"{key}={str(hub_id)!r}: {what} in the Hugging Face cache ({hub_cache(env)}) and {why}; "
            f"fetch it on a machine with access: {hub_id.fetch_command()}{tail}",
            key,
            hub_id,
            why,
            hub_cache(env),
            extra,
        )
    if isinstance(error, RevisionNotFoundError):
        return ConfigError(
            f"{key}={str(hub_id)!r}: the Hugging Face hub has no revision {hub_id.revision!r} of {hub_id.repo}"
        )
    kind = "dataset" if hub_id.repo_type == "dataset" else "model"
    if isinstance(error, GatedRepoError):  # the repo is there, its terms not accepted by this token
        return ConfigError(
            f"{key}={str(hub_id)!r}: gated on the Hugging Face hub and this machine has no access; "
            f"accept its terms at https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}"
            f"{hub_id.repo} and log in (hf auth login, or set HF_TOKEN){tail}"
        )
    if isinstance(error, RepositoryNotFoundError):  # also private repos without a token
        return ConfigError(
            f"{head}, nor a {kind} on the Hugging Face hub (if it is private or gated: hf auth "
            f"login, or set HF_TOKEN){tail}"
        )
    if isinstance(error, EntryNotFoundError):
        return ConfigError(f"{key}={str(hub_id)!r}: {hub_id} has no {name or 'such file'}")
    return ConfigError(
        f"{key}={str(hub_id)!r}: cannot fetch it from the Hugging Face hub "
        f"({type(error).__name__}: {' '.join(str(error).split())[:200]}){tail}"
    )
