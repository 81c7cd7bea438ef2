"""The job's layout from SLURM: inside `srun`, `ptrun train` takes the node count, the rendezvous host and the
rendezvous id from the environment SLURM gives every task, so one sbatch script starts the same command on
every node (docs/slurm.md; scripts/slurm/ptrun.sbatch). `launcher.*` keys given on the command line win.

ptrun runs ONE agent per node, which starts the node's `launcher.nproc_per_node` workers itself: a step with
several tasks on a node would start several agents there, each with its own workers, and the rendezvous would
count them as extra nodes. Such a step is refused.

Where each value comes from, first match wins (the step's variables first: `srun -N1` inside a two-node
allocation runs a one-node step, and the job's variables would make it wait for a node that never comes):
  nodes            SLURM_STEP_NUM_NODES, SLURM_NNODES, SLURM_JOB_NUM_NODES
  rendezvous host  MASTER_ADDR, else the first host of SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST
  rendezvous port  MASTER_PORT, else 29400 + SLURM_JOB_ID % 1000
                   (host and port only for several nodes: a one-node job keeps `launcher.rdzv_endpoint`,
                   localhost:0 by default, a free port that no other job can hold)
  rendezvous id    slurm-SLURM_JOB_ID
  tasks per node   SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE (each must be 1)

Not SLURM_LAUNCH_NODE_IPADDR: it is the host srun was started from, which under `salloc` is a login node that
runs no agent. The port depends on the job so that two jobs whose first node is the same machine (nodes shared
between jobs) do not meet at one store; a requeued job keeps its id, hence its port and rendezvous id.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace

from ptrun.config.launcher import LauncherConfig, parse_nnodes
from ptrun.errors import ConfigError

__all__ = [
    "BASE_PORT",
    "HOSTLIST_ALLOWED",
    "LAYOUT_FIELDS",
    "NODE_COUNT_VARS",
    "NODELIST_VARS",
    "PORT_SPREAD",
    "TASKS_PER_NODE_VARS",
    "SlurmJob",
    "expand_hostlist",
    "explicit_fields",
    "first_host",
    "from_slurm",
    "in_slurm",
    "iter_hosts",
    "read_job",
    "summary",
]

BASE_PORT = 29400  # torch's c10d default
PORT_SPREAD = 1000  # 29400-30399: below Linux's ephemeral range (32768-60999), where clients' ports come from
LAYOUT_FIELDS = ("nnodes", "rdzv_endpoint", "rdzv_id")
"""The launcher fields SLURM fills."""
NODE_COUNT_VARS = ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
HOSTLIST_ALLOWED = "a SLURM host list such as gpu[01-03,07],cpu5"


def in_slurm(env: Mapping[str, str]) -> bool:
    """Inside a SLURM task: the job id and the task's place in it are both set (a shell on a login node that
    merely has SLURM_JOB_ID from `salloc` has no SLURM_PROCID / SLURM_NODEID)."""
    return bool(env.get("SLURM_JOB_ID")) and ("SLURM_PROCID" in env or "SLURM_NODEID" in env)


# ---------------------------------------------------------------------------------------------- host lists


def _split_top_level(text: str, var: str) -> list[str]:
    """`a,b[1,2],c` -> [`a`, `b[1,2]`, `c`]: commas inside brackets separate numbers, not hosts."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ConfigError(f"{var}={text!r} is not allowed: {HOSTLIST_ALLOWED} (nested '[')")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{var}={text!r} is not allowed: {HOSTLIST_ALLOWED} (']' without '[')")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"{var}={text!r} is not allowed: {HOSTLIST_ALLOWED} ('[' without ']')")
    items.append(text[start:])
    return items


def _ranges(group: str, text: str, var: str) -> list[tuple[str, int]]:
    """`01-03,7` -> [(`01`, 3), (`7`, 7)]: each range's lower bound as written (its zero padding) and its upper
    bound."""
    out = []
    for part in group.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise ConfigError(
                f"{var}={text!r} is not allowed: {HOSTLIST_ALLOWED} (cannot read the range "
                f"{part!r}: N or LOW-HIGH with LOW <= HIGH)"
            )
        out.append((m.group(1), int(m.group(2) or m.group(1))))
    return out


