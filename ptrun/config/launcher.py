"""`launcher.*` and `device.*`: workers per machine, machines, rendezvous and restarts; the device's memory."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

from ptrun.config.gpus import visible_gpus_without_torch
from ptrun.config.rules import check_choices, choice, either, parse_memory, require
from ptrun.errors import ConfigError

LOCAL_HOST_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
BACKENDS = ("auto", "gloo", "nccl")
"""`launcher.backend`."""


@dataclass
class LauncherConfig:
    nproc_per_node: int | str = "auto"
    """Worker processes per machine (one per GPU on CUDA, one per emulated device on CPU): `auto` (the
    default) is one per visible GPU when the workers use CUDA (`backend` auto or nccl on a machine with a
    GPU), else `CPU_WORKERS` (2) emulated devices; or an integer, which on CUDA may not exceed the visible
    GPUs. Each machine of a multi-machine job counts its own."""
    nnodes: str = "1"
    """Number of machines, `N` or `MIN:MAX` for an elastic job. With MIN > 1, `rdzv_endpoint` must be a
    `host:port` every machine reaches (not loopback, not port 0), and the same command runs on each machine."""
    rdzv_endpoint: str = "localhost:0"
    """c10d rendezvous `host:port`; `localhost:0` binds loopback on a free port (single machine). For several
    machines: one machine's name or address and a fixed free port, e.g. `node0:29400`."""
    rdzv_id: str | None = None
    """Rendezvous id shared by all machines of one job; None = the run directory's name."""
    rdzv_last_call: int = 30
    """Seconds an elastic rendezvous (`nnodes=MIN:MAX`) that has MIN machines waits for more before the job
    (re)starts without them; a machine that joins later is taken in at the next restart boundary."""
    max_restarts: int = 3
    """Elastic restarts of the worker group after a failure (a worker dying, a machine lost) before the job
    fails; taking in a machine that joins does not count."""
    monitor_interval: float = 0.1
    """Seconds between the elastic agent's health checks of its workers (torchrun's default): also how long a
    finished run may wait for the agent to see its workers have ended."""
    stop_timeout: int = 60
    """Seconds the workers get after Ctrl-C or SIGTERM to finish their step and write a checkpoint before
    they are killed (keep it below the scheduler's grace period, e.g. SLURM's `--signal=B:TERM@SECONDS`)."""
    threads_per_worker: int | str = "auto"
    """Intra-op threads per worker (CPU): `auto` shares the cores this process may use equally among the
    machine's workers (2 workers on 2 cores: 1 each, so they do not oversubscribe; 1 worker: both), or an
    integer >= 1."""
    backend: str = choice("auto", BACKENDS, wording=either)
    """Process-group backend: `auto` (nccl with CUDA, else gloo), `gloo` or `nccl`."""


@dataclass
class DeviceConfig:
    """GPU switches (no effect on the CPU)."""

    tf32: bool = True
    """Let float32 matmuls and convolutions use TF32 tensor cores on Ampere and newer GPUs
    (`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`): several times faster, with
    10-bit mantissas inside the matmul."""
    cudnn_benchmark: bool = True
    """Let cuDNN time its convolution algorithms once per input shape and keep the fastest
    (`torch.backends.cudnn.benchmark`); input shapes are fixed here, so it pays off."""
    pin_memory: bool = True
    """Load input batches into pinned (page-locked) host memory, so their copy to the GPU is asynchronous."""
    memory: str | None = None
    """Memory one device offers a stage, for `pipe.length=auto`: a size such as `80GB`, `512MB`, or a share of
    the detected amount such as `90%`. Unset: 90% of the GPU's memory, or on the CPU of the host's memory
    divided by the node's workers (the rest is left to what no stage can use: the CUDA context, the
    allocator's fragmentation, the processes' own libraries); `ptrun plan` counts the same."""


def parse_nnodes(nnodes: str) -> tuple[int, int]:
    """`"2"` -> (2, 2); `"1:4"` -> (1, 4)."""
    parts = str(nnodes).split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, 0)
    except ValueError:
        lo, hi = 0, 0
    require(1 <= lo <= hi, "launcher.nnodes", "N or MIN:MAX with 1 <= MIN <= MAX", nnodes)
    return lo, hi


CPU_WORKERS = 2
"""`launcher.nproc_per_node=auto` where the workers do not use CUDA: emulated devices (worker processes) per
machine, ptrun's default worker count."""


def visible_gpus(lc: LauncherConfig) -> int:
    """The GPUs this machine's workers will use: those CUDA sees when `backend` lets them (the rule of
    `ptrun.launcher.worker.pick_device`), else 0. Without importing torch where `ptrun.config.gpus` can tell
    (torch costs seconds to import); called only where the answer matters."""
    if lc.backend == "gloo":
        return 0
    counted = visible_gpus_without_torch()
    if counted is not None:
        return counted
    import torch  # inner import: start-up

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def workers_per_node(lc: LauncherConfig) -> int:
    """`launcher.nproc_per_node` as the number of workers the launcher starts on this machine: an integer as
    given; `auto`: one per visible GPU when the workers will use CUDA, else CPU_WORKERS (`visible_gpus`)."""
    if lc.nproc_per_node != "auto":
        return lc.nproc_per_node  # type: ignore[return-value]
    return visible_gpus(lc) or CPU_WORKERS


