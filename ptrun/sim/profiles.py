"""A measured profile: per-unit forward + backward seconds (and optionally the forward alone, the unit frozen and
the optimizer update) measured on the target device, written as JSON (`save_profile`) and read back in place of
the FLOP model (`load_profile`; see `ptrun.costs.units`'s docstring)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ptrun.config import ConfigError
from ptrun.costs.units import ModelCosts


def save_profile(
    profile: Any,
    batch: int,
    path: str | Path,
    params: Sequence[float] | None = None,
    update_s: Sequence[float] | None = None,
) -> None:
    """Write a `UnitProfile` (`time_s` and `activation_bytes` for one micro-batch of `batch` samples, and
    `forward_s` / `frozen_s` when it has them) as the JSON `load_profile` reads; `params` (per-unit parameter
    counts) and `update_s` (per-unit optimizer seconds per step) are optional."""
    doc = {"batch": batch, "time_s": list(profile.time_s), "activation_bytes": list(profile.activation_bytes)}
    for key in ("forward_s", "frozen_s"):
        if getattr(profile, key, None) is not None:
            doc[key] = list(getattr(profile, key))
    if params is not None:
        doc["params"] = list(params)
    if update_s is not None:
        doc["update_s"] = list(update_s)
    Path(path).write_text(json.dumps(doc, indent=1))


def load_profile(path: str | Path, base: ModelCosts) -> ModelCosts:
    """`base` with its compute and activation sizes replaced by a measured profile (JSON: `batch`, the
    micro-batch the times were measured on; `time_s`, forward + backward seconds per unit for that batch;
    `activation_bytes`, each unit's output bytes for that batch; optional `forward_s` and `frozen_s` for that
    batch, `update_s` per step, and `params`). Other keys are ignored. Raises ConfigError."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"--profile {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"--profile {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not {"batch", "time_s", "activation_bytes"} <= set(doc):
        raise ConfigError(f"--profile {path}: needs the keys batch, time_s and activation_bytes")
    batch = doc["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--profile {path}: batch={batch!r} is not allowed: the micro-batch size, an integer >= 1")
    vectors = {
        k: doc[k] for k in ("time_s", "activation_bytes", "params", "forward_s", "frozen_s", "update_s") if k in doc
    }
    for key, vec in vectors.items():
        if (
            not isinstance(vec, list)
            or len(vec) != base.num_units
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in vec
            )
        ):
            raise ConfigError(
                f"--profile {path}: {key} must list {base.num_units} finite numbers >= 0 "
                f"(one per unit of the recipe's model)"
            )

    def per_sample(key: str) -> tuple[float, ...] | None:
        return tuple(t / batch for t in vectors[key]) if key in vectors else None

    return replace(
        base,
        fb_seconds=per_sample("time_s"),
        act_bytes=per_sample("activation_bytes"),
        params=tuple(map(float, vectors.get("params", base.params))),
        fwd_seconds=per_sample("forward_s"),
        frozen_seconds=per_sample("frozen_s"),
        update_seconds=tuple(map(float, vectors["update_s"])) if "update_s" in vectors else None,
    )
