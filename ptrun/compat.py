"""What differs between the torch and transformers releases ptrun supports, decided by capability, here alone.

Each gate asks the installed library what it can do (a dataclass field, a keyword in a signature), never its
version string, and is computed once: the rest of ptrun calls these functions and stays free of version
checks. The supported range is what pyproject.toml declares and CI runs (its oldest and newest pairs).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from functools import cache


@cache
def launch_config_fields() -> frozenset[str]:
    """The fields of this torch's `LaunchConfig` (`shutdown_timeout` arrived in torch 2.12)."""
    from torch.distributed.launcher.api import LaunchConfig  # inner import: start-up

    return frozenset(f.name for f in dataclasses.fields(LaunchConfig))


def launch_config_kwargs(fields: dict) -> dict:
    """`fields` less those this torch's LaunchConfig does not know (the agent applies what matters of them
    itself: see `agent_shutdown`)."""
    known = launch_config_fields()
    return {k: v for k, v in fields.items() if k in known}


@cache
def _shutdown_takes_timeout(agent_class: type) -> bool:
    return "timeout" in inspect.signature(agent_class._shutdown).parameters


def agent_shutdown(agent, shutdown, base_class: type, death_sig, timeout: float) -> None:
    """Stop `agent`'s workers through `shutdown` (its `_shutdown` up the class chain down to elastic's
    `base_class`) with a grace of `timeout` seconds between `death_sig` and SIGKILL. Before torch 2.12
    `_shutdown` takes no timeout and waits the process context's default (30 s); the context's `close` is then
    given the timeout for the duration of the call."""
    if _shutdown_takes_timeout(base_class):
        shutdown(death_sig, timeout)
        return
    context = getattr(agent, "_pcontext", None)
    if context is None:
        shutdown(death_sig)
        return
    close = context.close
    context.close = lambda sig=death_sig, grace=timeout: close(sig, grace)
    try:
        shutdown(death_sig)
    finally:
        context.close = close


@cache
def _ddp_parameters() -> frozenset[str]:
    from torch.nn.parallel import DistributedDataParallel  # inner import: start-up

    return frozenset(inspect.signature(DistributedDataParallel.__init__).parameters)


def ddp_no_buffer_sync() -> dict:
    """DistributedDataParallel's keyword that turns off the buffer broadcast before every forward pass:
    `forward_sync_buffers=False` where it exists (torch 2.12 on, which deprecates the other), else
    `broadcast_buffers=False`."""
    return (
        {"forward_sync_buffers": False} if "forward_sync_buffers" in _ddp_parameters() else {"broadcast_buffers": False}
    )


_MASK_PARAMETERS: dict = {}
"""A mask function's parameter names, read once. A plain dict, not functools.cache: compiled units trace the
lookup, and dynamo warns of a cache wrapper it has to trace through."""


def mask_parameters(function) -> frozenset[str]:
    """`function`'s parameter names (`split_decoder` reads them eagerly, so compiled units only look them up)."""
    if function not in _MASK_PARAMETERS:
        _MASK_PARAMETERS[function] = frozenset(inspect.signature(function).parameters)
    return _MASK_PARAMETERS[function]


def causal_mask_kwargs(function, positions) -> dict:
    """The keywords for transformers' `create_causal_mask` / `create_sliding_window_causal_mask` that say "no
    key-value cache" and give the positions: the cache is `cache=` from transformers 5.24, `past_key_values=`
    before; releases that still take `cache_position` get the positions there too."""
    params = mask_parameters(function)
    kwargs = {"cache": None} if "cache" in params else {"past_key_values": None}
    if "cache_position" in params:
        kwargs["cache_position"] = positions[0]
    if "position_ids" in params:
        kwargs["position_ids"] = positions
    return kwargs


def keep_inductor_headers_with_its_cache() -> None:
    """Inductor's precompiled C++ headers (about 150 MB on the CPU) go to $TMPDIR/torchinductor_USER whatever
    TORCHINDUCTOR_CACHE_DIR says (torch 2.14 fixes that path as its codecache module loads): they go beside the
    compiled graphs instead, in the cache directory ptrun documents. A torch without that path is left alone."""
    # inner import: optional library (inductor, for a run that compiles)
    from torch._inductor import codecache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    if hasattr(codecache, "_HEADER_DIR") and hasattr(codecache, "_HEADER_LOCK_DIR"):
        codecache._HEADER_DIR = os.path.join(cache_dir(), "precompiled_headers")
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
