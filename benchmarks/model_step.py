"""The model's own training step, ptrun's units against the library's model, in one process: what the two
cost on the same batch of the recipe's data (its first global batch), a classifier's or a causal LM's (the
next-token loss), each with fused AdamW, in interleaved rounds; with `--profile`, the operators (on a GPU: the
kernels) each spends its time in, and how often a step reads a tensor's value on the host (on a GPU, each read
waits for the device: the units should read no more often than the library's model). A recipe with
`adapter=lora` steps peft's `get_peft_model` around the library's model, as the plain peft loop has it, against
ptrun's units with their adapters.

What the engine adds around the step (the runtime, the feed, the cache, the freeze measure) is left out on
purpose: a gap here is the model's (its units, its masks, the kernels they pick), a gap in `benchmarks.peers` that
is not here is the engine's.

    python -m benchmarks.model_step --recipe bbc_news_bert --steps 20 --profile data.max_length=512

Prints one line per model (median milliseconds per step, min-max over the rounds), the ratio, and with
`--profile` the host reads and top operators of each; `--out FILE` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date

import torch
import torch.nn.functional as F

from benchmarks.harness import markdown_lines
from benchmarks.plain_loop import CAUSAL_LM, NO_DECAY, logits, recipe_config, with_adapter
from benchmarks.plain_loop import build_model as library_model
from benchmarks.tiny_inputs import machine
from ptrun.models.losses import IGNORE_INDEX

LIBRARY, UNITS = "library model", "ptrun units"


def first_batch(data, size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The split's first `size` samples as tensors on `device` (token columns as int64, as embeddings take)."""
    batch = data.train[list(range(min(size, len(data.train))))]
    return {
        k: (v if v.is_floating_point() else v.long()).to(device)
        for k, v in batch.items()
        if k in ("pixel_values", "input_ids", "attention_mask", "token_type_ids", "labels")
    }