def check_devices(lc: LauncherConfig) -> None:
    """On the machine that starts: one worker per GPU at most (a worker beyond them would ask CUDA for a
    device that does not exist), and `backend=nccl` only where there is a GPU. Raises ConfigError."""
    gpus = visible_gpus(lc)
    require(
        lc.backend != "nccl" or gpus > 0,
        "launcher.backend",
        "gloo or auto on a machine without a GPU (nccl needs CUDA)",
        lc.backend,
    )
    require(
        lc.nproc_per_node == "auto" or not gpus or lc.nproc_per_node <= gpus,
        "launcher.nproc_per_node",
        f"at most the {gpus} GPU{'s' if gpus > 1 else ''} this machine shows (CUDA_VISIBLE_DEVICES), or auto "
        f"for one worker per GPU",
        lc.nproc_per_node,
    )


def split_endpoint(endpoint: str) -> tuple[str, int | None] | None:
    """`host:port`, `[v6 address]:port` or `host` -> (host, port; None = torch's default port); None when it
    does not parse (`ptrun.launcher.rendezvous.check_rendezvous` reports that with torch's own parser)."""
    text = str(endpoint).strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else (None if not rest else "")
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:  # a bare name, or a bare IPv6 address
        host, port = text, None
    if port is None:
        return host, None
    return (host, int(port)) if port.isdigit() else None


def only_this_machine(host: str) -> bool:
    """A rendezvous host no other machine can reach: a loopback or unspecified address, or localhost."""

    name = host.strip().lower()
    if name in LOCAL_HOST_NAMES or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False  # a host name: whether it resolves is checked at launch (check_rendezvous)
    return address.is_loopback or address.is_unspecified


def check_machines(lc: LauncherConfig) -> None:
    """The rules of a job of several machines that only matter when it is launched (`ptrun plan` and the
    tests compose the two-machine recipes for a cluster without naming one): with MIN > 1 in
    `launcher.nnodes`, a rendezvous endpoint other machines can reach; with MAX > 1, a shared `rdzv_id`.
    Called once, when `ptrun train` resolves the config for a start on this machine
    (`ptrun.compose.for_this_machine`, before the run directory is created). Raises ConfigError."""
    lo, hi = parse_nnodes(lc.nnodes)
    endpoint = split_endpoint(lc.rdzv_endpoint)
    if lo > 1 and endpoint is not None and (only_this_machine(endpoint[0]) or endpoint[1] == 0):
        # The rendezvous store would listen where no other machine can connect (loopback, or a port chosen at
        # random on this machine), so the job would wait for machines that can never join (join timeout 900 s).
        why = " and ".join(
            w for w, bad in (("a loopback host", only_this_machine(endpoint[0])), ("port 0", endpoint[1] == 0)) if bad
        )
        raise ConfigError(
            f"launcher.nnodes={lc.nnodes!r} is not allowed with launcher.rdzv_endpoint="
            f"{lc.rdzv_endpoint!r} ({why}: no other machine can join); set launcher.rdzv_endpoint="
            f"HOST:PORT that every machine reaches and run the same command on each, or "
            f"launcher.nnodes=1 for one machine"
        )
    # Without an id each machine names its rendezvous after its own run directory plus a random suffix
    # (launch.launch_config), so the machines of one job would never meet: each waits, or starts alone.
    require(
        hi == 1 or bool(lc.rdzv_id),
        "launcher.rdzv_id",
        f"the same id on every machine of a "
        f"launcher.nnodes={lc.nnodes!r} job (e.g. launcher.rdzv_id=myjob-1), or launcher.nnodes=1 for one "
        f"machine",
        lc.rdzv_id,
    )


def check_launcher(cfg) -> None:
    lc = cfg.launcher
    require(
        lc.nproc_per_node == "auto" or (isinstance(lc.nproc_per_node, int) and lc.nproc_per_node >= 1),
        "launcher.nproc_per_node",
        "an integer >= 1 or auto",
        lc.nproc_per_node,
    )
    require(lc.max_restarts >= 0, "launcher.max_restarts", "an integer >= 0", lc.max_restarts)
    require(lc.rdzv_last_call >= 1, "launcher.rdzv_last_call", "whole seconds >= 1", lc.rdzv_last_call)
    require(lc.stop_timeout >= 1, "launcher.stop_timeout", "whole seconds >= 1", lc.stop_timeout)
    require(
        lc.threads_per_worker == "auto" or (isinstance(lc.threads_per_worker, int) and lc.threads_per_worker >= 1),
        "launcher.threads_per_worker",
        "an integer >= 1 or auto",
        lc.threads_per_worker,
    )
    check_choices(lc, "launcher")
    parse_nnodes(lc.nnodes)
    if cfg.device.memory is not None:
        parse_memory(cfg.device.memory, total=1, key="device.memory")


def worker_threads(setting: int | str, local_workers: int) -> int:
    """The intra-op threads a worker uses for `launcher.threads_per_worker`, with `local_workers` workers on
    its machine: `auto` is the cores this process may run on, shared equally (at least one)."""
    if setting != "auto":
        return int(setting)
    return max(1, len(os.sched_getaffinity(0)) // max(1, local_workers))
