"""Our metric functions against hand-computed values (the definitions of evaluate's accuracy, f1 and squad)."""

import pytest

from tf_family.metrics import accuracy, answer_f1, macro_f1, normalize_answer, squad_scores


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
