"""The plain peer: what a competent PyTorch user writes without ptrun, for `benchmarks.peers` to time.

Same config, data split, architecture, optimizer, schedule and batches as `ptrun train recipe=NAME`, but an
ordinary training loop: timm / transformers model, AdamW, LambdaLR, clip_grad_norm_, and under torchrun
DistributedDataParallel over gloo. One process, or several with each rank taking a contiguous share of every
global batch (the global batch stays `train.global_batch_size`). A classifier reports top-1; a causal LM
(`model.task=causal_lm`: `AutoModelForCausalLM.from_pretrained` on the packed blocks of ptrun's data source)
trains on the library's own next-token loss over the real tokens (the data's `labels`, -100 on padding) and
reports the eval loss per predicted token and its perplexity. A recipe with adapters (`adapter=lora`) makes
it the plain peft loop: the library model wrapped by peft's `get_peft_model` (`with_adapter`), the rest alike:

    python -m benchmarks.plain_loop --recipe digits_vit --threads 2 --out plain.json [overrides ...]
    python -m torch.distributed.run --standalone --nproc_per_node 2 -m benchmarks.plain_loop --threads 1 ...

With `train.compile=true` among the overrides the loop compiles the library model with `torch.compile` as a
user writes it (the whole model, DDP-wrapped where there are several processes, in `train.compile_mode`);
otherwise it runs eager (`auto` too: a user's loop does not compile unless told to). Only the loop over each
epoch's batches counts as training time; the set-up and the evaluation after each epoch count in the wall time
(`wall_s`, since the process started; `process_start_time`, `first_step_time` and `first_step_end_time` are Unix
times: the process started, its first step began before the forward pass and ended after the update). Rank 0
writes `--out`.
"""

from __future__ import annotations

import re
import time

T0 = time.time()  # before the heavy imports; the process's real start is read from /proc where there is one

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

NO_DECAY = ("pos_embed", "cls_token", "reg_token", "position_embeddings", "token_type_embeddings")
CAUSAL_LM = "causal_lm"
TASKS = ("classification", CAUSAL_LM)
IGNORE_INDEX = -100
"""The label of a position the loss leaves out (padding): transformers' convention, and ptrun's data's."""


