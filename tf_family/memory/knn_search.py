"""Retrieval backends of the Memorizing Transformer's kNN memory (`tf_family.memory.knn_memory`).

One function, `knn_top_k`, in front of three backends (scores are inner products of L2-normalised vectors):

* ``"exact"``: matrix products and an exact top-k (the default; on this CPU faster than faiss for per-document
  memories of up to 65k entries). Float32 on CPU runs the native search kernel (`native_top_k`: the products in
  cache-sized tiles, each query's k best kept against a rising threshold; ``csrc/knn_top_k.cpp`` beside
  `tf_family.attention.native`); otherwise, or where the kernel cannot be built, PyTorch: large memories go through
  `grouped_candidates` (the scores in chunks, a running
  maximum per group, then a selection over the best groups' members: exact, with a selection over the group maxima
  and one over the few members that reach the least chosen maximum, `grouped_bound` and `select_top_k_above`,
  instead of one over ``N``), with the (row, query) pairs in blocks (`scored_blocks`) so that the ``(B, H, T, N)``
  score matrix is never held at once; long selections go through `select_top_k`;
* ``"bucketed"``: meliad's approximate top-k: the slots fall into ``k`` strided buckets (slot ``s`` in bucket
  ``s mod k``) and each bucket contributes its best slot;
* ``"faiss"``: a faiss index per (row, head), persistent (`KNNMemory.faiss_indexes`, `tf_family.memory.knn_faiss`:
  built once, then kept in step with every write in place; flat = exact, IVF approximate).

`top_k_reference` is the brute-force twin (a Python sort per query) they are tested against. The searches are not
differentiable: their scores carry no gradient (the attention over the retrieved pairs recomputes its logits).

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``N`` memory slots (the capacity), ``K`` neighbours, ``Dh`` head width.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..attention import native
from .knn import FaissKNNStore

SEARCH_KINDS = ("exact", "bucketed", "faiss")


# ------------------------------------------------------------------------------------------------------------ search
def _check_search(queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, k: int) -> None:
    if queries.dim() != 4 or keys.dim() != 4 or queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"queries must be (B, H, T, Dh) and keys (B, H, N, Dh), got {tuple(queries.shape)} and {tuple(keys.shape)}."
        )
    if allowed.dim() != 4 or allowed.shape[-1] != keys.shape[2] or allowed.shape[-2] not in (1, queries.shape[2]):
        raise ValueError(f"allowed must broadcast to (B, H, T, N), got {tuple(allowed.shape)}.")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")


class Expired(NamedTuple):
    """The memory slots that some queries of a segment may no longer retrieve: a memory written token by token
    (``knn_retrieval="token"``) would already have overwritten them with the segment's own earlier positions."""

    slots: torch.Tensor  # (C,) long, distinct
    gone: torch.Tensor  # (T, C) bool: True where slot c is gone for query t


class MemoryAllowed(NamedTuple):
    """Which memory slots each query may retrieve: ``valid`` bool broadcastable to ``(B, H, T, N)`` (the real
    entries of the row's current document), less the ``expired`` (slot, query) pairs (None: none)."""

    valid: torch.Tensor
    expired: Expired | None = None


def expand_expired(allowed: torch.Tensor, expired: Expired | None, length: int) -> torch.Tensor:
    """``allowed`` with the ``expired`` pairs removed, as one bool tensor broadcastable to ``(B, H, T, N)``."""
    if expired is None:
        return allowed
    slots, gone = expired
    allowed = allowed.expand(*allowed.shape[:2], length, allowed.shape[-1]).clone()
    allowed[..., slots] &= ~gone
    return allowed


