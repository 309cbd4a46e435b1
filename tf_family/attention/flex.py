"""The ``"flex_attention"`` route: the sparse patterns as FlexAttention block masks (``torch.nn.attention.flex_attention``).

With ``attn_implementation="flex_attention"`` the three sparse kernels hand their whole pattern to one FlexAttention
call instead of cutting the sequence into chunks or block slabs:

- `flex_sliding_window_attention` (Longformer): the window (with dilation, causal or not) plus the global keys;
- `flex_block_sparse_attention` (BigBird): the global, window and random blocks, a repeated block counted as often
  as it appears (a ``log(count)`` score term, as `block_sparse_attention_reference` does);
- `flex_lsh_attention` (Reformer): the sorted chunks of every hashing round (rounds apart or, with
  ``wrap_around``, transformers' one sequence of rounds) and `flex_chunked_local_attention`.

The dense parts (Longformer's global rows, BigBird's short inputs, cached steps) keep going through `backend.attend`,
which treats ``"flex_attention"`` as ``"sdpa"``.

Each pattern is described twice: exactly, per element, by a ``mask_mod`` (and for Reformer a ``score_mod``: a query's
own key scores ``self_only``, and with ``correct_duplicates`` ``-log`` of how often the pair met), and per
``_BLOCK`` x ``_BLOCK`` tile by a block table computed from the pattern's arithmetic (no ``T x T`` tensor is ever
built): the tiles a query may reach (a superset of the exact mask) and the tiles it sees in full (a subset). A test
checks both against the exact mask (`tests/attention/test_flex.py`), and the outputs and gradients against the dense
twins.

On CUDA the attention runs through one ``torch.compile(flex_attention, dynamic=False)`` (the fused, block-sparse
Triton kernels); elsewhere uncompiled, PyTorch's reference implementation, which materialises the scores (tests and
CPU only; it is not a fast path). FlexAttention has no dropout: a call with ``dropout_p > 0`` raises (as
transformers' ``flex_attention_forward`` does); set the model's attention dropout to 0 or use ``"sdpa"``.
Sequences are padded inside to a multiple of ``_BLOCK`` (padded keys masked, padded queries dropped).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .patterns import ChunkPattern, WindowPattern

_BLOCK = 128  # FlexAttention's default sparse block; every block table here is in tiles of this size
_COMPILED: dict[str, object] = {}


def _flex_module():
    from torch.nn.attention import flex_attention as module  # imported on first use: not on the CPU import path

    return module


def _check_dropout(dropout_p: float) -> None:
    if dropout_p > 0.0:
        raise ValueError(
            f"attn_implementation='flex_attention' has no attention dropout, got dropout_p={dropout_p}; set the "
            "model's attention dropout to 0 (attention_probs_dropout_prob, lsh/local_attention_probs_dropout_prob) "
            "for training, call model.eval(), or use attn_implementation='sdpa'."
        )


def _run(query, key, value, block_mask, score_mod=None, return_lse: bool = False):
    """One FlexAttention call: compiled on CUDA, the uncompiled reference elsewhere. Returns ``(out, lse or None)``."""
    module = _flex_module()
    function = module.flex_attention
    if key.dtype != query.dtype or value.dtype != query.dtype:  # FlexAttention takes one dtype
        key, value = key.to(query.dtype), value.to(query.dtype)
    if query.device.type == "cpu" and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return _tiled_reference(query, key, value, block_mask, score_mod)  # FlexAttention refuses CPU backward
    if query.device.type == "cuda" and not torch.compiler.is_compiling():
        function = _COMPILED.get("flex")
        if function is None:
            function = _COMPILED["flex"] = torch.compile(module.flex_attention, dynamic=False)
    kwargs = {"score_mod": score_mod, "block_mask": block_mask}
    if return_lse:
        if hasattr(module, "AuxRequest"):
            kwargs["return_aux"] = module.AuxRequest(lse=True)
        else:  # torch before 2.9
            kwargs["return_lse"] = True
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        result = function(query, key, value, **kwargs)
    if not return_lse:
        return result, None
    out, aux = result
    return out, aux.lse if hasattr(aux, "lse") else aux


def _tiles(counts: torch.Tensor, indices: torch.Tensor | None, num_key_tiles: int) -> torch.Tensor:
    """FlexAttention's (counts, indices) of one kind of tile back to a ``(B, H, Nq, Nk)`` bool table."""
    table = torch.zeros(*counts.shape, num_key_tiles + 1, dtype=torch.bool, device=counts.device)
    if indices is not None:
        listed = torch.arange(indices.shape[-1], device=counts.device) < counts[..., None].long()
        table.scatter_(-1, torch.where(listed, indices.long(), num_key_tiles), True)
    return table[..., :num_key_tiles]


