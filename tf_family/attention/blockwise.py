"""Blockwise self-attention (Qiu, Ma, Levy, Yih, Wang & Tang 2020, "Blockwise Self-Attention for Long Document
Understanding", BlockBERT, arXiv:1911.02972, section 3), as pure functions: a mask function with a dense twin and a
gathered-block kernel.

The sequence is cut into blocks of ``block_length`` positions (``l``); a head with block permutation ``pi`` lets
every query of block ``b`` attend to the keys of block ``pi(b)`` only, so a head costs ``O(T l)`` instead of
``O(T^2)``. The heads of a layer take *different* permutations, or information would never leave its block (the
paper's point: with the identity alone a block is an island). The paper's permutations are shifts, and so are these:

- **bidirectional** (``causal=False``, the paper's BlockBERT encoder): ``pi_k(b) = (b + k) mod n`` over the ``n``
  blocks of the sequence (the paper fixes ``n`` = 2 or 3 and ``l = T / n``; here ``l`` is fixed and ``n`` follows the
  length, ``n = ceil(T / l)``; keys past the sequence end are masked). In a padded batch ``n`` follows each row's
  real length (``lengths``), so padding changes no real position's output;
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

from .backend import attend
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
    ``num_blocks`` (``n``, the blocks of the sequence) is needed by the bidirectional cyclic shift only: an int, or a
    tensor of ints ``(...)`` (one per row of a padded batch, ``ceil(length / l)``)."""
    query = query_positions[..., :, None]  # (..., T, 1)
    key = key_positions[..., None, :]  # (..., 1, S)
    query_block = torch.div(query, pattern.block_length, rounding_mode="floor")
    key_block = torch.div(key, pattern.block_length, rounding_mode="floor")
    if not pattern.causal:
        if isinstance(num_blocks, torch.Tensor):
            _check_num_blocks_tensor(num_blocks)
            num_blocks = num_blocks[..., None, None]  # (..., 1, 1)
        elif not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 1:
            raise ValueError(
                f"num_blocks must be an int >= 1 (or a tensor of them) for the cyclic shift (causal=False), got "
                f"{num_blocks!r}."
            )
        return key_block == (query_block + pattern.shift) % num_blocks
    if pattern.shift == 0:
        return (key_block == query_block) & (key <= query)
    target = query_block - pattern.shift
    exists = target >= 0  # (logical operators, not a bool `where`, which onnxruntime does not implement)
    return (exists & (key_block == target)) | (~exists & (key == query))


def _check_num_blocks_tensor(num_blocks: torch.Tensor) -> None:
    if num_blocks.dtype.is_floating_point or num_blocks.dtype == torch.bool:
        raise TypeError(f"num_blocks must hold integers, got dtype {num_blocks.dtype}.")
    if not torch.compiler.is_compiling() and not torch.compiler.is_exporting() and bool((num_blocks < 1).any()):
        raise ValueError(f"num_blocks must be >= 1 in every row, got {num_blocks.tolist()}.")


def num_blocks_of(lengths: torch.Tensor, block_length: int) -> torch.Tensor:
    """``n = ceil(length / l)`` per row (at least 1): the blocks a bidirectional pattern cycles over."""
    return torch.div(lengths + block_length - 1, block_length, rounding_mode="floor").clamp(min=1)


def blockwise_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: BlockwisePattern,
    slopes: torch.Tensor | DistanceAware | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense twin of `blockwise_attention`: plain attention under `build_blockwise_mask` over positions
    ``0 .. T - 1`` (plus the ALiBi bias of ``slopes`` ``(H,)``; or, for a `DistanceAware`, the distance-aware
    attention). With ``lengths`` ``(B,)`` (bidirectional only): row ``b`` has real tokens at ``0 .. lengths[b] - 1``,
    its own ``n`` and no padded key; a padded query sees itself only (its output is never used; `blockwise_attention`
    agrees on the real queries). ``(B, H, T, Dh)``."""
    length = query.shape[2]
    positions = torch.arange(length, device=query.device)
    if lengths is None:
        num_blocks = -(-length // pattern.block_length)
        allowed = build_blockwise_mask(pattern, positions, positions, num_blocks)  # (T, T)
        return reference_attention(query, key, value, allowed, slopes)
    _check_lengths(lengths, pattern, slopes, query.shape[0], length)
    num_blocks = num_blocks_of(lengths, pattern.block_length)  # (B,)
    batch_positions = positions.expand(query.shape[0], length)
    allowed = build_blockwise_mask(pattern, batch_positions, batch_positions, num_blocks)  # (B, T, T)
    real = positions[None, :] < lengths[:, None]  # (B, T)
    allowed = (allowed & real[:, None, :]) | (
        ~real[:, :, None] & torch.eye(length, dtype=torch.bool, device=query.device)
    )
    return reference_attention(query, key, value, allowed[:, None], None)


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
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention under ``pattern`` over positions ``0 .. T - 1``: each query block against its gathered key block
    (``O(T l)``; module docstring).

    Args:
        query, key, value: ``(B, H, T, Dh)``, every head with this pattern.
        pattern: the heads' `BlockwisePattern`.
        slopes: ``(H,)`` ALiBi slopes, a `DistanceAware` (DA-Transformer's ``w_h``, ``v_h``), or ``None``.
        dropout_p: dropout on the probabilities (0 in eval).
        implementation: ``config._attn_implementation``, for `backend.attend`.
        lengths: ``(B,)`` real tokens per row, at positions ``0 .. lengths[b] - 1`` (a padded batch, bidirectional
            patterns only, no ``slopes``): each row cycles over its own ``n = ceil(lengths[b] / l)`` blocks and
            reads no padded key; a padded query's output is unspecified (equal to the twin's on real queries only).

    Returns:
        ``(B, H, T, Dh)``, equal to `blockwise_attention_reference` up to float rounding.
    """
    length, size = query.shape[2], pattern.block_length
    blocks_q, blocks_k, blocks_v = (padded_blocks(t, size) for t in (query, key, value))  # (B, H, N, l, Dh)
    if lengths is not None:
        _check_lengths(lengths, pattern, slopes, query.shape[0], length)
        out = _per_row_attention(blocks_q, blocks_k, blocks_v, pattern, lengths, dropout_p, implementation)
        return out.flatten(2, 3)[:, :, :length]
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


