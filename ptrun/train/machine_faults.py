"""Faults of the machine, not of the code: a full disk (ENOSPC, or a quota: EDQUOT) and an exhausted memory.

A restart cannot cure either (a full disk stays full, a layout that does not fit does not fit the next time), so
the workers end with a report in the launch's errors directory, which tells ptrun's agent not to restart and the
launcher what its one line says (the exception, the report and the line: `ptrun.train.run_end`). This module
finds and measures them in the workers.

A write that finds no space is agreed on before anyone stops: where the write is collective (a checkpoint, the
export) in the collectives it already has (`settle_write`), where one rank writes alone (metrics.jsonl, train.log) by
noting it (`note`) for the stop all-reduce every step boundary runs (`ptrun.train.stop`), so every rank stops
at the same step and none waits in a collective its peers never join. An out-of-memory error cannot wait: the
rank it hits is in the middle of a step, so it reports and ends, and its peers' collectives fail on the lost
connection (or the agent ends them).
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.train.run_end import OutOfSpace

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# What Rust's I/O errors (safetensors) say of them: "No space left on device (os error 28)".
_OS_ERROR = re.compile(r"os error (\d+)")


def no_space(error: BaseException | None) -> bool:
    """Whether `error` (or an error it was raised from: torch.save reports a failed write as its own
    RuntimeError) is a write that found no space."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return True
        if any(int(code) in NO_SPACE for code in _OS_ERROR.findall(str(error))):
            return True
        error = error.__cause__ or error.__context__
    return False


# ---- a fault one rank found alone, for the next stop all-reduce -------------------------------------------
_noted: list[OutOfSpace] = []


def note(error: OutOfSpace) -> None:
    """Remember `error` (the first one only) for the stop all-reduce, which stops every rank at the next step
    boundary (`ptrun.train.stop.StopRequests`)."""
    if not _noted:
        _noted.append(error)


def noted() -> OutOfSpace | None:
    """The fault this rank noted, if any."""
    return _noted[0] if _noted else None


def settle_write(error: BaseException | None, what: str, path: Path, nbytes: int, cleanup=None) -> None:
    """Collective over every rank, in place of a barrier after a part of a collective write (`what`, to
    `path`): `error` is what this rank's part raised (None: it succeeded), `nbytes` what it meant to write.
    Where any rank failed, `cleanup` runs on rank 0 (the partial files go) and every rank raises: OutOfSpace
    where a write found no space (needing the sum of `nbytes`), this rank's own error where it had another,
    else a RuntimeError saying a peer failed (which a restart may cure, as any fault)."""
    full, other = no_space(error), error is not None and not no_space(error)
    flags = torch.tensor([int(full), int(other), nbytes], dtype=torch.int64)
    if dist.is_initialized():
        if dist.get_backend() == "nccl":
            flags = flags.cuda()
        dist.all_reduce(flags)
    any_full, any_other, needed = (int(v) for v in flags.tolist())
    if not (any_full or any_other):
        return
    if cleanup is not None and (not dist.is_initialized() or dist.get_rank() == 0):
        cleanup()
    if other:
        raise error  # type: ignore[misc]
    if any_full:
        raise OutOfSpace(what, path, needed)
    raise RuntimeError(f"another rank failed to write the {what} {path}")


# ---- out of memory ---------------------------------------------------------------------------------------
_REQUESTED = re.compile(r"Tried to allocate ([\d.]+) ([KMGT]?i?B)")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def memory_report(error: BaseException, device, where: str, plan) -> dict:
    """An out-of-memory error `error` on `device` at `where` (a step, a transition, the cache) in the layout
    `plan`: the device, its memory in use and in total, the allocation that failed (if it says), for the
    launcher's line and the planner's advice (`ptrun.launcher.memory_advice`)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used, name = total - free, f"{device} ({torch.cuda.get_device_name(device)})"
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        used, name = _resident_bytes(), "cpu"
    asked = _REQUESTED.search(str(error))
    requested = int(float(asked.group(1)) * _UNITS.get(asked.group(2), 1)) if asked else 0
    return {
        "kind": "oom",
        "device": name,
        "used": used,
        "total": total,
        "requested": requested,
        "where": where,
        "plan": plan.to_dict() if plan is not None else None,
    }


def _resident_bytes() -> int:
    """This process's resident memory (VmRSS), 0 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
