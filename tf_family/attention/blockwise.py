"""Blockwise self-attention (Qiu, Ma, Levy, Yih, Wang & Tang 2020, "Blockwise Self-Attention for Long Document
Understanding", BlockBERT, arXiv:1911.02972, section 3), as pure functions: a mask function with a dense twin and a
gathered-block kernel.

The sequence is cut into blocks of ``block_length`` positions (``l``); a head with block permutation ``pi`` lets
every query of block ``b`` attend to the keys of block ``pi(b)`` only, so a head costs ``O(T l)`` instead of
``O(T^2)``. The heads of a layer take *different* permutations, or information would never leave its block (the
paper's point: with the identity alone a block is an island). The paper's permutations are shifts, and so are these:

- **bidirectional** (``causal=False``, the paper's BlockBERT encoder): ``pi_k(b) = (b + k) mod n`` over the ``n``
  blocks of the sequence (the paper fixes ``n`` = 2 or 3 and ``l = T / n``; here ``l`` is fixed and ``n`` follows the
  length; keys past the sequence end are masked);
- **causal** (``causal=True``, for a decoder, which the paper does not define): a causal bijection of blocks can
  only be the identity, so the shift is partial, ``pi_k(b) = b - k``: shift 0 is the own block up to the query
  (causal inside the block), a shift ``k > 0`` is the whole block ``k`` blocks back, and the first ``k`` blocks, which
  have no block ``k`` back, see only the query itself (so no row is empty). Every key is at or before its query; one
  layer with shifts ``0 .. K`` reaches ``K`` blocks back, ``L`` layers ``L K`` blocks.

`build_blockwise_mask` evaluates a pattern on positions (the dense twin's mask, and a decoding step's row over the
cache); `blockwise_attention_reference` is plain attention under it; `blockwise_attention` gathers each query block's
key block and attends to it (``O(T l)`` time and memory, never ``T x T``), through `factorized.grouped_attend` (the
Sparse Transformer kernels' grouped `backend.attend`), with the same optional ALiBi slopes ``-m_h (i - j)`` or
DA-Transformer's distance-aware weights (`distance_aware`).
Tensors are ``(B, H, T, Dh)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .distance_aware import DistanceAware, reference_attention
from .factorized import grouped_attend, padded_blocks


@dataclass(frozen=True)
class BlockwisePattern:
    """One head's block permutation: a shift of blocks.

    Attributes:
        block_length: ``l``, positions per block.
        shift: ``k``: block ``b`` attends to block ``b - k`` (causal) or ``(b + k) mod n`` (bidirectional).
        causal: the decoder's partial shift (module docstring); False is the paper's cyclic shift.
    """

    block_length: int
    shift: int
    causal: bool = True

    def __post_init__(self):
        for name, minimum in (("block_length", 1), ("shift", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {self.causal!r}.")


def build_blockwise_mask(
    pattern: BlockwisePattern,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    num_blocks: int | None = None,
) -> torch.Tensor:
    """Where a query may attend under ``pattern``: bool ``(..., T, S)`` from positions ``(..., T)`` and ``(..., S)``.
    ``num_blocks`` (``n``, the blocks of the sequence) is needed by the bidirectional cyclic shift only."""
    query = query_positions[..., :, None]  # (..., T, 1)
    key = key_positions[..., None, :]  # (..., 1, S)
    query_block = torch.div(query, pattern.block_length, rounding_mode="floor")
    key_block = torch.div(key, pattern.block_length, rounding_mode="floor")
    if not pattern.causal:
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(
                f"num_blocks must be an int >= 1 for the cyclic shift (causal=False), got {num_blocks!r}."
            )
        return key_block == (query_block + pattern.shift) % num_blocks
    if pattern.shift == 0:
        return (key_block == query_block) & (key <= query)
    target = query_block - pattern.shift
    exists = target >= 0  # (logical operators, not a bool `where`, which onnxruntime does not implement)
    return (exists & (key_block == target)) | (~exists & (key == query))


def blockwise_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: BlockwisePattern,
    slopes: torch.Tensor | DistanceAware | None = None,
) -> torch.Tensor:
    """Dense twin of `blockwise_attention`: plain attention under `build_blockwise_mask` over positions
    ``0 .. T - 1`` (plus the ALiBi bias of ``slopes`` ``(H,)``; or, for a `DistanceAware`, the distance-aware
    attention). ``(B, H, T, Dh)``."""
    length = query.shape[2]
    positions = torch.arange(length, device=query.device)
    num_blocks = -(-length // pattern.block_length)
    allowed = build_blockwise_mask(pattern, positions, positions, num_blocks)  # (T, T)
    return reference_attention(query, key, value, allowed, slopes)


def key_blocks(pattern: BlockwisePattern, num_blocks: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The block each query block reads, ``(N,)``, and whether it is the permuted block ``(N,)`` (False: a causal
    block with no block ``k`` back, which reads its own block and sees only the query itself)."""
    blocks = torch.arange(num_blocks, device=device)
    if not pattern.causal:
        return (blocks + pattern.shift) % num_blocks, torch.ones_like(blocks, dtype=torch.bool)
    target = blocks - pattern.shift
    exists = target >= 0
    return torch.where(exists, target, blocks), exists


def blockwise_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: BlockwisePattern,
    slopes: torch.Tensor | DistanceAware | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> torch.Tensor:
    """Attention under ``pattern`` over positions ``0 .. T - 1``: each query block against its gathered key block
    (``O(T l)``; module docstring).

    Args:
        query, key, value: ``(B, H, T, Dh)``, every head with this pattern.
        pattern: the heads' `BlockwisePattern`.
        slopes: ``(H,)`` ALiBi slopes, a `DistanceAware` (DA-Transformer's ``w_h``, ``v_h``), or ``None``.
        dropout_p: dropout on the probabilities (0 in eval).
        implementation: ``config._attn_implementation``, for `backend.attend`.

    Returns:
        ``(B, H, T, Dh)``, equal to `blockwise_attention_reference` up to float rounding.
    """
    length, size = query.shape[2], pattern.block_length
    blocks_q, blocks_k, blocks_v = (padded_blocks(t, size) for t in (query, key, value))  # (B, H, N, l, Dh)
    num_blocks = blocks_q.shape[2]
    source, exists = key_blocks(pattern, num_blocks, query.device)  # (N,)
    offsets = torch.arange(size, device=query.device)
    query_positions = torch.arange(num_blocks, device=query.device)[:, None] * size + offsets  # (N, l)
    key_positions = source[:, None] * size + offsets  # (N, l)
    distance = query_positions[:, :, None] - key_positions[:, None, :]  # (N, l, l): i - j
    if not pattern.causal:
        allowed = (key_positions < length)[:, None, :].expand_as(distance)  # the last block's padding
    elif pattern.shift == 0:
        allowed = distance >= 0
    else:  # a whole earlier block, or (no block k back) the query itself
        allowed = exists[:, None, None] | (distance == 0)
    out = grouped_attend(
        blocks_q,
        blocks_k.index_select(2, source),
        blocks_v.index_select(2, source),
        allowed,
        distance,
        slopes,
        dropout_p,
        implementation,
    )  # (B, H, N, l, Dh)
    return out.flatten(2, 3)[:, :, :length]


__all__ = [
    "BlockwisePattern",
    "blockwise_attention",
    "blockwise_attention_reference",
    "build_blockwise_mask",
    "key_blocks",
]
