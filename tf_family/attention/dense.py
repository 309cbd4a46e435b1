"""Plain softmax attention: the slow, obviously-correct twin that every fast kernel in this package is tested
against, and the ``"eager"`` implementation of `backend.attend` (the one that can return the probabilities)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dense_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    dropout_p: float = 0.0,
    key_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention under a bool mask: the slow twin of every fast kernel here.

    Args:
        query: ``(B, H, T, Dh)``; key, value: ``(B, H, S, Dh)``.
        allowed: bool, broadcastable to ``(B, H, T, S)``; ``None``: nothing masked. Rows with no allowed key attend
            to every key (their output is meaningless but finite).
        key_bias: optional additive score bias broadcastable to ``(B, H, T, S)`` (e.g. ``log`` of key multiplicities,
            or relative-position scores), added after the ``1 / sqrt(Dh)`` scaling.

    Returns:
        ``(B, H, T, Dh)`` outputs and ``(B, H, T, S)`` probabilities.
    """
    scores = torch.einsum("bhtd,bhsd->bhts", query, key)  # (B, H, T, S)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * query.shape[-1] ** -0.5
    if key_bias is not None:
        scores = scores + key_bias
    if allowed is not None:
        allowed = allowed.expand(scores.shape)
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = scores.softmax(dim=-1).to(value.dtype)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return torch.einsum("bhts,bhsd->bhtd", probs, value), probs


__all__ = ["dense_attention"]
