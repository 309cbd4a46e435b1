"""CALM's confidence measures, threshold decay, exit schedule and anytime-loss weights (pure tensor functions).

Formulas follow the official code (google-research t5x ``contrib/calm`` and flaxformer ``calm_t5``), with one
correction: the hidden-state saturation measure is a cosine *per row*, where the official one divides by norms of
the whole batch array (right only at batch size 1).

Shapes: ``B`` rows, ``V`` vocabulary, ``D`` width, ``K`` restricted vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# the last two are the Depth-Adaptive Transformer's halting classifiers (`tf_family.early_exit.depth_adaptive`)
CONFIDENCE_MEASURES = ("softmax_diff", "softmax_max", "state", "meta", "restricted_softmax", "halting", "multinomial")
AGGREGATIONS = ("geometric", "uniform", "linear")


def softmax_diff_confidence(logits: torch.Tensor) -> torch.Tensor:
    """``p1 - p2``: the gap between the two largest softmax probabilities. ``logits`` ``(..., V)`` -> ``(...)``."""
    top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1).values  # (..., 2)
    return top[..., 0] - top[..., 1]


def softmax_max_confidence(logits: torch.Tensor) -> torch.Tensor:
    """``max p``: the largest softmax probability. ``logits`` ``(..., V)`` -> ``(...)``."""
    return torch.softmax(logits.float(), dim=-1).amax(dim=-1)


def state_confidence(previous_hidden: torch.Tensor, hidden: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Hidden-state saturation: the cosine between a row's hidden states at two consecutive exits, row by row.

    ``previous_hidden``, ``hidden``: ``(..., D)`` -> ``(...)``. (The official code normalises by the norms of the
    whole batch array, which equals this only for one row.)"""
    return F.cosine_similarity(previous_hidden.float(), hidden.float(), dim=-1, eps=eps)


def meta_confidence(meta_logits: torch.Tensor) -> torch.Tensor:
    """The meta classifier's probability that the exit's prediction equals the full model's: ``softmax(.)[..., 1]``
    of its two logits ``(..., 2)`` -> ``(...)``."""
    if meta_logits.shape[-1] != 2:
        raise ValueError(
            f"meta_logits must have 2 classes in the last dimension, got shape {tuple(meta_logits.shape)}."
        )
    return torch.softmax(meta_logits.float(), dim=-1)[..., 1]


def restricted_softmax_confidence(hidden: torch.Tensor, vocab_weight: torch.Tensor) -> torch.Tensor:
    """``p1 - p2`` of a softmax over a restricted vocabulary only: a cheap stand-in for `softmax_diff_confidence`
    when the full output layer costs as much as a transformer layer (vocabulary 8k on a CPU).

    Args:
        hidden: ``(..., D)`` the normalised hidden state the output layer reads.
        vocab_weight: ``(K, D)`` the output-layer rows of the ``K >= 2`` tokens kept (e.g. the most frequent).
    """
    if vocab_weight.shape[0] < 2:
        raise ValueError(f"the restricted vocabulary needs at least 2 tokens, got {vocab_weight.shape[0]}.")
    return softmax_diff_confidence(hidden @ vocab_weight.t())  # (..., K) -> (...)


def decayed_threshold(
    threshold: float, position: torch.Tensor | float, max_length: int, temperature: float
) -> torch.Tensor | float:
    """CALM's position-adjusted threshold ``λ'(t) = 0.9 λ + 0.1 λ exp(-τ t / N)``: strict early in the output,
    relaxing towards ``0.9 λ``. ``temperature`` τ = 0 keeps ``λ`` (``max_length`` N > 0)."""
    if max_length <= 0:
        raise ValueError(f"max_length (N) must be > 0, got {max_length}.")
    if temperature < 0:
        raise ValueError(f"temperature (τ) must be >= 0, got {temperature}.")
    if math.isinf(threshold) or temperature == 0:
        return (
            threshold
            if not isinstance(position, torch.Tensor)
            else torch.full_like(position, threshold, dtype=torch.float)
        )
    if isinstance(position, torch.Tensor):
        return 0.9 * threshold + 0.1 * threshold * torch.exp(-temperature * position.float() / max_length)
    return 0.9 * threshold + 0.1 * threshold * math.exp(-temperature * position / max_length)


