"""SQuAD v1.1 exact match and F1, in percent (`tf_family.metrics.squad_scores`): each prediction scores its best
match among its gold answers, after SQuAD's answer normalisation."""

import datasets
import evaluate

from tf_family.metrics import squad_scores

_DESCRIPTION = "SQuAD v1.1 exact match and token-overlap F1 (percentages 0-100) of predicted answer strings."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the predicted answer of each question.
    references (list of list of str): the gold answers of each question (at least one).
Returns:
    exact_match (float), f1 (float): between 0 and 100.
"""


class Squad(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="Rajpurkar et al. 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text (arXiv:1606.05250)",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references):
        return squad_scores(predictions, references)
