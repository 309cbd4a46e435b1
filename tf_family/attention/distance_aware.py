"""DA-Transformer's distance-aware attention (Wu, Wu & Huang, NAACL 2021, "DA-Transformer: Distance-aware
Transformer", arXiv:2010.06925, section 3), as pure functions: no position embeddings; the real distance between two
tokens re-scales their (ReLU-clipped) attention weight.

For head ``h`` with learned scalars ``w_h`` (weight on the distance) and ``v_h`` (the sigmoid's offset), query
position ``i`` and key position ``j``:

    R_ij        = |i - j|                                                   (the real distance)
    R^h_ij      = w_h R_ij                                                  (per head: w_h > 0 favours far keys,
                                                                             w_h < 0 near ones)
    f(x; v_h)   = (1 + exp(v_h)) / (1 + exp(v_h - x))                       (the learnable sigmoid)
    A^h_ij      = ReLU(q_i . k_j) * f(R^h_ij; v_h) / sqrt(Dh)
    P^h_ij      = A^h_ij / sum_j' A^h_ij'                                   (re-normalised, replacing softmax)
    out^h_i     = sum_j P^h_ij v_j

``f(0) = 1`` (a token's weight on itself is its clipped score), ``f`` increases with ``x`` and lies in
``(0, 1 + exp(v_h))``: ``v_h`` sets the range of the re-scaling. `distance_aware_coefficients` computes ``f`` as
``exp(softplus(v) - softplus(v - x))``, finite for any ``v`` and ``x``.

Masking (a causal or sparse pattern, padding) sets ``A^h_ij = 0`` before the row sum; the **causal** form is the
same formula over keys ``j <= i`` (``R_ij = i - j``). A row whose clipped scores are all zero (every allowed
``q . k <= 0``) has a zero sum: the sum is floored at `ROW_SUM_FLOOR`, so that row's output is zero, not NaN (the
normalisation is exact for every row whose sum is above the floor).

`DistanceAware` carries one call's ``(w, v)``; the Sparse Transformer's kernels take it where they take ALiBi slopes
and call `distance_aware_attention` on their gathered blocks; `reference_attention` is the dense twin of either
position scheme. Tensors are ``(B, H, T, Dh)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .alibi import alibi_bias
from .dense import dense_attention
from .dropout import dropout

ROW_SUM_FLOOR = 1e-6


def distance_aware_coefficients(weight: torch.Tensor, offset: torch.Tensor, distance: torch.Tensor) -> torch.Tensor:
    """``f(w |d|; v) = (1 + exp(v)) / (1 + exp(v - w |d|))`` elementwise; ``weight`` and ``offset`` broadcast against
    ``distance`` (the caller lines the head axis up)."""
    scaled = weight * distance.abs()
    offset = offset.to(scaled.dtype)  # one dtype on both sides, so that f(0) is exactly 1
    return torch.exp(F.softplus(offset) - F.softplus(offset - scaled))


@dataclass(frozen=True, eq=False)
class DistanceAware:
    """The distance-aware re-scaling of some heads: ``weight`` ``w_h`` and ``offset`` ``v_h``, both ``(H,)``."""

    weight: torch.Tensor
    offset: torch.Tensor

    def __post_init__(self):
        for name in ("weight", "offset"):
            tensor = getattr(self, name)
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1:
                raise ValueError(f"DistanceAware.{name} must be a 1-D tensor (one value per head), got {tensor!r}.")
        if self.weight.shape != self.offset.shape:
            raise ValueError(
                f"DistanceAware.weight {tuple(self.weight.shape)} and offset {tuple(self.offset.shape)} must have one "
                "value per head each."
            )

    def coefficients(self, distance: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``distance`` ``(..., T, S)`` (``i - j``) -> the heads' coefficients ``(..., H, T, S)`` in ``dtype``."""
        weight, offset = (t.to(distance.device, dtype)[:, None, None] for t in (self.weight, self.offset))
        return distance_aware_coefficients(weight, offset, distance.to(dtype)[..., None, :, :])


def distance_aware_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    coefficients: torch.Tensor,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``P V`` with ``P = ReLU(q k^T / sqrt(Dh)) * coefficients``, masked, divided by its row sum (module docstring).

    Args:
        query: ``(..., T, Dh)``; key, value: ``(..., S, Dh)``.
        allowed: bool, broadcastable to ``(..., T, S)``; ``None``: nothing masked.
        coefficients: ``f(w_h |i - j|; v_h)``, broadcastable to ``(..., T, S)`` (`DistanceAware.coefficients`).
        dropout_p: dropout on the normalised weights (0 in eval).

    Returns:
        ``(..., T, Dh)`` outputs and the ``(..., T, S)`` normalised weights.
    """
    work = torch.promote_types(query.dtype, torch.float32)
    scores = torch.einsum("...td,...sd->...ts", query.to(work), key.to(work)) * query.shape[-1] ** -0.5
    weights = F.relu(scores) * coefficients.to(work)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    probs = weights / weights.sum(dim=-1, keepdim=True).clamp_min(ROW_SUM_FLOOR)
    probs = dropout(probs, dropout_p, dropout_p > 0.0).to(value.dtype)
    return torch.einsum("...ts,...sd->...td", probs, value), probs


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor,
    positions: torch.Tensor | DistanceAware | None = None,
) -> torch.Tensor:
    """The dense twin of a sparse kernel over positions ``0 .. T - 1`` under ``allowed`` ``(T, S)``: softmax attention
    (with the ALiBi bias when ``positions`` is the ``(H,)`` slopes) or, for a `DistanceAware`, the re-normalised
    distance-aware attention. ``(B, H, T, Dh)``."""
    index = torch.arange(query.shape[2], device=query.device)
    if isinstance(positions, DistanceAware):
        distance = index[:, None] - index[None, :]  # (T, T)
        coefficients = positions.coefficients(distance, torch.promote_types(query.dtype, torch.float32))
        return distance_aware_attention(query, key, value, allowed, coefficients)[0]
    bias = None if positions is None else alibi_bias(positions, index[None], index[None])  # (1, H, T, T)
    return dense_attention(query, key, value, allowed, key_bias=bias)[0]


__all__ = [
    "ROW_SUM_FLOOR",
    "DistanceAware",
    "distance_aware_attention",
    "distance_aware_coefficients",
    "reference_attention",
]
