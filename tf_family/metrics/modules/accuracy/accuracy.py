"""Accuracy: the fraction of predictions equal to their reference (`tf_family.metrics.accuracy`)."""

import datasets
import evaluate

from tf_family.metrics import accuracy

_DESCRIPTION = "The fraction of predictions equal to their reference (0.0 for no examples)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted class ids.
    references (list of int): true class ids.
Returns:
    accuracy (float): between 0 and 1.
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        return {"accuracy": accuracy(predictions, references)}
