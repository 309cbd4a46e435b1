"""CALM early exit (Schuster et al. 2022, arXiv:2207.07061): pure functions, no `nn.Module`, no config.

- `confidence`: the confidence measures (softmax top-1 minus top-2, softmax max, hidden-state saturation per row,
  the meta classifier's score, a softmax over a restricted vocabulary), the position-decayed threshold, the exit
  schedule, the anytime-loss weights and the exits' self-distillation term (the official t5x/flaxformer formulas);
- `calibration`: Learn-then-Test (Angelopoulos et al. 2021) — Hoeffding and Hoeffding–Bentkus p-values and
  fixed-sequence testing over a descending threshold grid, which the paper uses for its consistency guarantee and
  which no released CALM code implements;
- `depth_adaptive`: the Depth-Adaptive Transformer's halting classifiers (Elbayad et al. 2020; geometric-like and
  multinomial), their oracles and losses: an exit strategy beside CALM's confidence measures;
- `losses`: the training losses of a model with exits (the anytime loss, the meta and halting classifiers'),
  over the exits' states, with the model's norm, head and classifiers passed in.
"""

from .calibration import (
    LTTResult,
    binomial_cdf,
    calibrate_threshold,
    fixed_sequence_test,
    hoeffding_bentkus_p_value,
    hoeffding_p_value,
    rescale_risks,
    rouge_l_f1,
    token_disagreement,
)
from .confidence import (
    AGGREGATIONS,
    CONFIDENCE_MEASURES,
    anytime_loss_weights,
    class_balanced_meta_loss,
    decayed_threshold,
    distillation_kl,
    exit_points,
    meta_confidence,
    restricted_softmax_confidence,
    softmax_diff_confidence,
    softmax_max_confidence,
    state_confidence,
)
from .depth_adaptive import (
    HALTING_MEASURES,
    ORACLES,
    geometric_exit_distribution,
    geometric_halting_confidence,
    geometric_halting_loss,
    multinomial_halting_confidence,
    multinomial_halting_loss,
    oracle_exits,
)
from .losses import ExitLosses, exit_losses, halting_classifier_loss

__all__ = [
    "ExitLosses",
    "exit_losses",
    "halting_classifier_loss",
    "AGGREGATIONS",
    "CONFIDENCE_MEASURES",
    "HALTING_MEASURES",
    "ORACLES",
    "geometric_exit_distribution",
    "geometric_halting_confidence",
    "geometric_halting_loss",
    "multinomial_halting_confidence",
    "multinomial_halting_loss",
    "oracle_exits",
    "LTTResult",
    "anytime_loss_weights",
    "binomial_cdf",
    "calibrate_threshold",
    "class_balanced_meta_loss",
    "decayed_threshold",
    "distillation_kl",
    "exit_points",
    "fixed_sequence_test",
    "hoeffding_bentkus_p_value",
    "hoeffding_p_value",
    "meta_confidence",
    "rescale_risks",
    "restricted_softmax_confidence",
    "rouge_l_f1",
    "softmax_diff_confidence",
    "softmax_max_confidence",
    "state_confidence",
    "token_disagreement",
]
