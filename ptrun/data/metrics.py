"""Evaluation metrics of the real workloads, computed with torchmetrics: GLUE per task and SQuAD EM / F1.

Everything is reported in percent (like `top1` and the official SQuAD script), under the names of the
Hugging Face `glue` / `squad` metrics. `glue_metrics` adds `score`, the task's GLUE score (the mean of its
metrics, as on the GLUE leaderboard), so one number can rank checkpoints for every task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torchmetrics.functional.classification import binary_f1_score, binary_matthews_corrcoef, multiclass_accuracy
from torchmetrics.functional.regression import pearson_corrcoef, spearman_corrcoef
from torchmetrics.functional.text import squad

GLUE_METRICS = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "qqp": ("f1", "accuracy"),
    "stsb": ("pearson", "spearmanr"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}
"""Task -> the metrics GLUE reports for it (F1 of MRPC and QQP is of the positive class, 1)."""


def glue_metrics(task: str, preds, labels) -> dict[str, float]:
    """The task's GLUE metrics in percent, plus `score` (their mean).

    `preds` are class indices [N] or logits [N, C] (argmax taken); for `stsb`, predicted scores [N] (or
    [N, 1]). `labels` are class indices, or the gold similarity scores for `stsb`.
    """
    if task not in GLUE_METRICS:
        raise ValueError(f"unknown GLUE task {task!r}: one of {', '.join(GLUE_METRICS)}")
    preds, labels = (torch.as_tensor(v).detach().cpu() for v in (preds, labels))  # lists, arrays or tensors
    if task == "stsb":
        result = regression_metrics(preds, labels)
    else:
        if preds.ndim == 2:
            preds = preds.argmax(dim=-1)
        preds, labels = preds.long(), labels.long()
        if preds.shape != labels.shape:
            raise ValueError(f"preds {tuple(preds.shape)} and labels {tuple(labels.shape)} differ in shape")
        wanted = GLUE_METRICS[task]
        result = {}
        if "accuracy" in wanted:
            classes = max(2, int(torch.cat([preds, labels]).max()) + 1)
            result["accuracy"] = multiclass_accuracy(preds, labels, num_classes=classes, average="micro")
        if "f1" in wanted:
            result["f1"] = binary_f1_score(preds, labels)
        if "matthews_correlation" in wanted:
            result["matthews_correlation"] = binary_matthews_corrcoef(preds, labels)
        result = {k: 100.0 * float(v) for k, v in result.items()}
    out = {k: result[k] for k in GLUE_METRICS[task]}
    out["score"] = float(np.mean(list(out.values())))
    return out


def regression_metrics(preds, targets) -> dict[str, float]:
    """The Pearson and Spearman correlations of predicted values [N] (or [N, 1]) with their targets, in
    percent: GLUE's STS-B metrics, and those of any `model.task=regression` run."""
    x, y = (torch.as_tensor(v).detach().cpu().reshape(-1).double() for v in (preds, targets))
    return {"pearson": 100.0 * float(pearson_corrcoef(x, y)), "spearmanr": 100.0 * float(spearman_corrcoef(x, y))}


def squad_metrics(
    predictions: Sequence[Mapping] | Mapping[str, str], references: Sequence[Mapping]
) -> dict[str, float]:
    """SQuAD v1.1 exact match and F1 in percent, each the max over an example's gold answers.

    torchmetrics' `squad` is the official evaluate-v1.1.py: answers are lower-cased, stripped of
    punctuation and of the articles a/an/the, and whitespace-normalised before comparing; F1 is over the
    remaining tokens. `predictions`: `[{"id", "prediction_text"}]` (what `postprocess_qa` returns) or a
    dict id -> text; `references`: `[{"id", "answers": {"text": [...]}}]` (`QAEvalData.references()`).
    A reference without a prediction scores 0 (torchmetrics warns).
    """
    if isinstance(predictions, Mapping):
        predictions = [{"id": i, "prediction_text": t} for i, t in predictions.items()]
    result = squad(list(predictions), list(references))
    return {"exact_match": float(result["exact_match"]), "f1": float(result["f1"])}
