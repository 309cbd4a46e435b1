"""The ``"flex_attention"`` route: the sparse patterns as FlexAttention block masks (``torch.nn.attention.flex_attention``).

With ``attn_implementation="flex_attention"`` two sparse kernels hand their whole pattern to one FlexAttention call
instead of cutting the sequence into chunks or block slabs:

- `flex_sliding_window_attention` (Longformer): the window (with dilation, causal or not) plus the global keys;
- `flex_block_sparse_attention` (BigBird): the global, window and random blocks, a repeated block counted as often
  as it appears (a ``log(count)`` score term, as `block_sparse_attention_reference` does);
- `flex_chunked_local_attention` (Reformer's local layers).

Reformer's LSH rounds are not here: they are batched dense chunks whose rounds are combined by their log-sum-exp, so
they run through `chunked.chunked_window_attention` under every implementation (every tile of a FlexAttention call
would be partial). The dense parts (Longformer's global rows, BigBird's short inputs, cached steps) go through
`backend.attend`, which treats ``"flex_attention"`` as ``"sdpa"``.

**What a block mask holds.** Each pattern is split in two. The ``mask_mod`` and the block tables hold only what the
shape and the pattern decide (the window, BigBird's block plan, the chunks); the data of a call (padding, which
tokens are global) enters through the ``score_mod``, as ``-inf`` scores, which FlexAttention applies in every tile.
So a `BlockMask` depends on ``(shape, pattern)`` alone: built once per model forward, shared by every layer with the
same pattern, and kept across calls in a `BlockMaskCache` the model owns. The tables come from the pattern's
arithmetic (no ``T x T`` tensor is built), with no host synchronisation; a test checks them against the exact
``mask_mod`` (`tests/attention/test_flex.py`): every allowed pair lies in a listed tile, and a "full" tile (where
the kernel skips ``mask_mod``) is allowed throughout.

**Tiles** (`Tiles`): queries in tiles of 128; keys in tiles of one BigBird block or Reformer chunk where it divides
128 (``BLOCK_SIZE=(128, 64)`` for 64-token blocks, so the kernel computes no key outside the blocks it needs), else 128.
Sequences are padded inside to a multiple of 128 (padded keys scored ``-inf``, padded queries dropped).

**Compilation.** On CUDA the attention runs through one ``torch.compile(flex_attention)`` with automatic dynamic
shapes: a second length recompiles once as a dynamic graph, and further lengths reuse it. If a kernel does not fit
the device's shared memory (Triton's ``OutOfResources``), the call is repeated with `SMALL_KERNEL_OPTIONS` and the
cache remembers that for the pattern. Elsewhere FlexAttention runs uncompiled (PyTorch's reference implementation,
which materialises the scores; tests and CPU only), and a CPU call that needs a gradient, or one under
``torch.compile``, runs `_tiled_reference` (plain PyTorch over the same block mask: PyTorch's FlexAttention has no CPU
backward). FlexAttention has no dropout: a call with ``dropout_p > 0`` takes the ``"sdpa"`` path of its kernel
instead (`flex_or_sdpa`, with a warning once).
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.utils import logging

from .backend import FLEX
from .patterns import ChunkPattern, WindowPattern

logger = logging.get_logger(__name__)

_TILE = 128  # query tiles, and key tiles unless a pattern's blocks fit them better
# a smaller kernel for devices whose shared memory a pattern's default one exceeds (pytorch#133254: BigBird's kernel
# asked 442,368 bytes of an H200's 232,448); the block sizes divide every tile size `Tiles` chooses
SMALL_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_M1": 32, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 32}
SMALL_KERNEL_OPTIONS["num_stages"] = 1


@dataclass(frozen=True)
class Tiles:
    """FlexAttention's sparse block size of a pattern: ``query`` x ``key`` tokens per tile."""

    query: int = _TILE
    key: int = _TILE

    @classmethod
    def for_blocks(cls, block: int) -> Tiles:
        """Key tiles of one ``block`` (BigBird's block, Reformer's chunk) where it divides 128 and is at least 16
        (the kernel's smallest), else 128."""
        return cls(_TILE, block if 16 <= block <= _TILE and _TILE % block == 0 else _TILE)


