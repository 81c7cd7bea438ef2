"""Every schedule, K in {1, 2, 4}, DP in {1, 2}, ViT and BERT (classification and MLM with tied weights), and a
2-stage pipeline of RoBERTa, DistilBERT, Qwen3, DeBERTa-v3, DeBERTa-v2 with its convolution, ModernBERT
(classification), GPT-2 and Llama (causal LM), on real worker processes (gloo, elastic_launch on localhost):
the loss, the pre-clip global gradient norm and the parameters after two clipped AdamW steps equal a plain
single-process reference on the same global batches (rtol 1e-5, atol 4e-5). All cases of one world size run in a single
launch (start-up is ~7 s)."""

from __future__ import annotations

import pipeline_cases as pc
import pytest
import torch
from helpers.process_group import load_ranks
from pipeline_cases import Case

from ptrun.numerics.optim import build_optimizer

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # the full schedule matrix, two launches: ~60 s

SCHEDULES = [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2)]
CASES = {
    2: [Case(kind, s, pp, 2 // pp, v) for kind in ("vit", "bert") for s, v in SCHEDULES for pp in (1, 2)]
    + [
        Case("bert_mlm", "1F1B", 2, 1),
        Case("bert_mlm", "GPipe", 1, 2),
        Case("vit", "1F1B", 2, 1, recompute="stage"),
        Case("bert", "GPipe", 2, 1, recompute="every:1"),
        Case("vit", "LoopedBFS", 2, 1, 2),
        Case("vit", "InterleavedZeroBubble", 2, 1, 2),
        Case("bert", "DualPipeV", 2, 1, 2),
    ]
    # every transformers family the tests build, as a 2-stage pipeline (GPT-2's tied LM head across stages,
    # DeBERTa's shared relative-position table); 4 stages of DeBERTa with the convolution cut block 0 in two,
    # so layer 0's input crosses to the stage of the convolution
    + [Case(kind, "1F1B", 2, 1) for kind in pc.FAMILIES]
    + [
        Case("llama_lm", "GPipe", 1, 2),
        Case("llama_lm", "ZBVZeroBubble", 2, 1, 2),
        Case("deberta-v2-conv", "Interleaved1F1B", 2, 1, 2),
    ]
    # a pass's masks and rotary tables are its own (`ptrun.models.per_pass`): recomputed attention halves under
    # 1F1B (a micro-batch's backward after the next one's forward), and one micro-batch a step, which stage 1
    # receives into the same buffer every step (step 1 pads otherwise than step 0)
    + [
        Case("llama_lm", "1F1B", 2, 1, recompute="every:1"),
        Case("modernbert", "1F1B", 2, 1, recompute="every:1"),
        Case("llama_lm", "GPipe", 2, 1, microbatches=1),
    ],
    4: [Case(kind, s, pp, 4 // pp, v) for kind in ("vit", "bert") for s, v in SCHEDULES for pp in (2, 4)]
    + [
        Case("bert_mlm", "GPipe", 2, 2),
        Case("bert_mlm", "1F1B", 4, 1),
        Case("bert_mlm", "ZBVZeroBubble", 2, 2, 2),
        Case("vit", "GPipe", 4, 1, recompute="every:2"),
    ],
}
ALL = [(world, case) for world, cases in CASES.items() for case in cases]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_cases")
    for world, cases in CASES.items():
        pc.launch(cases, world, out)
    return out


def reference(kind: str) -> tuple[list[float], list[float], dict[str, torch.Tensor]]:
    """Two textbook steps in one process: the library model on the whole global batch, the mean loss over
    real samples (MLM: over predicted tokens of real samples), torch's clip_grad_norm_, AdamW."""
    layered = pc.model(kind)
    net = layered.model
    net.train()
    optimizer = build_optimizer(list(net.named_parameters()), pc.OPTIM)
    losses, norms = [], []
    for step in range(pc.STEPS):
        loss = pc.textbook_loss(net, kind, pc.batch(kind, step))
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), pc.CLIP).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, norms, {n: p.detach() for n, p in net.named_parameters()}


_references: dict = {}


def cached_reference(kind: str):
    if kind not in _references:
        _references[kind] = reference(kind)
    return _references[kind]


@pytest.mark.parametrize("world,case", ALL, ids=[f"w{w}-{c.name}" for w, c in ALL])
def test_pipeline_equals_single_process(results, world, case):
    want_losses, want_norms, want_params = cached_reference(case.kind)
    ranks = load_ranks(results, case.name, world)
    for held in ranks:
        assert held["losses"] == pytest.approx(want_losses, rel=1e-5, abs=4e-5)
        assert held["norms"] == pytest.approx(want_norms, rel=1e-5, abs=4e-5)
    assert all(n > pc.CLIP for n in want_norms), "the clip must be active for this test to mean something"
    covered = set()
    for held in ranks:
        for name, value in held["params"].items():
            torch.testing.assert_close(
                value, want_params[name], rtol=1e-5, atol=4e-5, msg=lambda m, name=name: f"{name}: {m}"
            )
            covered.add(name)
    assert covered == set(want_params), "every parameter is held by some rank"


TIED = {
    "bert_mlm": "bert.embeddings.word_embeddings.weight",
    "gpt2_lm": "transformer.wte.weight",
    "deberta-v2": "deberta.encoder.rel_embeddings.weight",
    "deberta-v2-conv": "deberta.encoder.rel_embeddings.weight",
}


@pytest.mark.parametrize(
    "world,case", [(w, c) for w, c in ALL if c.kind in TIED], ids=[f"w{w}-{c.name}" for w, c in ALL if c.kind in TIED]
)
def test_tied_weight_is_identical_on_every_holder(results, world, case):
    name = TIED[case.kind]
    copies = [held["params"].get(name) for held in load_ranks(results, case.name, world)]
    copies = [c for c in copies if c is not None]
    assert len(copies) >= 2 or case.pp == 1
    first = pc.model(case.kind).model.get_parameter(name).detach()
    for c in copies:
        assert torch.equal(c, copies[0])
        assert not torch.equal(c, first), "the tied weight trained"
