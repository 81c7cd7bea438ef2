"""Local pretrained weights (a .safetensors file, a torch checkpoint, or a Hugging Face model directory)
loaded into a LayeredModel tensor by tensor: a worker reads only the parameters of the units it holds.

Keys are in the library model's namespace (`layered.model.state_dict()`); a leading `model.` / `module.`
(a wrapped or DDP model's state dict) is stripped. The task head may differ (another class count, another
task): its weights are then left as initialised. Anything else that does not fit is an error, because a
silently half-loaded backbone trains but gives wrong results; it is found from the file's index alone
(names and shapes), before any value is read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from ptrun.config import ConfigError
from ptrun.models.adapters import library_name, peft_key
from ptrun.models.layered import LayeredModel

log = logging.getLogger(__name__)


@dataclass
class WeightsFile:
    """A checked weights file: each model tensor's key in the file, and how to read one tensor."""

    path: str
    keys: dict[str, str]
    """Model name -> its key in the file, for every tensor the file supplies."""
    read: Callable[[str], torch.Tensor] = field(repr=False)


def _files(path: str) -> list[str]:
    """The weight files `path` names: itself, or a Hugging Face directory's (`model.safetensors`, its shards
    listed in `model.safetensors.index.json`, or `pytorch_model.bin`)."""
    folder = Path(path)
    if not folder.is_dir():
        return [path]
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            return sorted({str(folder / f) for f in json.loads(index.read_text())["weight_map"].values()})
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"model.pretrained={path!r}: cannot read weights ({index.name}: {type(e).__name__})"
            ) from e
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [str(folder / name)]
    raise ConfigError(
        f"model.pretrained={path!r}: no weights in the directory (model.safetensors, "
        f"model.safetensors.index.json or pytorch_model.bin)"
    )


def _index(path: str) -> tuple[dict[str, tuple[int, ...]], Callable[[str], torch.Tensor]]:
    """The tensor shapes by key of the file(s) `path` names, and a reader of one tensor."""
    shapes: dict[str, tuple[int, ...]] = {}
    readers: dict[str, Callable[[str], torch.Tensor]] = {}
    for file in _files(path):
        file_shapes, read = _index_file(file)
        shapes.update(file_shapes)
        readers.update(dict.fromkeys(file_shapes, read))
    return shapes, lambda key: readers[key](key)


def _index_file(path: str) -> tuple[dict[str, tuple[int, ...]], Callable[[str], torch.Tensor]]:
    """One file's tensor shapes by key, and a reader of one tensor. safetensors reads a tensor's bytes only
    when asked; a torch file is memory-mapped (`mmap=True`), so its pages are read only where touched."""
    try:
        if Path(path).suffix == ".safetensors":
            handle = safe_open(path, framework="pt", device="cpu")
            shapes = {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}
            return shapes, handle.get_tensor
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
            state = torch.load(path, map_location="cpu", weights_only=True)
        for wrapper in ("model", "state_dict"):
            if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
                state = state[wrapper]
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError("not a state dict of tensors")
        return {k: tuple(v.shape) for k, v in state.items()}, state.__getitem__
    except Exception as e:  # any failure to read is the user's file, reported on one line
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ConfigError(f"model.pretrained={path!r}: cannot read weights ({reason})") from e


def _strip(key: str) -> str:
    """A file key in the model's namespace: no `model.` / `module.` wrapper prefix, and a LayerNorm's
    `gamma` / `beta` (older BERT checkpoints) named `weight` / `bias`."""
    while key.startswith(("model.", "module.")):
        key = key.split(".", 1)[1]
    if key.endswith(".gamma") or key.endswith(".beta"):
        key = key.rsplit(".", 1)[0] + (".weight" if key.endswith(".gamma") else ".bias")
    return key


