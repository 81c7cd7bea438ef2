"""How many GPUs this machine shows CUDA, answered by the launcher before it imports torch where it can.

`ptrun train` needs the count to check its input (`launcher.nproc_per_node=auto`, the layouts a world size
allows) before the workers' server may start importing torch and the model's library. Importing torch to
count (and `torch.cuda.is_available()`, which initialises the CUDA driver) put seconds of a GPU machine's
start, one or two on a CPU, in front of the workers' own imports. The common cases need neither:

- a machine with no GPU driver's device files, or a torch built without CUDA, has no GPU torch could use: 0;
- an NVIDIA machine answers through NVML, the driver's management library, which counts devices without
  initialising CUDA (what `torch.cuda.device_count()` itself asks first), with `CUDA_VISIBLE_DEVICES` unset
  or a list of device numbers.

Anything else (device UUIDs or MIG instances in `CUDA_VISIBLE_DEVICES`, a ROCm machine, NVML missing or
failing) is left to torch, as before. (Where NVML sees GPUs that CUDA cannot use, a driver too old for the
torch, the count is NVML's: the workers then find no CUDA and train on the CPU.)"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg", "/dev/nvmap", "/dev/nvhost-ctrl-gpu")
"""What a GPU driver puts in /dev: NVIDIA's (desktop and data centre; Jetson's nvmap / nvhost), AMD's ROCm
(kfd), WSL's (dxg). None of them: torch would see no GPU either."""


def visible_gpus_without_torch() -> int | None:
    """The GPUs CUDA would show this process, or None where only torch can tell."""
    if not any(os.path.exists(path) for path in GPU_DEVICE_FILES) or not torch_has_cuda():
        return 0
    raw = nvml_device_count()
    return None if raw is None else visible_of(os.environ.get("CUDA_VISIBLE_DEVICES"), raw)


def visible_of(spec: str | None, raw: int) -> int | None:
    """The devices CUDA shows of `raw` physical ones under `CUDA_VISIBLE_DEVICES=spec` given as device numbers,
    read as torch reads it: the list ends at an empty or negative entry, a number named twice hides every
    device, and the devices shown are those before the first number with no device. None for what this does
    not read (UUIDs, MIG instances): torch matches those against NVML's device ids."""
    if spec is None:
        return raw
    numbers: list[int] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        if not entry.isdigit():
            return None
        if int(entry) in numbers:
            return 0
        numbers.append(int(entry))
    return next((i for i, n in enumerate(numbers) if n >= raw), len(numbers))


def torch_has_cuda() -> bool:
    """Whether the installed torch is a CUDA build (its CUDA library is there), found without importing it: a
    CPU build's `torch.cuda.is_available()` is always False."""
    spec = importlib.util.find_spec("torch")
    return spec is not None and spec.origin is not None and any(Path(spec.origin).parent.glob("lib/libtorch_cuda*"))


def visible_gpu_memory_without_torch() -> int | None:
    """The memory of the smallest GPU CUDA would show this process, in bytes (NVML's count of each device's
    total memory), or None where only torch can tell (as `visible_gpus_without_torch`)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    totals = nvml_memory_totals()
    if totals is None:
        return None
    shown = visible_of(spec, len(totals))
    if shown is None or shown == 0:
        return None
    numbers = [int(e) for e in spec.split(",")[:shown]] if spec is not None else list(range(shown))
    return min(totals[n] for n in numbers)


def nvml_memory_totals() -> list[int] | None:
    """Each NVIDIA GPU's total memory in bytes, by NVML's device number, or None where NVML cannot answer."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None

    class Memory(ctypes.Structure):  # nvmlMemory_t
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        totals = []
        for i in range(count.value):
            handle, memory = ctypes.c_void_p(), Memory()
            if (
                nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0
                or nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0
            ):
                return None
            totals.append(memory.total)
        return totals
    finally:
        nvml.nvmlShutdown()


def nvml_device_count() -> int | None:
    """The machine's NVIDIA GPUs as NVML counts them, or None where NVML cannot be loaded or answer."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint()
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else None
    finally:
        nvml.nvmlShutdown()
