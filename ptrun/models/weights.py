"""Local pretrained weights (a .safetensors file or a torch checkpoint) loaded into a LayeredModel, tensor by
tensor: a worker reads only the parameters of the units it holds.

Keys are in the library model's namespace (`layered.model.state_dict()`); a leading `model.` / `module.`
(a wrapped or DDP model's state dict) is stripped. The task head may differ (another class count, another
task): its weights are then left as initialised. Anything else that does not fit is an error, because a
silently half-loaded backbone trains but gives wrong results; it is found from the file's index alone
(names and shapes), before any value is read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ptrun.config import ConfigError
from ptrun.models.layered import LayeredModel

log = logging.getLogger(__name__)


@dataclass
class WeightsFile:
    """A checked weights file: each model tensor's key in the file, and how to read one tensor."""

    path: str
    keys: dict[str, str]
    """Model name -> its key in the file, for every tensor the file supplies."""
    read: Callable[[str], torch.Tensor] = field(repr=False)


def _index(path: str) -> tuple[dict[str, tuple[int, ...]], Callable[[str], torch.Tensor]]:
    """The file's tensor shapes by key, and a reader of one tensor. safetensors reads a tensor's bytes only
    when asked; a torch file is memory-mapped (`mmap=True`), so its pages are read only where touched."""
    try:
        if Path(path).suffix == ".safetensors":
            from safetensors import safe_open

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
    while key.startswith(("model.", "module.")):
        key = key.split(".", 1)[1]
    return key


def open_pretrained(layered: LayeredModel, path: str) -> WeightsFile:
    """Check that `path` fits `layered` (names and shapes, from the file's index) and return it ready to
    load. A head that does not fit is left to its initial values (a warning says so)."""
    path = str(Path(path).expanduser())
    shapes, read = _index(path)
    by_name = {_strip(k): k for k in shapes}
    head = set(layered.unit_param_names(len(layered.units) - 1))
    # state_dict() also lists a tied weight under its alias (e.g. the MLM decoder's weight, which is the word
    # embedding): it is loaded once, through the name named_parameters() gives it. Parameters may be empty
    # here (a worker that does not hold them), so their shapes come from `param_shapes`.
    wanted = dict(layered.param_shapes) | {n: b.shape for n, b in layered.model.named_buffers()
                                           if n in layered.model.state_dict()}
    keys, skipped = {}, []
    for name, shape in wanted.items():
        key = by_name.get(name)
        if key is not None and shapes[key] == tuple(shape):
            keys[name] = key
        elif name in head:
            skipped.append(name)
        else:
            why = "is missing" if key is None else f"has shape {shapes[key]}, the model {tuple(shape)}"
            raise ConfigError(f"model.pretrained={path!r}: {name} {why}")
    if skipped:
        log.warning("model.pretrained=%r: head re-initialised (%s does not fit)", path, ", ".join(skipped))
    unused = sorted(set(by_name) - set(layered.model.state_dict()))
    if unused:
        log.warning("model.pretrained=%r: %d weights not used (%s ...)", path, len(unused), unused[0])
    return WeightsFile(path, keys, read)


def load_pretrained(layered: LayeredModel, weights: WeightsFile, names: Iterable[str]) -> None:
    """Copy the file's values of the parameters `names` (those it supplies) and of the buffers it has."""
    targets = dict(layered.model.named_parameters()) | dict(layered.model.named_buffers())
    buffers = {n for n, _ in layered.model.named_buffers()}
    with torch.no_grad():
        for name in set(names) | buffers:
            key = weights.keys.get(name)
            if key is not None:
                targets[name].copy_(weights.read(key))