def adamw(model: torch.nn.Module, optim) -> torch.optim.Optimizer:
    """The plain loop's optimizer: fused AdamW, no decay on biases, norms and position tables."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim > 1 and not any(k in n for k in NO_DECAY)]
    rest = [p for n, p in named if not (p.ndim > 1 and not any(k in n for k in NO_DECAY))]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=optim.lr,
        fused=True,
    )


def loss_of(logits_: torch.Tensor, labels: torch.Tensor, task: str) -> torch.Tensor:
    """The mean loss: a classifier's cross-entropy, or a causal LM's over the next tokens (labels shifted by
    one, padding's -100 left out), as the library computes it."""
    if task == CAUSAL_LM:
        return F.cross_entropy(logits_[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX)
    return F.cross_entropy(logits_, labels)


def step_fn(forward: Callable[[], torch.Tensor], labels: torch.Tensor, optimizer, task: str) -> Callable[[], None]:
    def step() -> None:
        loss = loss_of(forward(), labels, task)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def models(cfg, data, batch: dict, device: torch.device) -> dict[str, tuple[torch.nn.Module, Callable[[], None]]]:
    """{label: (module, one training step)} for the library's model and ptrun's units, the same architecture."""
    from ptrun.models import build_model

    torch.manual_seed(cfg.train.seed)
    library = with_adapter(library_model(cfg.model, data), cfg).to(device).train()
    torch.manual_seed(cfg.train.seed)
    layered = build_model(cfg.model, **data.model_sizes, adapter=cfg.adapter).to(device).train()
    inputs = tuple(batch[k] for k in layered.input_names if k in batch)
    task = cfg.model.task
    return {
        LIBRARY: (library, step_fn(lambda: logits(library, batch), batch["labels"], adamw(library, cfg.optim), task)),
        UNITS: (layered, step_fn(lambda: layered(*inputs), batch["labels"], adamw(layered, cfg.optim), task)),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], None], steps: int, device: torch.device) -> float:
    """Milliseconds per step over `steps` steps, the device's queue drained before and after."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) * 1e3 / steps


def top_operators(step: Callable[[], None], device: torch.device, steps: int = 3, top: int = 12) -> dict:
    """The operators one of `steps` steps spends most time in (self time; on a GPU the device's), largest
    first, and how often a step reads a value on the host."""
    from torch.profiler import profile

    from ptrun.train.traces import host_reads, profiler_activities, self_time_key

    with profile(activities=profiler_activities(device)) as prof:
        for _ in range(steps):
            step()
        sync(device)
    key, averages = self_time_key(device), prof.key_averages()
    events = sorted(averages, key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
    return {
        "host_reads_per_step": host_reads(averages) / steps,
        "top": [
            {"name": e.key, "ms_per_step": getattr(e, key, 0.0) / 1e3 / steps, "calls_per_step": e.count / steps}
            for e in events
        ],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="bbc_news_bert")
    parser.add_argument("--steps", type=int, default=10, help="steps a round times, per model")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both models, interleaved")
    parser.add_argument("--profile", action="store_true", help="also list each model's top operators")
    parser.add_argument("--out", help="write the result as JSON here")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE on top of the recipe")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    from ptrun.data import build_datasets

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":  # as the plain loop and ptrun's `device.tf32` do
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cfg = recipe_config(args.recipe, args.overrides)
    if cfg.model.task not in ("classification", CAUSAL_LM):
        parser.error(
            f"--recipe {args.recipe}: model.task={cfg.model.task}; this benchmark steps classifiers and causal LMs"
        )
    data = build_datasets(cfg.data, task=cfg.model.task)
    batch = first_batch(data, cfg.train.global_batch_size, device)
    runs = models(cfg, data, batch, device)
    params = {label: sum(p.numel() for p in m.parameters() if p.requires_grad) for label, (m, _) in runs.items()}
    for _, step in runs.values():  # warm-up: allocator, kernels' autotuning, the optimizer's state
        timed(step, 2, device)
    ms: dict[str, list[float]] = {label: [] for label in runs}
    for _ in range(args.rounds):
        for label, (_, step) in runs.items():
            ms[label].append(timed(step, args.steps, device))
    shape = {k: list(v.shape) for k, v in batch.items()}
    result = {
        "command": shlex.join(["python", "-m", "benchmarks.model_step", *argv]),
        "date": date.today().isoformat(),
        "machine": f"{machine()}; torch {torch.__version__}",
        "recipe": args.recipe,
        "overrides": args.overrides,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch": shape,
        "params": params,
        "steps": args.steps,
        "rounds": args.rounds,
        "ms_per_step": {
            label: {"median": statistics.median(v), "min": min(v), "max": max(v)} for label, v in ms.items()
        },
    }
    library, units = (result["ms_per_step"][k]["median"] for k in (LIBRARY, UNITS))
    for label, m in result["ms_per_step"].items():
        print(
            f"{label}: {m['median']:.2f} ms/step ({m['min']:.2f}-{m['max']:.2f}), {params[label] / 1e6:.2f} M "
            f"trainable parameters",
            flush=True,
        )
    print(f"ptrun units / library model: {library / units:.2f}x the library's speed; batch {shape}", flush=True)
    if args.profile:
        result["top_operators"] = {label: top_operators(step, device) for label, (_, step) in runs.items()}
        for label, profiled in result["top_operators"].items():
            print(
                f"{label}: {profiled['host_reads_per_step']:.0f} host reads of a tensor's value per step; top "
                f"operators (ms per step, calls per step):",
                flush=True,
            )
            for op in profiled["top"]:
                print(f"  {op['ms_per_step']:8.3f}  {op['calls_per_step']:6.1f}  {op['name']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def caption(result: dict) -> str:
    shape = " x ".join(str(n) for n in next(v for k, v in result["batch"].items() if k != "labels"))
    return (
        f"{result['recipe']} ({' '.join(result['overrides']) or 'as shipped'}), one batch ({shape}), on "
        f"{result['device']}: {result['rounds']} round(s) of {result['steps']} steps of each model, interleaved; "
        f"medians (min-max over the rounds)"
    )


def table(result: dict) -> str:
    ms, library = result["ms_per_step"], result["ms_per_step"][LIBRARY]["median"]
    rows = [
        [
            label,
            f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f})",
            f"{library / m['median']:.2f}x",
            f"{result['params'][label] / 1e6:.2f}",
        ]
        for label, m in ms.items()
    ]
    lines = markdown_lines(["model", "ms per step", "speed against the library's", "trainable parameters (M)"], rows)
    for label, profiled in result.get("top_operators", {}).items():
        ops = profiled["top"] if isinstance(profiled, dict) else profiled  # results written before host reads
        reads = f" ({profiled['host_reads_per_step']:.0f} host reads a step)" if isinstance(profiled, dict) else ""
        lines += [
            "",
            *markdown_lines(
                [f"{label}: top operators{reads}", "ms per step", "calls per step"],
                [[f"`{op['name']}`", f"{op['ms_per_step']:.3f}", f"{op['calls_per_step']:.0f}"] for op in ops[:8]],
            ),
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
