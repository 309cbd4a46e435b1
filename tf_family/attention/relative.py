"""Relative positional attention of Transformer-XL (Dai et al. 2019, arXiv:1901.02860, section 3.3).

The score between query ``i`` and key ``j`` is decomposed into a content term and a position term::

    A_ij = (q_i + u) . k_j  +  (q_i + v) . r_(i-j)      # terms (a)+(c) and (b)+(d) of the paper

where ``r`` are projected sinusoid embeddings of the relative distance and ``u``, ``v`` are learned global biases.
The position term is first computed against every relative distance ``S-1 .. 0`` and then re-indexed per query
with :func:`rel_shift`; :func:`rel_shift_reference` is its slow, index-by-index twin.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def relative_position_sequence(
    key_length: int, clamp_len: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Relative distances ``S-1, S-2, ..., 0`` (one per key column), clamped to ``clamp_len`` when it is > 0."""
    positions = torch.arange(key_length - 1, -1, -1, device=device, dtype=torch.int64).to(dtype)  # (S,)
    if clamp_len > 0:
        positions = positions.clamp(max=clamp_len)
    return positions


def sinusoid_position_embedding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoid embedding ``[sin(p * f), cos(p * f)]`` with ``f_k = 1 / 10000^(2k / dim)`` (Vaswani et al. 2017).

    Args:
        positions: ``(R,)`` float tensor of (relative) positions.
        dim: embedding width ``D``; must be even.

    Returns:
        ``(R, D)`` tensor in the dtype of ``positions``.
    """
    if dim % 2 != 0:
        raise ValueError(f"Sinusoid position embeddings need an even width, got dim={dim}.")
    inverse_frequency = 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0, device=positions.device) / dim))  # (D/2,)
    angles = torch.outer(positions.float(), inverse_frequency)  # (R, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(positions.dtype)  # (R, D)


_EMBEDDING_CACHE: dict[tuple, torch.Tensor] = {}


def cached_position_embedding(
    key_length: int, clamp_len: int, dim: int, device: torch.device | str | None, dtype: torch.dtype
) -> torch.Tensor:
    """``sinusoid_position_embedding(relative_position_sequence(...), dim)`` ``(S, D)``, computed once per shape,
    clamp, device and dtype (and per inference mode: an inference tensor cannot enter autograd) and the same tensor
    object afterwards, so that the layers can keep their projection of it (`RelativeMultiHeadAttention`). Not
    cached while compiling or exporting. The tensor is shared: do not modify it in place."""
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        positions = relative_position_sequence(key_length, clamp_len, device, dtype)
        return sinusoid_position_embedding(positions, dim)
    key = (key_length, clamp_len, dim, torch.device(device) if device is not None else None, dtype,
           torch.is_inference_mode_enabled())  # fmt: skip
    embedding = _EMBEDDING_CACHE.get(key)
    if embedding is None:
        with torch.no_grad():
            embedding = sinusoid_position_embedding(
                relative_position_sequence(key_length, clamp_len, device, dtype), dim
            )
        if len(_EMBEDDING_CACHE) >= 64:
            _EMBEDDING_CACHE.clear()
        _EMBEDDING_CACHE[key] = embedding
    return embedding


def segment_position_embedding(
    key_length: int,
    clamp_len: int,
    dim: int,
    device: torch.device | str | None,
    dtype: torch.dtype,
    dropout: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The XL family's ``(S, D)`` relative position embeddings for one segment: with ``dropout`` (training with a
    dropout rate), a fresh tensor passed through it; without, `cached_position_embedding`'s shared tensor, whose
    projection the layers keep from segment to segment."""
    if dropout is None:
        return cached_position_embedding(key_length, clamp_len, dim, device, dtype)
    positions = relative_position_sequence(key_length, clamp_len, device, dtype)
    return dropout(sinusoid_position_embedding(positions, dim))


