"""Tiny random configurations of every supported transformers family, built with the library's own config
classes (imported by name by the tests and by spawned pipeline workers), and the sizes of a full-size one."""

from __future__ import annotations

ENCODERS = ("bert", "roberta", "xlm-roberta", "electra", "distilbert", "deberta-v2", "modernbert")
DECODERS = ("gpt2", "llama", "qwen2", "qwen3", "mistral")
VARIANTS = {"deberta-v2-conv": "deberta-v2"}
"""Further tiny configurations of a family (name -> its model_type), for what its default one leaves out."""
VOCAB = 100

LLAMA_3_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
}
"""The sizes in Meta-Llama-3-8B's config.json: what pricing and planning a hub model read, without its weights."""


def tiny_config(kind: str, num_labels: int = 3):
    """A 2-layer, 32-wide model of `kind` (4 heads; decoders with grouped KV heads where they have them,
    Mistral with a sliding window shorter than the test sequences, GPT-2 with tied embeddings).

    `deberta-v2` is shaped as DeBERTa-v3 (relative attention in log buckets fewer than the test sequences'
    distances, the table normalised, keys shared, no absolute positions); `deberta-v2-conv` as DeBERTa-v2
    xlarge (the same plus the convolution after layer 0), with its own position projections (keys not shared)
    and token types. `modernbert`: layer 0 global, layer 1 local with a window shorter than the sequences,
    classifying from the mean over the real tokens (as ModernBERT-base)."""
    import transformers as T

    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=num_labels,
    )
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    deberta_v3 = dict(
        relative_attention=True,
        position_buckets=4,
        max_relative_positions=-1,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type="p2c|c2p",
        position_biased_input=False,
        type_vocab_size=0,
        pooler_dropout=0.0,
        initializer_range=0.06,
    )  # gradients above the tests' clip
    make = {
        "bert": lambda: T.BertConfig(**common, **no_dropout),
        "roberta": lambda: T.RobertaConfig(**common, **no_dropout, pad_token_id=1, type_vocab_size=1),
        "xlm-roberta": lambda: T.XLMRobertaConfig(**common, **no_dropout, pad_token_id=1, type_vocab_size=1),
        "electra": lambda: T.ElectraConfig(**common, **no_dropout, embedding_size=16),
        "distilbert": lambda: T.DistilBertConfig(
            vocab_size=VOCAB,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            seq_classif_dropout=0.0,
            num_labels=num_labels,
            initializer_range=0.06,
        ),  # gradients above the tests' clip
        "deberta-v2": lambda: T.DebertaV2Config(**common, **no_dropout, **deberta_v3),
        "deberta-v2-conv": lambda: T.DebertaV2Config(
            **common,
            **no_dropout,
            **deberta_v3 | dict(conv_kernel_size=3, conv_act="gelu", share_att_key=False, type_vocab_size=2),
        ),
        "modernbert": lambda: T.ModernBertConfig(
            **common,
            local_attention=4,
            classifier_pooling="mean",
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        ),
        "gpt2": lambda: T.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            num_labels=num_labels,
        ),
        "llama": lambda: T.LlamaConfig(**common, num_key_value_heads=2, pad_token_id=0),
        "qwen2": lambda: T.Qwen2Config(**common, num_key_value_heads=2, pad_token_id=0, tie_word_embeddings=True),
        "qwen3": lambda: T.Qwen3Config(**common, num_key_value_heads=2, head_dim=16, pad_token_id=0),
        "mistral": lambda: T.MistralConfig(**common, num_key_value_heads=2, sliding_window=4, pad_token_id=0),
    }
    return make[kind]()


def auto_class(task: str):
    import transformers as T

    return {
        "classification": T.AutoModelForSequenceClassification,
        "qa": T.AutoModelForQuestionAnswering,
        "causal_lm": T.AutoModelForCausalLM,
    }[task]


def library_logits(model, inputs: dict, task: str):
    """A transformers model's own forward on `inputs` (its keyword tensors), as the logits ptrun's units
    return: a QA head's start and end logits stacked last."""
    import torch

    out = model(**inputs)
    return torch.stack([out.start_logits, out.end_logits], -1) if task == "qa" else out.logits


def save_tiny_llama(path, vocab_size: int = VOCAB):
    """The tiny Llama causal LM (`tiny_config`, `vocab_size` tokens) with seeded random weights, as
    `save_pretrained` writes it; `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    config.vocab_size = vocab_size
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def save_tiny_bert(path, layers: int = 2):
    """A BERT of width 16 with a WordPiece tokenizer over 12 tokens, saved as transformers saves them (a text
    recipe can resolve it, files and all); `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "news", "sport", "film", "a", "b", "c"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    BertTokenizerFast(tokenizer_object=tok).save_pretrained(path)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    return path