def _tiled_reference(query, key, value, block_mask, score_mod=None):
    """What FlexAttention computes, in plain PyTorch autograd over the full scores (CPU training, where PyTorch's
    FlexAttention refuses a backward; small inputs only): ``mask_mod`` inside the partial tiles, everything inside
    the full tiles, nothing elsewhere, and ``score_mod`` on every score. Returns ``(out, lse)``."""
    batch, heads, length, _ = query.shape
    num_key_tiles = -(-key.shape[2] // _BLOCK)
    partial = _tiles(block_mask.kv_num_blocks, block_mask.kv_indices, num_key_tiles)
    full = _tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, num_key_tiles)
    b = torch.arange(batch)[:, None, None, None]
    h = torch.arange(heads)[None, :, None, None]
    q_idx = torch.arange(length)[None, None, :, None]
    kv_idx = torch.arange(key.shape[2])[None, None, None, :]

    def spread(table):  # tiles -> elements, cut to the lengths
        return table.repeat_interleave(_BLOCK, -2).repeat_interleave(_BLOCK, -1)[..., :length, : key.shape[2]]

    allowed = (spread(partial) & block_mask.mask_mod(b, h, q_idx, kv_idx)) | spread(full)
    work = torch.promote_types(query.dtype, torch.float32)
    scores = (query.to(work) @ key.to(work).transpose(-1, -2)) * query.shape[-1] ** -0.5
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = scores.logsumexp(dim=-1)
    probs = (scores - lse[..., None]).exp()
    return (probs @ value.to(work)).to(query.dtype), lse


