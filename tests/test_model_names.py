"""A model name meets its recipe: `model.name` or `model.pretrained` naming a family the recipe's data or task
cannot use is refused before any worker starts, in one line naming the recipes that fit (read from
`recipes/`); a bare hub id (`bert-base-uncased`, `gpt2`) is a hub id, not a missing path. The refusals go
through `ptrun.cli.main` (the `cli` fixture, which fails a test that gets as far as starting workers); the
accepted cases through `ptrun.compose.resolve`, the same start short of the launch. Tiny models are built from
transformers' config classes; the hub cache is a temporary HF_HOME, offline."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_one_error_line
from hf_families import tiny_config
from test_hub import MAIN, TEXT, cache_repo

from ptrun.compose import resolve
from ptrun.config.cross import is_timm_image_name
from ptrun.config.hub import parse_hub_id
from ptrun.config.recipe_catalogue import recipe_catalogue

IMAGE_RECIPES = "use recipe=digits_vit (or another that fits: vit_cifar10, vit_cifar100, vit_imagenet)"
ENCODER_RECIPES = (
    "use recipe=text_classification (or another that fits: bbc_news_bert, bbc_news_lora, bert_glue, bert_squad, "
    "bert_sst2)"
)


def save_tiny(kind: str, path: Path) -> Path:
    """A 2-layer model of transformers family `kind` saved in `path` (config.json and safetensors, no
    tokenizer: these starts end before one is read)."""
    import transformers as T

    T.AutoModelForSequenceClassification.from_config(tiny_config(kind)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {kind: save_tiny(kind, root / kind) for kind in ("bert", "roberta", "gpt2")}


def refusal(cli, tmp_path: Path, *overrides: str) -> str:
    """The one error line of `ptrun train OVERRIDES` (exit code 2, no traceback, no worker), less its prefix."""
    out = cli("train", *overrides, f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    line = assert_one_error_line(out)
    assert not (tmp_path / "run").exists()
    return line.removeprefix("ptrun: error: ")


# ---- the refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, why",
    [
        (
            "deit_tiny_distilled_patch16_224",
            ", with a timm ViT ptrun splits (not deit_tiny_distilled_patch16_224: a distilled DeiT (two heads))",
        ),
        (
            "resnet50",
            ", with a timm ViT ptrun splits (not resnet50: timm builds it in timm.models.resnet, not as a "
            "VisionTransformer)",
        ),
        ("vit_small_patch16_224", ""),
    ],
)
def test_a_timm_name_on_the_default_text_recipe(cli, tmp_path, name, why):
    """The default recipe's packaged MiniLM would train under the image model's name: refused instead."""
    assert refusal(cli, tmp_path, "recipe=bbc_news_bert", f"model.name={name}") == (
        f"model.name={name!r} is a timm image model; recipe bbc_news_bert trains text (data.name=bbc_news) and "
        f"model.pretrained is a bert text model, which model.name only labels: {IMAGE_RECIPES}{why}"
    )


def test_a_timm_name_on_a_text_source_without_pretrained_weights(cli, tmp_path):
    line = refusal(
        cli,
        tmp_path,
        "recipe=bert_sst2",
        "model.name=vit_base_patch16_224",
        "model.pretrained=null",
        f"data.path={tmp_path}",
        f"data.tokenizer={tmp_path}",
    )
    assert line == (
        "model.name='vit_base_patch16_224' is a timm image model; recipe bert_sst2 trains text "
        f"(data.name=glue): {IMAGE_RECIPES}"
    )


def test_an_encoder_on_causal_lm(cli, tmp_path, models):
    """Refused before the data.path the recipe leaves to set: the model is the bigger mistake."""
    line = refusal(cli, tmp_path, "recipe=causal_lm", f"model.pretrained={models['bert']}")
    assert line == (
        f"model.task='causal_lm' is not allowed: one of classification, regression, qa for a bert "
        f"model (model.pretrained='{models['bert']}', an encoder; causal_lm takes a decoder: gpt2, "
        f"llama, qwen2, qwen3, mistral); for this model {ENCODER_RECIPES}"
    )


def test_a_decoder_on_question_answering(cli, tmp_path, models):
    line = refusal(cli, tmp_path, "recipe=bert_squad", f"model.pretrained={models['gpt2']}", f"data.path={tmp_path}")
    assert line.startswith(
        "model.task='qa' is not allowed: one of causal_lm, classification, regression for a "
        f"gpt2 model (model.pretrained='{models['gpt2']}', a decoder; qa takes an encoder: bert,"
    )
    assert line.endswith(
        "for this model use recipe=causal_lm (or another that fits: text_classification, "
        "bbc_news_bert, bbc_news_lora, bert_glue, bert_sst2)"
    )


@pytest.mark.parametrize("weights", ["", "/model.safetensors"])
def test_a_text_model_on_an_image_recipe(cli, tmp_path, models, weights):
    """A directory, or a weights file beside its config.json: before, the answer was about model.depth."""
    pretrained = f"{models['roberta']}{weights}"
    assert refusal(cli, tmp_path, "recipe=digits_vit", f"model.pretrained={pretrained}") == (
        f"model.pretrained={pretrained!r} is a roberta text model; recipe digits_vit trains images "
        f"(data.name=digits): {ENCODER_RECIPES}"
    )


def test_a_cached_bare_hub_id_of_a_text_model_on_an_image_recipe(cli, hub, tmp_path, models):
    """Its config.json says what it is: refused by the id typed, before a ViT's weights would be fetched."""
    cache_repo(hub, "roberta-base", models["roberta"], MAIN)
    assert refusal(cli, tmp_path, "recipe=digits_vit", "model.pretrained=roberta-base") == (
        f"model.pretrained='roberta-base' is a roberta text model; recipe digits_vit trains images "
        f"(data.name=digits): {ENCODER_RECIPES}"
    )