def _numbers(group: str, text: str, var: str) -> Iterator[str]:
    """`01-03,7` -> `01`, `02`, `03`, `7`: a range keeps its lower bound's zero padding, as SLURM writes it."""
    for lo, hi in _ranges(group, text, var):
        for n in range(int(lo), hi + 1):
            yield str(n).zfill(len(lo))


def _expand_item(item: str, text: str, var: str) -> Iterator[str]:
    """One host expression (`r[1-2]n[01-02]`): every combination, the first bracket varying slowest."""
    m = re.match(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if m is None:
        yield item
        return
    prefix, group, rest = m.groups()
    for number in _numbers(group, text, var):
        for tail in _expand_item(rest, text, var):
            yield prefix + number + tail


def _items(text: str, var: str) -> list[str]:
    """The list's host expressions, the whole list's syntax checked first (without expanding any range): a
    list SLURM did not write is an error wherever it is broken, even after the first host."""
    if not text:
        raise ConfigError(f"{var}='' is not allowed: {HOSTLIST_ALLOWED}")
    items = _split_top_level(text, var)
    for item in items:
        if not item or item.startswith("["):
            raise ConfigError(f"{var}={text!r} is not allowed: {HOSTLIST_ALLOWED} (an empty host name)")
        for group in re.findall(r"\[([^\]]*)\]", item):
            _ranges(group, text, var)
    return items


def iter_hosts(text: str, var: str = "SLURM_JOB_NODELIST") -> Iterator[str]:
    """The hosts of a SLURM host list (`gpu[01-03,07],cpu5` -> gpu01 gpu02 gpu03 gpu07 cpu5), in order,
    lazily; `var` names the variable in errors. What `scontrol show hostnames` prints, without scontrol."""
    text = text.strip()
    for item in _items(text, var):
        yield from _expand_item(item, text, var)


def expand_hostlist(text: str, var: str = "SLURM_JOB_NODELIST") -> list[str]:
    return list(iter_hosts(text, var))


def first_host(text: str, var: str = "SLURM_JOB_NODELIST") -> str:
    """The first host only, without expanding the rest (a job's list may name thousands)."""
    return next(iter_hosts(text, var))


# ------------------------------------------------------------------------------------------------ the job


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    nnodes: int
    node_id: int | None
    host: str | None
    """The rendezvous host: MASTER_ADDR, else the node list's first host; None when neither is set."""
    port: int


def _first(env: Mapping[str, str], names: Iterable[str]) -> tuple[str, str] | tuple[None, None]:
    return next(((n, env[n]) for n in names if env.get(n, "").strip()), (None, None))


def _count(var: str, value: str, allowed: str) -> int:
    if not value.strip().isdigit():
        raise ConfigError(f"{var}={value!r} is not allowed: {allowed}")
    return int(value)


def _check_one_task_per_node(env: Mapping[str, str]) -> None:
    var, value = _first(env, TASKS_PER_NODE_VARS)
    if var is None:
        return
    # SLURM writes per-node counts compressed: `1(x4)` = 1 on each of 4 nodes, `2,1` = 2 on one node, 1 on the next
    counts = [re.fullmatch(r"(\d+)(?:\(x\d+\))?", part.strip()) for part in value.split(",")]
    if any(c is None for c in counts):
        raise ConfigError(f"{var}={value!r} is not allowed: task counts per node such as 1 or 1(x2)")
    if any(int(c.group(1)) != 1 for c in counts):  # type: ignore[union-attr]
        raise ConfigError(
            f"{var}={value} is not allowed: 1 (ptrun runs one agent per node, which starts "
            f"launcher.nproc_per_node workers itself; submit with --ntasks-per-node=1)"
        )


def read_job(env: Mapping[str, str], with_host: bool = True) -> SlurmJob | None:
    """The job's layout, or None outside a SLURM task; ConfigError (one line naming the variable) when the
    environment is malformed or the step runs more than one task on a node. `with_host=False` leaves
    MASTER_ADDR, MASTER_PORT and the node list unread (host None): the command line gave the endpoint."""
    if not in_slurm(env):
        return None
    job_id = env["SLURM_JOB_ID"].strip()
    _count("SLURM_JOB_ID", job_id, "the job's number")
    _check_one_task_per_node(env)
    var, value = _first(env, NODE_COUNT_VARS)
    if var is None:
        raise ConfigError(
            f"none of {', '.join(NODE_COUNT_VARS)} is set: the number of nodes of the SLURM job "
            f"(or give launcher.nnodes)"
        )
    nnodes = _count(var, value, "the number of nodes, an integer >= 1")
    if nnodes < 1:
        raise ConfigError(f"{var}={value!r} is not allowed: the number of nodes, an integer >= 1")
    node_id = None
    if env.get("SLURM_NODEID", "").strip():
        node_id = _count("SLURM_NODEID", env["SLURM_NODEID"], f"this node's index, 0 to {nnodes - 1}")
        if node_id >= nnodes:
            raise ConfigError(
                f"SLURM_NODEID={node_id} is not allowed: this node's index, 0 to {nnodes - 1} ({var}={nnodes})"
            )
    host = (env.get("MASTER_ADDR", "").strip() or None) if with_host else None
    list_var, nodelist = _first(env, NODELIST_VARS)
    if with_host and host is None and list_var is not None:
        host = first_host(nodelist, list_var)
    if with_host and env.get("MASTER_PORT", "").strip():
        port = _count("MASTER_PORT", env["MASTER_PORT"], "a port 1-65535")
        if not 1 <= port <= 65535:
            raise ConfigError(f"MASTER_PORT={port} is not allowed: a port 1-65535")
    else:
        port = BASE_PORT + int(job_id) % PORT_SPREAD
    return SlurmJob(job_id=job_id, nnodes=nnodes, node_id=node_id, host=host, port=port)


def explicit_fields(overrides: Iterable[str]) -> set[str]:
    """Launcher field names among Hydra's command-line overrides: `launcher.nnodes=2`, `+launcher.x=1` and
    `~launcher.rdzv_id` name a field; `launcher=local` picks the group's preset, which names none."""
    names = {f.name for f in fields(LauncherConfig)}
    out = set()
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~").strip()
        if key.startswith("launcher.") and key[len("launcher.") :] in names:
            out.add(key[len("launcher.") :])
    return out


def from_slurm(launcher: LauncherConfig, env: Mapping[str, str], explicit: set[str]) -> LauncherConfig:
    """`launcher` with the SLURM job's nodes, rendezvous endpoint and id, except the fields in `explicit`
    (given on the command line: they win). Unchanged outside SLURM, or when all three are explicit (then the
    environment is not read, so it cannot be in the way). Pure: reads only its arguments."""
    if set(LAYOUT_FIELDS) <= explicit:
        return launcher
    job = read_job(env, with_host="rdzv_endpoint" not in explicit)
    if job is None:
        return launcher
    changes: dict[str, str] = {}
    if "nnodes" not in explicit:
        changes["nnodes"] = str(job.nnodes)
    if "rdzv_id" not in explicit:
        changes["rdzv_id"] = f"slurm-{job.job_id}"
    max_nodes = parse_nnodes(changes.get("nnodes", launcher.nnodes))[1]
    # A one-node job keeps its configured endpoint (localhost:0 by default: any free port, which no other job
    # can hold); the agents of several nodes meet at one host's port.
    if "rdzv_endpoint" not in explicit and max_nodes > 1:
        if job.host is None:
            raise ConfigError(
                f"none of MASTER_ADDR, {', '.join(NODELIST_VARS)} is set: the SLURM job's hosts, "
                f"where the rendezvous is (or give launcher.rdzv_endpoint)"
            )
        changes["rdzv_endpoint"] = f"[{job.host}]:{job.port}" if ":" in job.host else f"{job.host}:{job.port}"
    return replace(launcher, **changes)


def summary(launcher: LauncherConfig, env: Mapping[str, str], explicit: set[str]) -> str | None:
    """The start's one line saying the layout came from SLURM (None when it did not)."""
    if set(LAYOUT_FIELDS) <= explicit or not in_slurm(env):
        return None
    node = env.get("SLURM_NODEID", "?").strip()
    given = sorted(f"launcher.{f}" for f in set(LAYOUT_FIELDS) & explicit)
    note = f" ({', '.join(given)} from the command line)" if given else ""
    return (
        f"ptrun: SLURM job {env['SLURM_JOB_ID'].strip()}: node {node} of {launcher.nnodes}, rendezvous at "
        f"{launcher.rdzv_endpoint} (id {launcher.rdzv_id}){note}"
    )
