"""The shape of every config rule: a key, what is allowed, and the value that broke it, in one line."""

from __future__ import annotations

import os
from typing import Any

from ptrun.errors import ConfigError


def require(ok: bool, key: str, allowed: str, value: Any) -> None:
    """ConfigError `KEY=VALUE is not allowed: ALLOWED` unless `ok`."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


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
        raise ConfigError(f"{key}={spec!r} is not allowed: a share such as 50% (0-100] or "
                          f"a size such as 8GB, 512MB, 4096") from None