def size_key(*sizes: int) -> tuple[int, ...]:
    """The sizes (lengths, block counts) that go into a `BlockMaskCache` key: ``sizes``, or ``()`` inside a
    `torch.compile` graph. There a size may be symbolic, and looking it up in a dict would specialise the graph on
    it (one compilation per length); the cache of a compiled forward is its own, and every size in its keys comes
    from that forward's one input shape, so the keys stay distinct without them."""
    return () if torch.compiler.is_compiling() else sizes


class BlockMaskCache:
    """Block masks (and what goes with them) by ``(shape, pattern)`` key: built once, then shared by the layers of a
    forward and reused by later calls of the same shape. A model owns one (its state, not a module's); it holds at
    most ``max_entries`` (the oldest used goes first). Under ``torch.compile`` a model passes a fresh one per forward,
    so the graph builds the masks once per forward and mutates nothing outside it."""

    def __init__(self, max_entries: int = 32):
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple, object] = OrderedDict()

    def get(self, key: tuple, build: Callable[[], object]) -> object:
        """The entry under ``key``, built by ``build()`` the first time."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        value = self._entries[key] = build()
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def lookup(self, key: tuple) -> object | None:
        """The entry under ``key``, or ``None`` (nothing is built)."""
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def _cached(cache: BlockMaskCache | None, key: tuple, build: Callable[[], object]) -> object:
    return build() if cache is None else cache.get(key, build)


def flex_or_sdpa(implementation: str | None, dropout_p: float) -> str | None:
    """The implementation a sparse kernel runs: ``"flex_attention"`` takes its ``"sdpa"`` path under attention
    dropout (FlexAttention has none), said once; anything else as given."""
    if implementation == FLEX and dropout_p > 0.0:
        logger.warning_once(
            f"attn_implementation='flex_attention' has no attention dropout (dropout_p={dropout_p}): the sparse "
            "attention takes its 'sdpa' path while dropout is on. Set the attention dropout to 0 "
            "(attention_probs_dropout_prob, local_attention_probs_dropout_prob) to train with FlexAttention."
        )
        return "sdpa"
    return implementation


def _flex_module():
    from torch.nn.attention import flex_attention as module  # imported on first use: not on the CPU import path

    return module


_COMPILED: dict[str, Callable] = {}  # the one compiled FlexAttention function (a memo of torch.compile, no decision)


def _compiled_flex() -> Callable:
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(_flex_module().flex_attention)  # automatic dynamic shapes
    return _COMPILED["flex"]


def _is_out_of_shared_memory(error: Exception) -> bool:
    text = f"{type(error).__name__} {error}".lower()
    return "outofresources" in text or "shared memory" in text


def _run(query, key, value, block_mask, score_mod=None, cache: BlockMaskCache | None = None, pattern_key=()):
    """One FlexAttention call: compiled on CUDA, the uncompiled reference on CPU in eval, `_tiled_reference` for a
    CPU call that needs a gradient or runs under ``torch.compile``. Returns ``(B, H, T, Dh)``."""
    if key.dtype != query.dtype or value.dtype != query.dtype:  # FlexAttention takes one dtype
        key, value = key.to(query.dtype), value.to(query.dtype)
    if query.device.type == "cpu":
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if needs_grad or torch.compiler.is_compiling():
            return _tiled_reference(query, key, value, block_mask, score_mod)
        with warnings.catch_warnings():  # the CPU reference is uncompiled on purpose (tests and CPU only)
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return _flex_module().flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask)
    function = _flex_module().flex_attention if torch.compiler.is_compiling() else _compiled_flex()
    options_key = ("kernel_options", *pattern_key)
    options = None if cache is None else cache.lookup(options_key)
    try:
        return function(query, key, value, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
    except Exception as error:
        if options is not None or not _is_out_of_shared_memory(error):
            raise
    logger.warning_once(
        "FlexAttention's default kernel does not fit this device's shared memory; using smaller tiles "
        f"(kernel_options={SMALL_KERNEL_OPTIONS})."
    )
    if cache is not None:
        cache.get(options_key, lambda: dict(SMALL_KERNEL_OPTIONS))
    return function(
        query, key, value, score_mod=score_mod, block_mask=block_mask, kernel_options=dict(SMALL_KERNEL_OPTIONS)
    )


def _tiles(counts: torch.Tensor, indices: torch.Tensor | None, num_key_tiles: int) -> torch.Tensor:
    """FlexAttention's (counts, indices) of one kind of tile back to a ``(B, H, Nq, Nk)`` bool table."""
    table = torch.zeros(*counts.shape, num_key_tiles + 1, dtype=torch.bool, device=counts.device)
    if indices is not None:
        listed = torch.arange(indices.shape[-1], device=counts.device) < counts[..., None].long()
        table.scatter_(-1, torch.where(listed, indices.long(), num_key_tiles), True)
    return table[..., :num_key_tiles]


