"""The automatic parts of PipeTransformer: the freeze policies (`freeze`) and AutoPipe's next layout
(`autopipe`). Both are pure decision code (no torch, no process groups): the runtime calls them at epoch
boundaries and applies the Plan they return."""

from ptrun.auto.counts import blocks_of_units, frozen_units_for_blocks
from ptrun.auto.freeze import POLICIES, make_policy
from ptrun.auto.freeze_policy import FreezePolicy
from ptrun.layout.autopipe import next_plan, starting_max

__all__ = [
    "POLICIES",
    "FreezePolicy",
    "blocks_of_units",
    "frozen_units_for_blocks",
    "make_policy",
    "next_plan",
    "starting_max",
]
