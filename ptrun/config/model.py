"""`model.*`: which model, its sizes and its task."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ptrun.config.rules import check_choices, choice, either, require
from ptrun.errors import ConfigError

TASKS = ("classification", "regression", "qa", "causal_lm")
"""`model.task`."""


@dataclass(frozen=True)
class Family:
    """What ptrun knows of one model family, in one place: the library that builds it and whose format the
    run exports (`ptrun.models`), the model names that mean it when `model.family` is unset
    (`model_family`), and the modules a machine's workers import once before they start (`ptrun.launcher.worker_server`:
    seconds each)."""

    library: str
    """The library that builds the model: `timm` or `transformers`."""
    reads_images: bool
    """Whether the model reads images (a timm ViT: its sizes follow the image source) rather than tokens (a
    transformers model: its sizes and type come from its config.json)."""
    names: tuple[str, ...]
    """Prefixes of `model.name` that mean this family."""
    preload: tuple[str, ...]
    """The bulk of its library, imported by the workers' server. timm through ptrun.models.vit, which imports
    it with wandb hidden: `import timm` alone imports wandb when it is installed (seconds, and a temporary
    directory that a killed worker leaves behind)."""
    generic: bool = False
    """Whether it is the family of a model of the user's own (`model=transformers`: any Hugging Face model):
    its recipes are suggested first."""


FAMILY_SPECS: dict[str, Family] = {
    "vit": Family("timm", True, ("vit_", "deit"), ("ptrun.models.vit",)),
    "transformers": Family(
        "transformers",
        False,
        ("bert",),
        ("transformers.modeling_utils", "transformers.tokenization_utils_tokenizers"),
        generic=True,
    ),
}
"""Every model family, by the name `model_family` gives."""


def generic_family(family: str | None) -> bool:
    """Whether `model.family=family` names the family of a model of the user's own (`Family.generic`)."""
    return family in FAMILY_SPECS and FAMILY_SPECS[family].generic


FAMILY_ALIASES = {"bert": "transformers"}
"""`model.family` values that name a family of `FAMILY_SPECS` by another name (ptrun's BERT presets)."""
FAMILIES = (*FAMILY_SPECS, *FAMILY_ALIASES, None)
"""`model.family` (None: inferred from the name and `pretrained`)."""
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "deberta-v2", "modernbert")
"""Encoder `model_type`s (config.json) ptrun splits into units: classification, regression, qa."""
DECODER_TYPES = ("gpt2", "llama", "qwen2", "qwen3", "mistral")
"""Decoder `model_type`s ptrun splits into units: causal_lm, classification, regression."""
HF_MODEL_TYPES = ENCODER_TYPES + DECODER_TYPES
ENCODER_TASKS = ("classification", "regression", "qa")
"""The tasks of the encoder families (BERT presets also do `mlm`)."""
DECODER_TASKS = ("causal_lm", "classification", "regression")
"""The tasks of the decoder families."""
POOLED_TASKS = ("classification", "regression")
"""The tasks whose head reads one vector a sample (an encoder's: the first token, or a mean), not every token."""
ATTENTIONS = ("sdpa", "eager")
"""`model.attention`."""


