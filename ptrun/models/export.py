"""The trained model in its library's own format, usable without ptrun (written at the end of a run to
`RUN_DIR/model/`).

- transformers models: `save_pretrained` (config.json + model.safetensors) plus the tokenizer the run used, so
  `transformers.AutoModelForSequenceClassification.from_pretrained(RUN_DIR/model)` (or ...ForQuestionAnswering,
  ...ForCausalLM, ...ForMaskedLM) and `AutoTokenizer.from_pretrained(RUN_DIR/model)` load it; a classifier's
  `id2label` holds the data's class names.
- ViT: timm's state dict as `model.safetensors` plus `config.json` holding the `timm.create_model` arguments:
  `timm.create_model(**cfg, pretrained=True, pretrained_cfg_overlay={"file": "RUN_DIR/model/model.safetensors"})`
  with `cfg = json.load(open("RUN_DIR/model/config.json"))`.
- With adapters (`adapter=lora`): peft's own files (adapter_config.json + adapter_model.safetensors, the task
  head among them), `peft.PeftModel.from_pretrained(base_model, RUN_DIR/model)`; with `adapter.merge=true`
  the library's model as above, the adapters merged into its weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from ptrun.models.adapters import merged, save_adapter
from ptrun.models.layered import LayeredModel


def save_quietly(model, out: Path) -> None:
    """`model.save_pretrained(out)` without the library's per-shard progress bar: the run's own end line says
    where the model went, and a bar for one file is noise in the run's output."""
    from transformers.utils import logging as hf_logging  # inner import: optional library

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def export_model(
    layered: LayeredModel,
    out_dir: str | Path,
    tokenizer_dir: str | None = None,
    class_names: list[str] | None = None,
    *,
    merge: bool = False,
    base: str | None = None,
) -> Path:
    """Write `layered.model` (its host copy must be current) into `out_dir`; returns the directory. A model
    with adapters writes them in peft's format (`merge` false) or its library's model with the adapters merged
    into the base weights (`merge` true)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = layered.model
    if layered.adapters:
        if not merge:
            save_adapter(layered, out, base=base)
            if tokenizer_dir is not None:
                from transformers import AutoTokenizer  # inner import: optional library

                AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
            return out
        model = merged(layered)
    if hasattr(model, "save_pretrained"):  # a transformers model writes its own format
        config = model.config
        if class_names and layered.task == "classification" and len(class_names) == config.num_labels:
            config.id2label = dict(enumerate(class_names))
            config.label2id = {name: i for i, name in enumerate(class_names)}
        save_quietly(model, out)
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer  # inner import: optional library

            AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
        return out
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        str(out / "model.safetensors"),
    )
    (out / "config.json").write_text(json.dumps(layered.library_config, indent=1) + "\n")
    return out
