"""kNN-LM math (Khandelwal et al. 2020, "Generalization through Memorization", arXiv:1911.00172).

p(y | x) = λ · p_kNN(y | x) + (1 − λ) · p_LM(y | x), with p_kNN(y | x) ∝ Σ_{neighbours i with value y} exp(s_i / τ),
where s_i is the neighbour's score (negative squared L2 distance, or inner product) and τ the temperature
(``knn_temperature``; the paper uses τ = 1). Everything is computed in log space. Shapes: ``N`` query positions,
``K`` neighbours, ``V`` vocabulary. `knn_log_probs` scatters into the vocabulary; `dense_knn_log_probs` is its
one-hot twin used by the tests.
"""

from __future__ import annotations

import math

import torch


def _check(scores: torch.Tensor, token_ids: torch.Tensor, temperature: float) -> None:
    if scores.shape != token_ids.shape or scores.dim() != 2:
        raise ValueError(
            f"scores and token_ids must both have shape (N, K), got {tuple(scores.shape)} and {tuple(token_ids.shape)}."
        )
    if not temperature > 0:
        raise ValueError(f"knn_temperature must be > 0, got {temperature}.")


def knn_log_probs(scores: torch.Tensor, token_ids: torch.Tensor, vocab_size: int, temperature: float = 1.0):
    """log p_kNN ``(N, V)`` from neighbour scores ``(N, K)`` and their next tokens ``(N, K)``.

    Neighbours with ``token_id < 0`` or a score of ``-inf`` (missing) count for nothing; tokens no neighbour
    carries get ``-inf``. A row without any neighbour is ``-inf`` everywhere (interpolation then falls back on the
    LM alone, see `interpolate_log_probs`).
    """
    _check(scores, token_ids, temperature)
    valid = (token_ids >= 0) & torch.isfinite(scores)
    logits = (scores.float() / temperature).masked_fill(~valid, float("-inf"))  # (N, K)
    # a stable log-softmax over the K neighbours; rows with no valid neighbour stay -inf
    top = logits.max(-1, keepdim=True).values.clamp_min(torch.finfo(torch.float32).min)
    weights = (logits - top).exp()  # (N, K), 0 for invalid neighbours
    total = weights.sum(-1, keepdim=True)
    per_token = weights.new_zeros(scores.shape[0], vocab_size)
    per_token.scatter_add_(1, token_ids.clamp_min(0), weights)  # (N, V)
    return per_token.log() - total.clamp_min(torch.finfo(torch.float32).tiny).log()


def dense_knn_log_probs(scores: torch.Tensor, token_ids: torch.Tensor, vocab_size: int, temperature: float = 1.0):
    """`knn_log_probs` through a one-hot ``(N, K, V)`` tensor: the slow reference."""
    _check(scores, token_ids, temperature)
    valid = (token_ids >= 0) & torch.isfinite(scores)
    probs = torch.softmax((scores.float() / temperature).masked_fill(~valid, float("-inf")), -1).nan_to_num(0.0)
    one_hot = torch.nn.functional.one_hot(token_ids.clamp_min(0), vocab_size).float() * valid[..., None]
    return torch.einsum("nk,nkv->nv", probs, one_hot).log()


def knn_target_log_probs(
    scores: torch.Tensor, token_ids: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log p_kNN(target) ``(N,)`` for one target token per row, without building the ``(N, V)`` distribution.

    Equals ``knn_log_probs(scores, token_ids, V, temperature).gather(1, targets[:, None])[:, 0]``; used to evaluate
    a grid of (k, λ) from one search (the neighbours are sorted, so the first k columns are the k nearest).
    """
    _check(scores, token_ids, temperature)
    valid = (token_ids >= 0) & torch.isfinite(scores)
    logits = (scores.float() / temperature).masked_fill(~valid, float("-inf"))  # (N, K)
    normaliser = torch.logsumexp(logits, -1)  # (N,)
    hits = logits.masked_fill(token_ids != targets[:, None], float("-inf"))
    return torch.logsumexp(hits, -1) - normaliser.clamp_min(torch.finfo(torch.float32).min)


def interpolate_log_probs(lm_log_probs: torch.Tensor, knn_log_probs: torch.Tensor, lmbda: float) -> torch.Tensor:
    """log(λ · p_kNN + (1 − λ) · p_LM), elementwise over ``(..., V)``.

    λ = 0 returns ``lm_log_probs`` itself and λ = 1 ``knn_log_probs`` itself (exactly, not up to rounding). Rows
    where the kNN distribution is empty (no neighbours) keep the LM distribution.
    """
    if not 0.0 <= lmbda <= 1.0:
        raise ValueError(f"lmbda must be in [0, 1], got {lmbda}.")
    if lmbda == 0.0:
        return lm_log_probs
    if lmbda == 1.0:
        return knn_log_probs
    mixed = torch.logaddexp(lm_log_probs + math.log1p(-lmbda), knn_log_probs.to(lm_log_probs.dtype) + math.log(lmbda))
    empty = torch.isneginf(knn_log_probs).all(-1, keepdim=True)
    return torch.where(empty, lm_log_probs, mixed)


__all__ = ["dense_knn_log_probs", "interpolate_log_probs", "knn_log_probs", "knn_target_log_probs"]