def _tiled_reference(query, key, value, block_mask, score_mod=None):
    """What FlexAttention computes, in plain PyTorch autograd over the full scores (CPU training and CPU graphs,
    where PyTorch's FlexAttention has no backward; small inputs only): ``mask_mod`` inside the partial tiles,
    everything inside the full tiles, nothing elsewhere, and ``score_mod`` on every score. A row with nothing
    allowed gives zeros (as FlexAttention does)."""
    batch, heads, length, _ = query.shape
    key_length = key.shape[2]
    query_tile, key_tile = block_mask.BLOCK_SIZE
    num_key_tiles = -(-key_length // key_tile)
    partial = _tiles(block_mask.kv_num_blocks, block_mask.kv_indices, num_key_tiles)
    full = _tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, num_key_tiles)
    device = query.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.arange(heads, device=device)[None, :, None, None]
    q_idx = torch.arange(length, device=device)[None, None, :, None]
    kv_idx = torch.arange(key_length, device=device)[None, None, None, :]

    def spread(table):  # tiles -> elements, cut to the lengths
        return table.repeat_interleave(query_tile, -2).repeat_interleave(key_tile, -1)[..., :length, :key_length]

    allowed = (spread(partial) & block_mask.mask_mod(b, h, q_idx, kv_idx)) | spread(full)
    work = torch.promote_types(query.dtype, torch.float32)
    scores = (query.to(work) @ key.to(work).transpose(-1, -2)) * query.shape[-1] ** -0.5
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    scores = scores.masked_fill(~allowed, float("-inf"))
    has_key = torch.isfinite(scores).any(dim=-1, keepdim=True)  # (B, H, T, 1)
    scores = torch.where(has_key, scores, 0.0)
    probs = scores.softmax(dim=-1) * has_key
    return (probs @ value.to(work)).to(query.dtype)


