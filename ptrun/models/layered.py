"""The layered-model protocol: a library model seen as one ordered list of units.

Units are `embed`, then each block's attention half and MLP half, then `head` (final norm + task head):
`2L + 2` units for `L` blocks. Each half contains its own residual add, so a cut between any two units
never crosses a skip connection. Partitioning, freezing, caching and checkpointing speak only of unit
indices and `unit_param_names`; only the adapters (vit.py, bert.py) know timm or transformers.

A unit holds references to the library's own submodules (and, where the library keeps a parameter directly
on the top-level model, to that very Parameter object), so the parameters exist once and are shared by the
library model and the units. A pipeline stage registers `units[lo:hi]` as its children and holds exactly
those units' parameters.

Tied parameters. Some models use one Parameter in two places far apart: BERT's masked-LM decoder weight *is*
the word-embedding matrix (`tie_word_embeddings`), used by the first unit (lookup) and the last (output
projection). An adapter declares such parameters (`tied=`); every other parameter must be used by exactly
one unit, so accidental sharing is still an error. A tied parameter is *owned* by the first unit that uses
it (`unit_param_names(owner)` lists it, so checkpoints and optimisers see it once) and *shared* by the
others (`unit_shared_param_names(i)`). `self.tied` maps its name to all the units that use it.

In a pipeline the units using a tied parameter usually sit on different stages, and a stage cannot read
another process's tensor in its forward. So, as DeepSpeed's `TiedLayerSpec` does, every such stage keeps a
replica; each replica receives only the gradient of its own uses, and the true gradient is their sum. The
runtime therefore all-reduces (sums) the tied gradients over the stages that hold a replica after backward
and before the optimiser step; the identical update then keeps the replicas equal (they start equal
because they are copied from the one library model). In a single process the units share the very object,
autograd sums the two uses itself, and nothing needs doing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from ptrun.models.per_pass import one_pass


def run_units(units: Sequence[nn.Module], *inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Run `units` in order; a unit's tuple output is splatted into the next unit. One pass: the units share
    what they build for it alike (`ptrun.models.per_pass`)."""
    out: torch.Tensor | tuple[torch.Tensor, ...] = inputs
    with one_pass():
        for unit in units:
            out = unit(*(out if isinstance(out, tuple) else (out,)))
    return out