def _check_lengths(lengths, pattern: BlockwisePattern, slopes, batch: int, length: int) -> None:
    if pattern.causal:
        raise ValueError("lengths is for the bidirectional cyclic shift (causal=False); a causal pattern takes none.")
    if slopes is not None:
        raise NotImplementedError(
            "lengths with slopes: a padded batch of the cyclic shift takes no position bias here; use absolute or "
            "rotary positions (slopes=None)."
        )
    if not isinstance(lengths, torch.Tensor) or tuple(lengths.shape) != (batch,) or lengths.dtype.is_floating_point:
        raise ValueError(f"lengths must be an integer tensor of shape ({batch},), got {lengths!r}.")
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    if not tracing and bool(((lengths < 1) | (lengths > length)).any()):
        raise ValueError(f"lengths must lie in [1, {length}] (real tokens per row), got {lengths.tolist()}.")


def _per_row_attention(blocks_q, blocks_k, blocks_v, pattern, lengths, dropout_p, implementation):
    """The cyclic shift with each row's own block count: query block ``b < n_r`` of row ``r`` reads key block
    ``(b + k) mod n_r`` (its keys before ``lengths[r]``); a block of padding only reads itself, each query its own
    key (no empty row; padded outputs are unused). ``(B, H, N, l, Dh)`` in and out; ``O(T l)``."""
    batch, heads, num_blocks, size, head_dim = blocks_q.shape
    device = blocks_q.device
    blocks = torch.arange(num_blocks, device=device)  # (N,)
    row_blocks = num_blocks_of(lengths, size)[:, None]  # (B, 1): n_r
    real_block = blocks[None, :] < row_blocks  # (B, N)
    source = torch.where(real_block, (blocks[None, :] + pattern.shift) % row_blocks, blocks[None, :])  # (B, N)
    index = source[:, None, :, None, None].expand(batch, heads, num_blocks, size, head_dim)
    keys, values = blocks_k.gather(2, index), blocks_v.gather(2, index)  # (B, H, N, l, Dh): block source[b]
    offsets = torch.arange(size, device=device)
    key_positions = source[:, :, None] * size + offsets  # (B, N, l)
    query_positions = blocks[:, None] * size + offsets  # (N, l)
    real_key = key_positions < lengths[:, None, None]  # (B, N, l)
    # a padded query (its output unused) reads what its block reads, or (a block of padding) itself: no empty row
    own = query_positions[None, :, :, None] == key_positions[:, :, None, :]  # (B, N, l, l)
    allowed = torch.where(real_block[:, :, None, None], real_key[:, :, None, :], own)  # (B, N, l, l)
    allowed = (
        allowed[:, None].expand(batch, heads, num_blocks, size, size).reshape(batch, heads * num_blocks, size, size)
    )

    def merged(tensor):  # (B, H, N, l, Dh) -> (B, H * N, l, Dh)
        return tensor.reshape(batch, heads * num_blocks, size, head_dim)

    out, _ = attend(
        merged(blocks_q),
        merged(keys),
        merged(values),
        allowed,
        None,
        dropout_p=dropout_p,
        implementation=implementation,
    )
    return out.view(batch, heads, num_blocks, size, head_dim)


__all__ = [
    "BlockwisePattern",
    "blockwise_attention",
    "blockwise_attention_reference",
    "build_blockwise_mask",
    "key_blocks",
    "num_blocks_of",
]
