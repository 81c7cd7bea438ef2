"""benchmarks.model_step: the model's own step, ptrun's units against the library's model, on the recipe's
first batch (digits' ViT, the embedded default's MiniLM and a small Llama, small inputs)."""

from __future__ import annotations

import json

import pytest

from benchmarks import model_step


@pytest.mark.parametrize(
    "recipe,overrides,batch",
    [
        ("digits_vit", ["model.embed_dim=32", "model.depth=2", "model.num_heads=2"], {"pixel_values": [16, 1, 8, 8]}),
        pytest.param(
            "bbc_news_bert",
            ["data.max_length=16"],
            {"input_ids": [16, 16], "attention_mask": [16, 16]},
            marks=pytest.mark.slow,
        ),  # loads MiniLM and tokenizes the corpus: ~10 s
        pytest.param(
            "causal_lm",
            ["data.max_length=16"],
            {"input_ids": [8, 16], "attention_mask": [8, 16]},
            marks=pytest.mark.slow,
        ),  # trains a tokenizer: ~10 s
    ],
)
def test_both_models_step_the_same_architecture_on_the_same_batch(tmp_path, recipe, overrides, batch):
    out = tmp_path / "step.json"
    if recipe == "causal_lm":
        from benchmarks import tiny_decoder

        tiny_decoder.main(
            [str(tmp_path / "lm"), "--documents", "20", "--hidden", "64", "--layers", "2", "--vocab", "300"]
        )
        overrides = [
            *overrides,
            f"model.pretrained={tmp_path / 'lm' / 'llama'}",
            f"data.path={tmp_path / 'lm' / 'news.jsonl'}",
        ]
    result = model_step.main(
        ["--recipe", recipe, "--steps", "1", "--rounds", "2", "--profile", "--out", str(out), *overrides]
    )
    assert json.loads(out.read_text()) == result
    size = next(iter(batch.values()))[0]
    assert {k: result["batch"][k] for k in batch} == batch and result["batch"]["labels"][0] == size
    params = result["params"]
    assert set(params) == {"library model", "ptrun units"} and len(set(params.values())) == 1  # the same model
    for label, ms in result["ms_per_step"].items():
        assert 0 < ms["min"] <= ms["median"] <= ms["max"], label
        ops = result["top_operators"][label]["top"]
        assert ops and all(op["ms_per_step"] >= 0 and op["calls_per_step"] > 0 for op in ops), label
        assert any("mm" in op["name"] for op in ops), label  # the matrix products are among the top
    # ptrun's units read values on the host no more often than the library's model (a GPU waits for each)
    reads = {label: p["host_reads_per_step"] for label, p in result["top_operators"].items()}
    assert reads["ptrun units"] <= reads["library model"], reads
    # the results page's caption and table (`benchmarks.results_page`)
    assert model_step.caption(result).startswith(f"{recipe} ({' '.join(overrides)}), one batch ({size} x ")
    text = model_step.table(result)
    library = result["ms_per_step"]["library model"]["median"]
    assert f"| library model | {library:.2f} (" in text and "| 1.00x |" in text
    assert f"| ptrun units: top operators ({reads['ptrun units']:.0f} host reads a step) | ms per step |" in text


def test_a_task_it_does_not_step_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        model_step.main(["--recipe", "bert_squad", "model.pretrained=null", "data.path=null"])
    assert e.value.code == 2 and "model.task=qa" in capsys.readouterr().err