class LayeredModel(nn.Module):
    """A library model (`self.model`) plus its ordered units.

    `units` is a plain list, deliberately not registered: the parameters are registered once, under `model`,
    and `unit_param_names(i)` names unit i's parameters in `model.named_parameters()`'s namespace.

    `tied` declares the parameters that several units may use (Parameter objects of `model`, or any of their
    names in it, e.g. an alias such as `cls.predictions.decoder.weight`). After construction `self.tied` maps
    the name of each declared parameter that more than one unit actually uses (its name in
    `model.named_parameters()`, which lists a shared Parameter once, under its first name) to the sorted
    indices of those units. A declared parameter used by a single unit needs no replica and is not listed.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        family: str,
        task: str,
        units: list[nn.Module],
        input_names: tuple[str, ...],
        tied: Iterable[nn.Parameter | str] = (),
        init: Callable[[nn.Module], None] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.family = family
        self.task = task
        self.units = list(units)  # a list is not a Module, so nn.Module stores it as a plain attribute
        self.num_blocks = (len(units) - 2) // 2
        self.unit_names = (
            ["embed"] + [f"block.{b}.{half}" for b in range(self.num_blocks) for half in ("attn", "mlp")] + ["head"]
        )
        self.input_names = input_names
        self.sequence_units = next(
            (i for i, unit in enumerate(self.units) if getattr(unit, "first_token_only", False)), len(self.units)
        )
        """How many leading units return every token's row. A classification head's last layer may keep the first
        token's only (ptrun.models.encoders); AutoCache caches no deeper, where an entry would change shape."""
        self._tied_declared = list(tied)
        self.repartition()
        self.library_config: dict = {}
        """How the library rebuilds `model` (timm: the `create_model` arguments), for the export."""
        self.fixed: set[str] = set()
        """The parameters that never train: the base weights under adapters (`ptrun.models.adapters`)."""
        self.adapters: set[str] = set()
        """The adapters' parameters (`adapter=lora`), empty without adapters."""
        self.adapter_config = None
        """peft's config of the adapters (a LoraConfig), None without adapters."""
        self.after_values = None
        """Called with the units `init_units` just filled, once they hold their initial and pretrained values
        (DoRA's magnitudes are computed from the loaded base weights); None: nothing to do."""
        self._init = init
        self.init_seed = 0
        """Unit i's initial values are drawn from the generator seeded with `init_seed + i` (ptrun.models.lazy)."""
        self.weights = None
        """The pretrained weights file units read their values from as they are filled (ptrun.models.weights)."""

    def repartition(self) -> None:
        """Name each unit's parameters (again, after an adapter added some) and record their shapes."""
        self.tied: dict[str, tuple[int, ...]] = {}
        self._param_names, self._shared_names = self._partition(self._tied_declared)
        self.param_shapes = {name: p.shape for name, p in self.model.named_parameters()}
        """Each parameter's shape, also while a worker that does not hold it keeps it empty (ptrun.models.lazy)."""

    def _declared_tied(self, tied: Iterable[nn.Parameter | str]) -> set[int]:
        """Object ids of the declared tied parameters; each must be a parameter of `model`."""
        own = {id(p) for p in self.model.parameters()}
        ids = set()
        for entry in tied:
            # get_parameter resolves any registered name, including an alias of a tied Parameter
            p = self.model.get_parameter(entry) if isinstance(entry, str) else entry
            if id(p) not in own:
                raise RuntimeError(
                    f"tied parameter {entry if isinstance(entry, str) else tuple(p.shape)} "
                    f"is not a parameter of the model"
                )
            ids.add(id(p))
        return ids

    def _partition(self, tied: Iterable[nn.Parameter | str]) -> tuple[list[list[str]], list[list[str]]]:
        """Name each unit's parameters by object identity; check that every parameter is owned exactly once.

        Identity (not names) is what tells whether two units use the same tensor: a unit's submodules are the
        library's own, so `unit.parameters()` yields the library's Parameter objects. Returns the owned and
        the shared (used, not owned) names per unit, and fills `self.tied`.
        """
        allowed = self._declared_tied(tied)
        name_of = {id(p): name for name, p in self.model.named_parameters()}
        rank = {name: k for k, name in enumerate(name_of.values())}
        users: dict[str, list[int]] = {}
        for i, unit in enumerate(self.units):
            for p in unit.parameters():  # deduplicated within the unit, so a unit counts once per parameter
                name = name_of.get(id(p))
                if name is None:
                    raise RuntimeError(
                        f"unit {self.unit_names[i]}: a parameter of shape {tuple(p.shape)} "
                        f"is not a parameter of the model"
                    )
                seen = users.setdefault(name, [])
                if seen and id(p) not in allowed:  # sharing that no adapter asked for is a bug, not a tie
                    raise RuntimeError(
                        f"unit {self.unit_names[i]}: parameter {name} is not owned once "
                        f"(also used by unit {self.unit_names[seen[0]]}) and not declared tied"
                    )
                seen.append(i)
        orphans = [n for n in name_of.values() if n not in users]
        if orphans:
            raise RuntimeError(f"parameters in no unit: {orphans[:5]}")
        owned: list[list[str]] = [[] for _ in self.units]
        shared: list[list[str]] = [[] for _ in self.units]
        for name in sorted(users, key=rank.__getitem__):  # in the model's own order
            first, *others = users[name]  # units were visited in order, so `first` is the lowest index
            owned[first].append(name)
            for i in others:
                shared[i].append(name)
            if others:
                self.tied[name] = tuple(users[name])
        return owned, shared

    def unit_param_names(self, i: int) -> list[str]:
        """Fully qualified names (in `self.model.named_parameters()`) of the parameters owned by unit i.

        Over all units these name every parameter exactly once; a tied parameter is listed for its owner (the
        first unit using it) only.
        """
        return list(self._param_names[i])

    def unit_shared_param_names(self, i: int) -> list[str]:
        """Names of the tied parameters unit i uses but does not own (empty for most units and models).

        A stage holding unit i holds a replica of each of these; its gradient must be summed with the other
        replicas' (see the module docstring), and it is saved only by the owner's stage.
        """
        return list(self._shared_names[i])

    def tied_parameter_names(self, units: Iterable[int] | None = None) -> list[str]:
        """Names of the tied parameters used by any of `units` (all tied parameters if None), model order.

        For a stage holding `units`, these are the replicas whose gradients it must all-reduce.
        """
        if units is None:
            return list(self.tied)
        wanted = set(units)
        return [name for name, users in self.tied.items() if wanted.intersection(users)]

    def init_unit(self, i: int) -> None:
        """Draw unit i's initial values with the library's own rule for its modules, from the global generator
        (`ptrun.models.lazy.init_units` seeds it per unit)."""
        if self._init is None:
            raise RuntimeError(f"{self.family}: this model has no per-unit initialisation")
        self._init(self.units[i])

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
