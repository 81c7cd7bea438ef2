"""peft's LoRA linear with the adapter's sum in one kernel: `FusedLoraLinear`.

peft's `lora.Linear` adds its adapter as `result + lora_B(lora_A(dropout(x))) * scaling`: after `lora_B`'s
matmul, two more passes over the full-width output (the scaling's multiply and the add), and two more in the
backward (the add's and the multiply's gradients). A GEMM takes both as its epilogue: `result.addmm_(h, B.T,
alpha=scaling)` accumulates into the base layer's output in one kernel on every backend (in place: the base
layer's backward needs its input, never its output), and its backward scales only the rank-wide gradient of
`h`. It is the same sum, so the loss and every gradient agree with peft's to rounding. On 2 CPU cores it took
110 ms of adds and multiplies out of a MiniLM LoRA step of 949 ms, for 21 ms of `addmm_` (docs/results.md,
"LoRA's step"). peft does everything else: the wrapping, the parameters and their names, merging, the saved
format.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora import Linear as LoraLinear


class FusedLoraLinear(LoraLinear):
    """peft's `lora.Linear`, its plain LoRA forward (one active adapter, unmerged, no variant such as DoRA, no
    bias on `lora_B`, no per-call arguments) in one `addmm`; any other case runs peft's own forward."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or self.disable_adapters or self.merged or len(self.active_adapters) != 1:
            return super().forward(x, *args, **kwargs)
        name = self.active_adapters[0]
        if name not in self.lora_A or name in self.lora_variant or self.lora_B[name].bias is not None:
            return super().forward(x, *args, **kwargs)
        lora_A, weight = self.lora_A[name], self.lora_B[name].weight
        autocast = torch.is_autocast_enabled(x.device.type)
        if not autocast and not self.get_base_layer().weight.dtype == lora_A.weight.dtype == weight.dtype:
            return super().forward(x, *args, **kwargs)  # mixed precisions without autocast: peft's own sum
        flat = x.reshape(-1, x.shape[-1])
        result = self.base_layer(flat)
        h = lora_A(self.lora_dropout[name](self._cast_input_dtype(flat, lora_A.weight.dtype)))
        if autocast:  # it casts no in-place op: do what it does to an addmm
            h, weight = h.to(result.dtype), weight.to(result.dtype)
        return result.addmm_(h, weight.t(), alpha=self.scaling[name]).view(*x.shape[:-1], result.shape[-1])


def fuse_lora_linears(model: torch.nn.Module) -> int:
    """Make each of `model`'s peft `lora.Linear` modules (exactly that class) a `FusedLoraLinear`, in place (the
    same object, parameters and state: only the class changes); how many it changed."""
    changed = 0
    for module in model.modules():
        if type(module) is LoraLinear:
            module.__class__ = FusedLoraLinear
            changed += 1
    return changed
