"""Evaluation metrics of the encoder recipes: accuracy and macro-F1 for classification, exact match and F1 for
extractive question answering (the official SQuAD v1.1 definitions).

These are the definitions of the Hugging Face ``evaluate`` metrics ``accuracy``, ``f1`` (``average="macro"``) and
``squad``, computed here because ``evaluate.load`` fetches its metric scripts from the Hub: it cannot load them on an
offline machine, and the recipes must run offline. The results are the same numbers (``squad`` reports percentages
0-100, so do `squad_scores`).
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Hashable, Sequence


def _check_lengths(predictions: Sequence, references: Sequence) -> None:
    if len(predictions) != len(references):
        raise ValueError(
            f"{len(predictions)} predictions for {len(references)} references; pass one prediction per reference."
        )


def accuracy(predictions: Sequence[Hashable], references: Sequence[Hashable]) -> float:
    """The fraction of predictions equal to their reference (0.0 for no examples)."""
    _check_lengths(predictions, references)
    if not references:
        return 0.0
    return sum(p == r for p, r in zip(predictions, references, strict=True)) / len(references)


def macro_f1(
    predictions: Sequence[Hashable], references: Sequence[Hashable], labels: Sequence[Hashable] | None = None
) -> float:
    """The unweighted mean over classes of the per-class F1 (scikit-learn's ``f1_score(average="macro")``).

    ``labels`` fixes the classes averaged over (default: every class seen in the references or predictions); a class
    with no true and no predicted example scores 0, as in scikit-learn.
    """
    _check_lengths(predictions, references)
    classes = list(labels) if labels is not None else sorted(set(references) | set(predictions), key=str)
    if not classes:
        return 0.0
    scores = []
    for label in classes:
        true_positive = sum(p == label and r == label for p, r in zip(predictions, references, strict=True))
        predicted = sum(p == label for p in predictions)
        actual = sum(r == label for r in references)
        scores.append(2 * true_positive / (predicted + actual) if predicted + actual else 0.0)
    return sum(scores) / len(scores)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_f1(prediction: str, reference: str) -> float:
    """Token-overlap F1 of two answers after `normalize_answer`."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    common = collections.Counter(predicted) & collections.Counter(gold)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(predicted), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> dict[str, float]:
    """``exact_match`` and ``f1`` in percent: each prediction scores its best match among its gold answers."""
    _check_lengths(predictions, references)
    if not references:
        return {"exact_match": 0.0, "f1": 0.0}
    exact, f1 = 0.0, 0.0
    for prediction, answers in zip(predictions, references, strict=True):
        if not answers:
            raise ValueError("every reference needs at least one gold answer (SQuAD v1.1 scoring).")
        exact += max(float(normalize_answer(prediction) == normalize_answer(a)) for a in answers)
        f1 += max(answer_f1(prediction, a) for a in answers)
    return {"exact_match": 100.0 * exact / len(references), "f1": 100.0 * f1 / len(references)}


__all__ = ["accuracy", "answer_f1", "macro_f1", "normalize_answer", "squad_scores"]
