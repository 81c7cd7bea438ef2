"""The automatic parts of PipeTransformer beside freezing (`ptrun.freezing`): AutoPipe's next layout
(`autopipe`), AutoDP and AutoCache, and the controller that runs them. The decisions are pure code (no torch,
no process groups): the runtime calls them at epoch boundaries and applies the Plan they return."""

from ptrun.layout.autopipe import next_plan, starting_max

__all__ = ["next_plan", "starting_max"]
