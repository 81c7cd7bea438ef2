"""transformers models as layered units: the supported families, read from a checkpoint's `config.json`.

The family is the checkpoint's `model_type`, never its name. Each family names its dropout fields and how its
task model splits into units (`encoders.split_encoder`, `deberta.split_deberta`, `modernbert.split_modernbert`,
`decoders.split_decoder`); the task model is the library's own `AutoModelFor...` class built from the
directory's configuration, its weights read per unit later (`ptrun.models.weights`). transformers is imported
inside the functions: it costs seconds per process.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from torch import nn

from ptrun.config import ConfigError, ModelConfig
from ptrun.config.model import DECODER_TASKS, DECODER_TYPES, ENCODER_TASKS, ENCODER_TYPES, HF_MODEL_TYPES
from ptrun.models.deberta import shared_rel_embeddings, split_deberta
from ptrun.models.decoders import split_decoder, tied_lm_head
from ptrun.models.encoders import split_encoder
from ptrun.models.layered import LayeredModel
from ptrun.models.modernbert import split_modernbert

AUTO_CLASSES = {
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "qa": "AutoModelForQuestionAnswering",
    "mlm": "AutoModelForMaskedLM",
    "causal_lm": "AutoModelForCausalLM",
}
"""The library's task model class of each task."""


@dataclass(frozen=True)
class Family:
    decoder: bool
    dropout: tuple[str, ...]
    """The config fields `model.dropout` sets."""
    attention_kernels: bool = True
    """Whether the library offers the family `model.attention`'s kernels (sdpa, eager). DeBERTa has one
    attention of its own and raises when asked for sdpa (the default), so it is not asked."""
    extra_tasks: tuple[str, ...] = ()
    """Tasks beyond its kind's (`ENCODER_TASKS` or `DECODER_TASKS`): BERT's masked-language-model head."""

    @property
    def tasks(self) -> tuple[str, ...]:
        return (DECODER_TASKS if self.decoder else ENCODER_TASKS) + self.extra_tasks


