"""A text classifier that `ptrun train` exported, loaded and run the way a user without ptrun does: torch,
transformers and peft only (this file imports nothing of ptrun, and refuses to run where ptrun is importable).

    python load_export.py adapter RUN_DIR/model --base BASE_MODEL --eval EVAL.jsonl [--max-length 128]
    python load_export.py merged RUN_DIR/model --eval EVAL.jsonl [--max-length 128]

`adapter`: `peft.PeftModel.from_pretrained(base, RUN_DIR/model)` over the library's classifier built from the
base model (the head comes from the adapter's files). `merged`: `transformers.pipeline("text-classification",
model=RUN_DIR/model)`. EVAL.jsonl holds one {"text": ..., "label": int} a line. Prints one JSON line: the
predicted class of every text, the number right and the top-1 in percent.
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch


def read_eval(path: str) -> tuple[list[str], list[int]]:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    return [r["text"] for r in rows], [int(r["label"]) for r in rows]


def adapter_predictions(export: str, base: str, texts: list[str], max_length: int, batch: int) -> list[int]:
    from peft import PeftConfig, PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    # The number of classes is the saved head's width (the narrowest of the saved modules' weights: a pooler,
    # if saved too, is hidden x hidden); the library builds a fresh head of that size for peft to fill.
    head = PeftConfig.from_pretrained(export).modules_to_save or []
    saved = load_file(f"{export}/adapter_model.safetensors")
    widths = [t.shape[0] for n, t in saved.items() if any(h in n for h in head) and n.endswith("weight")]
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=min(widths))
    model = PeftModel.from_pretrained(model, export).eval()
    tok = AutoTokenizer.from_pretrained(export)
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            enc = tok(texts[i : i + batch], truncation=True, max_length=max_length, padding=True, return_tensors="pt")
            out += model(**enc).logits.argmax(-1).tolist()
    return out


def merged_predictions(export: str, texts: list[str], max_length: int, batch: int) -> list[int]:
    from transformers import pipeline

    classify = pipeline("text-classification", model=export, device="cpu")
    label_ids = classify.model.config.label2id
    found = classify(texts, batch_size=batch, truncation=True, max_length=max_length)
    return [label_ids[f["label"]] for f in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("adapter", "merged"))
    parser.add_argument("export", help="RUN_DIR/model")
    parser.add_argument("--base", help="the base model's directory or hub id (adapter only)")
    parser.add_argument("--eval", required=True, help="jsonl of {text, label}")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    if importlib.util.find_spec("ptrun") is not None:
        raise SystemExit("load_export.py: ptrun is importable here; run it where only torch, transformers and peft are")
    texts, labels = read_eval(args.eval)
    if args.kind == "adapter":
        if not args.base:
            raise SystemExit("load_export.py adapter: --base BASE_MODEL is needed")
        predicted = adapter_predictions(args.export, args.base, texts, args.max_length, args.batch)
    else:
        predicted = merged_predictions(args.export, texts, args.max_length, args.batch)
    right = sum(p == y for p, y in zip(predicted, labels, strict=True))
    print(json.dumps({"predicted": predicted, "right": right, "top1": 100.0 * right / len(labels)}))


if __name__ == "__main__":
    main()