def open_pretrained(layered: LayeredModel, path: str) -> WeightsFile:
    """Check that `path` fits `layered` (names and shapes, from the file's index) and return it ready to
    load. A head that does not fit is left to its initial values (a warning says so)."""
    path = str(Path(path).expanduser())
    shapes, read = _index(path)
    by_name = {_strip(k): k for k in shapes}
    # A Hugging Face base-model checkpoint (`BertModel`) names its tensors without the task model's prefix.
    prefix = getattr(layered.model, "base_model_prefix", "")
    if prefix:
        by_name |= {f"{prefix}.{name}": k for name, k in by_name.items() if not name.startswith(f"{prefix}.")}
    head = set(layered.unit_param_names(len(layered.units) - 1))
    # Parameters may be empty here (a worker that does not hold them): their shapes come from `param_shapes`.
    # Each is loaded once, under the name named_parameters() gives it.
    saved = set(layered.model.state_dict())
    wanted = dict(layered.param_shapes) | {n: b.shape for n, b in layered.model.named_buffers() if n in saved}
    keys, new, skipped = {}, [], []
    # A tied parameter has several names (the MLM decoder's weight is the word embedding); a file may use any.
    names_of: dict[int, list[str]] = {}
    for name, p in layered.model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    aliases = {names[0]: names for names in names_of.values()}
    for name, shape in wanted.items():
        if name in layered.adapters:
            continue  # the adapters start from their own rule, never from the base model's file
        names = [library_name(a) for a in aliases.get(name, [name])]
        key = next((by_name[a] for a in names if a in by_name), None)
        if key is not None and shapes[key] == tuple(shape):
            keys[name] = key
        elif name in head:
            (new if key is None else skipped).append(name)
        else:
            why = "is missing" if key is None else f"has shape {shapes[key]}, the model {tuple(shape)}"
            raise ConfigError(f"model.pretrained={path!r}: {name} {why}")
    if new:  # a task head on a backbone checkpoint: the usual fine-tuning start
        log.info("model.pretrained=%s: newly initialised (not in the checkpoint): %s", path, ", ".join(new))
    if skipped:
        log.warning("model.pretrained=%r: head re-initialised (%s does not fit)", path, ", ".join(skipped))
    unused = sorted(_strip(k) for k in set(shapes) - set(keys.values()) if not k.endswith("position_ids"))
    if unused:
        log.warning("model.pretrained=%r: %d weights not used (%s ...)", path, len(unused), unused[0])
    return WeightsFile(path, keys, read)


def open_adapter(layered: LayeredModel, path: str, base: WeightsFile | None) -> WeightsFile:
    """`base` (the base model's file, or None) with the trained parameters of the peft adapter in `path`
    (`adapter.pretrained`: its adapters and task head, under the keys `get_peft_model_state_dict` gives them)
    laid over it, checked from the file's index: every parameter that trains is there in its shape, and the
    file holds nothing else."""
    file = str(Path(path).expanduser() / "adapter_model.safetensors")
    shapes, read = _index_file(file)
    trained = sorted(set(layered.param_shapes) - layered.fixed)
    keys = {name: peft_key(name) for name in trained}
    for name, key in keys.items():
        want = tuple(layered.param_shapes[name])
        if shapes.get(key) != want:
            why = "lacks it" if key not in shapes else f"has shape {shapes[key]}, the model {want}"
            raise ConfigError(f"adapter.pretrained={path!r}: {key} (the run's {name}): the adapter {why}")
    extra = sorted(set(shapes) - set(keys.values()))
    if extra:
        raise ConfigError(f"adapter.pretrained={path!r}: {extra[0]} is no parameter this run trains")
    if base is None:
        return WeightsFile(file, keys, read)
    ours = set(keys.values())
    return WeightsFile(
        f"{base.path} + {file}", base.keys | keys, lambda key: read(key) if key in ours else base.read(key)
    )


def load_pretrained(layered: LayeredModel, weights: WeightsFile, names: Iterable[str]) -> None:
    """Copy the file's values of the parameters `names` (those it supplies) and of the buffers it has."""
    targets = dict(layered.model.named_parameters()) | dict(layered.model.named_buffers())
    buffers = {n for n, _ in layered.model.named_buffers()}
    with torch.no_grad():
        for name in set(names) | buffers:
            key = weights.keys.get(name)
            if key is not None:
                targets[name].copy_(weights.read(key))
