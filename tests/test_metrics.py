"""Our metric functions against hand-computed values (the definitions of evaluate's accuracy, f1 and squad), and the
evaluate modules shipped with them: loaded offline from their folders, the same numbers, results saved by
``evaluate.save``."""

import json
import math

import pytest

from tf_family import metrics
from tf_family.metrics import accuracy, answer_f1, language_model_metrics, macro_f1, normalize_answer, squad_scores


def test_accuracy_and_macro_f1_by_hand():
    predictions, references = [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]
    assert accuracy(predictions, references) == pytest.approx(4 / 6)
    # class 0: tp 1, predicted 2, actual 2 -> 0.5; class 1: tp 1, 1, 2 -> 2/3; class 2: tp 2, 3, 2 -> 0.8
    assert macro_f1(predictions, references) == pytest.approx((0.5 + 2 / 3 + 0.8) / 3)
    # a class in `labels` with neither true nor predicted examples counts 0 (scikit-learn's convention)
    assert macro_f1(predictions, references, labels=[0, 1, 2, 3]) == pytest.approx((0.5 + 2 / 3 + 0.8) / 4)
    assert accuracy([], []) == 0.0
    with pytest.raises(ValueError, match="3 predictions for 2 references"):
        accuracy([1, 2, 3], [1, 2])


def test_squad_scores_by_hand():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert answer_f1("the cat sat", "a cat sat down") == pytest.approx(2 * 1.0 * (2 / 3) / (1 + 2 / 3))
    scores = squad_scores(["Denver Broncos", "in 1961", "nothing"], [["Denver Broncos"], ["1961", "in 1961 ."], ["x"]])
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)
    assert scores["f1"] == pytest.approx(100 * 2 / 3)
    with pytest.raises(ValueError, match="at least one gold answer"):
        squad_scores(["a"], [[]])


def test_every_shipped_evaluate_module_loads_offline_and_computes_what_its_function_computes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    assert metrics.module_names() == ["accuracy", "f1", "perplexity", "squad"]
    predictions, references = [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]
    assert metrics.load("accuracy").compute(predictions=predictions, references=references) == {
        "accuracy": accuracy(predictions, references)
    }
    assert metrics.load("f1").compute(predictions=predictions, references=references, labels=[0, 1, 2, 3]) == {
        "f1": macro_f1(predictions, references, labels=[0, 1, 2, 3])
    }
    answers, gold = ["the Eiffel Tower", "Paris France"], [["Eiffel Tower"], ["Paris", "in Paris, France"]]
    assert metrics.load("squad").compute(predictions=answers, references=gold) == squad_scores(answers, gold)
    nll, tokens, characters = 1234.5678, 987, 4321
    got = metrics.load("perplexity").compute(nll=[nll], tokens=[tokens], characters=[characters])
    assert got == language_model_metrics(nll, tokens, characters)  # one part: the very numbers, bit for bit
    assert got["perplexity"] == math.exp(nll / tokens)
    saved = metrics.save(tmp_path / "results", **got, run="test")
    assert json.loads(saved.read_text())["perplexity"] == got["perplexity"]
    with pytest.raises(ValueError, match="no evaluate module 'bleu'"):
        metrics.load("bleu")
