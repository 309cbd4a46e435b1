"""Adaptive attention span (Sukhbaatar et al. 2019, arXiv:1905.07799, "Adaptive Attention Span in Transformers"):
the soft span mask, its application to attention weights, and how many keys a span needs. Pure functions; the
learned parameter lives in `tf_family.layers.adaptive_span`.

Every head has a span ``z`` (in tokens, ``0 <= z <= S``) and the weight of a key at distance ``x`` from its query is
scaled by the ramp (section 3, eq. 3 and 4)

    m_z(x) = clamp((R + z - x) / R, 0, 1)

(1 up to distance ``z``, falling linearly to 0 at distance ``z + R``), then the weights are renormalised:
``a'_tr = m(t - r) a_tr / sum_s m(t - s) a_ts`` with ``a = softmax(scores)``. That equals
``softmax(scores + log m)`` (both are ``m e^scores / sum m e^scores``), which is how the models apply it: the log of
the mask is one more additive score bias, so every attention backend runs it. `adaptive_span_attention_reference`
is the dense twin that does what the paper writes (softmax, multiply, renormalise); a test holds them equal, values
and gradients. A key at distance ``>= z + R`` has weight exactly 0 (bias ``-inf``), so dropping it changes nothing:
`span_key_limit` says how many of the most recent memory slots a set of spans can reach.
"""

from __future__ import annotations

import math

import torch


def span_ramp(distances: torch.Tensor, spans: torch.Tensor, ramp: int) -> torch.Tensor:
    """The soft mask ``m_z(x) = clamp((R + z - x) / R, 0, 1)``.

    Args:
        distances: ``(T, S)`` query-to-key distances ``x`` (query position minus key position; negative for future
            keys, which get 1 and are left to the causal mask).
        spans: ``(H,)`` spans ``z`` in tokens.
        ramp: ``R``, the width of the linear ramp in tokens (>= 1).

    Returns:
        ``(H, T, S)`` mask values in ``[0, 1]``, differentiable in ``spans`` where ``0 < m < 1``.
    """
    distances = distances.to(spans.dtype)
    return ((ramp + spans[:, None, None] - distances) / ramp).clamp(0, 1)  # (H, T, S)


def span_log_mask(distances: torch.Tensor, spans: torch.Tensor, ramp: int) -> torch.Tensor:
    """``log m_z(x)`` ``(H, T, S)``, ``-inf`` where the mask is 0: the additive score bias that makes a softmax
    equal the paper's masked and renormalised weights. The gradient is finite everywhere (0 where the mask is 0 or
    1, as the clamp's; ``1 / m`` times the ramp's slope in between)."""
    mask = span_ramp(distances, spans, ramp)  # (H, T, S)
    tiny = torch.finfo(mask.dtype).tiny
    # log of the clamped value: the branch not taken gets no gradient, so no 0 * inf = nan at m = 0
    return torch.where(mask > 0, mask.clamp_min(tiny).log(), torch.full_like(mask, float("-inf")))


def segment_distances(query_length: int, key_length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``(T, S)`` distances from the ``T`` queries (the last ``T`` of the ``S`` keys ``[memory, segment]``) to every
    key: ``S - T + t - s`` for query ``t`` and key ``s``."""
    queries = torch.arange(key_length - query_length, key_length, device=device)  # (T,)
    keys = torch.arange(key_length, device=device)  # (S,)
    return queries[:, None] - keys[None, :]  # (T, S)


def span_key_limit(max_span: float, ramp: int, multiple: int) -> int:
    """How many of the most recent memory slots heads whose largest span is ``max_span`` tokens can reach, rounded
    up to a multiple of ``multiple`` (so that the key length changes only in steps).

    Memory slot ``k`` from the end (``k = 1`` the newest) is at distance ``>= k`` from every query of the segment,
    and its mask is 0 once ``k >= z + R``: the slots ``k < z + R``, that is ``ceil(z + R) - 1`` of them, are all a
    span can reach; one more is kept so that the count is never short by rounding.
    """
    if ramp < 1 or multiple < 1:
        raise ValueError(f"span_key_limit needs ramp >= 1 and multiple >= 1, got ramp={ramp}, multiple={multiple}.")
    needed = math.ceil(max(float(max_span), 0.0) + ramp)
    return -(-needed // multiple) * multiple


def adaptive_span_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor,
    spans: torch.Tensor,
    ramp: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense twin, as the paper writes it: ``a = softmax(q k^T / sqrt(Dh) + bias)``, ``a' = m a / sum(m a)``,
    output ``a' v``.

    Args:
        query: ``(B, H, T, Dh)``; key, value: ``(B, H, S, Dh)`` (the queries are the last ``T`` of the keys).
        bias: additive scores broadcastable to ``(B, H, T, S)`` (position term, ``finfo.min`` where not allowed).
        spans: ``(H,)`` spans in tokens. ramp: ``R``.

    Returns:
        ``(B, H, T, Dh)`` and the renormalised weights ``(B, H, T, S)``.
    """
    query_length, key_length = query.shape[-2], key.shape[-2]
    scores = query @ key.transpose(-1, -2) * query.shape[-1] ** -0.5 + bias  # (B, H, T, S)
    weights = scores.softmax(dim=-1)
    mask = span_ramp(segment_distances(query_length, key_length, query.device), spans, ramp)  # (H, T, S)
    masked = weights * mask.to(weights.dtype)
    masked = masked / masked.sum(dim=-1, keepdim=True)
    return masked @ value, masked  # (B, H, T, Dh), (B, H, T, S)


__all__ = [
    "adaptive_span_attention_reference",
    "segment_distances",
    "span_key_limit",
    "span_log_mask",
    "span_ramp",
]