def _ordered(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``(B, H, Nq, Nk)`` bool tile table as FlexAttention's (counts, indices): the True columns of each row
    first, in order."""
    counts = table.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(table.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts.contiguous(), indices.contiguous()


def _block_mask(reach: torch.Tensor, full: torch.Tensor, mask_mod, length: int):
    """A `BlockMask` from the tiles a query block may reach and those it sees whole (``(B|1, H|1, N, N)`` bool; a
    full tile is not listed as partial, so the kernel skips ``mask_mod`` there)."""
    module = _flex_module()
    full = full & reach
    partial = reach & ~full
    counts, indices = _ordered(partial)
    full_counts, full_indices = _ordered(full)
    return module.BlockMask.from_kv_blocks(
        counts, indices, full_counts, full_indices, BLOCK_SIZE=_BLOCK, mask_mod=mask_mod, seq_lengths=(length, length)
    )


def _pad_to_block(length: int) -> int:
    return -(-length // _BLOCK) * _BLOCK


def _pad_sequence(tensors, padded: int):
    """Pad ``(B, H, T, Dh)`` tensors to ``padded`` positions."""
    return [F.pad(t, (0, 0, 0, padded - t.shape[2])) if t.shape[2] != padded else t for t in tensors]


def _tile_range(num_tiles: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, 1)`` query tile and ``(1, N)`` key tile indices."""
    tiles = torch.arange(num_tiles, device=device)
    return tiles[:, None], tiles[None, :]


# --------------------------------------------------------------------------------------------------- Longformer
def flex_sliding_window_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: WindowPattern,
    key_valid: torch.Tensor | None = None,
    global_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """`sliding_window.sliding_window_attention` in one FlexAttention call.

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        pattern: the `WindowPattern` (one-sided window ``W`` in steps of ``dilation``, causal or not).
        key_valid: ``(B, T)`` bool, True at real tokens (``None``: all real).
        global_mask: ``(B, T)`` bool, True at global tokens (never at padding), keys every query sees (causal: those
            at or before it); their own rows are computed like any other (Longformer replaces them).
        dropout_p: must be 0 (FlexAttention has no dropout).

    Returns:
        ``(B, H, T, Dh)``, equal to `sliding_window_attention_reference` up to float rounding.
    """
    _check_dropout(dropout_p)
    length = query.shape[2]
    block_mask = sliding_window_block_mask(
        query, pattern.window, pattern.dilation, pattern.causal, key_valid, global_mask
    )
    query, key, value = _pad_sequence((query, key, value), block_mask.seq_lengths[0])
    return _run(query, key, value, block_mask)[0][:, :, :length]


def sliding_window_block_mask(query, window, dilation=1, causal=False, key_valid=None, global_mask=None):
    """The `BlockMask` of `flex_sliding_window_attention` (``query``: shape and device), over the length padded to a
    multiple of 128."""
    batch, _, length, _ = query.shape
    device = query.device
    padded = _pad_to_block(length)
    valid = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid.bool()
    valid = F.pad(valid, (0, padded - length), value=False)  # (B, Tp)
    is_global = None if global_mask is None else F.pad(global_mask.bool() & valid[:, :length], (0, padded - length))
    reach_steps = window * dilation

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx - kv_idx
        in_window = (distance <= reach_steps) & (distance >= (0 if causal else -reach_steps))
        if dilation > 1:
            in_window = in_window & (distance % dilation == 0)
        allowed = in_window & valid[b, kv_idx]
        if is_global is not None:
            see_global = is_global[b, kv_idx]
            if causal:
                see_global = see_global & (distance >= 0)
            allowed = allowed | see_global
        return allowed | ((distance == 0) & ~valid[b, q_idx])  # a padded query attends to itself

    # tiles: the distances between a query tile and a key tile span [d0 - (b-1), d0 + (b-1)], d0 = (i - j) * b
    num_tiles = padded // _BLOCK
    query_tile, key_tile = _tile_range(num_tiles, device)
    start = (query_tile - key_tile) * _BLOCK
    low, high = start - (_BLOCK - 1), start + (_BLOCK - 1)
    lowest = 0 if causal else -reach_steps
    reach = (high >= lowest) & (low <= reach_steps)  # (N, N); dilation only thins a tile (exact in mask_mod)
    full = (low >= lowest) & (high <= reach_steps) & (dilation == 1)
    key_tiles_valid = valid.view(batch, num_tiles, _BLOCK)
    full = full[None] & key_tiles_valid.all(-1)[:, None, :]  # (B, N, N)
    reach = reach[None] | (start == 0)[None]  # the diagonal tile (padded queries attend to themselves)
    if is_global is not None:
        reach = reach | is_global.view(batch, num_tiles, _BLOCK).any(-1)[:, None, :]
    return _block_mask(reach[:, None], full[:, None], mask_mod, padded)


# ------------------------------------------------------------------------------------------------------ BigBird
def flex_block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_size: int,
    counts: torch.Tensor,
    key_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """`block_sparse.block_sparse_attention` in one FlexAttention call.

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        block_size: BigBird's block ``b``.
        counts: ``(H, N, N)`` how often each query block attends to each key block (`build_block_sparse_counts`,
            ``N = ceil(T / b)``).
        key_valid: ``(B, T)`` bool, True at real tokens; a row without any real token sees every key.
        dropout_p: must be 0.

    Returns:
        ``(B, H, T, Dh)``, equal to `block_sparse_attention_reference` up to float rounding.
    """
    _check_dropout(dropout_p)
    length = query.shape[2]
    block_mask, score_mod = block_sparse_block_mask(query, block_size, counts, key_valid)
    query, key, value = _pad_sequence((query, key, value), block_mask.seq_lengths[0])
    return _run(query, key, value, block_mask, score_mod)[0][:, :, :length]


def block_sparse_block_mask(query, block_size, counts, key_valid=None):
    """The `BlockMask` and ``score_mod`` (``None`` unless a block repeats) of `flex_block_sparse_attention`."""
    batch, heads, length, _ = query.shape
    device = query.device
    num_blocks = counts.shape[-1]
    padded = _pad_to_block(num_blocks * block_size)
    valid = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid.bool()
    valid = valid | ~valid.any(dim=1, keepdim=True)
    valid = F.pad(valid, (0, padded - length), value=False)  # (B, Tp)
    # blocks of the padding beyond N * b: queries as block 0 (a global row: finite, dropped), keys never reached
    extra = -(-padded // block_size) - num_blocks
    counts = F.pad(counts.to(device), (0, extra, 0, extra))
    counts[:, num_blocks:] = counts[:, :1]
    repeated = bool((counts > 1).any())
    log_counts = counts.clamp(min=1).to(torch.promote_types(query.dtype, torch.float32)).log() if repeated else None

    def mask_mod(b, h, q_idx, kv_idx):
        return (counts[h, q_idx // block_size, kv_idx // block_size] > 0) & valid[b, kv_idx]

    score_mod = None
    if repeated:

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + log_counts[h, q_idx // block_size, kv_idx // block_size]

    # tiles from the block counts: every element of a query tile against every element of a key tile
    num_tiles = padded // _BLOCK
    first = torch.arange(num_tiles, device=device) * _BLOCK // block_size  # the blocks each tile touches
    last = (torch.arange(num_tiles, device=device) * _BLOCK + _BLOCK - 1) // block_size
    span = int((last - first).max()) + 1
    touched = torch.minimum(first[:, None] + torch.arange(span, device=device)[None, :], last[:, None])  # (N, span)
    sub = counts[:, touched][:, :, :, touched] > 0  # (H, N, span, N, span)
    reach, full = sub.any(4).any(2), sub.all(4).all(2)
    key_tiles_valid = valid.view(batch, num_tiles, _BLOCK).all(-1)  # (B, N)
    full = full[None] & key_tiles_valid[:, None, None, :]  # (B, H, N, N)
    return _block_mask(reach[None].expand(batch, -1, -1, -1), full, mask_mod, padded), score_mod


# ----------------------------------------------------------------------------------------------------- Reformer
def flex_chunked_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """`lsh.chunked_local_attention` in one FlexAttention call: each position attends to the real keys of its own
    chunk and the ``pattern.before`` / ``pattern.after`` neighbouring chunks (modulo the number of chunks with
    ``wrap_around``), causal by position; a query without any such key attends to itself."""
    _check_dropout(dropout_p)
    length = query.shape[2]
    block_mask = chunked_local_block_mask(query, pattern, key_valid)
    query, key, value = _pad_sequence((query, key, value), block_mask.seq_lengths[0])
    return _run(query, key, value, block_mask)[0][:, :, :length]


def chunked_local_block_mask(query: torch.Tensor, pattern: ChunkPattern, key_valid: torch.Tensor | None = None):
    """The `BlockMask` of `flex_chunked_local_attention`."""
    chunk_length, before, after = pattern.chunk_length, pattern.before, pattern.after
    causal, wrap_around = pattern.causal, pattern.wrap_around
    batch, _, length, _ = query.shape
    device = query.device
    num_chunks = -(-length // chunk_length)
    padded = _pad_to_block(length)
    valid = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid.bool()
    valid = F.pad(valid, (0, padded - length), value=False)
    offsets = [o % num_chunks if wrap_around else o for o in range(-before, after + 1)]

    def near_chunk(query_chunk, key_chunk):
        offset = key_chunk - query_chunk
        if wrap_around:
            offset = offset % num_chunks
            return sum((offset == o) for o in sorted(set(offsets))) > 0
        return (offset >= -before) & (offset <= after)

    # a query without any real key in reach attends to itself, as the chunked path does
    real = valid[:, :length]
    if causal:  # real keys in [start of the chunk `before` chunks back, the query] (wrapping reaches only later keys)
        position = torch.arange(length, device=device)
        start = ((position // chunk_length - before).clamp(min=0) * chunk_length)[None].expand(batch, -1)
        running = F.pad(real.long().cumsum(1), (1, 0))  # (B, T + 1)
        lonely = (running[:, 1:] - running.gather(1, start)) == 0
    else:
        chunk_real = F.pad(real, (0, num_chunks * chunk_length - length)).view(batch, num_chunks, -1).any(-1)
        reach_chunk = torch.zeros(batch, num_chunks, dtype=torch.bool, device=device)
        for o in sorted(set(offsets)):
            target = torch.arange(num_chunks, device=device) + o
            inside = (target >= 0) & (target < num_chunks)
            if wrap_around:
                target, inside = target % num_chunks, torch.ones_like(inside)
            reach_chunk |= inside[None] & chunk_real[:, target.clamp(0, num_chunks - 1)]
        lonely = ~reach_chunk.repeat_interleave(chunk_length, dim=1)[:, :length]
    lonely = F.pad(lonely, (0, padded - length), value=True)  # (B, Tp); the padding to the tile sees itself

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = near_chunk(q_idx // chunk_length, kv_idx // chunk_length) & valid[b, kv_idx] & (q_idx < length)
        if causal:
            allowed = allowed & (kv_idx <= q_idx)
        return allowed | ((q_idx == kv_idx) & lonely[b, q_idx])  # the padding to the tile: itself only

    reach, full = _chunk_tiles(padded, chunk_length, num_chunks, near_chunk, device)
    if causal:
        query_tile, key_tile = _tile_range(padded // _BLOCK, device)
        reach, full = reach & (key_tile <= query_tile), full & (key_tile < query_tile)
    full = full[None] & valid.view(batch, -1, _BLOCK).all(-1)[:, None, :]
    return _block_mask(reach[None, None], full[:, None], mask_mod, padded)


def _chunk_tiles(padded: int, chunk_length: int, num_chunks: int, near_chunk, device):
    """``(N, N)`` tiles a chunk pattern reaches and covers whole, from the chunks each tile's rows and columns touch
    (positions past the last chunk count as its own chunk ``num_chunks``, which reaches nothing but the diagonal)."""
    num_tiles = padded // _BLOCK
    first = torch.arange(num_tiles, device=device) * _BLOCK // chunk_length
    last = (torch.arange(num_tiles, device=device) * _BLOCK + _BLOCK - 1) // chunk_length
    span = int((last - first).max()) + 1
    touched = first[:, None] + torch.arange(span, device=device)[None, :]  # (N, span) chunks of each tile
    inside = (touched <= last[:, None]) & (touched < num_chunks)
    near = near_chunk(touched[:, :, None, None], touched[None, None, :, :])  # (N, span, N, span)
    near = near & inside[:, :, None, None] & inside[None, None, :, :]
    query_tile, key_tile = _tile_range(num_tiles, device)
    reach = near.any(3).any(1) | (query_tile == key_tile)
    whole = inside.all(1) & (last < num_chunks)  # tile made of real chunks only
    full = (near | ~(inside[:, :, None, None] & inside[None, None, :, :])).all(3).all(1)
    return reach, full & whole[:, None] & whole[None, :]


class SortedRows(NamedTuple):
    """Where the sorted rows of `flex_lsh_attention` come from (`lsh.lsh_attention` sorts them).

    Attributes:
        positions: ``(B, A, L)`` the position in each slot, ``-1`` for the dummy slots that pad a round.
        slot_of: ``(B, H, R, T)`` the slot of each position in each round (for ``correct_duplicates``).
        key_valid: ``(B, T)`` bool, False at padding.
    """

    positions: torch.Tensor
    slot_of: torch.Tensor
    key_valid: torch.Tensor


def flex_lsh_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sorted_rows: SortedRows,
    pattern: ChunkPattern,
    masked_self: float,
    correct_duplicates: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked attention of `lsh.lsh_attention` over its sorted rows, in one FlexAttention call.

    Args:
        query, key, value: ``(B, A, L, Dh)`` sorted rows (``A`` rows of ``L`` slots: per head and round, or with
            ``wrap_around`` per head, the rounds one after another).
        sorted_rows: the position in each slot, the slot of each position, the real positions (`SortedRows`).
        pattern: the `ChunkPattern` (chunk length, neighbours, causal, wrap-around).
        masked_self: the score of a query's own key (far below any real score: it counts only when the query has
            nothing else).
        correct_duplicates: subtract ``log`` of the number of rounds in which the pair meets.

    Returns:
        ``(B, A, L, Dh)`` outputs and ``(B, A, L)`` log-sum-exp of the scores.
    """
    row_length = query.shape[2]
    block_mask, score_mod = lsh_block_mask(query, sorted_rows, pattern, masked_self, correct_duplicates)
    query, key, value = _pad_sequence((query, key, value), block_mask.seq_lengths[0])
    out, lse = _run(query, key, value, block_mask, score_mod, return_lse=True)
    return out[:, :, :row_length], lse[:, :, :row_length]


def lsh_block_mask(
    query: torch.Tensor,
    sorted_rows: SortedRows,
    pattern: ChunkPattern,
    masked_self: float,
    correct_duplicates: bool = False,
):
    """The `BlockMask` and ``score_mod`` of `flex_lsh_attention`."""
    sorted_positions, slot_of, key_valid = sorted_rows
    chunk_length, before, after = pattern.chunk_length, pattern.before, pattern.after
    causal, wrap_around = pattern.causal, pattern.wrap_around
    batch, rows, row_length, _ = query.shape
    device = query.device
    num_chunks = row_length // chunk_length
    padded = _pad_to_block(row_length)
    offsets = sorted({o % num_chunks if wrap_around else o for o in range(-before, after + 1)})
    length = key_valid.shape[1]
    positions = F.pad(sorted_positions, (0, padded - row_length), value=-1)  # (B, A, Lp)
    # a dummy slot (position -1) reads index T of the per-position tables: never valid, never meeting
    lookup = torch.where(positions >= 0, positions, length)
    valid = F.pad(key_valid.bool(), (0, 1), value=False)  # (B, T + 1)

    def near_chunk(query_chunk, key_chunk):
        offset = key_chunk - query_chunk
        if wrap_around:
            offset = offset % num_chunks
            return sum((offset == o) for o in offsets) > 0
        return (offset >= -before) & (offset <= after)

    def mask_mod(b, h, q_idx, kv_idx):
        query_position, key_position = positions[b, h, q_idx], positions[b, h, kv_idx]
        allowed = near_chunk(q_idx // chunk_length, kv_idx // chunk_length) & valid[b, lookup[b, h, kv_idx]]
        if causal:
            allowed = allowed & (key_position <= query_position)
        # its own key (scored masked_self) keeps every row non-empty; the dummy slots only see themselves
        return (allowed & (key_position >= 0) & (q_idx < row_length)) | (q_idx == kv_idx)

    rounds = slot_of.shape[2]
    # a tensor, not the Python float: FlexAttention traces score_mod (compiled, or through its eager wrapper), and a
    # float it closes over is a constant of the graph, so another value (finfo.min / 2 without wrap-around, -1e5
    # with it) recompiles, and newer torch turns it into a SymFloat that flex_attention refuses
    self_score = torch.tensor(masked_self, dtype=torch.promote_types(query.dtype, torch.float32), device=device)
    chunk_of = None
    if correct_duplicates:
        chunk_of = F.pad(slot_of // chunk_length, (0, 1), value=-(10**9))  # (B, H, R, T + 1)

    def score_mod(score, b, h, q_idx, kv_idx):
        query_position, key_position = positions[b, h, q_idx], positions[b, h, kv_idx]
        score = torch.where(key_position == query_position, self_score.to(score.dtype), score)
        if chunk_of is not None:
            head = h // rounds
            meets = 0
            for r in range(rounds):
                offset = chunk_of[b, head, r, lookup[b, h, kv_idx]] - chunk_of[b, head, r, lookup[b, h, q_idx]]
                meets = meets + ((offset >= -before) & (offset <= after)).to(score.dtype)
            score = score - torch.log(torch.clamp(meets, min=1.0))
        return score

    reach, _ = _chunk_tiles(padded, chunk_length, num_chunks, near_chunk, device)
    full = torch.zeros_like(reach)  # the self score and the sorted positions are per element: no tile is plain
    return _block_mask(reach[None, None], full[None, None], mask_mod, padded), score_mod


__all__ = [
    "block_sparse_block_mask",
    "chunked_local_block_mask",
    "flex_block_sparse_attention",
    "flex_chunked_local_attention",
    "flex_lsh_attention",
    "flex_sliding_window_attention",
    "lsh_block_mask",
    "SortedRows",
    "sliding_window_block_mask",
]