def exit_points(num_layers: int, first_exit: int, exit_interval: int) -> list[int]:
    """The layer counts after which an exit reads the hidden state: ``first_exit``, then every ``exit_interval``
    layers, and always the last layer. ``exit_points(8, 2, 2) == [2, 4, 6, 8]``; ``exit_points(8, 1, 3) == [1, 4,
    7, 8]``."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}.")
    if first_exit < 1 or exit_interval < 1:
        raise ValueError(f"first_exit and exit_interval must be >= 1, got {first_exit} and {exit_interval}.")
    points = list(range(first_exit, num_layers, exit_interval))
    return [*points, num_layers]


def anytime_loss_weights(num_exits: int, aggregation: str | int = "linear") -> torch.Tensor:
    """Weights of the exits' losses in the anytime loss, normalised to sum to 1 (``(E,)`` float64).

    The official code's ``aggregation_weights``: ``"geometric"`` (its -1) weighs exit i by 2^i; ``"uniform"`` (0)
    equally; ``"linear"`` (1, its default) by i + 1; an integer k >= 1 by ``1, 1 + k, 1 + 2k, …``
    (``arange(1, k E + 1, k)``)."""
    if num_exits < 1:
        raise ValueError(f"num_exits must be >= 1, got {num_exits}.")
    aggregation = {-1: "geometric", 0: "uniform"}.get(aggregation, aggregation)  # the official integer codes
    if aggregation == "geometric":
        weights = 2.0 ** torch.arange(num_exits, dtype=torch.float64)
    elif aggregation == "uniform":
        weights = torch.ones(num_exits, dtype=torch.float64)
    elif aggregation == "linear" or (isinstance(aggregation, int) and not isinstance(aggregation, bool)):
        step = 1 if aggregation == "linear" else aggregation
        if step < 1:
            raise ValueError(f"aggregation must be 'geometric' (-1), 'uniform' (0), 'linear' or k >= 1, got {step}.")
        weights = torch.arange(1, step * num_exits + 1, step, dtype=torch.float64)
    else:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS} or an integer step >= 1, got {aggregation!r}.")
    return weights / weights.sum()


def distillation_kl(exit_logits: torch.Tensor, final_logits: torch.Tensor) -> torch.Tensor:
    """Self-distillation of an exit: ``KL(p_final || p_exit) = Σ_v p_final(v) (log p_final(v) - log p_exit(v))``
    per position, with ``p = softmax(logits)`` (float32). ``exit_logits``, ``final_logits`` ``(..., V)`` ->
    ``(...)``; the final layer's distribution is the target (detached: the exit learns to match it, the last layer
    is not pulled towards its exits)."""
    if exit_logits.shape != final_logits.shape:
        raise ValueError(
            f"exit_logits {tuple(exit_logits.shape)} and final_logits {tuple(final_logits.shape)} must have the "
            "same shape."
        )
    target = torch.log_softmax(final_logits.detach().float(), dim=-1)
    log_exit = torch.log_softmax(exit_logits.float(), dim=-1)
    return (target.exp() * (target - log_exit)).sum(-1)


def class_balanced_meta_loss(meta_logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor | None = None):
    """The meta classifier's class-balanced cross entropy: each class's examples weigh ``1 / (2 n_class)``, so both
    classes count equally whatever their frequency.

    Args:
        meta_logits: ``(N, 2)``; labels: ``(N,)`` 1 where the exit's prediction equals the final layer's.
        valid: ``(N,)`` bool, the examples that count (``None``: all).
    """
    labels = labels.long()
    if valid is None:
        valid = torch.ones_like(labels, dtype=torch.bool)
    losses = F.cross_entropy(meta_logits.float(), labels, reduction="none")  # (N,)
    total = meta_logits.new_zeros((), dtype=torch.float32)
    present = 0
    for label in (0, 1):
        chosen = valid & (labels == label)
        count = int(chosen.sum())
        if count:
            total = total + (losses * chosen).sum() / count
            present += 1
    return total / max(present, 1) + 0.0 * meta_logits.sum()  # keeps the graph when nothing is valid


__all__ = [
    "AGGREGATIONS",
    "CONFIDENCE_MEASURES",
    "anytime_loss_weights",
    "class_balanced_meta_loss",
    "decayed_threshold",
    "distillation_kl",
    "exit_points",
    "meta_confidence",
    "restricted_softmax_confidence",
    "softmax_diff_confidence",
    "softmax_max_confidence",
    "state_confidence",
]