def _ordered(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``(B, H, Nq, Nk)`` bool tile table as FlexAttention's (counts, indices): the True columns of each row
    first, in order."""
    counts = table.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(table.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts.contiguous(), indices.contiguous()


def _block_mask(reach: torch.Tensor, full: torch.Tensor, mask_mod, lengths: tuple[int, int], tiles: Tiles):
    """A `BlockMask` from the tiles a query tile may reach and those ``mask_mod`` allows throughout (``(1|H, Nq, Nk)``
    bool; a full tile is not listed as partial, so the kernel skips ``mask_mod`` there)."""
    full = (full & reach)[None]
    partial = reach[None] & ~full
    counts, indices = _ordered(partial)
    full_counts, full_indices = _ordered(full)
    return _flex_module().BlockMask.from_kv_blocks(
        counts,
        indices,
        full_counts,
        full_indices,
        BLOCK_SIZE=(tiles.query, tiles.key),
        mask_mod=mask_mod,
        seq_lengths=lengths,
    )


def _pad_to_tile(length: int) -> int:
    return -(-length // _TILE) * _TILE


def _pad_sequence(tensors, padded: int):
    """Pad ``(B, H, T, Dh)`` tensors to ``padded`` positions."""
    return [F.pad(t, (0, 0, 0, padded - t.shape[2])) if t.shape[2] != padded else t for t in tensors]


def _touched(num_tiles: int, tile: int, block: int, device) -> torch.Tensor:
    """``(N, span)`` the blocks of ``block`` tokens each tile of ``tile`` tokens touches (the last one repeated
    where a tile touches fewer). ``span`` is the bound ``(tile - 1) // block + 2`` from the arithmetic, not a
    maximum read back from the device."""
    span = (tile - 1) // block + 2
    starts = torch.arange(num_tiles, device=device) * tile
    first, last = starts // block, (starts + tile - 1) // block
    return torch.minimum(first[:, None] + torch.arange(span, device=device)[None, :], last[:, None])


# --------------------------------------------------------------------------------------------------- Longformer
def flex_sliding_window_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: WindowPattern,
    key_valid: torch.Tensor | None = None,
    global_tokens=None,
    cache: BlockMaskCache | None = None,
) -> torch.Tensor:
    """`sliding_window.sliding_window_attention` in one FlexAttention call (no dropout).

    The keys are laid out as the global tokens' keys first (``G`` slots padded to a tile), then the sequence: the
    block mask then depends on ``(T, G, pattern)`` only, and which tokens are global enters as data (`score_mod`).
    A global key that also lies in a window counts once (in the global slots).

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        pattern: the `WindowPattern` (one-sided window ``W`` in steps of ``dilation``, causal or not).
        key_valid: ``(B, T)`` bool, True at real tokens (``None``: all real).
        global_tokens: `sliding_window.GlobalTokens` (keys every query sees; causal: those at or before it), or
            ``None``; their own rows are computed like any other (Longformer replaces them).
        cache: where the block mask is kept (`BlockMaskCache`); ``None`` builds it for this call.

    Returns:
        ``(B, H, T, Dh)``, equal to `sliding_window_attention_reference` up to float rounding.
    """
    batch, _, length, _ = query.shape
    device = query.device
    padded = _pad_to_tile(length)
    num_slots = 0 if global_tokens is None else global_tokens.num_slots
    global_padded = _pad_to_tile(num_slots) if num_slots else 0
    block_mask = _cached(
        cache,
        ("window", pattern, *size_key(padded, global_padded), device),
        lambda: sliding_window_block_mask(padded, global_padded, pattern, device),
    )
    valid = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid.bool()
    valid = F.pad(valid, (0, padded - length), value=False)  # (B, Tp)
    window_ok = valid
    if global_tokens is not None:  # a global key is seen through its slot, not again in a window
        window_ok = valid & ~F.pad(global_tokens.mask.bool(), (0, padded - length), value=False)
    query, key, value = _pad_sequence((query, key, value), padded)
    score_mod = _window_score_mod(window_ok, valid, global_tokens, global_padded, pattern.causal)
    if global_tokens is not None:
        global_keys, global_values = (
            F.pad(global_tokens.gather(t, dim=2), (0, 0, 0, global_padded - num_slots)) for t in (key, value)
        )
        key, value = torch.cat([global_keys, key], dim=2), torch.cat([global_values, value], dim=2)
    pattern_key = ("window", pattern, *size_key(padded, global_padded), device)
    return _run(query, key, value, block_mask, score_mod, cache, pattern_key)[:, :, :length]


def _window_score_mod(window_ok, valid, global_tokens, global_padded: int, causal: bool):
    """The data of a sliding-window call: ``-inf`` for a padded or global key in a window (a padded query keeps
    itself), for an unused global slot and (causal) a global key after the query."""
    padded = valid.shape[1]

    def window_allowed(b, q_idx, position):
        return window_ok[b, position] | ((position == q_idx) & ~valid[b, q_idx])

    if global_tokens is None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return torch.where(window_allowed(b, q_idx, kv_idx), score, float("-inf"))

        return score_mod

    slots = global_tokens.num_slots
    slot_valid = F.pad(global_tokens.valid.bool(), (0, global_padded - slots), value=False)  # (B, Gp)
    slot_position = F.pad(global_tokens.indices, (0, global_padded - slots))  # (B, Gp)

    def score_mod(score, b, h, q_idx, kv_idx):
        slot = kv_idx.clamp(max=global_padded - 1)
        global_allowed = slot_valid[b, slot]
        if causal:
            global_allowed = global_allowed & (slot_position[b, slot] <= q_idx)
        position = (kv_idx - global_padded).clamp(0, padded - 1)
        allowed = torch.where(kv_idx < global_padded, global_allowed, window_allowed(b, q_idx, position))
        return torch.where(allowed, score, float("-inf"))

    return score_mod


def sliding_window_block_mask(padded: int, global_padded: int, pattern: WindowPattern, device):
    """The `BlockMask` of `flex_sliding_window_attention` over ``padded`` queries and ``global_padded + padded``
    keys (global slots first): the window by distance, every global slot allowed."""
    reach_steps = pattern.window * pattern.dilation
    lowest = 0 if pattern.causal else -reach_steps
    dilation = pattern.dilation

    def mask_mod(b, h, q_idx, kv_idx):
        distance = q_idx - (kv_idx - global_padded)
        in_window = (distance <= reach_steps) & (distance >= lowest)
        if dilation > 1:
            in_window = in_window & (distance % dilation == 0)
        return in_window | (kv_idx < global_padded)

    # tiles: the distances between a query tile and a key tile span [d0 - (t-1), d0 + (t-1)], d0 = (i - j) * t
    num_tiles = padded // _TILE
    tiles = torch.arange(num_tiles, device=device)
    start = (tiles[:, None] - tiles[None, :]) * _TILE
    low, high = start - (_TILE - 1), start + (_TILE - 1)
    reach = (high >= lowest) & (low <= reach_steps)  # (N, N); dilation only thins a tile (exact in mask_mod)
    full = (low >= lowest) & (high <= reach_steps) & (dilation == 1)
    global_tiles = global_padded // _TILE
    if global_tiles:
        every = torch.ones(num_tiles, global_tiles, dtype=torch.bool, device=device)
        reach, full = torch.cat([every, reach], dim=1), torch.cat([every, full], dim=1)
    return _block_mask(reach[None], full[None], mask_mod, (padded, global_padded + padded), Tiles())


# ------------------------------------------------------------------------------------------------------ BigBird
def flex_block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_size: int,
    counts: torch.Tensor | Callable[[], torch.Tensor],
    key_valid: torch.Tensor,
    cache: BlockMaskCache | None = None,
    plan_key: tuple = (),
) -> torch.Tensor:
    """`block_sparse.block_sparse_attention` in one FlexAttention call (no dropout).

    Args:
        query, key, value: ``(B, H, T, Dh)``, ``T`` a multiple of ``block_size``.
        block_size: BigBird's block ``b``.
        counts: ``(H, N, N)`` how often each query block attends to each key block (`build_block_sparse_counts`,
            ``N = T / b``), on the inputs' device; or a function that builds them (called only when the cache does
            not hold the block mask yet).
        key_valid: ``(B, T)`` bool, True at real tokens (a row without any sees every key: `block_sparse._padded`).
        cache, plan_key: where the block mask is kept, and what identifies ``counts`` there (the caller's random
            plan: layer, seed, mode); ``cache=None`` builds it for this call.

    Returns:
        ``(B, H, T, Dh)``, equal to `block_sparse_attention_reference` up to float rounding.
    """
    length = query.shape[2]
    padded = _pad_to_tile(length)
    work = torch.promote_types(query.dtype, torch.float32)  # the scores' dtype inside FlexAttention
    full_key = ("blocks", block_size, *size_key(length, padded), query.device, work, *plan_key)

    def build():
        return block_sparse_block_mask(block_size, counts() if callable(counts) else counts, padded, work)

    block_mask, log_counts = _cached(cache, full_key, build)
    valid = F.pad(key_valid.bool(), (0, padded - length), value=False)  # (B, Tp)

    def score_mod(score, b, h, q_idx, kv_idx):
        score = score + log_counts[h, q_idx // block_size, kv_idx // block_size]
        return torch.where(valid[b, kv_idx], score, float("-inf"))

    query, key, value = _pad_sequence((query, key, value), padded)
    return _run(query, key, value, block_mask, score_mod, cache, full_key)[:, :, :length]


def block_sparse_block_mask(block_size: int, counts: torch.Tensor, padded: int, dtype=torch.float32):
    """The `BlockMask` of `flex_block_sparse_attention` over ``padded`` positions, and the ``(H, N', N')``
    ``log(count)`` table (in ``dtype``) its ``score_mod`` reads (the padding past ``N * b`` queries as block 0, a global row whose
    output is dropped; its keys are never reached)."""
    device = counts.device
    num_blocks = counts.shape[-1]
    tiles = Tiles.for_blocks(block_size)
    extra = -(-padded // block_size) - num_blocks
    counts = F.pad(counts, (0, extra, 0, extra))
    counts[:, num_blocks:] = counts[:, :1]
    log_counts = counts.clamp(min=1).to(dtype).log()

    def mask_mod(b, h, q_idx, kv_idx):
        return counts[h, q_idx // block_size, kv_idx // block_size] > 0

    # every element of a query tile against every element of a key tile, from the blocks they touch
    query_blocks = _touched(padded // tiles.query, tiles.query, block_size, device)  # (Nq, sq)
    key_blocks = _touched(padded // tiles.key, tiles.key, block_size, device)  # (Nk, sk)
    sub = counts[:, query_blocks][:, :, :, key_blocks] > 0  # (H, Nq, sq, Nk, sk)
    reach, full = sub.any(4).any(2), sub.all(4).all(2)
    return _block_mask(reach, full, mask_mod, (padded, padded), tiles), log_counts


# ----------------------------------------------------------------------------------------------------- Reformer
def flex_chunked_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor | None = None,
    cache: BlockMaskCache | None = None,
) -> torch.Tensor:
    """`lsh.chunked_local_attention` in one FlexAttention call (no dropout): each position attends to the real keys
    of its own chunk and the ``pattern.before`` / ``pattern.after`` neighbouring chunks (modulo the number of chunks
    with ``wrap_around``), causal by position; a query without any such key attends to itself."""
    batch, _, length, _ = query.shape
    device = query.device
    size, before = pattern.chunk_length, pattern.before
    padded = _pad_to_tile(length)
    block_mask = _cached(
        cache,
        ("chunks", pattern, *size_key(length), device),
        lambda: chunked_local_block_mask(length, pattern, device),
    )
    real = torch.ones(batch, length, dtype=torch.bool, device=device) if key_valid is None else key_valid.bool()
    num_chunks = -(-length // size)
    if pattern.causal:  # real keys in [start of the chunk `before` chunks back, the query] (wrapping reaches later)
        position = torch.arange(length, device=device)
        start = ((position // size - before).clamp(min=0) * size)[None].expand(batch, -1)
        running = F.pad(real.long().cumsum(1), (1, 0))  # (B, T + 1)
        lonely = (running[:, 1:] - running.gather(1, start)) == 0
    else:
        chunk_real = F.pad(real, (0, num_chunks * size - length)).view(batch, num_chunks, -1).any(-1)
        reach_chunk = torch.zeros(batch, num_chunks, dtype=torch.bool, device=device)
        for offset in sorted(set(_chunk_offsets(pattern, num_chunks))):
            target = torch.arange(num_chunks, device=device) + offset
            inside = (target >= 0) & (target < num_chunks)
            if pattern.wrap_around:
                target, inside = target % num_chunks, torch.ones_like(inside)
            reach_chunk |= inside[None] & chunk_real[:, target.clamp(0, num_chunks - 1)]
        lonely = ~reach_chunk.repeat_interleave(size, dim=1)[:, :length]
    lonely = F.pad(lonely, (0, padded - length), value=True)  # (B, Tp); the padding to the tile sees itself
    valid = F.pad(real, (0, padded - length), value=False)

    def score_mod(score, b, h, q_idx, kv_idx):
        allowed = valid[b, kv_idx] | ((q_idx == kv_idx) & lonely[b, q_idx])
        return torch.where(allowed, score, float("-inf"))

    query, key, value = _pad_sequence((query, key, value), padded)
    pattern_key = ("chunks", pattern, *size_key(length), device)
    return _run(query, key, value, block_mask, score_mod, cache, pattern_key)[:, :, :length]


def _chunk_offsets(pattern: ChunkPattern, num_chunks: int) -> list[int]:
    offsets = range(-pattern.before, pattern.after + 1)
    return [o % num_chunks for o in offsets] if pattern.wrap_around else list(offsets)


def chunked_local_block_mask(length: int, pattern: ChunkPattern, device):
    """The `BlockMask` of `flex_chunked_local_attention` for ``length`` positions (padded inside to a tile): the
    chunks in reach (causal by position), and each position itself."""
    size, before, after = pattern.chunk_length, pattern.before, pattern.after
    causal, wrap_around = pattern.causal, pattern.wrap_around
    num_chunks = -(-length // size)
    chunked = num_chunks * size  # positions past it belong to no chunk
    padded = _pad_to_tile(length)
    offsets = sorted(set(_chunk_offsets(pattern, num_chunks)))
    tiles = Tiles.for_blocks(size)

    def near_chunk(query_chunk, key_chunk):
        offset = key_chunk - query_chunk
        if wrap_around:
            offset = offset % num_chunks
            return sum((offset == o) for o in offsets) > 0
        return (offset >= -before) & (offset <= after)

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = near_chunk(q_idx // size, kv_idx // size) & (q_idx < chunked) & (kv_idx < chunked)
        if causal:
            allowed = allowed & (kv_idx <= q_idx)
        return allowed | (q_idx == kv_idx)

    query_chunks = _touched(padded // tiles.query, tiles.query, size, device)  # (Nq, sq)
    key_chunks = _touched(padded // tiles.key, tiles.key, size, device)  # (Nk, sk)
    near = near_chunk(query_chunks[:, :, None, None], key_chunks[None, None, :, :])  # (Nq, sq, Nk, sk)
    inside_q, inside_k = query_chunks < num_chunks, key_chunks < num_chunks
    near = near & inside_q[:, :, None, None] & inside_k[None, None, :, :]
    query_tile = torch.arange(padded // tiles.query, device=device)[:, None]
    key_tile = torch.arange(padded // tiles.key, device=device)[None, :]
    query_first, query_last = query_tile * tiles.query, query_tile * tiles.query + tiles.query - 1
    key_first, key_last = key_tile * tiles.key, key_tile * tiles.key + tiles.key - 1
    diagonal = (key_first <= query_last) & (query_first <= key_last)  # tiles that hold some (i, i)
    reach = near.any(3).any(1) | diagonal
    whole_q = (query_last < chunked).expand(-1, key_tile.shape[1])
    whole_k = (key_last < chunked).expand(query_tile.shape[0], -1)
    full = near.all(3).all(1) & whole_q & whole_k
    if causal:  # a tile wholly at or below the diagonal is causal throughout; one wholly above is out of reach
        reach = reach & (key_first <= query_last)
        full = full & (key_last <= query_first)
    return _block_mask(reach[None], full[None], mask_mod, (padded, padded), tiles)


__all__ = [
    "BlockMaskCache",
    "SMALL_KERNEL_OPTIONS",
    "Tiles",
    "block_sparse_block_mask",
    "chunked_local_block_mask",
    "flex_block_sparse_attention",
    "flex_chunked_local_attention",
    "flex_or_sdpa",
    "flex_sliding_window_attention",
    "size_key",
    "sliding_window_block_mask",
]
