"""Per-unit costs of the Hugging Face families whose units are not BERT's, priced from their whole config.json:
the decoders (GPT-2, the Llama family: `decoder_costs`), DeBERTa-v2 / v3 (`deberta_costs`) and ModernBERT
(`modernbert_costs`), each function saying what it counts. The units, the fields and the FLOP conventions are
`ptrun.costs.units`'s."""

from __future__ import annotations

from typing import Any

from ptrun.costs.units import BERT_NAMES, FP32, ModelCosts, attention_flops, block_linears, head_linears, unit_names


def decoder_costs(
    *,
    seq_len: int,
    hidden: int,
    depth: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab_size: int,
    gated: bool = True,
    positions: int = 0,
    task: str = "causal_lm",
    num_labels: int = 2,
) -> ModelCosts:
    """Costs of a decoder as ptrun splits it (GPT-2, the Llama family): pre-norm halves, grouped KV heads,
    a gated MLP (three D x I matrices) or GPT-2's two, the padding mask (N fp32 values) travelling with
    the hidden state. The causal attention is counted in full (an upper bound: fused kernels skip about half
    of the scores). The causal-LM head is the vocabulary projection at every token; tied to the input
    embedding it is counted again, as the head's stage holds a replica."""
    t, d = seq_len, hidden
    mask = t * FP32
    projections = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q and o; k and v
    attn_p = projections + d
    mlp_p = (3 if gated else 2) * d * intermediate + d
    attn_f = 2.0 * (t * projections + 2 * t * t * heads * head_dim)
    mlp_f = 2.0 * t * (3 if gated else 2) * d * intermediate
    act = t * d * FP32 + mask
    blocks_p = [attn_p, mlp_p] * depth
    blocks_f = [attn_f, mlp_f] * depth
    embed_p = vocab_size * d + positions * d
    if task == "causal_lm":
        head = (d + vocab_size * d, 2.0 * t * d * vocab_size, t * vocab_size * FP32)
    else:
        head = (d + d * num_labels, 2.0 * d * num_labels, num_labels * FP32)
    q, kv, i = heads * head_dim, kv_heads * head_dim, intermediate
    if gated:
        attn = (("q_proj", d, q), ("k_proj", d, kv), ("v_proj", d, kv), ("o_proj", q, d))
        mlp = (("gate_proj", d, i), ("up_proj", d, i), ("down_proj", i, d))
    else:  # GPT-2's fused c_attn
        attn, mlp = (("c_attn", d, q + 2 * kv), ("c_proj", q, d)), (("c_fc", d, i), ("c_proj", i, d))
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, [embed_p, *blocks_p, head[0]])),
        tuple(map(float, [act, *[act] * (2 * depth), head[2]])),
        tuple([0.0, *blocks_f, head[1]]),
        linears=block_linears(depth, attn, mlp, head_linears(task, d, num_labels, classifier="score")),
    )


