"""Evaluation metrics of the recipes: accuracy and macro-F1 for classification, exact match and F1 for extractive
question answering (the official SQuAD v1.1 definitions), and a language model's loss, perplexity and bits per token
and per character.

Each is also a Hugging Face ``evaluate`` module shipped in the package (``modules/<name>/<name>.py``: ``accuracy``,
``f1``, ``squad``, ``perplexity``), which `load` loads offline by its local path (``evaluate.load(<folder>)``; a
name alone would fetch the Hub's script) and which can be pushed to the Hub as it is (it needs tf_family installed:
its ``_compute`` calls the function here, so there is one definition of each metric). `save` writes results with
``evaluate.save``. The functions give the numbers of ``evaluate``'s own ``accuracy``, ``f1`` (``average="macro"``)
and ``squad`` (``squad`` reports percentages 0-100, so does `squad_scores`).
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

# the evaluate modules' folders: MODULES / name / f"{name}.py"
MODULES = Path(__file__).resolve().parent / "modules"


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


def language_model_metrics(nll: float, count: int, characters: int, loss_key: str = "loss") -> dict[str, float]:
    """Loss (``loss_key``: mean NLL in nats per scored token), perplexity, bits per token and per character from a
    summed ``nll`` over ``count`` scored tokens of a text of ``characters`` characters."""
    loss = nll / max(count, 1)
    return {
        loss_key: loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "bits_per_token": loss / math.log(2),
        "bits_per_character": nll / math.log(2) / max(characters, 1),
    }


def module_names() -> list[str]:
    """The evaluate modules shipped in the package."""
    return sorted(path.name for path in MODULES.iterdir() if (path / f"{path.name}.py").is_file())


def load(name: str, **kwargs: Any):
    """The shipped evaluate module ``name`` (`module_names`), loaded from its folder: ``evaluate.load(<folder>)``,
    offline."""
    if name not in module_names():
        raise ValueError(f"no evaluate module {name!r} in tf_family.metrics; choose one of {module_names()}.")
    import evaluate

    return evaluate.load(str(MODULES / name), **kwargs)


def save(folder: str | Path, **results: Any) -> Path:
    """Write ``results`` (metrics, and the run's parameters beside them) as ``evaluate.save`` does: a timestamped
    JSON file in ``folder``, with the system's description; returns its path."""
    import evaluate

    return Path(evaluate.save(str(folder), **results))


__all__ = [
    "MODULES",
    "accuracy",
    "answer_f1",
    "language_model_metrics",
    "load",
    "macro_f1",
    "module_names",
    "normalize_answer",
    "save",
    "squad_scores",
]