def process_start() -> float:
    """When this process started (Unix time), from /proc: interpreter start-up and imports included."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return T0


def recipe_config(recipe: str, overrides: list[str]):
    """ptrun's resolved config for the recipe, exactly as `ptrun train recipe=NAME overrides...` sees it
    (defaults filled: a text source's tokenizer is the model's), not validated: the loop reads its model,
    data and training keys and writes nothing to the run directory."""
    from ptrun.compose import compose

    return compose([f"recipe={recipe}", *overrides], run_dir=tempfile.gettempdir(), check=False)


def build_model(m, data) -> torch.nn.Module:
    """The model of `m` (ptrun's model config) for `data`, built the ordinary way: timm, or transformers'
    `from_pretrained` with the recipe's dropout (and for a decoder its attention kernel, fp32 weights)."""
    from ptrun.config.model import FAMILY_SPECS, model_family

    if FAMILY_SPECS[model_family(m)].reads_images:
        import timm

        kwargs = dict(
            num_classes=m.num_classes or data.num_classes,
            img_size=m.img_size or data.image_size,
            patch_size=m.patch_size,
            in_chans=m.in_chans or data.in_chans,
            embed_dim=m.embed_dim,
            depth=m.depth,
            num_heads=m.num_heads,
            mlp_ratio=m.mlp_ratio,
            drop_rate=m.dropout,
            drop_path_rate=m.drop_path,
        )
        return timm.create_model(m.name, pretrained=False, **{k: v for k, v in kwargs.items() if v is not None})
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging

    logging.set_verbosity_error()  # the fresh classifier head's warning, once per rank
    logging.disable_progress_bar()
    if m.task == CAUSAL_LM:
        from ptrun.models.hf import FAMILIES, model_type  # the family's dropout fields: the recipe's 0.0 everywhere

        dropout = dict.fromkeys(FAMILIES[model_type(m.pretrained)].dropout, m.dropout)
        return AutoModelForCausalLM.from_pretrained(
            m.pretrained, dtype=torch.float32, attn_implementation=m.attention, **dropout
        )
    return AutoModelForSequenceClassification.from_pretrained(
        m.pretrained,
        num_labels=m.num_classes or data.num_classes,
        hidden_dropout_prob=m.dropout,
        attention_probs_dropout_prob=m.dropout,
    )


def with_adapter(net: torch.nn.Module, cfg) -> torch.nn.Module:
    """`net` as a LoRA user wraps it where the recipe asks for adapters (`adapter=lora`): peft's
    `get_peft_model` with the recipe's LoRA settings on the blocks' linears it picks (a regex over the numbered
    blocks' paths, so a pooler's or a head's `dense` stays as it is; the user's own regex as it is) and the
    classifier trained beside them;
    else `net` itself."""
    from ptrun.config import ADAPTER_SPECS

    a = cfg.adapter
    if ADAPTER_SPECS[a.name].trains_base:
        return net
    from peft import LoraConfig, get_peft_model

    from ptrun.config.adapter import BLOCK_LINEARS, adapter_family, lora_alpha, selected_paths
    from ptrun.config.adapter_layers import adapted_blocks

    family = adapter_family(cfg.model)
    # peft takes no `layers_to_transform` beside a regex: the regex names the blocks of `adapter.layers` instead
    blocks = r"\d+" if a.layers is None else "|".join(map(str, adapted_blocks(a.layers, num_blocks(cfg))))
    if isinstance(a.targets, str) and a.targets not in ("auto", "all-linear"):
        # the user's own regex, as peft reads it (within the blocks of `adapter.layers`)
        targets = a.targets if a.layers is None else rf"(?=(?:{a.targets})$).*?\.(?:{blocks})\..*"
    else:
        paths = "|".join(re.escape(p) for p in selected_paths(a, family))
        targets = rf".*\.(?:{blocks})\.(?:{paths})"
    heads = [n for n in ("classifier", "score", "head") if cfg.model.task != CAUSAL_LM and hasattr(net, n)]
    config = LoraConfig(
        r=a.r,
        lora_alpha=lora_alpha(a),
        lora_dropout=a.dropout,
        target_modules=targets,
        exclude_modules=a.exclude if isinstance(a.exclude, str) else None,
        fan_in_fan_out=BLOCK_LINEARS[family].conv1d,
        use_rslora=a.rslora,
        use_dora=a.dora,
        init_lora_weights=a.init,
        modules_to_save=heads or None,
    )
    return get_peft_model(net, config)


def num_blocks(cfg) -> int:
    """The blocks of the model `cfg` builds, from its analytic sizes."""
    from ptrun.costs.from_config import costs_from_config

    return costs_from_config(cfg.model, cfg.data).num_blocks


def model_inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def logits(model, batch: dict) -> torch.Tensor:
    if "pixel_values" in batch:
        return model(batch["pixel_values"])
    return model(**model_inputs(batch)).logits


def predicted_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Per row of causal-LM labels [B, T], the tokens the model predicts: position t predicts token t + 1, so
    every label but the first counts, except padding's -100."""
    return (labels[:, 1:] != IGNORE_INDEX).sum(1)


def summed_loss(model, batch: dict, task: str, denominator) -> torch.Tensor:
    """The batch's loss summed over its samples (a causal LM's: over its predicted tokens), over
    `denominator`."""
    if task == CAUSAL_LM:
        # transformers' own loss: it shifts the labels, leaves the -100s out and, given num_items_in_batch,
        # sums the tokens' losses and divides the sum by it
        return model(**model_inputs(batch), labels=batch["labels"], num_items_in_batch=denominator).loss
    return F.cross_entropy(logits(model, batch), batch["labels"], reduction="sum") / denominator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="digits_vit")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--out", default=None, help="JSON result (written by rank 0)")
    parser.add_argument("--save-state", default=None, help="also save the final state_dict and per-step losses")
    parser.add_argument("overrides", nargs="*", help="ptrun overrides, e.g. train.epochs=1")
    args = parser.parse_args(argv)
    start = process_start()
    torch.set_num_threads(args.threads)
    # Late in training, tiny gradients and Adam moments become denormal floats, which run many times slower
    # on x86 CPUs (measured here: epochs 10-17 of digits_vit took 2-4x as long without this line). ptrun's
    # workers flush them to zero too; a peer without it would lose for a reason that is not the engine.
    torch.set_flush_denormal(True)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    # One GPU per process where there are GPUs (nccl), else the CPU (gloo): the same loop either way.
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # What a user on a GPU sets (and ptrun's `device.tf32`, on by default): TF32 tensor cores for fp32.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    # ---- preparation: ptrun's config and data split; the model built the ordinary way --------------------
    from ptrun.config import LR_SCHEDULE_SPECS, PRECISION_SPECS
    from ptrun.data import build_datasets

    cfg = recipe_config(args.recipe, args.overrides)
    task = cfg.model.task
    assert PRECISION_SPECS[cfg.train.precision].autocast is None and task in TASKS, (
        "the peer trains fp32 classifiers and causal LMs"
    )
    data = build_datasets(cfg.data, task=task)
    columns = [
        c
        for c in ("pixel_values", "input_ids", "attention_mask", "token_type_ids", "labels")
        if c in data.train.column_names
    ]
    # Small datasets: whole tensors in memory (token columns as int64, as the embeddings want them).
    train, test = (
        {c: (v if v.is_floating_point() else v.long()).to(device) for c, v in split[:].items() if c in columns}
        for split in (data.train, data.eval)
    )
    torch.manual_seed(cfg.train.seed)
    net = with_adapter(build_model(cfg.model, data), cfg).to(device)
    net.train()
    model = torch.nn.parallel.DistributedDataParallel(net) if world > 1 else net
    if cfg.train.compile is True:  # as a user compiles: the whole (DDP-wrapped) library model, in ptrun's mode
        model = torch.compile(model, mode=None if cfg.train.compile_mode == "default" else cfg.train.compile_mode)
    named = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    decay = [p for n, p in named if p.ndim > 1 and not any(k in n for k in NO_DECAY)]
    no_decay = [p for n, p in named if not (p.ndim > 1 and not any(k in n for k in NO_DECAY))]
    o, t = cfg.optim, cfg.train
    # fused=True works on the CPU too (torch 2.14), and its step took half the time of foreach=True here.
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr,
        betas=tuple(o.betas),
        eps=o.eps,
        fused=True,
    )
    n_train, batch = len(train["labels"]), t.global_batch_size
    steps = min(math.ceil(n_train / batch), t.max_steps_per_epoch or math.ceil(n_train / batch))
    total, warmup = t.epochs * steps, int(o.warmup_fraction * t.epochs * steps)

    def lr_factor(step: int) -> float:  # linear warm-up, then cosine or linear decay (ptrun's schedule)
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return LR_SCHEDULE_SPECS[o.schedule](progress)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)

    # A causal LM's eval batches hold [B, T, vocab] logits: the training batch's size keeps them in memory.
    eval_batch = batch if task == CAUSAL_LM else 128

    def evaluate() -> dict:
        """Top-1 in percent, or a causal LM's loss per predicted token and its perplexity; each rank a
        contiguous shard of the eval split."""
        net.eval()
        shard = torch.tensor_split(torch.arange(len(test["labels"])), world)[rank]
        sums = torch.zeros(2, dtype=torch.float64, device=device)  # correct or summed loss; samples or tokens
        with torch.no_grad():
            for ids in shard.split(eval_batch):
                b = {k: v[ids.to(device)] for k, v in test.items()}
                if task == CAUSAL_LM:
                    sums += torch.stack(
                        [summed_loss(net, b, task, 1).double(), predicted_tokens(b["labels"]).sum().double()]
                    )
                else:
                    sums += torch.tensor(
                        [(logits(net, b).argmax(-1) == b["labels"]).sum().item(), len(ids)], device=device
                    )
        if world > 1:
            dist.all_reduce(sums)
        net.train()
        if task == CAUSAL_LM:
            loss = sums[0].item() / sums[1].item()
            return {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}  # exp overflows beyond ~709
        return {"top1": 100.0 * sums[0].item() / sums[1].item()}

    # ---- training ------------------------------------------------------------------------------------------
    epochs, losses, elapsed, samples = [], [], 0.0, 0
    first_step: dict[str, float] = {}  # when the first step began and ended (Unix times): the start-up
    # The loss's denominator per sample: 1, or a causal LM's predicted tokens (its loss is a token mean).
    weight = predicted_tokens(train["labels"]) if task == CAUSAL_LM else torch.ones(n_train, device=device)
    for epoch in range(t.epochs):
        # ptrun's shuffle (seed x 1,000,003 + epoch): the same batches in the same order, so runs without
        # freezing follow the same trajectory and accuracies compare on this small eval split.
        order = torch.randperm(n_train, generator=torch.Generator().manual_seed(t.seed * 1_000_003 + epoch))
        t_epoch = time.perf_counter()
        for ids in order.split(batch)[:steps]:  # the last batch may be smaller: nothing dropped
            mine = torch.tensor_split(ids, world)[rank]  # this rank's contiguous share of the global batch
            b = {k: v[mine.to(device)] for k, v in train.items()}
            first_step.setdefault("first_step_time", time.time())
            # The share's summed loss over the global batch's samples (or predicted tokens) over the world
            # size: DDP's gradient average is then the global batch's mean loss, even when the last batch
            # does not split evenly.
            loss = summed_loss(model, b, task, weight[ids.to(device)].sum() / world)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), t.grad_clip)
            optimizer.step()
            scheduler.step()
            if "first_step_end_time" not in first_step:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # once: the step has ended when its kernels have
                first_step["first_step_end_time"] = time.time()
            losses.append(loss.detach() / world)
            samples += len(ids)
        train_s = time.perf_counter() - t_epoch
        elapsed += train_s
        t_eval = time.perf_counter()
        metrics = evaluate()
        epochs.append(
            {
                "epoch": epoch,
                "train_time_s": train_s,
                "eval_time_s": time.perf_counter() - t_eval,
                "elapsed_train_s": elapsed,
                "wall_s": time.time() - start,
                **metrics,
            }
        )
        if rank == 0:
            shown = (
                f"eval loss {metrics['loss']:.4f}  perplexity {metrics['perplexity']:.2f}"
                if task == CAUSAL_LM
                else f"top-1 {metrics['top1']:.2f}"
            )
            print(f"epoch {epoch + 1}/{t.epochs}  {train_s:.1f}s  {shown}", flush=True)

    per_step = torch.stack(losses)
    if world > 1:
        dist.all_reduce(per_step)  # each rank's part of every step's global mean loss
    if rank == 0 and args.out:
        # final_top1, or a causal LM's final_eval_loss and final_perplexity
        final = {f"final_{'eval_loss' if key == 'loss' else key}": value for key, value in metrics.items()}
        result = {
            "train_time_s": elapsed,
            "samples_per_s": samples / elapsed,
            "epochs": epochs,
            **final,
            "final_train_loss": per_step[-steps:].mean().item(),
            "world_size": world,
            "threads": args.threads,
            "wall_s": time.time() - start,
            "process_start_time": start,
            **first_step,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if rank == 0 and args.save_state:
        torch.save({"state_dict": net.state_dict(), "losses": per_step}, args.save_state)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
