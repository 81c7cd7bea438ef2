"""A model built without its weights, and units given storage and initial values one by one.

A worker runs only its stages' units, so it must not build the whole model first. As torchtitan
(meta-device models) and DeepSpeed (`LayerSpec`) do, `build_model` creates every parameter on the meta device
(shape and dtype, no storage) and then makes it an empty host tensor, keeping the Parameter object: the
library model and the units share it, and a unit a worker receives later is filled in place. Buffers (BERT's
position ids) are small and read by any unit a worker may receive, so they are built real.

Initial values are per unit. Unit i is initialised by the library's own rule for its modules (timm's
`init_weights_vit_timm`, transformers' `_init_weights`, in `LayeredModel.init_unit`) from the random
generator seeded with `layered.init_seed + i`, then overwritten by the pretrained file's values where
one is given (read per unit). So a unit's initial values are the same whatever the layout,
the world size, or the other units a process builds: workers that each build their own units start from one
model, and the single-process reference equals them.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from ptrun.models.weights import load_pretrained


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """While open, every parameter a module registers goes to the meta device; buffers stay real. A parameter
    already on meta (a tied one, registered a second time) is kept as it is, so a tie stays one object."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = type(param)(param.data.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def empty_meta_parameters(model: nn.Module) -> None:
    """Make each meta parameter an empty host tensor of its dtype, in place (`swap_tensors` keeps the Python
    object, so every module and unit that refers to it sees the change)."""
    for p in model.parameters():
        if p.device.type == "meta":
            torch.utils.swap_tensors(p, nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=p.requires_grad))


def is_empty(layered, name: str, p: torch.Tensor) -> bool:
    """Whether parameter `name` has no storage here (a worker that does not hold it)."""
    return p.numel() == 0 and layered.param_shapes[name].numel() > 0


def unit_names(layered, units: Iterable[int]) -> set[str]:
    """The parameters the stages running `units` hold: the units' own and the tied ones they share."""
    return {n for u in units for n in layered.unit_param_names(u) + layered.unit_shared_param_names(u)}


def allocate(layered, names: Iterable[str]) -> None:
    """Give each empty parameter among `names` storage of its shape (its values are written next)."""
    params = dict(layered.model.named_parameters())
    for name in names:
        p = params[name]
        if is_empty(layered, name, p):
            p.data = p.data.new_empty(layered.param_shapes[name])


def release(layered, names: Iterable[str]) -> None:
    """Empty the parameters among `names` (their memory goes back, to the operating system too; the
    Parameter objects stay)."""
    params = dict(layered.model.named_parameters())
    on_host = False
    for name in names:
        p = params[name]
        if not is_empty(layered, name, p):
            on_host |= p.device.type == "cpu"
            p.data = p.data.new_empty(0)
    if on_host:
        give_back_host_memory()


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def give_back_host_memory() -> None:
    """Hand the host memory freed so far back to the operating system, where the C library is glibc (a
    no-op elsewhere). Call it where storage a worker no longer holds was freed on the host.

    Why: glibc serves a block of a few MB from its heap once a block that size has been freed (its threshold
    for giving a block a mapping of its own rises to the largest freed one), and keeps what is freed there for
    reuse. Filling units one after another (the start-up's profile of every unit, a layout's units) did not
    reuse it: freed units' parameter and gradient blocks stayed resident, so a worker that held one stage
    kept a whole model's worth of memory. `malloc_trim(0)` returns the free pages; it reads the heap once
    (milliseconds), and runs only after storage was released."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def empty_units(layered, units: Iterable[int]) -> list[int]:
    """Those of `units` with a parameter that has no storage yet."""
    params = dict(layered.model.named_parameters())
    return [u for u in units if any(is_empty(layered, n, params[n]) for n in unit_names(layered, [u]))]


def init_units(layered, units: Iterable[int]) -> None:
    """Give the empty ones of `units` storage and their initial values (unit by unit, each from its own
    seed). A tied parameter such a unit shares without owning takes its owner's initial values: the owner is
    initialised too, and what only the owner needs is emptied again."""
    wanted = set(empty_units(layered, units))
    if not wanted:
        return
    params = dict(layered.model.named_parameters())
    tied_owners = {
        layered.tied[n][0]
        for u in wanted
        for n in layered.unit_shared_param_names(u)
        if is_empty(layered, n, params[n])
    }
    extra = tied_owners - wanted
    allocate(layered, unit_names(layered, wanted | extra))
    supplied = set(layered.weights.keys) if layered.weights is not None else set()
    for u in sorted(wanted | extra):  # an owner comes before the units sharing its parameter
        if set(layered.unit_param_names(u)) <= supplied:
            continue  # the pretrained file gives all of it: drawing values to overwrite them is wasted
        shared = [params[n] for n in layered.unit_shared_param_names(u)]
        kept = [p.detach().clone() for p in shared]
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(layered.init_seed + u)
            layered.init_unit(u)
            for p, value in zip(shared, kept, strict=True):  # a unit's own rule must not redraw its owner's values
                p.copy_(value)
    if layered.weights is not None:  # pretrained values, read for these units only
        load_pretrained(layered, layered.weights, unit_names(layered, wanted | extra))
    if layered.after_values is not None:
        layered.after_values(sorted(wanted | extra))
    release(layered, unit_names(layered, extra) - unit_names(layered, wanted))


@contextmanager
def borrowed(layered, units: Iterable[int]) -> Iterator[None]:
    """`units` with their initial values while open (a measurement runs them), emptied again afterwards
    unless they held values already: so measuring a model unit by unit holds one unit at a time."""
    every = range(len(layered.units))
    held = set(every) - set(empty_units(layered, every))
    filled = empty_units(layered, units)
    init_units(layered, filled)
    try:
        yield
    finally:  # a tied parameter a held unit uses stays
        release(layered, unit_names(layered, filled) - unit_names(layered, held))