@dataclass
class ModelConfig:
    name: str = "vit_tiny_patch16_224"
    """timm model name (any `vit_*` / `deit_*`), a BERT preset (`bert-tiny`, `bert-mini`, `bert-small`,
    `bert-medium`, `bert-base`, `bert-large`: random weights), or a label of your own when `pretrained` is a
    Hugging Face model (its architecture comes from its config.json, not from this name; a timm model's name
    there is refused, as is a text model on an image recipe: the refusal names the recipes that fit)."""
    family: str | None = choice(None, FAMILIES, wording=either)
    """`vit` (timm) or `transformers` (a Hugging Face model: a BERT preset, or `pretrained`'s `model_type`:
    bert, roberta, xlm-roberta, electra, distilbert, deberta-v2, modernbert, gpt2, llama, qwen2, qwen3, mistral);
    `bert` means `transformers`. None = inferred from `name` and `pretrained`."""
    task: str = choice("classification", TASKS)
    """`classification` (images, text), `regression` (one real-valued output: GLUE's STS-B, or `data.name=hf`
    with a numeric `data.label_column`; eval reports the mean squared error and the Pearson and Spearman
    correlations), `qa` (SQuAD-style
    span extraction, encoders) or `causal_lm` (next-token prediction over the real tokens, decoders; its eval
    metric is perplexity). Decoders classify from the last real token of each text. The models and losses also
    implement `mlm` (BERT masked language modelling, its decoder tied to the word embedding), which the pipeline
    tests use for tied weights across stages; no data source makes masked-LM batches, so `ptrun train` does
    not accept it."""
    pretrained: str | None = None
    """Pretrained weights: a .safetensors file, a torch checkpoint (loaded with weights_only=True), a Hugging
    Face model directory, or a Hugging Face hub id `org/name[@revision]` or, for the hub's models without an
    org, `name[@revision]` (`gpt2`, `bert-base-uncased`); a value that exists on disk is a path, and so is a
    missing one that starts with `.`, `/` or `~` or ends like a file (`.safetensors`, `.pt`, `.bin`). An id is looked up
    in the Hugging Face cache (HF_HOME, HF_HUB_CACHE) and, unless HF_HUB_OFFLINE=1, its config.json, safetensors weights
    and tokenizer files are fetched into it once, at the start on each machine; the workers read the local snapshot. A
    timm ViT's id is its timm repo, the name with its tag:
    `model.name=vit_base_patch16_224.augreg_in21k model.pretrained=timm/vit_base_patch16_224.augreg_in21k`
    (its model.safetensors). A task head whose class count differs is re-initialised."""
    num_classes: int | None = None
    """Classes of the task head; None = taken from the dataset."""
    img_size: int | None = None
    """ViT input resolution in pixels; None = the data's resolution."""
    patch_size: int | None = None
    """ViT patch size in pixels; None = the timm default for `name`."""
    in_chans: int | None = None
    """ViT input channels; None = the data's channel count."""
    embed_dim: int | None = None
    """Width (ViT embed_dim / BERT hidden_size); None = the default for `name`."""
    depth: int | None = None
    """Number of transformer blocks L (ViT depth / BERT num_hidden_layers); None = the default for `name`."""
    num_heads: int | None = None
    """Attention heads; None = the default for `name`."""
    mlp_ratio: float | None = None
    """MLP hidden size as a multiple of the width (BERT intermediate_size / hidden_size)."""
    vocab_size: int | None = None
    """BERT vocabulary size; None = the tokenizer's (or BERT's 30522)."""
    max_position_embeddings: int | None = None
    """BERT maximum sequence length the position table holds; None = 512."""
    dropout: float = 0.0
    """Dropout probability: ViT head dropout (timm drop_rate); BERT hidden and attention dropout."""
    drop_path: float = 0.0
    """Stochastic depth rate (ViT only)."""
    attention: str = choice("sdpa", ATTENTIONS, wording=either)
    """BERT's attention kernel: `sdpa` (torch's fused scaled-dot-product attention, what transformers picks by
    default: about 1.5x faster a step here) or `eager` (transformers' explicit softmax(QK^T + mask) V, bit for
    bit the library model's own forward whatever its mask). timm's ViT uses its own default (fused); DeBERTa
    (`deberta-v2`) has one attention of its own (disentangled), whatever this says."""


def check_model(cfg) -> None:
    m = cfg.model
    check_choices(m, "model")
    require(0.0 <= m.dropout < 1.0, "model.dropout", "0 <= p < 1", m.dropout)
    require(0.0 <= m.drop_path < 1.0, "model.drop_path", "0 <= p < 1", m.drop_path)
    for key in ("num_classes", "img_size", "patch_size", "in_chans", "embed_dim", "depth", "num_heads"):
        v = getattr(m, key)
        require(v is None or v >= 1, f"model.{key}", "a positive integer or null", v)


def is_hf_dir(path: str | None) -> bool:
    """A Hugging Face model directory (has config.json)."""
    return path is not None and (Path(path).expanduser() / "config.json").is_file()


def named_family(cfg: ModelConfig) -> str | None:
    """The family `model.family` names (an alias resolved), else the one `model.name` begins with
    (`Family.names`); None when neither says."""
    if cfg.family is not None:
        return FAMILY_ALIASES.get(cfg.family, cfg.family)
    return next((family for family, spec in FAMILY_SPECS.items() if cfg.name.startswith(spec.names)), None)


def family_spec(cfg: ModelConfig) -> Family | None:
    """The family of `model_family`, or None where nothing says which (a check that needs one refuses)."""
    if is_hf_dir(cfg.pretrained):
        return FAMILY_SPECS["transformers"]
    named = named_family(cfg)
    return FAMILY_SPECS.get(named) if named is not None else None


def model_family(cfg: ModelConfig) -> str:
    """`vit` (timm) or `transformers`: a Hugging Face directory as `pretrained` decides (its config.json names
    the architecture, whatever the model group said), then `cfg.family` (`bert` is `transformers`), then the
    name: `bert*` -> transformers; `vit_*` / `deit*` -> vit. Here, below the models, so the launcher knows
    which library its workers will import without importing any."""
    if is_hf_dir(cfg.pretrained):
        return "transformers"
    named = named_family(cfg)
    if named is not None:
        return named
    raise ConfigError(
        f"model.name={cfg.name!r} is not a known model: use a timm vit_*/deit_* name, "
        f"a BERT preset (bert-tiny ... bert-large), a Hugging Face directory as model.pretrained, "
        f"or set model.family"
    )