def deberta_costs(hf: dict[str, Any], *, seq_len: int, task: str = "classification", num_labels: int = 2) -> ModelCosts:
    """Costs of a DeBERTa-v2 / v3 (`hf`: its config.json, with the library's defaults for absent keys) as
    ptrun splits it (`ptrun.models.deberta`): the padding mask (N fp32 values) travels with the hidden state;
    the relative-position table (and its LayerNorm) is counted on every attention half, each holding a
    replica; block 0's attention half also passes its input on when the model has the convolution after
    layer 0, which its MLP half holds. Attention FLOPs add the content-to-position and position-to-content
    scores (N x 2S per head, S the relative span)."""
    t, d, i, v = seq_len, hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    e = hf.get("embedding_size") or d
    heads = hf["num_attention_heads"]
    a = heads * hf["attention_head_size"] if hf.get("attention_head_size") else d
    positions = hf.get("max_position_embeddings") or 512
    kinds = hf.get("pos_att_type") or []
    kinds = [k.strip() for k in kinds.lower().split("|")] if isinstance(kinds, str) else list(kinds)
    relative = bool(hf.get("relative_attention", False))
    max_relative = hf.get("max_relative_positions", -1)
    max_relative = positions if max_relative < 1 else max_relative
    buckets = hf.get("position_buckets", -1)
    span = buckets if buckets > 0 else max_relative
    normed = "layer_norm" in [x.strip() for x in str(hf.get("norm_rel_ebd", "none")).lower().split("|")]
    kernel, groups = hf.get("conv_kernel_size", 0) or 0, hf.get("conv_groups", 1) or 1
    mask = t * FP32
    embed_p = (
        v * e
        + (positions * e if hf.get("position_biased_input", True) else 0)
        + (hf.get("type_vocab_size", 0) or 0) * e
        + (e * d if e != d else 0)
        + 2 * d
    )
    attn_p = 3 * (d * a + a) + d * d + d + 2 * d
    attn_f = 2.0 * (3 * t * d * a + t * a * d + 2 * t * t * a)
    if relative:
        if not hf.get("share_att_key", False):
            attn_p += sum(d * a + a for k in ("c2p", "p2c") if k in kinds)
        attn_p += 2 * span * d + (2 * d if normed else 0)  # the shared table: a replica on every attention half
        attn_f += 2.0 * t * 2 * span * a * sum(k in kinds for k in ("c2p", "p2c"))
    mlp_p = 2 * d * i + i + d + 2 * d
    mlp_f = 2.0 * 2 * t * d * i
    conv_p = d * (d // groups) * kernel + d + 2 * d if kernel > 0 else 0
    act = t * d * FP32 + mask
    params = [embed_p] + [attn_p, mlp_p] * hf["num_hidden_layers"]
    flops = [2.0 * t * e * d if e != d else 0.0] + [attn_f, mlp_f] * hf["num_hidden_layers"]
    acts = [act] * (1 + 2 * hf["num_hidden_layers"])
    if conv_p:
        params[2] += conv_p
        flops[2] += 2.0 * t * d * (d // groups) * kernel
        acts[1] += t * d * FP32  # layer 0's input, for the convolution
    if task == "qa":
        head = (2 * d + 2, 2.0 * t * d * 2, t * 2 * FP32)
    else:  # ContextPooler (first token, dense) and the classifier
        head = (d * d + d + d * num_labels + num_labels, 2.0 * (d * d + d * num_labels), num_labels * FP32)
    q, k, v, o, up, down = ("query_proj", "key_proj", "value_proj", *BERT_NAMES[3:])
    attn, mlp = ((q, d, a), (k, d, a), (v, d, a), (o, d, d)), ((up, d, i), (down, i, d))
    return ModelCosts(
        unit_names(hf["num_hidden_layers"]),
        tuple(map(float, params + [head[0]])),
        tuple(map(float, acts + [head[2]])),
        tuple(flops + [head[1]]),
        linears=block_linears(hf["num_hidden_layers"], attn, mlp, head_linears(task, d, num_labels)),
    )


def modernbert_costs(
    hf: dict[str, Any], *, seq_len: int, task: str = "classification", num_labels: int = 2
) -> ModelCosts:
    """Costs of a ModernBERT (`hf`: its config.json, the library's defaults for absent keys) as ptrun splits it
    (`ptrun.models.modernbert`): pre-norm halves (layer 0's attention norm is an identity), fused QKV, a gated
    MLP (Wi: D x 2I, Wo: I x D), the padding mask travelling with the hidden state. Local layers are counted
    as global ones: the padded path computes every score and masks those outside the window. Head: final norm,
    the prediction head (dense, norm) and the classifier, on the pooled token or (qa) every token. Pooling the
    first token, the last layer keeps that row after its attention: its MLP runs one token."""
    t, d, i, v = seq_len, hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    norm = d * (2 if hf.get("norm_bias", False) else 1)
    attn_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    attn_p = 4 * d * d + (4 * d if attn_bias else 0)
    mlp_p = norm + 3 * d * i + (2 * i + d if mlp_bias else 0)
    attn_f, mlp_f = attention_flops(t, d), 2.0 * t * 3 * d * i
    depth = hf["num_hidden_layers"]
    params = [v * d + norm] + [p for layer in range(depth) for p in (attn_p + (norm if layer else 0), mlp_p)]
    labels = 2 if task == "qa" else num_labels
    head_p = 2 * norm + d * d + (d if hf.get("classifier_bias", False) else 0) + d * labels + labels
    pooled = t if task == "qa" else 1
    head = (head_p, 2.0 * pooled * (d * d + d * labels), pooled * labels * FP32)
    act = t * d * FP32 + t * FP32
    acts, flops = [act] * (1 + 2 * depth), [0.0] + [attn_f, mlp_f] * depth
    first_token = task != "qa" and hf.get("classifier_pooling", "cls") == "cls"
    if first_token:  # ptrun.models.modernbert
        acts[-2:] = [d * FP32 + t * FP32] * 2
        flops[-1] = 2.0 * 3 * d * i
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, params + [head[0]])),
        tuple(map(float, acts + [head[2]])),
        tuple(flops + [head[1]]),
        sequence_units=2 * depth - 1 if first_token else None,
        linears=block_linears(
            depth, (("Wqkv", d, 3 * d), ("Wo", d, d)), (("Wi", d, 2 * i), ("Wo", i, d)), head_linears(task, d, labels)
        ),
    )


ENCODER_COSTS = {"deberta-v2": deberta_costs, "modernbert": modernbert_costs}
"""Encoder families whose units are not BERT's (`bert_costs`), by `model_type`: priced from their whole
config.json."""
