"""A language model's loss, perplexity and bits per token and per character from summed negative log-likelihoods
(`tf_family.metrics.language_model_metrics`): the recipes sum the NLL of every scored token themselves (the models
carry memory across segments, which evaluate's own ``perplexity``, running a model from the Hub, cannot)."""

import datasets
import evaluate

from tf_family.metrics import language_model_metrics

_DESCRIPTION = "Mean NLL (nats per scored token), perplexity, bits per token and bits per character."
_KWARGS_DESCRIPTION = """
Args:
    nll (list of float): summed negative log-likelihood (nats) of each evaluated part.
    tokens (list of int): scored tokens of each part.
    characters (list of int): characters of the text of each part.
Returns:
    loss, perplexity, bits_per_token, bits_per_character (float).
"""


class Perplexity(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "nll": datasets.Value("float64"),
                    "tokens": datasets.Value("int64"),
                    "characters": datasets.Value("int64"),
                }
            ),
        )

    def _compute(self, nll, tokens, characters):
        return language_model_metrics(sum(nll), sum(tokens), sum(characters))
