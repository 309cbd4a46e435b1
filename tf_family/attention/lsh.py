"""Reformer's attention kernels (Kitaev, Kaiser & Levskaya 2020, arXiv:2001.04451): LSH attention (section 2) and
local chunked attention.

**LSH attention.** Queries and keys are the same vectors (shared-QK; keys are RMS-normalised, `normalize_shared_keys`).
Each of ``R`` hashing rounds draws a random rotation (`lsh_rotations`, from a `torch.Generator`, never the global
RNG) and puts every position in a bucket: ``argmax([xR, -xR])`` (angular LSH), or a mixed-radix id of several such
hashes when ``num_buckets`` is factorised (`hash_vectors`). Per round the positions are sorted by (bucket, position)
(padding last), cut into chunks of ``C`` and each chunk attends to itself and ``before`` / ``after`` neighbouring
chunks. Causal masking and padding are by original position; a query never attends to itself unless it has nothing
else to attend to in any round (section 2.2, "shared-QK"). The rounds are combined by their log-sum-exp weights,
which is one softmax over the multiset of keys a query met; with ``correct_duplicates`` a key met ``n`` times has
``log n`` subtracted from its score, so each distinct key counts once.

The dense twin (`lsh_attention_reference`) builds the same attention as a ``(B, H, T, T)`` count of how often each
pair met, from the same buckets, and runs one dense softmax with ``log(count)`` as a score bias. With one bucket it
is full shared-QK attention (`shared_qk_attention`).

**Local attention** (`chunked_local_attention`): positions cut into chunks of ``C``, each chunk attends to itself and
``before`` / ``after`` chunks, through `backend.attend`; dense twin `chunked_local_attention_reference`.

**transformers compatibility** (``ChunkPattern.wrap_around``): transformers' Reformer looks at neighbouring chunks
with a roll, so the first chunk sees the last one (bidirectional local attention: position 0 attends to the end of
the sequence), and it sorts all rounds as one sequence, so the first chunk of round ``r`` sees the last chunk of
round ``r - 1``. ``wrap_around=True`` reproduces that (for parity); the default keeps rounds apart and does not wrap.

Mask values come from the score dtype at call time (``finfo.min``; the self-attention fallback ``finfo.min / 2``),
never from stored buffers. Tensors are ``(B, H, T, Dh)``; ``key_valid`` is ``(B, T)`` bool, True at real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .backend import FLEX, NATIVE, attend, check_implementation
from .chunked import WindowScores, chunked_window_attention, pad_chunks, window_view
from .dense import dense_attention
from .flex import BlockMaskCache, flex_chunked_local_attention, flex_or_sdpa
from .patterns import ChunkPattern


# ---------------------------------------------------------------------------------------------------------- hashing
def bucket_factors(num_buckets: int | Sequence[int]) -> list[int]:
    """The factors of a (possibly factorised) bucket count; each must be even (a hash yields ``+-`` directions)."""
    factors = [num_buckets] if isinstance(num_buckets, int) else list(num_buckets)
    if not factors or any(not isinstance(f, int) or f < 2 or f % 2 for f in factors):
        raise ValueError(f"num_buckets must be an even int >= 2 or a list of them, got {num_buckets!r}.")
    return factors


def auto_num_buckets(length: int, chunk_length: int, max_positions: int) -> int | list[int]:
    """transformers' automatic bucket count for a ``length``-token call: about ``2 * length / chunk_length`` (the
    paper's recommendation, rounded down to a power of two, at least 2), factorised into two powers of two when it
    exceeds ``2 * max(sqrt(max_positions / chunk_length), chunk_length)``. Computed per call, never stored."""
    exponent = max((2 * (length // chunk_length)).bit_length() - 1, 1)
    limit = 2 * max(int((max_positions // chunk_length) ** 0.5), chunk_length)
    if 2**exponent > limit:
        return [2 ** (exponent // 2), 2 ** (exponent - exponent // 2)]
    return 2**exponent


def lsh_rotations(
    seed: int,
    num_heads: int,
    head_dim: int,
    num_hashes: int,
    num_buckets: int | Sequence[int],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Random rotations ``(H, Dh, R, sum(factors) / 2)`` drawn on the CPU from ``torch.Generator().manual_seed(seed)``
    (the global RNG is untouched; the same numbers as transformers' ``torch.manual_seed(hash_seed); torch.randn``).

    Memoised per arguments (a pure function of them; callers never write to the result): `torch.export` and
    `torch.compile` then see a constant, where a draw traced inside them would keep the generator but not its seed
    (the second call of the exported program would hash with other rotations). A model warms the memo when built."""
    width = sum(bucket_factors(num_buckets)) // 2
    key = (seed, num_heads, head_dim, num_hashes, width, dtype)
    rotations = _ROTATIONS.get(key)
    if rotations is None:
        generator = torch.Generator().manual_seed(seed)
        shape = (num_heads, head_dim, num_hashes, width)
        rotations = torch.randn(shape, generator=generator, dtype=dtype, device="cpu")
        if not (torch.compiler.is_compiling() or torch.compiler.is_exporting()) and len(_ROTATIONS) < 256:
            _ROTATIONS[key] = rotations
    return rotations.to(device)


