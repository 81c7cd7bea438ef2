"""ptrun.bench.model_step: the model's own step, ptrun's units against the library's model, on the recipe's
first batch (digits' ViT and the embedded default's MiniLM, small inputs)."""

from __future__ import annotations

import json

import pytest

from ptrun.bench import model_step


@pytest.mark.parametrize("recipe,overrides,batch", [
    ("digits_vit", ["model.embed_dim=32", "model.depth=2", "model.num_heads=2"], {"pixel_values": [16, 1, 8, 8]}),
    pytest.param("bbc_news_bert", ["data.max_length=16"], {"input_ids": [16, 16], "attention_mask": [16, 16]},
                 marks=pytest.mark.slow),  # loads MiniLM and tokenizes the corpus: ~10 s
])
def test_both_models_step_the_same_architecture_on_the_same_batch(tmp_path, recipe, overrides, batch):
    out = tmp_path / "step.json"
    result = model_step.main(["--recipe", recipe, "--steps", "1", "--rounds", "2", "--profile", "--out", str(out),
                              *overrides])
    assert json.loads(out.read_text()) == result
    assert {k: result["batch"][k] for k in batch} == batch and result["batch"]["labels"] == [16]
    params = result["params"]
    assert set(params) == {"library model", "ptrun units"} and len(set(params.values())) == 1  # the same model
    for label, ms in result["ms_per_step"].items():
        assert 0 < ms["min"] <= ms["median"] <= ms["max"], label
        ops = result["top_operators"][label]
        assert ops and all(op["ms_per_step"] >= 0 and op["calls_per_step"] > 0 for op in ops), label
        assert any("mm" in op["name"] for op in ops), label  # the matrix products are among the top
    # the results page's caption and table (`ptrun.bench.results_page`)
    assert model_step.caption(result).startswith(f"{recipe} ({' '.join(overrides)}), one batch (16 x ")
    text = model_step.table(result)
    library = result["ms_per_step"]["library model"]["median"]
    assert f"| library model | {library:.2f} (" in text and "| 1.00x |" in text
    assert "| ptrun units: top operators | ms per step | calls per step |" in text


def test_a_recipe_that_is_not_a_classifier_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        model_step.main(["--recipe", "causal_lm", "model.pretrained=/nowhere"])
    assert e.value.code == 2 and "model.task=causal_lm" in capsys.readouterr().err
