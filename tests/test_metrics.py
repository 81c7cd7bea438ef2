"""GLUE and SQuAD metrics against hand-computed values and scikit-learn / scipy references."""

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from ptrun.data.metrics import GLUE_METRICS, glue_metrics, squad_metrics


def ref(qid: str, *answers: str) -> dict:
    return {"id": qid, "answers": {"text": list(answers), "answer_start": [0] * len(answers)}}


# ---- SQuAD ----


@pytest.mark.parametrize(
    "prediction, answers, em, f1",
    [
        ("Paris", ["Paris"], 1, 1),
        ("The Eiffel Tower!", ["eiffel   tower"], 1, 1),  # case, article, punctuation, whitespace
        ("an apple, a pear", ["apple pear"], 1, 1),  # a / an inside the answer too
        ("theory", ["the ory"], 0, 0),  # `the` is removed only as a whole word
        ("Paris France", ["Paris"], 0, 2 / 3),  # precision 1/2, recall 1: F1 = 2 * 0.5 / 1.5
        ("in 1990", ["1990", "in the year 1990"], 0, 0.8),  # max over golds: 2/3 vs (p 1, r 2/3) = 0.8
        ("London", ["Paris", "paris."], 0, 0),
        ("The 1990s.", ["1990s", "the nineties"], 1, 1),  # EM from the first gold
    ],
)
def test_squad_single_cases(prediction, answers, em, f1):
    result = squad_metrics([{"id": "q", "prediction_text": prediction}], [ref("q", *answers)])
    assert result == pytest.approx({"exact_match": 100.0 * em, "f1": 100.0 * f1}, abs=1e-4)


def test_squad_averages_over_questions_and_accepts_a_dict():
    references = [ref("a", "Denver Broncos"), ref("b", "Santa Clara, California", "Santa Clara"), ref("c", "gold")]
    predictions = {"a": "the Denver Broncos", "b": "Clara", "c": "golden"}
    # a: EM 1, F1 1; b: EM 0, F1 max(2*(1*1/3)/(4/3) = 0.5, 2*(1*0.5)/1.5 = 2/3); c: 0, 0
    result = squad_metrics(predictions, references)
    assert result == pytest.approx({"exact_match": 100 / 3, "f1": 100 * (1 + 2 / 3) / 3}, abs=1e-4)
    as_list = squad_metrics([{"id": k, "prediction_text": v} for k, v in predictions.items()], references)
    assert as_list == pytest.approx(result)


def test_squad_unanswered_question_scores_zero():
    with pytest.warns(UserWarning, match="Unanswered"):
        result = squad_metrics({"a": "x"}, [ref("a", "x"), ref("b", "y")])
    assert result == pytest.approx({"exact_match": 50.0, "f1": 50.0})


# ---- GLUE ----


def test_binary_metrics_by_hand():
    preds, labels = [1, 1, 0, 0, 1], [1, 0, 0, 1, 1]
    # tp 2, fp 1, fn 1, tn 1: accuracy 3/5, F1 2*2/(2*2+1+1) = 2/3, MCC (2*1-1*1)/sqrt(3*3*2*2) = 1/6
    assert glue_metrics("mrpc", preds, labels) == pytest.approx(
        {"f1": 200 / 3, "accuracy": 60.0, "score": (200 / 3 + 60) / 2}
    )
    assert glue_metrics("cola", preds, labels) == pytest.approx({"matthews_correlation": 100 / 6, "score": 100 / 6})
    assert glue_metrics("rte", preds, labels) == pytest.approx({"accuracy": 60.0, "score": 60.0})


@pytest.mark.parametrize("task", [t for t in GLUE_METRICS if t != "stsb"])
def test_classification_tasks_match_scikit_learn(task):
    rng = np.random.default_rng(sum(map(ord, task)))
    classes = 3 if task == "mnli" else 2
    labels = rng.integers(0, classes, 200)
    preds = np.where(rng.random(200) < 0.7, labels, rng.integers(0, classes, 200))  # mostly right
    expected = {"accuracy": accuracy_score, "f1": f1_score, "matthews_correlation": matthews_corrcoef}
    result = glue_metrics(task, preds, labels)
    assert set(result) == {*GLUE_METRICS[task], "score"}
    for name in GLUE_METRICS[task]:
        assert result[name] == pytest.approx(100 * expected[name](labels, preds), abs=1e-4)
    assert result["score"] == pytest.approx(np.mean([result[n] for n in GLUE_METRICS[task]]))


def test_logits_are_argmaxed():
    logits = np.array([[2.0, -1.0, 0.0], [0.1, 0.3, 0.2], [0.0, 0.0, 5.0], [1.0, 2.0, 0.0]])
    assert glue_metrics("mnli", logits, [0, 1, 1, 1])["accuracy"] == pytest.approx(75.0)


def test_stsb_correlations_match_scipy():
    rng = np.random.default_rng(3)
    gold = np.round(rng.uniform(0, 5, 100), 1)  # rounded: ties, which Spearman ranks as averages
    predicted = gold + rng.normal(0, 1.0, 100)
    result = glue_metrics("stsb", predicted[:, None], gold)
    assert result["pearson"] == pytest.approx(100 * pearsonr(predicted, gold)[0], abs=1e-4)
    assert result["spearmanr"] == pytest.approx(100 * spearmanr(predicted, gold)[0], abs=1e-4)
    assert result["score"] == pytest.approx((result["pearson"] + result["spearmanr"]) / 2)
    exact = glue_metrics("stsb", [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0])
    assert exact["pearson"] == pytest.approx(100.0) and exact["spearmanr"] == pytest.approx(100.0)


def test_glue_errors():
    with pytest.raises(ValueError, match="unknown GLUE task"):
        glue_metrics("sst-2", [0], [0])
    with pytest.raises(ValueError, match="differ in shape"):
        glue_metrics("sst2", [0, 1], [0, 1, 1])