_ROTATIONS: dict[tuple, torch.Tensor] = {}  # lsh_rotations' memo


def hash_vectors(vectors: torch.Tensor, rotations: torch.Tensor, num_buckets: int | Sequence[int]) -> torch.Tensor:
    """Angular LSH buckets ``(B, H, R, T)`` of ``vectors`` ``(B, H, T, Dh)`` under ``rotations`` ``(H, Dh, R, W)``.

    With one factor ``n``: ``argmax([xR, -xR])`` in ``[0, n)``. With factors ``n1, n2, ...``: each factor hashes
    with its own slice of the rotation and the ids combine in mixed radix (``b1 + n1 * b2 + ...``). No gradient."""
    factors = bucket_factors(num_buckets)
    rotated = torch.einsum("bhtd,hdrk->bhrtk", vectors.detach(), rotations.to(vectors.dtype))  # (B, H, R, T, W)
    buckets, start, radix = None, 0, 1
    for factor in factors:
        part = rotated[..., start : start + factor // 2]
        # argmax([part, -part]) (first maximum) without building the concatenation
        high, high_at = part.max(dim=-1)
        low, low_at = part.min(dim=-1)
        ids = torch.where(high >= -low, high_at, low_at + factor // 2)  # (B, H, R, T)
        buckets = ids if buckets is None else buckets + radix * ids
        start, radix = start + factor // 2, radix * factor
    return buckets


def normalize_shared_keys(vectors: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Shared-QK keys: the query vectors scaled to unit root-mean-square (``x / sqrt(mean(x^2) + eps)``)."""
    return vectors * torch.rsqrt(vectors.pow(2).mean(dim=-1, keepdim=True) + eps)


# ------------------------------------------------------------------------------------------------------ shared pieces
def _mask_values(dtype: torch.dtype, transformers_values: bool = False) -> tuple[float, float]:
    """(masked score, self-only score) for scores of ``dtype``: far below any real score, the second above the
    first, so a query with nothing else attends to itself and such a round weighs nothing next to a real one.
    ``transformers_values``: transformers' constants where they are finite (float32 / float64)."""
    if transformers_values and dtype in (torch.float32, torch.float64):
        return -1e9, -1e5
    smallest = torch.finfo(dtype).min
    return smallest, smallest / 2


def _score_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


# the sort bucket of padding (dummy slots: one more): past every bucket id, and data-independent (torch.export)
_PAD_BUCKET = 2**31


def _valid(key_valid: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    if key_valid is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return key_valid.to(torch.bool)


def _sort_order(buckets: torch.Tensor, valid: torch.Tensor, padded_length: int) -> torch.Tensor:
    """Per round, the positions sorted by (bucket, position), padding and the ``padded_length - T`` dummy
    positions last: ``(B, H, R, Tp)``."""
    batch, heads, rounds, length = buckets.shape
    keys = _position_bucket_keys(buckets, valid)  # (B, H, R, T)
    keys = torch.nn.functional.pad(keys, (0, padded_length - length), value=_PAD_BUCKET + 1)
    position = torch.arange(padded_length, device=buckets.device)
    return (keys * padded_length + position).argsort(dim=-1)  # unique keys: the order is stable


def _window_positions(positions: torch.Tensor, pattern: ChunkPattern) -> torch.Tensor:
    """Key positions of each chunk's window ``(B, A, N, C)`` -> ``(B, A, N, span*C)``, ``-1`` for a missing
    neighbour (with wrap-around the neighbours roll over the row's chunks)."""
    padded = pad_chunks(positions[..., None], pattern.before, pattern.after, pattern.wrap_around, -1)
    return window_view(padded, pattern.span, pattern.chunk_length)[..., 0, :]


# ------------------------------------------------------------------------------------------------------------ LSH
def lsh_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    buckets: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor | None = None,
    *,
    correct_duplicates: bool = False,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> torch.Tensor:
    """Chunked LSH attention (module docstring): linear in ``T`` for a fixed chunk length.

    Nine parameters: the vectors, their buckets and the pattern, then three per-call options by keyword.

    Args:
        query: ``(B, H, T, Dh)`` shared query-key vectors; key: ``(B, H, T, Dh)`` the keys (normally
            `normalize_shared_keys` of the queries); value: ``(B, H, T, Dh)``. Scores are ``q . k / sqrt(Dh)``.
        buckets: ``(B, H, R, T)`` bucket ids per round (`hash_vectors`).
        pattern: chunk length and neighbours, causal, wrap-around.
        key_valid: ``(B, T)`` bool, False at padding (never attended to; sorted last).
        correct_duplicates: subtract ``log`` of how many times a query met a key (over rounds), so each distinct
            key counts once (not in wrap-around mode, where rounds see each other's chunks).
        dropout_p: dropout on the attention probabilities (training).
        implementation: checked, and otherwise not used: the rounds' chunks are batched dense tiles combined by
            their log-sum-exp, which neither PyTorch's SDPA nor a FlexAttention block mask (every tile partial)
            computes better, so every implementation runs `chunked.chunked_window_attention` on them.

    Returns:
        ``(B, H, T, Dh)``. A padded query's output is finite and meaningless.
    """
    check_implementation(implementation)
    if correct_duplicates and pattern.wrap_around:
        raise NotImplementedError(
            "correct_duplicates is only defined for rounds kept apart; set wrap_around=False (the transformers-"
            "compatible chunking lets rounds see each other's chunks)."
        )
    batch, _, length, head_dim = query.shape
    rounds = _SortedRounds.of(buckets, _valid(key_valid, batch, length, query.device), pattern)
    out, lse = _chunked_rounds(query, key, value, rounds, pattern, correct_duplicates, dropout_p)
    # back to the original order, per round, then combine the rounds by their log-sum-exp weights
    out, lse = rounds.unsort(out, head_dim), rounds.unsort(lse, 1)[..., 0]  # (B, H, R, T, Dh), (B, H, R, T)
    return _combine_rounds(out, lse, pattern).to(value.dtype)


@dataclass
class _SortedRounds:
    """The hashing rounds of `lsh_attention` sorted by (bucket, position), and the indices that sort vectors into
    chunks and back. With wrap-around the ``R * N`` chunks of a head are one row (transformers); else each round is
    its own row.

    Attributes:
        buckets: ``(B, H, R, T)``; valid: ``(B, T)`` bool, the real positions.
        order: ``(B, H, R, Tp)`` the position in each sorted slot (``Tp = N * C``, dummy positions last).
        inverse: ``(B, H, R, T)`` the slot of each position.
        sort_index, slot_index, position_index: `_RowGather`'s indices into and out of the sorted order.
        positions: ``(B, rows, chunks, C)`` the position in each slot, ``-1`` for the dummy slots.
        rows, chunks, num_chunks: rows of chunks, chunks per row, chunks per round.
    """

    buckets: torch.Tensor
    valid: torch.Tensor
    order: torch.Tensor
    inverse: torch.Tensor
    sort_index: torch.Tensor
    slot_index: torch.Tensor
    position_index: torch.Tensor
    positions: torch.Tensor
    rows: int
    chunks: int
    num_chunks: int
    chunk_length: int

    @classmethod
    def of(cls, buckets: torch.Tensor, valid: torch.Tensor, pattern: ChunkPattern) -> _SortedRounds:
        batch, heads, rounds, length = buckets.shape
        size = pattern.chunk_length
        num_chunks = -(-length // size)
        padded = num_chunks * size
        order = _sort_order(buckets, valid, padded)  # (B, H, R, Tp): the position in each sorted slot
        arange = torch.arange(padded, device=order.device).expand_as(order)
        inverse = torch.empty_like(order).scatter_(-1, order, arange)
        # (B, H, R, T): the slot of each position, gathered into a tensor of its own rather than sliced (a compiled
        # graph would guard on whether the slice is contiguous, i.e. on T being a multiple of the chunk, and compile
        # once more for the lengths that are)
        inverse = inverse.gather(-1, torch.arange(length, device=order.device).expand(batch, heads, rounds, length))
        offsets = torch.arange(rounds, device=order.device)[:, None]
        # slots beyond T read position T - 1 (masked as keys, dropped as queries); their gradient goes nowhere
        sort_index = (order.clamp(max=length - 1)).view(batch, heads, rounds * padded)
        slot_index = (inverse + offsets * padded).view(batch, heads, rounds * length)
        position_index = torch.where(order < length, order + offsets * length, rounds * length).flatten(2)
        rows, chunks = (heads, rounds * num_chunks) if pattern.wrap_around else (heads * rounds, num_chunks)
        positions = torch.where(order < length, order, -1).view(batch, rows, chunks, size)
        return cls(
            buckets=buckets,
            valid=valid,
            order=order,
            inverse=inverse,
            sort_index=sort_index,
            slot_index=slot_index,
            position_index=position_index,
            positions=positions,
            rows=rows,
            chunks=chunks,
            num_chunks=num_chunks,
            chunk_length=size,
        )

    def sort(self, tensor: torch.Tensor) -> torch.Tensor:
        """``(B, H, T, Dh)`` -> ``(B, rows, chunks * C, Dh)``, in the input's dtype."""
        batch, _, _, head_dim = tensor.shape
        rounds = self.buckets.shape[2]
        gathered = _RowGather.apply(tensor, self.sort_index, self.slot_index, rounds)
        return gathered.view(batch, self.rows, self.chunks * self.chunk_length, head_dim)

    def unsort(self, tensor: torch.Tensor, width: int) -> torch.Tensor:
        """``(B, rows, chunks, C[, Dh])`` -> ``(B, H, R, T, width)``."""
        batch, heads, rounds, length = self.buckets.shape
        flat = tensor.reshape(batch, heads, rounds * self.num_chunks * self.chunk_length, width)
        return _RowGather.apply(flat, self.slot_index, self.position_index, 1).view(
            batch, heads, rounds, length, width
        )


def _chunked_rounds(
    query, key, value, rounds: _SortedRounds, pattern: ChunkPattern, correct_duplicates: bool, dropout_p: float
):
    """The sorted rows' attention chunk by chunk (`chunked.chunked_window_attention`, in float32 or float64):
    ``(B, rows, chunks, C, Dh)`` outputs and ``(B, rows, chunks, C)`` log-sum-exp."""
    batch, heads, length, head_dim = query.shape
    num_rounds, size = rounds.buckets.shape[2], pattern.chunk_length
    rows, chunks, num_chunks, positions, valid = (
        rounds.rows,
        rounds.chunks,
        rounds.num_chunks,
        rounds.positions,
        rounds.valid,
    )

    def sort(tensor):  # (B, H, T, Dh) -> (B, rows, chunks, C, Dh)
        work = tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()
        return rounds.sort(work).view(batch, rows, chunks, size, head_dim)

    key_positions = _window_positions(positions, pattern)  # (B, rows, chunks, K)
    key_ok = (key_positions >= 0) & valid.gather(1, key_positions.clamp(min=0).flatten(1)).view(key_positions.shape)
    query_pos, key_pos = positions[..., :, None], key_positions[..., None, :]
    blocked = ~key_ok[..., None, :]
    if pattern.causal:
        blocked = blocked | (key_pos > query_pos)
    if pattern.causal_buckets:
        blocked = blocked | _outside_causal_bucket(rounds.order, rounds.buckets, valid, pattern, rows, chunks)
    bias = None
    if correct_duplicates:
        counts = _duplicate_counts(rounds.order, positions.view(batch, heads, num_rounds, num_chunks, size),
                                   key_positions.view(batch, heads, num_rounds, num_chunks, -1), pattern, length,
                                   _position_bucket_keys(rounds.buckets, valid))  # fmt: skip
    work_dtype = _score_dtype(query.dtype)
    if correct_duplicates:
        bias = -counts.to(work_dtype).log().view(batch, rows, chunks, size, -1)
    masked, self_only = _mask_values(work_dtype, pattern.wrap_around)
    self_slot = key_pos == query_pos if pattern.wrap_around else "diagonal"
    scores = WindowScores(blocked, self_slot, bias, masked, self_only)
    return chunked_window_attention(
        sort(query), sort(key), sort(value), pattern.before, pattern.after, pattern.wrap_around, scores, dropout_p
    )  # (B, rows, chunks, C, Dh), (B, rows, chunks, C)


def _combine_rounds(out: torch.Tensor, lse: torch.Tensor, pattern: ChunkPattern) -> torch.Tensor:
    """The rounds' outputs ``(B, H, R, T, Dh)`` weighted by their log-sum-exp ``(B, H, R, T)``: ``(B, H, T, Dh)``."""
    if lse.shape[2] == 1:
        return out[:, :, 0]
    # exp(lse_r - logsumexp_r lse_r): transformers' formula (its rounding included), else computed max-shifted
    weights = (lse - lse.logsumexp(dim=2, keepdim=True)).exp() if pattern.wrap_around else lse.softmax(dim=2)
    return (out * weights[..., None]).sum(dim=2)  # (B, H, T, Dh)


class _RowGather(torch.autograd.Function):
    """Rows ``index`` ``(B, H, Y)`` of each ``(b, h)`` of a ``(B, H, X, W)`` tensor (one ``index_select`` over the
    flattened rows: several times faster on CPU than ``gather`` with an expanded index), whose backward selects
    rows too (no scatter-add): row ``x`` of the gradient sums ``groups`` consecutive blocks of rows ``back_index``
    ``(B, H, groups * X)`` of the incoming gradient; ``back_index == Y`` reads a zero row."""

    @staticmethod
    def forward(ctx, tensor, index, back_index, groups):
        ctx.save_for_backward(back_index)
        ctx.groups = groups
        return _select_rows(tensor, index)

    @staticmethod
    def backward(ctx, grad):
        (back_index,) = ctx.saved_tensors
        batch, heads, _, width = grad.shape
        selected = _select_rows(torch.nn.functional.pad(grad, (0, 0, 0, 1)), back_index)
        if ctx.groups > 1:
            selected = selected.view(batch, heads, ctx.groups, -1, width).sum(dim=2)
        return selected, None, None, None


def _select_rows(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    batch, heads, rows, width = tensor.shape
    offsets = torch.arange(0, batch * heads * rows, rows, device=index.device).view(batch, heads, 1)
    flat = tensor.reshape(batch * heads * rows, width).index_select(0, (index + offsets).flatten())
    return flat.view(batch, heads, index.shape[-1], width)


def _position_bucket_keys(buckets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B, H, R, T)`` the bucket each position sorts by: its own, or one past every bucket for padding."""
    return torch.where(valid[:, None, None, :], buckets, _PAD_BUCKET)


def _sorted_bucket_keys(order: torch.Tensor, buckets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(B, H, R, Tp)`` the sort key's bucket of each sorted slot (padding and dummy slots: ids past every
    bucket), so equal values mean the same bucket of real tokens."""
    keys = _position_bucket_keys(buckets, valid)
    keys = torch.nn.functional.pad(keys, (0, order.shape[-1] - buckets.shape[-1]), value=_PAD_BUCKET + 1)
    return keys.gather(-1, order)


def _outside_causal_bucket(order, buckets, valid, pattern: ChunkPattern, rows: int, chunks: int) -> torch.Tensor:
    """``(B, rows, chunks, C, span*C)`` True where a key slot is not one of the query's ``before * C`` nearest
    earlier slots of its own bucket (``causal_buckets``)."""
    batch, size = order.shape[0], pattern.chunk_length
    slot_buckets = _sorted_bucket_keys(order, buckets, valid).view(batch, rows, chunks, size)
    slots = torch.arange(chunks * size, device=order.device).view(1, 1, chunks, size).expand(batch, rows, -1, -1)
    key_buckets, key_slots = _window_positions(slot_buckets, pattern), _window_positions(slots, pattern)
    distance = slots[..., :, None] - key_slots[..., None, :]  # (B, rows, chunks, C, span*C)
    same = slot_buckets[..., :, None] == key_buckets[..., None, :]
    return ~same | (distance < 0) | (distance > pattern.before * size) | (key_slots[..., None, :] < 0)


def _duplicate_counts(
    order, positions, key_positions, pattern: ChunkPattern, length: int, bucket_keys: torch.Tensor
) -> torch.Tensor:
    """For every (query, key) slot of the chunked scores, in how many rounds that pair met (>= 1 where they meet in
    this slot; rounds kept apart). ``bucket_keys`` ``(B, H, R, T)``: each position's sort bucket per round."""
    batch, heads, rounds, padded = order.shape
    rank = order.argsort(dim=-1)[..., :length]  # (B, H, R, T): slot per round

    def per_round(table, slot_positions):  # (B, H, R, T+1) at (B, H, R, N, X) -> (B, H, R, N, X, R): every round
        flat = torch.where(slot_positions < 0, length, slot_positions).flatten(2)  # (B, H, R*N*X)
        gathered = table.gather(3, flat[:, :, None, :].expand(-1, -1, rounds, -1))  # (B, H, R, R*N*X)
        return gathered.view(batch, heads, rounds, *slot_positions.shape[2:]).movedim(2, -1)

    if pattern.causal_buckets:  # same bucket, and the key among the query's before * C nearest earlier slots
        slot_of = torch.nn.functional.pad(rank, (0, 1), value=-(10**9))  # position -1 -> never meets
        bucket_of = torch.nn.functional.pad(bucket_keys, (0, 1), value=-1)
        distance = per_round(slot_of, positions)[..., :, None, :] - per_round(slot_of, key_positions)[..., None, :, :]
        same = per_round(bucket_of, positions)[..., :, None, :] == per_round(bucket_of, key_positions)[..., None, :, :]
        meets = same & (distance >= 0) & (distance <= pattern.before * pattern.chunk_length)
        return meets.sum(dim=-1).clamp(min=1).to(torch.float32)
    chunk_of = torch.nn.functional.pad(rank // pattern.chunk_length, (0, 1), value=-(10**9))  # -1 -> never meets
    query_chunks = per_round(chunk_of, positions)[..., :, None, :]  # (B, H, R, N, C, 1, R)
    key_chunks = per_round(chunk_of, key_positions)[..., None, :, :]  # (B, H, R, N, 1, span*C, R)
    offset = key_chunks - query_chunks
    meets = (offset >= -pattern.before) & (offset <= pattern.after)
    return meets.sum(dim=-1).clamp(min=1).to(torch.float32)  # (B, H, R, N, C, span*C)


def lsh_meeting_counts(
    buckets: torch.Tensor, pattern: ChunkPattern, key_valid: torch.Tensor | None = None
) -> torch.Tensor:
    """``(B, H, T, T)`` how many times each query slot meets each key slot in the chunk windows, summed over rounds
    (the dense view of `lsh_attention`'s chunks, from the same buckets), computed pair by pair from each position's
    chunk index in every round."""
    batch, heads, rounds, length = buckets.shape
    size = pattern.chunk_length
    num_chunks = -(-length // size)
    padded = num_chunks * size
    valid = _valid(key_valid, batch, length, buckets.device)
    if not pattern.wrap_around and torch.compiler.is_exporting():
        # the dummy positions sort after every real one, so leaving them out changes no rank (and keeps a graph
        # with a dynamic length free of a branch on the length)
        padded = length
    rank = _sort_order(buckets, valid, padded).argsort(dim=-1)[..., :length]  # (B, H, R, T): slot per position
    if pattern.causal_buckets:  # same bucket, and the key among the query's before * C nearest earlier slots
        keys = _position_bucket_keys(buckets, valid)
        distance = rank[..., :, None] - rank[..., None, :]  # (B, H, R, Tq, Tk)
        meets = (keys[..., :, None] == keys[..., None, :]) & (distance >= 0) & (distance <= pattern.before * size)
        return meets.sum(dim=2).to(torch.float32)
    if not pattern.wrap_around:
        chunk = rank // size  # (B, H, R, T)
        offset = chunk[..., None, :] - chunk[..., :, None]  # (B, H, R, Tq, Tk)
        meets = (offset >= -pattern.before) & (offset <= pattern.after)
        return meets.sum(dim=2).to(torch.float32)
    total = rounds * num_chunks  # transformers: one sequence of R * N chunks, neighbours found by a roll
    chunk = (rank + torch.arange(rounds, device=rank.device)[:, None] * padded) // size  # (B, H, R, T)
    offset = (chunk[:, :, None, None, :] - chunk[:, :, :, :, None, None]) % total  # (B, H, Rq, Tq, Rk, Tk)
    reach = torch.zeros(total, dtype=torch.float32, device=rank.device)  # a chunk reached twice counts twice
    for o in range(-pattern.before, pattern.after + 1):
        reach[o % total] += 1
    return reach[offset].sum(dim=(2, 4))


def _self_fallback(allowed: torch.Tensor) -> torch.Tensor:
    """A query with no allowed key other than itself attends to itself only (shared-QK rule)."""
    eye = torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)
    others = allowed & ~eye
    return others | (eye & ~others.any(dim=-1, keepdim=True))


def lsh_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    buckets: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor | None = None,
    correct_duplicates: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense twin of `lsh_attention`: one softmax over all keys, restricted to the pairs that meet in some
    round's chunk window (`lsh_meeting_counts`), with ``log(count)`` added to the scores (each meeting counts)
    unless ``correct_duplicates``. Returns ``(B, H, T, Dh)`` outputs and ``(B, H, T, T)`` probabilities."""
    batch, heads, rounds, length = buckets.shape
    valid = _valid(key_valid, batch, length, query.device)
    counts = lsh_meeting_counts(buckets, pattern, valid)  # (B, H, T, T)
    allowed = (counts > 0) & valid[:, None, None, :]
    if pattern.causal:
        allowed &= torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    allowed = _self_fallback(allowed)
    bias = None if correct_duplicates else counts.clamp(min=1).to(_score_dtype(query.dtype)).log()
    return dense_attention(query, key, value, allowed, 0.0, key_bias=bias)


def shared_qk_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_valid: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full shared-QK attention (what LSH attention becomes with one bucket, or for inputs within one chunk):
    every valid key (at or before the query if ``causal``) except the query itself, unless it has no other. Through
    `backend.attend`; returns ``(B, H, T, Dh)`` and, for ``"eager"``, the probabilities."""
    batch, _, length, _ = query.shape
    allowed = _valid(key_valid, batch, length, query.device)[:, None, None, :].expand(-1, 1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    return attend(query, key, value, _self_fallback(allowed), None, dropout_p, implementation)


def cached_shared_qk_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_valid: torch.Tensor,
    new: int,
    implementation: str | None = "sdpa",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A cached decoding step of `shared_qk_attention`: the last ``new`` of the shared query-key vectors
    ``(B, H, P + t, Dh)`` attend the cached and new positions (causal by index, ``key_valid`` ``(B, P + t)``),
    every key but the query itself unless it has no other."""
    total = query.shape[2]
    rows = torch.arange(total - new, total, device=query.device)
    columns = torch.arange(total, device=query.device)
    allowed = (columns[None, :] < rows[:, None]) & key_valid[:, None, :]  # (B, t, P + t): others only
    allowed = allowed | ((columns[None, :] == rows[:, None]) & ~allowed.any(-1, keepdim=True))
    return attend(query[:, :, -new:], key, value, allowed[:, None], dropout_p=0.0, implementation=implementation)


# ---------------------------------------------------------------------------------------------------------- local
def build_chunked_local_mask(
    length: int, pattern: ChunkPattern, key_valid: torch.Tensor | None = None, device=None
) -> torch.Tensor:
    """``(B or 1, T, T)`` bool: query ``i`` may attend key ``j`` when ``j``'s chunk is within ``before`` / ``after``
    chunks of ``i``'s (modulo the number of chunks with wrap-around), ``j`` is real and (causal) ``j <= i``."""
    num_chunks = -(-length // pattern.chunk_length)
    chunk = torch.arange(length, device=device) // pattern.chunk_length
    offset = chunk[None, :] - chunk[:, None]  # (T, T)
    if pattern.wrap_around:
        reach = torch.zeros(num_chunks, dtype=torch.bool, device=device)
        reach[[o % num_chunks for o in range(-pattern.before, pattern.after + 1)]] = True
        allowed = reach[offset % num_chunks]
    else:
        allowed = (offset >= -pattern.before) & (offset <= pattern.after)
    if pattern.causal:
        allowed &= torch.ones(length, length, dtype=torch.bool, device=device).tril()
    allowed = allowed[None]
    if key_valid is not None:
        allowed = allowed & key_valid.to(torch.bool)[:, None, :]
    return allowed


def chunked_local_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense twin of `chunked_local_attention` (the full mask of `build_chunked_local_mask`)."""
    allowed = build_chunked_local_mask(query.shape[2], pattern, key_valid, query.device)[:, None]
    return dense_attention(query, key, value, allowed)


def chunked_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
    block_masks: BlockMaskCache | None = None,
) -> torch.Tensor:
    """Local attention by chunks: each chunk of ``C`` queries attends to the keys of its own and its neighbouring
    chunks. ``(B, H, T, Dh)`` in and out; any ``T`` (the last chunk is padded inside). ``implementation``
    ``"tff_native"`` runs `chunked.chunked_window_attention` on float32 / float64 (windows read in place; on this
    project's CPU it measures faster than one `backend.attend` call over copied windows); ``"sdpa"``, ``"eager"``
    and other dtypes fold the chunks into the batch and go through `backend.attend` (``"sdpa"``: one batched
    PyTorch SDPA call; ``"eager"``: the dense softmax per chunk); ``"flex_attention"``: one FlexAttention call
    (`flex.flex_chunked_local_attention`, its block mask kept in ``block_masks``; under dropout, the ``"sdpa"``
    path: `flex.flex_or_sdpa`)."""
    implementation = flex_or_sdpa(implementation, dropout_p)
    if implementation == FLEX:
        return flex_chunked_local_attention(query, key, value, pattern, key_valid, block_masks)
    batch, heads, length, head_dim = query.shape
    size = pattern.chunk_length
    num_chunks = -(-length // size)
    padded = num_chunks * size
    valid = torch.nn.functional.pad(_valid(key_valid, batch, length, query.device), (0, padded - length))
    positions = torch.arange(padded, device=query.device).view(1, 1, num_chunks, size)
    key_positions = _window_positions(positions, pattern)[0, 0]  # (N, span*C)
    query_positions = positions[0, 0]  # (N, C)
    key_ok = (key_positions >= 0)[None] & valid.gather(
        1, key_positions.clamp(min=0).flatten()[None].expand(batch, -1)
    ).view(batch, num_chunks, -1)  # (B, N, span*C)
    allowed = key_ok[:, :, None, :]  # (B, N, 1 or C, span*C)
    if pattern.causal:
        allowed = allowed & (key_positions[:, None, :] <= query_positions[:, :, None])
    # a query with nothing to attend to (padding only) attends to itself: finite, meaningless output
    self_slot = key_positions[:, None, :] == query_positions[:, :, None]  # (N, C, span*C)
    allowed = allowed | (self_slot & ~allowed.any(dim=-1, keepdim=True))

    def chunks(tensor):  # (B, H, T, Dh) -> (B, H, N, C, Dh)
        tensor = torch.nn.functional.pad(tensor, (0, 0, 0, padded - length))
        return tensor.view(batch, heads, num_chunks, size, head_dim)

    if implementation == NATIVE and query.dtype in (torch.float32, torch.float64):
        scores = WindowScores(blocked=~allowed[:, None], masked=torch.finfo(query.dtype).min, self_only=0.0)
        out, _ = chunked_window_attention(
            chunks(query),
            chunks(key),
            chunks(value),
            pattern.before,
            pattern.after,
            pattern.wrap_around,
            scores,
            dropout_p,
        )
    else:  # fold the chunks into the batch: (B*N, H, C, Dh) against copied windows (B*N, H, span*C, Dh)

        def fold(tensor):
            return tensor.transpose(1, 2).reshape(batch * num_chunks, heads, *tensor.shape[-2:])

        def windows(tensor):
            padded_chunks = pad_chunks(chunks(tensor), pattern.before, pattern.after, pattern.wrap_around)
            return window_view(padded_chunks, pattern.span, size).transpose(-1, -2)  # (B, H, N, span*C, Dh)

        allowed = allowed.expand(-1, -1, size, -1).reshape(batch * num_chunks, 1, size, -1)
        out, _ = attend(
            fold(chunks(query)), fold(windows(key)), fold(windows(value)), allowed, None, dropout_p, implementation
        )
        out = out.view(batch, num_chunks, heads, size, head_dim).transpose(1, 2)
    return out.reshape(batch, heads, padded, head_dim)[:, :, :length]


def cached_chunked_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: ChunkPattern,
    key_valid: torch.Tensor,
    position_ids: torch.Tensor,
    implementation: str | None = "sdpa",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A cached decoding step of `chunked_local_attention`: the new queries ``(B, H, t, Dh)`` attend the keys
    ``(B, H, P + t, Dh)`` of their own chunk and ``pattern.before`` chunks back, chunks counted by
    ``position_ids`` ``(B, P + t)`` (real tokens), so left padding does not move them; causal by index."""
    total, new = key.shape[2], query.shape[2]
    size = pattern.chunk_length
    query_chunk = position_ids[:, -new:, None] // size  # (B, t, 1)
    key_chunk = position_ids[:, None, :] // size  # (B, 1, P + t)
    offset = key_chunk - query_chunk
    allowed = (offset >= -pattern.before) & (offset <= 0) & key_valid[:, None, :]
    rows = torch.arange(total - new, total, device=query.device)
    allowed &= torch.arange(total, device=query.device)[None, None, :] <= rows[None, :, None]
    return attend(query, key, value, allowed[:, None], dropout_p=0.0, implementation=implementation)


__all__ = [
    "ChunkPattern",
    "auto_num_buckets",
    "bucket_factors",
    "build_chunked_local_mask",
    "cached_chunked_local_attention",
    "cached_shared_qk_attention",
    "chunked_local_attention",
    "chunked_local_attention_reference",
    "hash_vectors",
    "lsh_attention",
    "lsh_attention_reference",
    "lsh_meeting_counts",
    "lsh_rotations",
    "normalize_shared_keys",
    "shared_qk_attention",
]
