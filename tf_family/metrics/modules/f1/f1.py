"""Macro-F1: the unweighted mean over classes of the per-class F1 (`tf_family.metrics.macro_f1`; scikit-learn's
``f1_score(average="macro")``)."""

import datasets
import evaluate

from tf_family.metrics import macro_f1

_DESCRIPTION = "The unweighted mean over classes of the per-class F1 (a class never true nor predicted scores 0)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted class ids.
    references (list of int): true class ids.
    labels (list of int, optional): the classes averaged over (default: every class seen).
Returns:
    f1 (float): between 0 and 1.
"""


class F1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references, labels=None):
        return {"f1": macro_f1(predictions, references, labels)}
