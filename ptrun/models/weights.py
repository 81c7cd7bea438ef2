"""Local pretrained weights (a .safetensors file or a torch checkpoint) loaded into a LayeredModel.

Keys are in the library model's namespace (`layered.model.state_dict()`); a leading `model.` / `module.`
(a wrapped or DDP model's state dict) is stripped. The task head may differ (another class count, another
task): its weights are then left as initialised. Anything else that does not fit is an error, because a
silently half-loaded backbone trains but gives wrong results.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from ptrun.config import ConfigError
from ptrun.models.layered import LayeredModel

log = logging.getLogger(__name__)


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file or a torch file (a bare state dict, or one under model/state_dict)."""
    try:
        if Path(path).suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
            for wrapper in ("model", "state_dict"):
                if isinstance(state, Mapping) and isinstance(state.get(wrapper), Mapping):
                    state = state[wrapper]
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ValueError("not a state dict of tensors")
    except Exception as e:  # any failure to read is the user's file, reported on one line
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ConfigError(f"model.pretrained={path!r}: cannot read weights ({reason})") from e
    return {_strip(key): value for key, value in state.items()}


def _strip(key: str) -> str:
    while key.startswith(("model.", "module.")):
        key = key.split(".", 1)[1]
    return key


def load_pretrained(layered: LayeredModel, path: str) -> None:
    """Copy the weights in `path` into `layered.model`; a head that does not fit is re-initialised."""
    path = str(Path(path).expanduser())
    state = read_state_dict(path)
    own = layered.model.state_dict()
    head = set(layered.unit_param_names(len(layered.units) - 1))
    # state_dict() also lists a tied weight under its alias (e.g. the MLM decoder's weight, which is the word
    # embedding): load it once, through the name named_parameters() gives it.
    primary = {n for n, _ in layered.model.named_parameters()} | {n for n, _ in layered.model.named_buffers()}
    load, skipped = {}, []
    for key, target in own.items():
        if key not in primary:
            continue
        value = state.get(key)
        if value is not None and value.shape == target.shape:
            load[key] = value
        elif key in head:
            skipped.append(key)
        else:
            why = "is missing" if value is None else f"has shape {tuple(value.shape)}, the model {tuple(target.shape)}"
            raise ConfigError(f"model.pretrained={path!r}: {key} {why}")
    layered.model.load_state_dict(load, strict=False)
    if skipped:
        log.warning("model.pretrained=%r: head re-initialised (%s does not fit)", path, ", ".join(skipped))
    unused = sorted(set(state) - set(own))
    if unused:
        log.warning("model.pretrained=%r: %d weights not used (%s ...)", path, len(unused), unused[0])
