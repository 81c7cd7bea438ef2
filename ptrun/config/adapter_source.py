"""`adapter.pretrained`: a peft LoRA adapter to continue training, checked before any worker starts.

It is a directory in peft's format (`adapter_config.json` beside `adapter_model.safetensors`, what
`save_pretrained` and a LoRA run's export write), or a hub id the start fetched into one
(`ptrun.config.hub`). Continuing it is peft's `PeftModel.from_pretrained(model, path, is_trainable=True)`:
the saved config says what the adapters are, so the run's `adapter.*` keys must say the same, or the
values would not mean what they meant. Each setting is compared (`SETTINGS`) and the first that differs is
named in one line with both values. The tensors' names and shapes are read from the safetensors header
alone (no tensor), so a corrupt file is refused here too; the worker reads the values
(`ptrun.models.weights.open_adapter`).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from ptrun.config.adapter import lora_alpha
from ptrun.config.adapter_layers import adapted_blocks
from ptrun.errors import ConfigError

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
"""The two files of a peft adapter ptrun reads."""
BLOCK_INDEX = re.compile(r"(?:^|\.)(\d+)\.")
"""The block index in a module's full name (`bert.encoder.layer.3.attention.self.query`, `blocks.0.attn.qkv`):
the first number between dots, as peft finds the layer of `layers_to_transform`."""


def _problem(path: str, what: str) -> ConfigError:
    return ConfigError(f"adapter.pretrained={path!r}: {what}")


def read_adapter_config(path: str) -> dict[str, Any]:
    """The adapter_config.json of the adapter directory `path`, its weights file checked readable; one line
    when either is missing or unreadable, or the adapter is not LoRA."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise _problem(path, f"no such directory (a peft adapter: {CONFIG_FILE} and {WEIGHTS_FILE})")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise _problem(path, f"no {name} in the directory (a peft adapter: {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        saved = json.loads((folder / CONFIG_FILE).read_text())
        if not isinstance(saved, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise _problem(path, f"cannot read {CONFIG_FILE} ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if saved.get("peft_type") != "LORA":
        raise _problem(path, f"{CONFIG_FILE} has peft_type={saved.get('peft_type')!r}; adapter=lora continues LORA")
    if not any(".lora_" in key for key in safetensors_shapes(path, folder / WEIGHTS_FILE)):
        raise _problem(path, f"{WEIGHTS_FILE} holds no LoRA weights (lora_A, lora_B)")
    return saved


def safetensors_shapes(path: str, file: Path) -> dict[str, list[int]]:
    """Each tensor's shape in a safetensors file, from its header alone: an 8-byte little-endian length, then
    that many bytes of JSON (the format's own definition); one line when it is not that."""
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > file.stat().st_size - 8:
                raise ValueError(f"a header of {size} bytes in a file of {file.stat().st_size}")
            header = json.loads(f.read(size))
        return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, struct.error, KeyError, TypeError, AttributeError) as e:
        raise _problem(path, f"cannot read {file.name} ({type(e).__name__}: {str(e).splitlines()[0]})") from None


def saved_targets(saved: dict[str, Any]) -> Any:
    """What the saved `target_modules` wraps within a block: the sorted leaf names of a list (full names such
    as a LoRA run's export writes, or peft's short ones), or peft's string (a regex, `all-linear`) as it is."""
    targets = saved.get("target_modules")
    if isinstance(targets, str):
        return targets
    return sorted({str(t).rsplit(".", 1)[-1] for t in targets or ()})


def saved_blocks(saved: dict[str, Any], num_blocks: int) -> list[int]:
    """The blocks the saved adapter wraps: its `layers_to_transform`, else the block indices in full target
    names, else every block."""
    layers = saved.get("layers_to_transform")
    if isinstance(layers, int):
        return [layers]
    if layers:
        return sorted(layers)
    targets = saved.get("target_modules")
    found = {
        int(m[1]) for t in targets or () if not isinstance(targets, str) for m in [BLOCK_INDEX.search(str(t))] if m
    }
    return sorted(found) if found else list(range(num_blocks))


def _same(ours: Any, theirs: Any) -> bool:
    if isinstance(ours, float) or isinstance(theirs, float):
        try:
            return math.isclose(float(ours), float(theirs), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return ours == theirs


def settings(adapter, family: str | None, num_blocks: int, targets: tuple[str, ...] | None, conv1d: bool):
    """(peft's key in adapter_config.json, the ptrun key that sets it, what this run would write, what a config
    without the key means) for each setting a continued adapter must share with the run. `targets`: the block
    modules `adapter.targets` names in `family` (None: the family is not known, and they are not compared)."""
    rows = [
        ("r", "adapter.r", adapter.r, 8),
        ("lora_alpha", "adapter.alpha", lora_alpha(adapter), 8.0),
        ("lora_dropout", "adapter.dropout", float(adapter.dropout), 0.0),
        ("layers_to_transform", "adapter.layers", list(adapted_blocks(adapter.layers, num_blocks)), None),
        ("fan_in_fan_out", f"the model ({family})", conv1d, False),
        ("bias", "ptrun (which trains no bias)", "none", "none"),
        ("use_rslora", "adapter.rslora", adapter.rslora, False),
        ("use_dora", "ptrun (which continues no DoRA adapter: it computes the magnitudes from the base)", False, False),
    ]
    if targets is not None:
        rows.insert(3, ("target_modules", "adapter.targets", sorted(targets), None))
    return rows


def check_adapter_source(adapter, family: str | None, num_blocks: int, targets, conv1d: bool) -> None:
    """`adapter.pretrained` is a readable peft LoRA adapter whose saved settings are this run's (`settings`);
    else one line naming the first setting that differs, with both values."""
    path = adapter.pretrained
    saved = read_adapter_config(path)
    theirs_of = {
        "target_modules": lambda: saved_targets(saved),
        "layers_to_transform": lambda: saved_blocks(saved, num_blocks),
    }
    for key, ptrun_key, ours, default in settings(adapter, family, num_blocks, targets, conv1d):
        theirs = theirs_of[key]() if key in theirs_of else saved.get(key, default)
        if not _same(ours, theirs):
            raise _problem(
                path, f"its {CONFIG_FILE} has {key}={theirs!r}, this run {ours!r} ({ptrun_key}); they must agree"
            )
    # peft wraps a leaf name wherever it is (BERT's `dense` in the pooler too): ptrun wraps the blocks' only
    blocks = set(adapted_blocks(adapter.layers, num_blocks))
    for key in safetensors_shapes(path, Path(path).expanduser() / WEIGHTS_FILE):
        found = BLOCK_INDEX.search(key)
        if ".lora_" in key and (found is None or int(found[1]) not in blocks):
            raise _problem(path, f"{WEIGHTS_FILE} holds {key}, an adapter outside the blocks this run adapts")
