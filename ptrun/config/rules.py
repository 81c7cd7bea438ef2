"""The shape of every config rule: a key, what is allowed, and the value that broke it, in one line."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import field, fields
from typing import Any

from ptrun.errors import ConfigError

CHOICES = "choices"
"""The metadata key of a field made by `choice`: its allowed values (and `WORDING`, `CHECK`: how its check
words them, and whether `check_choices` checks it)."""
WORDING, CHECK = "choices_wording", "choices_check"


def _words(values: Iterable) -> list[str]:
    return ["null" if v is None else str(v) for v in values]


def one_of(values: Iterable) -> str:
    """`one of a, b, c`: what a check says a choice allows."""
    return f"one of {', '.join(_words(values))}"


def either(values: Iterable) -> str:
    """`a, b or c`: the same for a short list (a few checks have always worded it so)."""
    words = _words(values)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def require(ok: bool, key: str, allowed: str, value: Any) -> None:
    """ConfigError `KEY=VALUE is not allowed: ALLOWED` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def choice(default: Any, values: tuple, *, wording: Callable[[Iterable], str] = one_of, check: bool = True) -> Any:
    """A dataclass field whose value is one of `values`, the field's one declaration of them: its check
    (`check_choices`, whose message lists them with `wording`: `one_of` or `either`) and docs/config.md are
    made from the same tuple. `check=False` leaves the check to the group's own (a rule that depends on other
    keys). OmegaConf 2.3 cannot type a structured config's field as a `Literal`, so the field keeps its plain
    type and carries its values in its metadata (`choices_of`)."""
    assert default in values, (default, values)
    return field(default=default, metadata={CHOICES: tuple(values), WORDING: wording, CHECK: check})


def choices_of(dataclass_field) -> tuple | None:
    """The allowed values of a field made by `choice`, else None."""
    return dataclass_field.metadata.get(CHOICES)


def check_choices(group: Any, prefix: str = "") -> None:
    """The fields of the config group `group` (a dataclass instance, its keys under `prefix`; "" for the top
    level) that `choice` made hold one of their values: ConfigError `KEY=VALUE is not allowed: one of ...`
    at the first that does not, in the order the fields are declared."""
    for f in fields(group):
        values = choices_of(f)
        if values is not None and f.metadata[CHECK]:
            value = getattr(group, f.name)
            require(value in values, f"{prefix}.{f.name}" if prefix else f.name, f.metadata[WORDING](values), value)


def parse_memory(spec: str, total: int | None = None, key: str = "cache.max_memory") -> int:
    """A memory size in bytes (`cache.max_memory`, `device.memory`): `50%` of `total` (the machine's RAM when
    None), or `8GB`, `512MB`, `64KB`, `1024` (bytes)."""
    text = str(spec).strip().upper()
    units = {"TB": 1 << 40, "GB": 1 << 30, "MB": 1 << 20, "KB": 1 << 10, "B": 1}
    try:
        if text.endswith("%"):
            share = float(text[:-1])
            if not 0 < share <= 100:
                raise ValueError
            if total is None:
                total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return int(total * share / 100)
        unit = next((u for u in units if text.endswith(u)), "B")
        value = float(text[: len(text) - len(unit)] if text.endswith(unit) else text)
        if value < 0:
            raise ValueError
        return int(value * units[unit])
    except ValueError:
        raise ConfigError(
            f"{key}={spec!r} is not allowed: a share such as 50% (0-100] or a size such as 8GB, 512MB, 4096"
        ) from None