@torch.no_grad()
def _masked_scores(
    queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, expired: Expired | None
) -> torch.Tensor:
    scores = torch.einsum("bhtd,bhnd->bhtn", queries, keys.to(queries.dtype))  # (B, H, T, N)
    if torch.compiler.is_exporting() or not bool(allowed.all()):  # export: no branch on the data
        scores.masked_fill_(~allowed, float("-inf"))  # in place: the score tensor is the large one
    if expired is not None:  # only C columns differ per query: mask them without a (T, N) mask
        slots, gone = expired
        scores[..., slots] = scores[..., slots].masked_fill(gone, float("-inf"))
    return scores


def exact_top_k(
    queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, k: int, expired: Expired | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``min(k, N)`` best allowed slots per query: ``(B, H, T, K)`` scores (``-inf`` past the allowed ones) and
    slot indices, by decreasing score. ``allowed`` is bool, broadcastable to ``(B, H, T, N)``; ``expired`` (slots
    ``(C,)`` and a ``(T, C)`` mask) removes a few more (query, slot) pairs without a ``(T, N)`` mask."""
    scores, slots = exact_candidates(queries, keys, allowed, k, expired)
    if isinstance(slots, torch.Tensor):  # the native kernel's: already the top k, sorted
        return scores, slots
    best, position = select_top_k_above(scores, grouped_bound(scores, slots, k), k)
    return best, position if slots is None else slots.gather(-1, position)


DIRECT_SELECT = 256  # rows of up to this many scores go to `torch.topk` as they are (`select_top_k`)


def select_top_k(scores: torch.Tensor, k: int, sorted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores.topk(min(k, n), dim=-1, sorted=sorted)`` over rows of ``n`` scores, through group maxima for long
    rows (``sorted=False``: the same ``k`` in any order, cheaper where only the set matters).

    The ``n`` columns are cut into ``g`` chunks of ``G ~ 4 k``, column ``c * G + j`` in group ``j``; the ``k``
    groups with the best maxima hold the ``k`` best columns (`grouped_candidates` gives the argument), and the least
    of those ``k`` maxima bounds the ``k``-th best score from below, so a selection over the ``G`` maxima and one
    over the few of those groups' ``g * k`` members that reach the bound (`select_top_k_above`) replace one over
    ``n`` (on a CPU the selections, not the products, are most of an exact search over a few thousand slots; with the
    packed second selection a narrow first one pays: docs/benchmarks.md, "Measurements behind choices in the code").
    The same values; the indices may differ only between equal scores."""
    width = scores.shape[-1]
    k = k if k <= width else width  # min(k, width), decided from the sizes' ranges when traced
    groups = round(width / max(4 * k, 1))
    # (an exported graph selects directly: the grouping is sized from the width, a branch on a dynamic length)
    if torch.compiler.is_exporting() or width <= DIRECT_SELECT or groups < 2:
        return scores.topk(k, dim=-1, sorted=sorted)
    # a chunk count near g that divides the width saves padding (a copy of the scores); G stays >= k
    divisors = [count for count in range(max(2, groups // 2), 2 * groups + 1) if width % count == 0]
    if divisors:
        groups = min(divisors, key=lambda count: abs(count - groups))
    size = -(-width // groups)
    chunks = -(-width // size)
    if chunks * size != width:
        scores = F.pad(scores, (0, chunks * size - width), value=float("-inf"))
    grouped = scores.unflatten(-1, (chunks, size))  # (..., g, G)
    maxima, chosen = grouped.amax(-2).topk(k, dim=-1, sorted=False)  # (..., K): the groups and their maxima
    members = grouped.gather(-1, chosen.unsqueeze(-2).expand(*grouped.shape[:-1], k))  # (..., g, K)
    values, position = select_top_k_above(members.flatten(-2), maxima.amin(-1, keepdim=True), k, sorted)
    index = chosen.gather(-1, position % k) + torch.div(position, k, rounding_mode="floor") * size
    return values, index.clamp_max_(width - 1)


def select_top_k_above(
    scores: torch.Tensor, bound: torch.Tensor | None, k: int, sorted: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """`select_top_k` for rows whose ``k``-th best score is known to be at least ``bound`` (broadcastable to
    ``(..., 1)``; e.g. `grouped_bound`; ``None``: no bound known, `select_top_k` itself): only the scores ``>= bound`` can be among the ``k`` best, so they are
    packed, in order, into the narrowest width that holds every row's (a few more than ``k`` for the grouped
    search's candidates, against two selections over ~``sqrt(n k)`` scores each: measured faster, docs/benchmarks.md),
    and selected there. Rows where more than
    half the scores pass (a bound of ``-inf``: fewer than ``k`` allowed candidates) or fewer than ``k`` do go to
    `select_top_k`. The same values; the indices may differ only between equal scores.

    A bound above a row's ``k``-th best score makes the result wrong: the caller guarantees it."""
    if bound is None:
        return select_top_k(scores, k, sorted)
    width = scores.shape[-1]
    k = k if k <= width else width  # min(k, width), decided from the sizes' ranges when traced
    rows = scores.reshape(-1, width)
    keep = rows >= bound.expand(*scores.shape[:-1], 1).reshape(-1, 1)  # (R, n)
    flat = keep.view(-1).nonzero().squeeze(1)  # the kept (row, column) pairs, row by row, columns in order
    row = torch.div(flat, width, rounding_mode="floor")
    # counted from the kept pairs: keep.sum(-1) would copy the (R, n) mask into int64 (25 MB at 8k entries,
    # page-faulted in anew at every step)
    counts = torch.bincount(row, minlength=rows.shape[0])  # (R,)
    wide = (counts > width // 2) | (counts < k)  # selected whole
    if bool(wide.all()):
        return select_top_k(scores, k, sorted)
    if bool(wide.any()):
        narrow = ~wide.index_select(0, row)
        flat, row = flat[narrow], row[narrow]
        counts = counts.masked_fill(wide, 0)
    packed_width = int(counts.max())
    start = counts.cumsum(0) - counts  # where each row's kept scores begin in `flat`
    target = torch.arange(flat.shape[0], device=flat.device) - start.index_select(0, row) + row * packed_width
    packed = rows.new_full((rows.shape[0], packed_width), float("-inf"))
    packed.view(-1).index_copy_(0, target, rows.view(-1).index_select(0, flat))
    columns = torch.zeros(rows.shape[0], packed_width, dtype=torch.long, device=flat.device)
    columns.view(-1).index_copy_(0, target, flat - row * width)
    values, position = packed.topk(k, dim=-1, sorted=sorted)
    index = columns.gather(-1, position)
    if bool(wide.any()):
        rest = wide.nonzero().squeeze(1)
        rest_values, rest_index = select_top_k(rows.index_select(0, rest), k, sorted)
        values.index_copy_(0, rest, rest_values)
        index.index_copy_(0, rest, rest_index)
    shape = (*scores.shape[:-1], k)
    return values.view(shape), index.view(shape)


def grouped_bound(scores: torch.Tensor, slots: GroupedSlots | torch.Tensor | None, k: int) -> torch.Tensor | None:
    """A lower bound ``(B, H, T, 1)`` of the ``k``-th best of `grouped_candidates`' candidate ``scores`` (and so of
    any set holding them, e.g. merged with the segment's own scores), for `select_top_k_above`: the least of the
    chosen groups' maxima (``k`` distinct slots score at least that much), or for the native kernel's sorted top
    ``k`` (``slots`` a tensor, `native_top_k`) its ``k``-th score. None when the candidates are every slot
    (``slots`` None), fewer than ``k`` groups were chosen (groups of fewer than ``k`` slots) or fewer than ``k``
    slots exist; ``-inf`` where fewer than ``k`` allowed slots (groups holding one) were found."""
    if isinstance(slots, torch.Tensor):
        return scores[..., k - 1 : k] if scores.shape[-1] >= k else None
    if not isinstance(slots, GroupedSlots):
        return None
    top = slots.groups.shape[-1]
    if top < k:
        return None
    return scores.unflatten(-1, (-1, top)).amax(-2).amin(-1, keepdim=True)


DIRECT_SEARCH_SCORES = 1 << 21  # below this many (query, slot) scores the exact search scores them all at once


def exact_candidates(
    queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, k: int, expired: Expired | None = None
) -> tuple[torch.Tensor, GroupedSlots | torch.Tensor | None]:
    """Scores ``(B, H, T, M)`` of candidate slots whose top ``k`` is the exact top ``k`` of the memory, and the
    slots they are: the native kernel's exact top ``k`` itself (`native_top_k`, ``M = min(k, N)``, sorted, with its
    ``(B, H, T, M)`` slots) where it runs; else ``None`` (the candidates are every slot in order, ``M = N``: small
    memories, scored whole) or `GroupedSlots` (large ones, `grouped_candidates`; its ``gather`` gives the slots of
    selected candidates). A caller merging more candidates (the segment's own
    positions, `retrieve`) selects once over all of them."""
    _check_search(queries, keys, allowed, k)
    found = native_top_k(queries, keys, allowed, k, expired)
    if found is not None:
        return found
    batch, heads, length, _ = queries.shape
    slots = keys.shape[2]
    # (an exported graph scores every slot: the choice would be a branch on a dynamic size)
    if torch.compiler.is_exporting() or slots <= 4 * k or batch * heads * length * slots < DIRECT_SEARCH_SCORES:
        return _masked_scores(queries, keys, allowed, expired), None
    return grouped_candidates(queries, keys, allowed, k, expired)


@torch.no_grad()
def native_top_k(
    queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, k: int, expired: Expired | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`exact_top_k` computed by the native search kernel (``csrc/knn_top_k.cpp``), or None where it does not run:
    not float32 on CPU, an empty memory, repeated expired slots, under `torch.compile` / export, or no kernel
    (`tf_family.attention.native.extension`: ``TF_FAMILY_NATIVE=0``, or no compiler). Same arguments and outputs;
    between equal scores the earlier slot is kept (`torch.topk` may keep another at the k-th place).

    The kernel scores a block of queries against a chunk of slots at a time in cache and keeps each query's ``k``
    best against a rising threshold, so almost every score costs one vector comparison and nothing of size
    ``(B, H, T, N)`` is allocated: at 8k slots (batch 2 x 256 queries, 8 heads x 64) about the products' own time
    and half the PyTorch search's."""
    batch, heads, length, width = queries.shape
    slots = keys.shape[2]
    extension = native.float32_cpu_extension(queries, keys) if slots else None
    if extension is None:
        return None
    column = gone = None
    if expired is not None:
        expired_slots, gone_mask = expired
        if expired_slots.numel() and int(expired_slots.unique().numel()) != expired_slots.numel():
            return None
        column = torch.full((slots,), -1, dtype=torch.int32)
        column[expired_slots.cpu()] = torch.arange(expired_slots.numel(), dtype=torch.int32)
        gone = gone_mask.to(torch.uint8).contiguous()  # (T, C)
    mask = None
    if not bool(allowed.all()):
        mask = allowed.to(torch.bool).expand(batch, heads, length, slots)
        if mask.stride(-1) != 1:  # the kernel reads a query's slots contiguously
            mask = mask.contiguous()
        mask = mask.view(torch.uint8)
    scores, index = extension.knn_top_k(
        queries.detach().reshape(batch * heads, length, width).contiguous(),
        keys.reshape(batch * heads, slots, width).contiguous(),
        heads,
        mask,
        column,
        gone,
        k,
    )
    return scores.view(batch, heads, length, -1), index.view(batch, heads, length, -1)


def grouped_top_k(
    queries: torch.Tensor,
    keys: torch.Tensor,
    allowed: torch.Tensor,
    k: int,
    expired: Expired | None = None,
    groups: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`exact_top_k` through `grouped_candidates` (what it runs for large memories; same arguments and outputs)."""
    _check_search(queries, keys, allowed, k)
    scores, slots = grouped_candidates(queries, keys, allowed, k, expired, groups)
    best, position = select_top_k_above(scores, grouped_bound(scores, slots, k), k)
    return best, slots.gather(-1, position)


GROUPS_HALVED_FROM = 256  # `grouped_candidates`: from this many slots per neighbour on, g ~ sqrt(N / k) / 2
BUCKET_CHUNK_SLOTS = 1024  # the bucketed search's chunk of slots (rounded to a multiple of k)
SEARCH_BLOCK_SCORES = 1 << 22  # `scored_blocks` holds at most this many (query, slot) scores at a time (16 MiB),
SEARCH_BLOCK_MAX = 1 << 24  # raised up to this (64 MiB) so that a block spans 2 rows x 256 queries (`scored_blocks`)


def grouped_candidates(
    queries: torch.Tensor,
    keys: torch.Tensor,
    allowed: torch.Tensor,
    k: int,
    expired: Expired | None = None,
    groups: int | None = None,
) -> tuple[torch.Tensor, GroupedSlots]:
    """``k * g`` candidates per query that hold the exact top ``k`` of ``N`` slots, found with one selection over
    ``G`` group maxima instead of one over every slot.

    The ``N`` slots are cut into ``g`` consecutive chunks of ``G = ceil(N / g)`` (``g ~ sqrt(N / k)``, halved from
    `GROUPS_HALVED_FROM` ``k`` slots on), and slot ``c * G + j`` belongs to group ``j``. The chunks' scores are
    computed one chunk at a time while a running maximum keeps each group's best score. Each of the true top ``k``
    lies in a group whose best score is at least its own, and at most ``k - 1`` other groups can beat that, so the
    ``k`` groups with the highest maxima hold all of them.
    Returns their scores ``(B, H, T, k * g)`` (padding slots come with ``-inf``) and their slots (`GroupedSlots`).

    The (row and head, query) pairs are taken in blocks (`scored_blocks`): the ``(B, H, T, N)`` score matrix is
    never held at once.
    """
    batch, heads, length, _ = queries.shape
    slots = keys.shape[2]
    if groups is None:
        # g ~ sqrt(N / k) balances the group selection against the candidates; from 256 k slots on, half as many
        # chunks (twice as many groups, half as many candidates to gather from the scores) measured faster (below
        # that, slower: docs/benchmarks.md)
        groups = max(1, round((slots / k) ** 0.5 / (2 if slots >= GROUPS_HALVED_FROM * k else 1)))
    size = -(-slots // groups)  # G: slots per chunk = number of groups
    chunks = -(-slots // size)
    top = min(k, size)
    rows = batch * heads
    candidates = queries.new_empty(rows, length, chunks, top)
    chosen_groups = torch.empty(rows, length, top, dtype=torch.long, device=queries.device)
    for block, scores, best in scored_blocks(queries, keys, allowed, expired, size, running_max=True):
        chosen = select_top_k(best, top, sorted=False)[1]  # (rows, queries, K1): the groups, in any order
        chosen_groups[block] = chosen
        picked = scores.gather(-1, chosen.expand(chunks, *chosen.shape))  # (g, rows, queries, K1)
        candidates[block] = picked.permute(1, 2, 0, 3)
    return candidates.view(batch, heads, length, chunks * top), GroupedSlots(
        chosen_groups.view(batch, heads, length, top), size, slots
    )


@torch.no_grad()
def scored_blocks(
    queries: torch.Tensor,
    keys: torch.Tensor,
    allowed: torch.Tensor,
    expired: Expired | None,
    size: int,
    running_max: bool = False,
):
    """The masked scores of blocks of (row and head, query) pairs against all ``N`` slots, in chunks of ``size``.

    Yields ``(block, scores, best)``: ``block`` indexes the flattened ``(B * H, T)`` pairs, ``scores``
    ``(g, rows, queries, size)`` chunk ``c`` holding slots ``c * size ...`` (``-inf`` where not allowed, expired, or
    past ``N``), ``best`` their maximum over the chunks (with ``running_max``, else None). Every block is written
    into one buffer of at most `SEARCH_BLOCK_SCORES` scores (up to `SEARCH_BLOCK_MAX` for large memories), reused:
    valid until the next block. The ``(B, H, T, N)`` score matrix is never held at once (allocating it anew at every
    step, page by page, cost about as much as the products themselves)."""
    batch, heads, length, width = queries.shape
    slots = keys.shape[2]
    chunks = -(-slots // size)
    rows = batch * heads
    flat_queries = queries.reshape(rows, length, width)
    flat_keys = keys.reshape(rows, slots, width).to(queries.dtype)
    # (B, H or 1, T or 1, N): the broadcast heads and queries are not copied; None when every slot is allowed
    allowed = None if bool(allowed.all()) else allowed.expand(batch, allowed.shape[1], allowed.shape[2], slots)
    chunk_expired = [None] * chunks  # per chunk: its expired columns and the (T, C') queries they are gone for
    if expired is not None:
        for chunk in range(chunks):
            inside = (expired[0] >= chunk * size) & (expired[0] < (chunk + 1) * size)
            if bool(inside.any()):
                columns = expired[0][inside] - chunk * size
                if bool((columns.diff() == 1).all()):  # a run of slots (the model's: the oldest, in order): a view
                    columns = slice(int(columns[0]), int(columns[-1]) + 1)
                chunk_expired[chunk] = (columns, expired[1][:, inside])
    # a block: `row_block` rows x `query_block` queries; every chunk of it scored into the buffer before selecting
    # a block of 1 row x 128 queries (32k slots in 16 MiB) made products too small to use 2 threads; blocks of 2 rows x
    # 256 queries (64 MiB) halve the search time (docs/benchmarks.md)
    budget = max(SEARCH_BLOCK_SCORES, min(2 * min(length, 256) * chunks * size, SEARCH_BLOCK_MAX))
    query_block = max(1, min(length, budget // (chunks * size)))
    row_block = max(1, min(rows, budget // (chunks * size * query_block)))
    buffer = queries.new_empty(chunks * row_block * query_block * size)
    best_buffer = queries.new_empty(row_block * query_block * size) if running_max else None
    for row in range(0, rows, row_block):
        row_end = min(row + row_block, rows)
        block_allowed = None
        if allowed is not None:
            row_index = torch.arange(row, row_end, device=queries.device)
            block_allowed = allowed[row_index // heads, row_index % heads if allowed.shape[1] > 1 else 0]
        for query in range(0, length, query_block):
            query_end = min(query + query_block, length)
            block = (row_end - row, query_end - query, size)  # contiguous views: the products are written in place
            scores = buffer[: chunks * block[0] * block[1] * size].view(chunks, *block)
            best = None if best_buffer is None else best_buffer[: block[0] * block[1] * size].view(block)
            block_queries = flat_queries[row:row_end, query:query_end]
            for chunk in range(chunks):
                start, stop = chunk * size, min((chunk + 1) * size, slots)
                part = scores[chunk]
                chunk_keys = flat_keys[row:row_end, start:stop].transpose(1, 2)
                if stop - start == size:
                    torch.bmm(block_queries, chunk_keys, out=part)
                else:  # the last chunk: padded so that every chunk has `size` columns
                    part[..., : stop - start] = torch.bmm(block_queries, chunk_keys)
                    part[..., stop - start :] = float("-inf")
                if block_allowed is not None:
                    mask = block_allowed[:, query:query_end] if block_allowed.shape[1] > 1 else block_allowed
                    part[..., : stop - start].masked_fill_(~mask[..., start:stop], float("-inf"))
                if chunk_expired[chunk] is not None:
                    columns, gone = chunk_expired[chunk]
                    if isinstance(columns, slice):  # masked in place, without indexing copies
                        part[..., columns].masked_fill_(gone[query:query_end], float("-inf"))
                    else:
                        part[..., columns] = part[..., columns].masked_fill(gone[query:query_end], float("-inf"))
                if best is not None and chunks == 1:
                    best.copy_(part)
                elif best is not None and chunk > 0:  # while the chunk is in cache (chunk 1 meets chunk 0: no copy)
                    torch.maximum(scores[0] if chunk == 1 else best, part, out=best)
            yield (slice(row, row_end), slice(query, query_end)), scores, best


@dataclass
class GroupedSlots:
    """The slots of `grouped_candidates`' candidates, not materialised (a ``(B, H, T, g * K1)`` long tensor per
    search): candidate ``c * K1 + j`` of a query is slot ``c * G + groups[..., j]``, clamped into range (padding)."""

    groups: torch.Tensor  # (B, H, T, K1) the chosen groups
    size: int  # G: slots per chunk
    slots: int  # N

    def gather(self, dim: int, position: torch.Tensor) -> torch.Tensor:
        """The slots of the candidates at ``position`` ``(B, H, T, K)`` (like `torch.Tensor.gather` on the last dim)."""
        if dim not in (-1, 3):
            raise ValueError(f"GroupedSlots.gather selects along the last dimension, got dim={dim}.")
        top = self.groups.shape[-1]
        group = self.groups.gather(-1, position % top)
        return (group + torch.div(position, top, rounding_mode="floor") * self.size).clamp_max_(self.slots - 1)


def bucketed_top_k(
    queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, k: int, expired: Expired | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """meliad's approximate top-k: slot ``s`` belongs to bucket ``s mod k``; each of the ``k`` buckets gives its best
    allowed slot. Exact when ``N <= k``. Same arguments and outputs as `exact_top_k` (sorted by decreasing score)."""
    _check_search(queries, keys, allowed, k)
    batch, heads, length, _ = queries.shape
    slots = keys.shape[2]
    if slots <= k:
        return exact_top_k(queries, keys, allowed, k, expired)
    # chunks of a multiple of k slots, so that column j of every chunk is in bucket j mod k
    size = k * max(1, min(-(-slots // k), BUCKET_CHUNK_SLOTS // k))
    best = queries.new_empty(batch * heads, length, k)
    index = torch.empty(batch * heads, length, k, dtype=torch.long, device=queries.device)
    buckets = torch.arange(k, device=queries.device)
    for block, scores, _ in scored_blocks(queries, keys, allowed, expired, size):
        scores = scores.unflatten(-1, (size // k, k))  # (g, rows, queries, size / k, K)
        bucket_best, chunk = scores.amax(dim=-2).max(dim=0)  # (rows, queries, K): each bucket's best chunk
        members = scores.gather(0, chunk[None, :, :, None].expand(1, *scores.shape[1:]))[0]  # of that chunk
        row = members.argmax(dim=-2)  # (rows, queries, K)
        best[block], index[block] = bucket_best, chunk * size + row * k + buckets
    index.clamp_max_(slots - 1)  # a bucket with nothing allowed may point past the memory (its score is -inf)
    best, order = best.sort(dim=-1, descending=True)
    shape = (batch, heads, length, k)
    return best.view(shape), index.gather(-1, order).view(shape)


def faiss_top_k(
    queries: torch.Tensor,
    keys: torch.Tensor,
    allowed: torch.Tensor,
    k: int,
    expired: Expired | None = None,
    index_type: str = "flat",
    indexes: Sequence | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`exact_top_k` through a faiss inner-product index per (row, head): each query asks for enough neighbours to
    cover the slots it may not see, which are then dropped. ``indexes``: the memory's persistent per-(row, head)
    indexes (`tf_family.memory.knn_faiss.FaissSlotIndex`, kept in step with its writes); without them a flat index
    is built for this call (`FaissKNNStore`). Exact with flat indexes."""
    _check_search(queries, keys, allowed, k)
    allowed = expand_expired(allowed, expired, queries.shape[2])
    batch, heads, length, _ = queries.shape
    slots = keys.shape[2]
    if slots == 0:
        return exact_top_k(queries, keys, allowed, k)
    top = min(k, slots)
    allowed = allowed.expand(batch, heads, length, slots)
    out_scores = queries.new_full((batch, heads, length, top), float("-inf"), dtype=torch.float32)
    out_index = torch.zeros((batch, heads, length, top), dtype=torch.long, device=queries.device)
    for b in range(batch):
        for h in range(heads):
            hidden = int((~allowed[b, h]).sum(-1).max())
            if indexes is None:
                store = FaissKNNStore(keys.shape[-1], "ip", index_type)
                store.add(keys[b, h])
                scores, index = store.search(queries[b, h], min(slots, top + hidden))  # (T, K')
            else:
                scores, index = indexes[b * heads + h].search(queries[b, h], top + hidden)  # (T, K')
                if scores.shape[-1] < top:  # fewer indexed slots than k: pad with nothing found
                    scores = F.pad(scores, (0, top - scores.shape[-1]), value=float("-inf"))
                    index = F.pad(index, (0, top - index.shape[-1]), value=-1)
            index = index.to(queries.device)
            seen = allowed[b, h].gather(-1, index.clamp_min(0)) & (index >= 0)
            scores = scores.to(out_scores.device, out_scores.dtype).masked_fill(~seen, float("-inf"))
            best, position = scores.topk(top, dim=-1)
            out_scores[b, h], out_index[b, h] = best, index.gather(-1, position).clamp_min(0)
    return out_scores.to(queries.dtype), out_index


def knn_top_k(
    kind: str,
    queries: torch.Tensor,
    keys: torch.Tensor,
    allowed: torch.Tensor,
    k: int,
    expired: Expired | None = None,
    indexes: Sequence | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to the backend ``kind`` (one of `SEARCH_KINDS`); computed without gradient. ``indexes``: the
    memory's persistent faiss indexes (``kind="faiss"`` only)."""
    search = {"exact": exact_top_k, "bucketed": bucketed_top_k, "faiss": faiss_top_k}.get(kind)
    if search is None:
        raise ValueError(f"knn search {kind!r} is unknown; choose one of {list(SEARCH_KINDS)}.")
    with torch.no_grad():
        if kind == "faiss" and indexes is not None:
            return faiss_top_k(queries.detach(), keys, allowed, k, expired, indexes=indexes)
        return search(queries.detach(), keys, allowed, k, expired)


def top_k_reference(
    queries: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slow twin of `exact_top_k`: every query's allowed slots scored one by one and sorted in Python."""
    batch, heads, length, _ = queries.shape
    slots = keys.shape[2]
    top = min(k, slots)
    allowed = allowed.expand(batch, heads, length, slots)
    scores = torch.full((batch, heads, length, top), float("-inf"), dtype=queries.dtype)
    index = torch.zeros((batch, heads, length, top), dtype=torch.long)
    for b in range(batch):
        for h in range(heads):
            for t in range(length):
                found = sorted(
                    ((float(queries[b, h, t] @ keys[b, h, s]), s) for s in range(slots) if allowed[b, h, t, s]),
                    reverse=True,
                )[:top]
                for rank, (score, slot) in enumerate(found):
                    scores[b, h, t, rank], index[b, h, t, rank] = score, slot
    return scores, index


__all__ = [
    "SEARCH_KINDS",
    "Expired",
    "GroupedSlots",
    "MemoryAllowed",
    "bucketed_top_k",
    "exact_candidates",
    "exact_top_k",
    "expand_expired",
    "faiss_top_k",
    "grouped_candidates",
    "grouped_top_k",
    "knn_top_k",
    "native_top_k",
    "scored_blocks",
    "grouped_bound",
    "select_top_k",
    "select_top_k_above",
    "top_k_reference",
]
