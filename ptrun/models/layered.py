"""The layered-model protocol: a library model seen as one ordered list of units.

Units are `embed`, then each block's attention half and MLP half, then `head` (final norm + task head):
`2L + 2` units for `L` blocks. Each half contains its own residual add, so a cut between any two units
never crosses a skip connection. Partitioning, freezing, caching and checkpointing speak only of unit
indices and `unit_param_names`; only the adapters (vit.py, bert.py) know timm or transformers.

A unit holds references to the library's own submodules (and, where the library keeps a parameter directly
on the top-level model, to that very Parameter object), so the parameters exist once and are shared by the
library model and the units. A pipeline stage registers `units[lo:hi]` as its children and owns exactly
those parameters.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


def run_units(units: Sequence[nn.Module], *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Run `units` in order; a unit's tuple output is splatted into the next unit."""
    out: torch.Tensor | tuple[torch.Tensor, ...] = inputs
    for unit in units:
        out = unit(*(out if isinstance(out, tuple) else (out,)))
    return out


class LayeredModel(nn.Module):
    """A library model (`self.model`) plus its ordered units.

    `units` is a plain list, deliberately not registered: the parameters are registered once, under `model`,
    and `unit_param_names(i)` names unit i's parameters in `model.named_parameters()`'s namespace.
    """

    def __init__(self, model: nn.Module, *, family: str, task: str, units: list[nn.Module],
                 input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.family = family
        self.task = task
        self.units = list(units)  # a list is not a Module, so nn.Module stores it as a plain attribute
        self.num_blocks = (len(units) - 2) // 2
        self.unit_names = (["embed"] + [f"block.{b}.{half}" for b in range(self.num_blocks)
                                        for half in ("attn", "mlp")] + ["head"])
        self.input_names = input_names
        self._param_names = self._partition()

    def _partition(self) -> list[list[str]]:
        """Name each unit's parameters by object identity; check they partition the model's parameters."""
        name_of = {id(p): name for name, p in self.model.named_parameters()}
        rank = {name: k for k, name in enumerate(name_of.values())}
        owner: dict[str, int] = {}
        per_unit: list[list[str]] = []
        for i, unit in enumerate(self.units):
            names = []
            for p in unit.parameters():
                name = name_of.get(id(p))
                if name is None or name in owner:
                    raise RuntimeError(f"unit {self.unit_names[i]}: parameter {name or '?'} is not owned once")
                owner[name] = i
                names.append(name)
            per_unit.append(sorted(names, key=rank.__getitem__))  # in the model's own order
        orphans = [n for n in name_of.values() if n not in owner]
        if orphans:
            raise RuntimeError(f"parameters in no unit: {orphans[:5]}")
        return per_unit

    def unit_param_names(self, i: int) -> list[str]:
        """Fully qualified names (in `self.model.named_parameters()`) of the parameters owned by unit i."""
        return list(self._param_names[i])

    def unit_block(self, i: int) -> int | None:
        """Block index of unit i; None for the embedding and the head."""
        if not 0 <= i < len(self.units):
            raise IndexError(f"unit {i} out of range 0..{len(self.units) - 1}")
        return None if i in (0, len(self.units) - 1) else (i - 1) // 2

    def train(self, mode: bool = True) -> LayeredModel:
        """Also flip the units' own flags (their submodules are shared with `model` and already flipped)."""
        super().train(mode)
        for unit in self.units:
            unit.train(mode)
        return self

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        """All units in order; equals the library model's own logits."""
        return run_units(self.units, *inputs)  # type: ignore[return-value]
