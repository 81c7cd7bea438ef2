"""The HF Trainer peer: what a transformers user runs without ptrun, for `benchmarks.peers` to time.

transformers' `Trainer` over the recipe's model (`from_pretrained`, as the plain loop builds it, wrapped by peft's
`get_peft_model` where the recipe asks for adapters: `adapter=lora`), data split, epochs, global batch,
AdamW (fused), learning-rate schedule and warm-up, gradient clip and seed, evaluating after every epoch; one
process. The Trainer shuffles with its own sampler (the batches differ from ptrun's, the split does not). It
writes `--out` in the plain loop's format (training time: the epochs' loops, evaluation left out; samples/s;
each epoch's top-1 or perplexity), which `benchmarks.peer_runs` reads alike:

    python -m benchmarks.hf_trainer --recipe bbc_news_lora --threads 2 --out trainer.json [overrides ...]
"""

from __future__ import annotations

import time

T0 = time.time()  # before the heavy imports

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402

from benchmarks.plain_loop import CAUSAL_LM, build_model, process_start, recipe_config, with_adapter  # noqa: E402

SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup"}
"""ptrun's `optim.schedule` -> the Trainer's `lr_scheduler_type` (the same shape after the warm-up)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bbc_news_lora")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--out", default=None, help="JSON result")
    parser.add_argument("overrides", nargs="*", help="ptrun overrides, e.g. train.epochs=1")
    args = parser.parse_args(argv)
    start = process_start()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as the plain loop and ptrun's workers do (denormal Adam moments)
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.utils import logging

    from ptrun.data import build_datasets

    logging.set_verbosity_error()
    cfg = recipe_config(args.recipe, args.overrides)
    task, o, t = cfg.model.task, cfg.optim, cfg.train
    assert task in ("classification", CAUSAL_LM) and SCHEDULES.get(o.schedule), "the Trainer peer trains these"
    data = build_datasets(cfg.data, task=task)
    columns = [c for c in ("input_ids", "attention_mask", "token_type_ids", "labels") if c in data.train.column_names]
    train, test = (Rows(split, columns) for split in (data.train, data.eval))
    torch.manual_seed(t.seed)
    net = with_adapter(build_model(cfg.model, data), cfg)
    steps = math.ceil(len(train) / t.global_batch_size)
    steps = min(steps, t.max_steps_per_epoch or steps)
    total = t.epochs * steps
    if t.max_steps_per_epoch:  # the Trainer's max_steps counts over the run: an epoch is cut to its steps' rows
        train = torch.utils.data.Subset(train, range(min(len(train), steps * t.global_batch_size)))
    clock = EpochClock()

    class Clock(TrainerCallback):
        def on_epoch_begin(self, *_, **__):
            clock.begin()

        def on_step_begin(self, *_, **__):
            clock.first_step()

        def on_epoch_end(self, *_, **__):
            clock.end()

        def on_evaluate(self, *_, metrics=None, **__):
            clock.evaluated(metrics or {}, task)

    def top1(prediction) -> dict:
        return {"top1": 100.0 * float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(
            model=net,
            args=TrainingArguments(
                output_dir=scratch,
                per_device_train_batch_size=t.global_batch_size,
                per_device_eval_batch_size=t.global_batch_size if task == CAUSAL_LM else 128,
                num_train_epochs=t.epochs,
                learning_rate=o.lr,
                weight_decay=o.weight_decay,
                adam_beta1=o.betas[0],
                adam_beta2=o.betas[1],
                adam_epsilon=o.eps,
                lr_scheduler_type=SCHEDULES[o.schedule],
                warmup_steps=int(o.warmup_fraction * total),
                max_grad_norm=t.grad_clip,
                optim="adamw_torch_fused",
                seed=t.seed,
                eval_strategy="epoch",
                save_strategy="no",
                logging_strategy="no",
                report_to=[],
                disable_tqdm=True,
                dataloader_num_workers=0,
                use_cpu=not torch.cuda.is_available(),
            ),
            train_dataset=train,
            eval_dataset=test,
            compute_metrics=None if task == CAUSAL_LM else top1,
            callbacks=[Clock()],
        )
        trainer.train()
    key = "perplexity" if task == CAUSAL_LM else "top1"
    result = {
        "train_time_s": clock.elapsed,
        "samples_per_s": min(total * t.global_batch_size, t.epochs * len(train)) / clock.elapsed,
        "epochs": clock.epochs,
        f"final_{key}": clock.epochs[-1][key],
        "world_size": 1,
        "threads": args.threads,
        "wall_s": time.time() - start,
        "process_start_time": start,
        "first_step_time": clock.first,
    }
    for epoch in clock.epochs:
        print(
            f"epoch {epoch['epoch'] + 1}/{t.epochs}  {epoch['train_time_s']:.1f}s  {key} {epoch[key]:.2f}", flush=True
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


class Rows(torch.utils.data.Dataset):
    """A split's model columns as tensors in memory (token ids as int64), one dict a row, as the Trainer's
    default collator stacks them."""

    def __init__(self, split, columns: list[str]) -> None:
        whole = split[:]
        self.columns = {c: (whole[c] if whole[c].is_floating_point() else whole[c].long()) for c in columns}

    def __len__(self) -> int:
        return len(self.columns["labels"])

    def __getitem__(self, i: int) -> dict:
        return {c: v[i] for c, v in self.columns.items()}


class EpochClock:
    """The epochs' training time (from an epoch's start to its end, the evaluation after it left out) and each
    evaluation's metric, as the Trainer's callbacks report them."""

    def __init__(self) -> None:
        self.elapsed, self.epochs, self.first = 0.0, [], None
        self._t = self._eval = 0.0

    def begin(self) -> None:
        self._t = time.perf_counter()

    def first_step(self) -> None:
        self.first = self.first or time.time()

    def end(self) -> None:
        self.train_s = time.perf_counter() - self._t
        self.elapsed += self.train_s
        self._eval = time.perf_counter()

    def evaluated(self, metrics: dict, task: str) -> None:
        if task == CAUSAL_LM:
            loss = metrics["eval_loss"]
            shown = {"loss": loss, "perplexity": math.exp(min(loss, 700.0))}
        else:
            shown = {"top1": metrics["eval_top1"]}
        self.epochs.append(
            {
                "epoch": len(self.epochs),
                "train_time_s": self.train_s,
                "eval_time_s": time.perf_counter() - self._eval,
                "elapsed_train_s": self.elapsed,
                **shown,
            }
        )


if __name__ == "__main__":
    main()
