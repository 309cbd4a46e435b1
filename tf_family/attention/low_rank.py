"""Low-rank attention (Linformer, Wang et al. 2020, arXiv:2006.04768): keys and values projected along the sequence
axis, ``S -> K``, by learned matrices ``E`` and ``F`` before softmax attention, so the cost is ``O(T K Dh)``.

`project_along_sequence` picks each real position's row of the projection by its position (the count of real tokens
before it), so left and right padding give the same projection, and leaves padding out (its keys and values are
zeroed before the projection, not mixed in). `project_prefix_along_sequence` is the same projection where every real
token's position is its index (no padding, or padding on the right only): the first ``S`` rows are sliced instead of
gathered per row, so the projection's gradient is one product instead of a scatter-add of ``B S`` rows. `low_rank_attention` is softmax attention over the ``K`` projected
slots; its dense twin `low_rank_attention_reference` builds the ``(T, S)`` matrix the two steps imply
(``softmax(q (E^T k)^T) F^T``) and applies it to the original values.

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``S`` keys, ``Dh`` head width, ``K`` projected length; a projection is
``(P, N, K)`` with ``P`` 1 (shared by the heads) or ``H``, and ``N >= S`` rows (the longest input).
"""

from __future__ import annotations

import torch


def _gathered_projection(projection: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """``(B, P, S, K)``: row ``positions[b, s]`` of ``projection`` for each key, zero at padding."""
    rows = projection[:, positions]  # (P, B, S, K)
    rows = rows.permute(1, 0, 2, 3)
    return torch.where(key_valid[:, None, :, None], rows, torch.zeros((), dtype=rows.dtype))


def project_along_sequence(
    states: torch.Tensor, projection: torch.Tensor, positions: torch.Tensor, key_valid: torch.Tensor
) -> torch.Tensor:
    """``E^T x`` along the sequence: ``(B, H, S, Dh)`` keys or values, ``(P, N, K)`` projection, ``(B, S)``
    positions (``< N``) and ``key_valid`` -> ``(B, H, K, Dh)``. Padding contributes nothing."""
    rows = _gathered_projection(projection, positions, key_valid)  # (B, P, S, K)
    states = torch.where(key_valid[:, None, :, None], states, torch.zeros((), dtype=states.dtype))
    if rows.shape[1] == 1:  # one projection for all heads: not expanded to (B, H, S, K), whose gradient is a sum
        return torch.einsum("bsk,bhsd->bhkd", rows[:, 0], states)
    return torch.einsum("bhsk,bhsd->bhkd", rows, states)


def project_prefix_along_sequence(
    states: torch.Tensor, projection: torch.Tensor, key_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """`project_along_sequence` for inputs whose real tokens sit at positions ``0 ..`` (each real token's position
    is its index: no padding, or padding on the right only): ``(B, H, S, Dh)`` keys or values, ``(P, N, K)``
    projection, ``key_valid`` ``(B, S)`` or ``None`` (no padding) -> ``(B, H, K, Dh)``. Padding contributes nothing."""
    rows = projection[:, : states.shape[2]]  # (P, S, K): rows 0 .. S-1
    if key_valid is not None:
        states = torch.where(key_valid[:, None, :, None], states, torch.zeros((), dtype=states.dtype))
    if rows.shape[0] == 1:
        return torch.einsum("sk,bhsd->bhkd", rows[0], states)
    return torch.einsum("hsk,bhsd->bhkd", rows, states)


def low_rank_attention(
    query: torch.Tensor, projected_key: torch.Tensor, projected_value: torch.Tensor, dropout=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``(B, H, T, Dh)`` queries over ``(B, H, K, Dh)`` projected keys and values: the output
    ``(B, H, T, Dh)`` and the probabilities ``(B, H, T, K)``. ``dropout``: a callable applied to the probabilities
    (training), or ``None``."""
    scores = torch.einsum("bhtd,bhkd->bhtk", query, projected_key) * query.shape[-1] ** -0.5  # (B, H, T, K)
    probs = scores.float().softmax(dim=-1).to(query.dtype)
    kept = probs if dropout is None else dropout(probs)
    return torch.einsum("bhtk,bhkd->bhtd", kept, projected_value), probs


def low_rank_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    projections: tuple[torch.Tensor, torch.Tensor],
    positions: torch.Tensor,
    key_valid: torch.Tensor,
) -> torch.Tensor:
    """Dense twin of `project_along_sequence` + `low_rank_attention` (no dropout): the implied ``(T, S)`` weights
    ``softmax(q (E^T k)^T / sqrt(Dh)) F^T`` applied to the unprojected values. ``projections``: ``(E, F)``."""
    key_rows = _gathered_projection(projections[0], positions, key_valid)  # (B, P, S, K)
    value_rows = _gathered_projection(projections[1], positions, key_valid)
    heads = query.shape[1]
    key_rows, value_rows = key_rows.expand(-1, heads, -1, -1), value_rows.expand(-1, heads, -1, -1)
    valid = key_valid[:, None, :, None]
    key = torch.where(valid, key, 0.0)
    value = torch.where(valid, value, 0.0)
    slot_keys = torch.einsum("bhsk,bhsd->bhkd", key_rows, key)
    probs = (torch.einsum("bhtd,bhkd->bhtk", query, slot_keys) * query.shape[-1] ** -0.5).softmax(-1)
    weights = torch.einsum("bhtk,bhsk->bhts", probs, value_rows)  # (B, H, T, S)
    return torch.einsum("bhts,bhsd->bhtd", weights, value)


__all__ = [
    "low_rank_attention",
    "low_rank_attention_reference",
    "project_along_sequence",
    "project_prefix_along_sequence",
]