def test_a_bare_hub_id_missing_offline_says_how_to_fetch_it(cli, hub, tmp_path):
    line = refusal(
        cli,
        tmp_path,
        "recipe=text_classification",
        "model.pretrained=bert-base-uncased",
        f"data.path={tmp_path}/news.csv",
    )
    assert line == (
        f"model.pretrained='bert-base-uncased': no such file or directory, and not in the Hugging "
        f"Face cache ({hub}) and HF_HUB_OFFLINE=1; fetch it on a machine with access: "
        f"hf download bert-base-uncased"
    )


# ---- what is still accepted --------------------------------------------------------------------------------


def test_a_label_names_a_text_model_of_your_own(tiny_bert):
    cfg = resolve([*TEXT, f"model.pretrained={tiny_bert}", "model.name=my-news-model"]).cfg
    assert (cfg.model.name, cfg.model.pretrained) == ("my-news-model", str(tiny_bert))


@pytest.mark.parametrize("name", ["vit_tiny_patch16_224", "vit_small_patch16_224", "deit_tiny_patch16_224"])
def test_a_vit_name_on_the_image_recipe(name):
    assert resolve(["recipe=digits_vit", f"model.name={name}"]).cfg.model.name == name


def test_a_decoder_on_text_classification(models, tiny_bert, tmp_path):
    data = tmp_path / "news.csv"
    data.write_text("text,topic\nthe news,a\nthe film,b\n")
    cfg = resolve(
        [
            "recipe=text_classification",
            f"model.pretrained={models['gpt2']}",
            f"data.path={data}",
            f"data.tokenizer={tiny_bert}",
        ]
    ).cfg
    assert cfg.model.pretrained == str(models["gpt2"])


def test_a_cached_bare_hub_id_resolves(hub, tiny_bert, capsys):
    snapshot = cache_repo(hub, "bert-base-uncased", tiny_bert, MAIN)
    cfg = resolve([*TEXT, "model.pretrained=bert-base-uncased"]).cfg
    assert cfg.model.pretrained == str(snapshot)
    assert f"model.pretrained=bert-base-uncased -> {snapshot}" in capsys.readouterr().err


# ---- the pieces --------------------------------------------------------------------------------------------


def test_bare_names_are_hub_ids_and_paths_stay_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my-model").mkdir()
    for value in ("gpt2", "bert-base-uncased", "distilbert-base-uncased", "Qwen2.5-0.5B", "roberta-base@v1"):
        assert parse_hub_id(value) is not None, value
    assert parse_hub_id("roberta-base@v1").revision == "v1"
    for value in ("my-model", "weights.safetensors", "model.pt", "ckpt.bin", "./x", "../x/y", "~/x", ".x", "/x"):
        assert parse_hub_id(value) is None, value


def test_timm_image_names_are_known_without_importing_timm():
    import sys

    timm_loaded = "timm" in sys.modules
    assert all(is_timm_image_name(n) for n in ("resnet50", "convnext_tiny.fb_in1k", "vit_anything", "deit_x"))
    assert not any(is_timm_image_name(n) for n in ("bert-base", "transformers", "my-news-model", "llama", "gpt2"))
    assert ("timm" in sys.modules) == timm_loaded


def test_the_catalogue_reads_every_recipe():
    recipes = {r.name: r for r in recipe_catalogue()}
    assert set(recipes) == {p.stem for p in (Path(__file__).parents[1] / "recipes").glob("*.yaml")}
    assert {n for n, r in recipes.items() if r.inputs == "images"} == {
        "digits_vit",
        "vit_cifar10",
        "vit_cifar100",
        "vit_imagenet",
    }
    assert (recipes["causal_lm"].task, recipes["bert_squad"].task, recipes["bert_glue"].data) == (
        "causal_lm",
        "qa",
        "glue",
    )