def rel_shift(position_scores: torch.Tensor) -> torch.Tensor:
    """Re-index scores against relative distances into scores against key positions.

    ``position_scores[..., i, r]`` is the score of query ``i`` against relative distance ``S - 1 - r``. The result
    ``out[..., i, j]`` is the score against the distance between query ``i`` (at key index ``S - T + i``) and key
    ``j``, i.e. ``position_scores[..., i, j + T - 1 - i]``, for every ``j <= S - T + i``. Entries with ``j`` after
    the query (future keys, always masked by the causal mask) hold arbitrary values.

    Implemented with the zero-pad-and-reshape trick of the original code (one copy, no gather) where autograd
    records it; otherwise (evaluation) as a strided view of ``position_scores`` itself, no copy at all:
    ``out[..., i, j]`` sits at offset ``(T - 1) + i * (S - 1) + j`` of each ``(T, S)`` block, so the view has row
    stride ``S - 1`` (the entries after the query read the next row's first scores: arbitrary, as above).
    """
    *batch, query_length, key_length = position_scores.shape
    if (
        not position_scores.requires_grad
        and position_scores.is_contiguous()
        and query_length <= key_length
        and position_scores.numel() > 0
        and not torch.compiler.is_compiling()
    ):
        strides = position_scores.stride()
        return position_scores.as_strided(
            position_scores.shape,
            (*strides[:-2], key_length - 1, 1),
            position_scores.storage_offset() + query_length - 1,
        )
    padded = torch.nn.functional.pad(position_scores, (1, 0))  # (..., T, S + 1)
    if torch.compiler.is_exporting():
        # the same elements (the first T of the flat (S + 1) * T dropped): viewing (T, S + 1) as (S + 1, T) makes
        # the exporter branch on whether T divides S, which a graph with a dynamic length cannot
        return padded.flatten(-2)[..., query_length:].reshape(*batch, query_length, key_length)  # (..., T, S)
    padded = padded.view(*batch, key_length + 1, query_length)  # (..., S + 1, T)
    return padded[..., 1:, :].reshape(*batch, query_length, key_length)  # (..., T, S)


def rel_shift_reference(position_scores: torch.Tensor) -> torch.Tensor:
    """Slow twin of :func:`rel_shift`: explicit index computation, zeros where the key lies after the query."""
    *batch, query_length, key_length = position_scores.shape
    memory_length = key_length - query_length
    out = torch.zeros_like(position_scores)
    for i in range(query_length):
        for j in range(memory_length + i + 1):
            out[..., i, j] = position_scores[..., i, j + query_length - 1 - i]
    return out


def relative_position_scores(
    query: torch.Tensor, position_keys: torch.Tensor, position_bias: torch.Tensor
) -> torch.Tensor:
    """The position term ``rel_shift((q + v) . r)`` of Transformer-XL attention, unscaled and unmasked.

    Args:
        query: ``(B, H, T, Dh)``.
        position_keys: ``(H, S, Dh)`` projected embeddings of the relative distances ``S-1 .. 0``.
        position_bias: ``(H, Dh)``, the paper's ``v``.

    Returns:
        ``(B, H, T, S)`` scores against key positions.
    """
    position = torch.einsum("bhtd,hsd->bhts", query + position_bias[:, None, :], position_keys)  # (B, H, T, S)
    return rel_shift(position)


def relative_attention_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    position_keys: torch.Tensor,
    content_bias: torch.Tensor,
    position_bias: torch.Tensor,
) -> torch.Tensor:
    """Unscaled, unmasked Transformer-XL attention scores ``(q + u) . k + rel_shift((q + v) . r)``.

    Args:
        query: ``(B, H, T, Dh)``.
        key: ``(B, H, S, Dh)``, memory first.
        position_keys: ``(H, S, Dh)`` projected embeddings of the relative distances ``S-1 .. 0``.
        content_bias: ``(H, Dh)``, the paper's ``u``.
        position_bias: ``(H, Dh)``, the paper's ``v``.

    Returns:
        ``(B, H, T, S)`` scores.
    """
    content = torch.einsum("bhtd,bhsd->bhts", query + content_bias[:, None, :], key)  # (B, H, T, S)
    return content + relative_position_scores(query, position_keys, position_bias)