_BERT_LIKE = ("hidden_dropout_prob", "attention_probs_dropout_prob")
FAMILIES = {
    "bert": Family(False, _BERT_LIKE, extra_tasks=("mlm",)),
    "roberta": Family(False, _BERT_LIKE),
    "xlm-roberta": Family(False, _BERT_LIKE),
    "electra": Family(False, _BERT_LIKE),
    "distilbert": Family(False, ("dropout", "attention_dropout", "seq_classif_dropout", "qa_dropout")),
    "deberta-v2": Family(False, _BERT_LIKE + ("pooler_dropout",), attention_kernels=False),
    "modernbert": Family(False, ("embedding_dropout", "attention_dropout", "mlp_dropout", "classifier_dropout")),
    "gpt2": Family(True, ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
    "llama": Family(True, ("attention_dropout",)),
    "qwen2": Family(True, ("attention_dropout",)),
    "qwen3": Family(True, ("attention_dropout",)),
    "mistral": Family(True, ("attention_dropout",)),
}
assert tuple(FAMILIES) == HF_MODEL_TYPES and all(FAMILIES[t].decoder == (t in DECODER_TYPES) for t in FAMILIES)
assert set(ENCODER_TYPES) | set(DECODER_TYPES) == set(HF_MODEL_TYPES)


def model_type(path: str) -> str:
    """The `model_type` of the directory's config.json, checked to be a supported family."""
    try:
        found = json.loads((Path(path).expanduser() / "config.json").read_text()).get("model_type")
    except (OSError, ValueError) as e:
        raise ConfigError(f"model.pretrained={path!r}: cannot read config.json ({type(e).__name__})") from None
    if found not in FAMILIES:
        raise ConfigError(
            f"model.pretrained={path!r} is a {found!r} model, which ptrun cannot split into "
            f"units: supported are {', '.join(HF_MODEL_TYPES)}"
        )
    return found


def task_problem(kind: str, task: str) -> str | None:
    """Why family `kind` cannot do `task` (None when it can)."""
    allowed = FAMILIES[kind].tasks
    return None if task in allowed else f"a {kind} model does {', '.join(allowed)}"


def build_transformers(cfg: ModelConfig, config, kind: str, *, task_class: str | None = None) -> LayeredModel:
    """The task model of `config` (a transformers config of family `kind`), split into units."""
    import transformers  # inner import: optional library

    problem = task_problem(kind, cfg.task)
    if problem is not None:
        raise ConfigError(f"model.task={cfg.task!r} is not allowed: {problem}")
    cls = getattr(transformers, task_class or AUTO_CLASSES[cfg.task])
    model = cls.from_config(config)
    if FAMILIES[kind].decoder:
        units, tied = split_decoder(model, cfg.task), tied_lm_head(model, cfg.task)
        input_names: tuple[str, ...] = ("input_ids", "attention_mask")
    else:
        units, tied = _split_encoder(model, kind, cfg.task)
        uses_types = getattr(config, "type_vocab_size", 0) > 1  # RoBERTa / XLM-R have one type: none needed
        input_names = ("input_ids", "attention_mask") + (("token_type_ids",) if uses_types else ())
    return LayeredModel(
        model,
        family=kind,
        task=cfg.task,
        units=units,
        input_names=input_names,
        tied=tied,
        init=partial(init_hf_unit, model),
    )


def _split_encoder(model: nn.Module, kind: str, task: str) -> tuple[list[nn.Module], list[nn.Parameter]]:
    """An encoder's units and the parameters several of them use."""
    if kind == "deberta-v2":
        return split_deberta(model, task), shared_rel_embeddings(model)
    if kind == "modernbert":
        return split_modernbert(model, task), []
    return split_encoder(model, task), (_tied_decoder(model) if task == "mlm" else [])


def from_directory(cfg: ModelConfig, *, num_labels: int) -> LayeredModel:
    """The task model of the Hugging Face directory `cfg.pretrained`: its configuration with ptrun's task,
    labels, attention kernel and dropout; its weights are read per unit as units are filled."""
    from transformers import AutoConfig  # inner import: optional library

    path = str(Path(cfg.pretrained).expanduser())  # type: ignore[arg-type]
    kind = model_type(path)
    dropout = dict.fromkeys(FAMILIES[kind].dropout, cfg.dropout)
    labels = {} if cfg.task == "causal_lm" else {"num_labels": num_labels}
    kernel = {"attn_implementation": cfg.attention} if FAMILIES[kind].attention_kernels else {}
    config = AutoConfig.from_pretrained(path, **kernel, **labels, **dropout)
    if getattr(config, "is_decoder", False) and not FAMILIES[kind].decoder:
        raise ConfigError(
            f"model.pretrained={cfg.pretrained!r} is not allowed: a {kind} configured as a "
            f"decoder (is_decoder=true); ptrun trains {kind} as an encoder"
        )
    check_sizes(cfg, config)
    return build_transformers(cfg, config, kind)


def check_sizes(cfg: ModelConfig, config) -> None:
    """Size fields set in cfg must agree with the pretrained directory's (they cannot change its weights)."""
    have = {
        "depth": config.num_hidden_layers,
        "embed_dim": config.hidden_size,
        "num_heads": config.num_attention_heads,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None),
    }
    if getattr(config, "intermediate_size", None):
        have["mlp_ratio"] = config.intermediate_size / config.hidden_size
    for key, value in have.items():
        want = getattr(cfg, key)
        if want is not None and want != value:
            raise ConfigError(
                f"model.{key}={want!r} is not allowed: model.pretrained={cfg.pretrained!r} has {value!r}; leave it null"
            )


def _tied_decoder(model: nn.Module) -> list[nn.Parameter]:
    """The MLM decoder weight, checked to be the word-embedding Parameter itself when the config ties them.

    transformers ties them in `post_init` (also while the parameters are on the meta device); a copy instead of
    the same object would train two diverging matrices, so it is an error rather than silently untied.
    """
    decoder = model.cls.predictions.decoder.weight
    if not model.config.tie_word_embeddings:
        return []  # a checkpoint that trained them untied: two ordinary parameters, nothing to declare
    if decoder is not model.get_input_embeddings().weight:
        raise RuntimeError(
            f"{type(model).__name__}: tie_word_embeddings is set but the decoder weight is not "
            f"the word-embedding Parameter"
        )
    return [decoder]


def init_hf_unit(model: nn.Module, unit: nn.Module) -> None:
    """transformers' own initialisation (`_init_weights`: e.g. Linear and Embedding normal with the config's
    `initializer_range`, zero biases and padding row, norms ones and zeros), for one unit's modules.

    Children before their parents (`apply`), as the library's `initialize_weights` visits them: a rule for a
    block (GPT-2's scaled `c_proj` in its attention and MLP, ModernBERT's truncated normals) then has the last
    word over the generic rule for the Linear inside it."""
    unit.apply(model._init_weights)
    classifier = getattr(model, "classifier", None)
    if model.config.model_type == "modernbert" and any(p is classifier.weight for p in unit.parameters()):
        model._init_weights(model)  # ModernBERT draws its classifier in the rule for the task model itself
