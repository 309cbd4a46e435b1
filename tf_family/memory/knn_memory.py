"""The kNN memory of the Memorizing Transformer (Wu et al. 2022, arXiv:2203.08913) and its pure math.

`KNNMemory` holds, per kNN-augmented layer, batch row and head, a FIFO ring buffer of (key, value) pairs that receive
no gradient: ``capacity`` slots written in order, the oldest overwritten when it is full (never a full reset), a
per-row mask of real entries (a row is reset at a document boundary by masking, not zeroing: a zero key is still a
key), `index_select` for beam search and `state_dict` / `from_state_dict` for checkpoints. Like a transformers
``Cache`` it is passed into ``forward`` and the updated memory is returned (a new object: the one passed in is
left as it is, unless the write is in place: `KNNMemory.write` with ``in_place=True``, the model's default, updates
the preallocated buffers and marks the memory passed in as consumed, so that a second use of it raises instead of
reading the newer entries; `KNNMemory.clone` keeps a copy). What the memories over the same buffers share (their
count of writes in place, their live readers, their faiss indexes) is one `SharedBuffers` object they hold, not a
module-level table. The capacity belongs to the memory object,
so a model trained with one size can read with another (`KNNMemory.empty`). `MemorizingMemory` bundles it with the
Transformer-XL `SegmentMemory`: the whole state a Memorizing Transformer carries between calls.

The retrieval backends (`knn_top_k`: exact, bucketed, faiss) are in `tf_family.memory.knn_search`. `retrieve` runs
one and merges the segment's own positions; `knn_attention` is the attention over the retrieved pairs (`Retrieved`),
`fused_knn_attention` the same with its backward written out (what the gated kNN layer runs),
`gathered_knn_attention` its twin over the rank-ordered gathered pairs and `dense_knn_attention` its twin over every
allowed entry (equal when ``k`` covers the memory).

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``N`` memory slots (the capacity), ``K`` neighbours, ``Dh`` head width.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .knn_reader import MemoryReader, ReaderRegistry
from .knn_search import (
    MemoryAllowed,
    exact_candidates,
    grouped_bound,
    knn_top_k,
    select_top_k_above,
)
from .segment import SegmentMemory


# --------------------------------------------------------------------------------------------------------- attention
def gather_neighbours(memory: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``(B, H, N, Dh)`` memory, ``(B, H, T, K)`` slot indices -> ``(B, H, T, K, Dh)`` the retrieved vectors.

    One row copy per neighbour (`index_select` over the flattened memory: several times faster on CPU than a
    `gather` along ``N`` with an index expanded over ``Dh``)."""
    batch, heads, slots, width = memory.shape
    rows = torch.arange(batch * heads, device=index.device).view(batch, heads, 1, 1) * slots
    picked = memory.reshape(batch * heads * slots, width).index_select(0, (index + rows).reshape(-1))
    return picked.view(*index.shape, width)


GATHER_BLOCK_BYTES = 1 << 22  # `gather_blocks`: at most this many bytes per block of gathered vectors (4 MiB)


def gather_blocks(memory: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`gather_neighbours` in blocks over the flattened ``B * H`` (row, head) pairs: ``(R_i, T, K, Dh)`` tensors of
    at most `GATHER_BLOCK_BYTES` each (at least one pair), which `Retrieved` scores and attends block by block.

    Why blocks: a training step gathers the keys and the values retrieved from the memory (at 8k entries, batch 2
    x 256 tokens, 8 heads x 64: 32 MiB each). Tensors that large sit at glibc's mmap threshold, so each was mapped
    anew and page-faulted in at every step (most of the gather's time); blocks of a few MiB reuse freed heap memory
    (`bench/bench_memorizing.py` measures it)."""
    batch, heads, slots, width = memory.shape
    pairs, length, top = batch * heads, index.shape[2], index.shape[3]
    flat = memory.reshape(pairs * slots, width)
    index = (index + torch.arange(pairs, device=index.device).view(batch, heads, 1, 1) * slots).view(pairs, -1)
    per_pair = max(1, length * top * width * memory.element_size())
    if torch.compiler.is_exporting():  # one block: the block count would be a branch on a dynamic size
        return (flat.index_select(0, index.reshape(-1)).view(-1, length, top, width),)
    step = max(1, GATHER_BLOCK_BYTES // per_pair)
    return tuple(
        flat.index_select(0, index[start : start + step].reshape(-1)).view(-1, length, top, width)
        for start in range(0, pairs, step)
    )


def _pair_scores(query: torch.Tensor, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(R, T, Dh)`` queries, blocks ``(R_i, T, K, Dh)`` of their own pairs -> ``(R, T, K)``: one ``(1, Dh) @ (Dh, K)``
    product per query (the fast batched form on CPU: contiguous operands)."""
    query = query.contiguous()
    parts = []
    for part, block in zip(query.split([block.shape[0] for block in blocks]), blocks, strict=True):
        rows, length, top, width = block.shape
        parts.append(torch.bmm(part.reshape(rows * length, 1, width), block.view(-1, top, width).transpose(1, 2)))
    return torch.cat(parts).view(query.shape[0], query.shape[1], -1)


def _pair_mix(weights: torch.Tensor, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
    """``(R, T, K)`` weights, blocks ``(R_i, T, K, Dh)`` -> ``(R, T, Dh)``: each query's weighted sum of its own pairs,
    one ``(1, K) @ (K, Dh)`` product per query."""
    weights = weights.contiguous()
    parts = []
    for part, block in zip(weights.split([block.shape[0] for block in blocks]), blocks, strict=True):
        rows, length, top, width = block.shape
        parts.append(torch.bmm(part.reshape(rows * length, 1, top), block.view(-1, top, width)))
    return torch.cat(parts).view(weights.shape[0], weights.shape[1], -1)


class _PairScores(torch.autograd.Function):
    """`_pair_scores` with a gradient for the queries only (the memory's pairs have none). Written out because
    autograd's backward of the batched product received the gradient in the layout of the layer's output (heads
    transposed), which sent `torch.bmm` down its slow path: one small product and copy per query."""

    @staticmethod
    def forward(ctx, query: torch.Tensor, *blocks: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*blocks)
        return _pair_scores(query, blocks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        blocks = ctx.saved_tensors  # read once: checkpointing allows a single unpack
        return _pair_mix(grad, blocks), *(None for _ in blocks)


class _PairMix(torch.autograd.Function):
    """`_pair_mix` with a gradient for the weights only (see `_PairScores`)."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, *blocks: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*blocks)
        return _pair_mix(weights, blocks)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        blocks = ctx.saved_tensors  # read once: checkpointing allows a single unpack
        return _pair_scores(grad, blocks), *(None for _ in blocks)


@dataclass
class Retrieved:
    """The ``k`` pairs each query retrieved (`retrieve`), kept apart by where they come from.

    The memory's pairs are named by slot (``memory_slots``) in the memory's own buffers (``memory``); their copies
    ``(B, H, T, K, Dh)`` (in blocks over ``B * H``, `gather_blocks`; without gradient: the memory has none) are
    gathered on first use (`memory_keys`, `memory_values`), from the buffers as they are then: before a write in
    place (the model's layers use them within their forward). The gated layer's attention (`fused_knn_attention`)
    gathers nothing where the native pair kernels run: it reads the rows by slot (`MemoryReader`). The
    segment's own pairs (``knn_retrieval="token"``) are this forward's keys and values and carry its gradient: they
    stay where they are, ``(B, H, T, Dh)``, with a ``(B, H, T, T)`` mask of the ones each query retrieved, and
    `knn_attention` scores them with one ``(T, T)`` product per row and head. Gathering ``k`` copies of them with
    gradient (and merging them with the memory's) made ``(B, H, T, K, Dh)`` tensors in the forward and the backward
    that cost more than the search itself. `gathered` rebuilds that single rank-ordered form (the twin the tests
    compare against).

    Attributes:
        memory: the memory's keys and values ``(B, H, N, Dh)`` (its buffers, not copies).
        memory_slots: ``(B, H, T, K)`` long, the slot of rank ``r`` (meaningful where ``memory_found``).
        memory_found: ``(B, H, T, K)`` bool, True where rank ``r`` is a pair of the memory.
        found: ``(B, H, T, K)`` bool, True where rank ``r`` holds a pair (of the memory or of the segment).
        segment_index: ``(B, H, T, K)`` long, the segment position of rank ``r`` (``-1``: not from the segment).
        segment: the segment's keys and values ``(B, H, T, Dh)``, or None (nothing retrievable in the segment).
        segment_found: ``(B, H, T, T)`` bool, True where position ``s`` of the segment is among query ``t``'s ``k``.
        scores, segment_scores: the search's own cosine scores, without gradient, of rank ``r`` ``(B, H, T, K)``
            (``-inf`` where nothing was found) and of the segment's positions ``(B, H, T, T)`` (before masking),
            which `fused_knn_attention` reuses instead of computing them again; None when the search did not compute
            them in the query's dtype (faiss).
        dtype: the dtype of the queries (the gathered copies are cast to it).
    """

    memory: tuple[torch.Tensor, torch.Tensor]
    memory_slots: torch.Tensor
    memory_found: torch.Tensor
    found: torch.Tensor
    segment_index: torch.Tensor
    segment: tuple[torch.Tensor, torch.Tensor] | None = None
    segment_found: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    segment_scores: torch.Tensor | None = None
    dtype: torch.dtype = torch.float32

    @functools.cached_property
    def memory_keys(self) -> tuple[torch.Tensor, ...]:
        """Blocks ``(R_i, T, K, Dh)`` of the ``(B * H, T, K, Dh)`` retrieved keys (`gather_blocks`)."""
        return self._gathered(self.memory[0])

    @functools.cached_property
    def memory_values(self) -> tuple[torch.Tensor, ...]:
        """Blocks ``(R_i, T, K, Dh)`` of the ``(B * H, T, K, Dh)`` retrieved values (`gather_blocks`)."""
        return self._gathered(self.memory[1])

    def _gathered(self, memory: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Blocks of the retrieved rows of ``memory`` (the memory's keys or values), in the queries' dtype."""
        batch, heads, length, top = self.memory_slots.shape
        if memory.shape[2] == 0:  # an empty memory: nothing to gather
            return (memory.new_zeros(batch * heads, length, top, memory.shape[-1], dtype=self.dtype),)
        with torch.no_grad():
            return tuple(block.to(self.dtype) for block in gather_blocks(memory, self.memory_slots))

    @property
    def any_found(self) -> torch.Tensor:
        """``(B, H, T, 1)`` bool: the query retrieved at least one pair."""
        return self.found.any(-1, keepdim=True)

    def logits(self, query: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """Scaled cosine scores ``(B, H, T, K + T)`` (``(B, H, T, K)`` without a segment) of ``query`` against the
        memory's pairs by rank, then the segment's positions; ``-inf`` where nothing was retrieved."""
        scale = scale[:, None, None]
        keys = tuple(block.to(query.dtype) for block in self.memory_keys)
        logits = _PairScores.apply(query.flatten(0, 1), *keys).view(self.memory_found.shape)  # (B, H, T, K)
        logits = (logits * scale).masked_fill(~self.memory_found, float("-inf"))
        if self.segment is None:
            return logits
        segment = (query @ self.segment[0].to(query.dtype).transpose(-1, -2)) * scale  # (B, H, T, T)
        return torch.cat([logits, segment.masked_fill(~self.segment_found, float("-inf"))], -1)

    def attend(self, probs: torch.Tensor) -> torch.Tensor:
        """``probs`` ``(B, H, T, K [+ T])`` over the pairs in the order of `logits` -> ``(B, H, T, Dh)``."""
        ranks = self.memory_found.shape[3]
        values = tuple(block.to(probs.dtype) for block in self.memory_values)
        attended = _PairMix.apply(probs[..., :ranks].flatten(0, 1), *values).view(*probs.shape[:3], -1)
        if self.segment is None:
            return attended
        return attended + probs[..., ranks:] @ self.segment[1].to(probs.dtype)

    def gathered(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The retrieved pairs in one rank-ordered form: keys, values ``(B, H, T, K, Dh)`` and ``found``
        ``(B, H, T, K)`` (what `gathered_knn_attention` reads; the segment's pairs keep their gradient)."""
        shape = (*self.memory_found.shape, -1)
        memory_keys, memory_values = (
            torch.cat(blocks).view(shape) for blocks in (self.memory_keys, self.memory_values)
        )
        if self.segment is None:
            return memory_keys, memory_values, self.found
        in_segment = (self.segment_index >= 0)[..., None]  # (B, H, T, K, 1)
        index = self.segment_index.clamp_min(0)
        keys, values = (
            torch.where(in_segment, gather_neighbours(part, index), memory.to(part.dtype))
            for part, memory in zip(self.segment, (memory_keys, memory_values), strict=True)
        )
        return keys, values, self.found


def knn_attention(query: torch.Tensor, retrieved: Retrieved, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each query over its own retrieved pairs (no positions: a retrieved pair has none).

    Args:
        query: ``(B, H, T, Dh)``, L2-normalised.
        retrieved: what `retrieve` found (keys L2-normalised).
        scale: ``(H,)`` the learned per-head scale of the cosine scores.

    Returns:
        ``(B, H, T, Dh)`` attended values (0 for a query that found nothing) and the logits (`Retrieved.logits`:
        ``-inf`` where nothing was retrieved), which a joint softmax with the local attention reuses.
    """
    logits = retrieved.logits(query, scale)
    probs = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a row with nothing found attends to nothing
    return retrieved.attend(probs), logits


class _RetrievedAttention(torch.autograd.Function):
    """`knn_attention`'s attended values with its backward written out (`fused_knn_attention`).

    Autograd's composition (scaled and masked scores, a concatenation with the segment's ``(T, T)`` scores, softmax,
    `nan_to_num`, slices) made about twenty passes over the ``(B, H, T, K + T)`` logits forward and backward; here
    the memory's ``(B, H, T, K)`` and the segment's ``(B, H, T, T)`` parts stay apart and share one softmax
    (maximum, exponentials, one normaliser; 0 where a query found nothing), and the backward is the softmax's:
    ``dlogits = p * (dp - sum(p * dp))``.

    Its ``forward`` takes ten arguments and the pairs because `apply` passes everything positionally and the
    tensors must be its inputs for autograd and checkpointing to see them; `fused_knn_attention` is the named call."""

    @staticmethod
    def forward(
        ctx, query, scale, segment_keys, segment_values, memory_found, segment_found, scores, segment_scores, reader,
        blocks, *pairs,
    ):  # fmt: skip
        """Ten inputs and the pairs, positionally: `apply` takes no keywords (see the class docstring)."""
        key_blocks, value_blocks = pairs[:blocks], pairs[blocks:]
        batch, heads, length, width = query.shape
        factor = scale.view(1, heads, 1, 1)
        if scores is None:
            flat_query = query.reshape(batch * heads, length, width)
            memory_scores = _pair_scores(flat_query, key_blocks) if reader is None else reader.key_scores(flat_query)
            memory_scores = memory_scores.view(memory_found.shape)  # (B, H, T, K)
        else:  # the search's: finite where the backward multiplies them by a zero gradient
            memory_scores = scores.masked_fill(~memory_found, 0.0)
        memory_probs = (memory_scores * factor).masked_fill_(~memory_found, float("-inf"))
        top = memory_probs.amax(-1, keepdim=True)  # (B, H, T, 1)
        segment_probs = None
        if segment_keys is not None:
            if segment_scores is None:
                segment_scores = query @ segment_keys.transpose(-1, -2)  # (B, H, T, T)
            segment_probs = (segment_scores * factor).masked_fill_(~segment_found, float("-inf"))
            top = torch.maximum(top, segment_probs.amax(-1, keepdim=True))
        top = top.masked_fill_(top == float("-inf"), 0.0)  # a query that found nothing: every logit is -inf
        memory_probs = memory_probs.sub_(top).exp_()
        total = memory_probs.sum(-1, keepdim=True)
        if segment_probs is not None:
            segment_probs = segment_probs.sub_(top).exp_()
            total += segment_probs.sum(-1, keepdim=True)
        inverse = torch.where(total > 0, total.reciprocal(), 0.0)  # 0: attends to nothing
        memory_probs *= inverse
        flat_probs = memory_probs.view(batch * heads, length, -1)
        attended = _pair_mix(flat_probs, value_blocks) if reader is None else reader.mix_values(flat_probs)
        attended = attended.view(query.shape)
        if segment_probs is not None:
            segment_probs *= inverse
            flat_probs = segment_probs.view(batch * heads, length, length)
            flat_values = segment_values.reshape(batch * heads, length, width)
            attended = attended.view(batch * heads, length, width).baddbmm_(flat_probs, flat_values).view(query.shape)
        ctx.blocks, ctx.reader = blocks, reader
        ctx.save_for_backward(
            query, scale, segment_keys, segment_values, memory_scores, memory_probs, segment_scores, segment_probs,
            *pairs,
        )  # fmt: skip
        return attended

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):  # as the forward: in the inputs' dtype
            return _RetrievedAttention._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        saved = ctx.saved_tensors  # read once: checkpointing allows a single unpack
        query, scale, segment_keys, segment_values, memory_scores, memory_probs, segment_scores, segment_probs = saved[
            :8
        ]
        key_blocks, value_blocks = saved[8 : 8 + ctx.blocks], saved[8 + ctx.blocks :]
        batch, heads, length, width = query.shape
        grad, reader = grad.contiguous(), ctx.reader
        flat_grad = grad.view(batch * heads, length, width)
        memory_grad = _pair_scores(flat_grad, value_blocks) if reader is None else reader.value_scores(flat_grad)
        memory_grad = memory_grad.view(memory_probs.shape)
        dot = (memory_probs * memory_grad).sum(-1, keepdim=True)  # (B, H, T, 1): sum of p * dp
        segment_grad = None
        if segment_probs is not None:
            segment_grad = grad @ segment_values.transpose(-1, -2)  # (B, H, T, T)
            dot += (segment_probs * segment_grad).sum(-1, keepdim=True)
            segment_grad = segment_grad.sub_(dot).mul_(segment_probs)  # d loss / d logits
        memory_grad = memory_grad.sub_(dot).mul_(memory_probs)
        grad_scale = (memory_grad * memory_scores).sum((0, 2, 3))
        if segment_grad is not None:
            grad_scale += (segment_grad * segment_scores).sum((0, 2, 3))
        factor = scale.view(1, heads, 1, 1)
        memory_grad *= factor  # d loss / d cosine scores
        flat_memory_grad = memory_grad.view(batch * heads, length, -1)
        grad_query = _pair_mix(flat_memory_grad, key_blocks) if reader is None else reader.mix_keys(flat_memory_grad)
        grad_query = grad_query.view(query.shape)
        grad_segment_keys = grad_segment_values = None
        if segment_grad is not None:
            segment_grad *= factor
            grad_query = grad_query + segment_grad @ segment_keys
            grad_segment_keys = segment_grad.transpose(-1, -2) @ query
            grad_segment_values = segment_probs.transpose(-1, -2) @ grad
        return (
            grad_query, grad_scale, grad_segment_keys, grad_segment_values, None, None, None, None, None, None,
            *(None for _ in range(2 * ctx.blocks)),
        )  # fmt: skip


def fused_knn_attention(
    query: torch.Tensor, retrieved: Retrieved, scale: torch.Tensor, readers: ReaderRegistry | None = None
) -> torch.Tensor:
    """`knn_attention`'s attended values ``(B, H, T, Dh)`` (its twin: the same values and gradients for the query,
    the scale and the segment's keys and values) through one autograd Function (`_RetrievedAttention`): what the
    model's gated kNN layer runs. The cosine scores come from the search (`Retrieved.scores`, ``segment_scores``):
    ``query`` must be the query the pairs were retrieved with.

    ``readers``: the `ReaderRegistry` of the memory layer the pairs come from (`KNNMemory.readers`). With it, where
    the native pair kernels run (float32 on CPU, `MemoryReader`), the memory's pairs are read by slot, not gathered
    (at 8k entries, batch 2 x 256 tokens, 8 heads x 64: 64 MiB of copies per training step saved, and their
    products), and the memory's writes in place keep what the backward reads; without it they are gathered."""
    reader = None
    if readers is not None:
        reader = MemoryReader.of(retrieved.memory, retrieved.memory_slots, query.dtype, readers)
    keys = values = ()
    if reader is None:
        keys = tuple(block.to(query.dtype) for block in retrieved.memory_keys)
        values = tuple(block.to(query.dtype) for block in retrieved.memory_values)
    segment_keys = segment_values = segment_found = segment_scores = None
    if retrieved.segment is not None:
        segment_keys, segment_values = (part.to(query.dtype) for part in retrieved.segment)
        segment_found, segment_scores = retrieved.segment_found, _same_dtype(retrieved.segment_scores, query)
    # every input is in the query's dtype: autocast must not switch some products to bf16 inside the Function
    with torch.autocast(query.device.type, enabled=False):
        return _RetrievedAttention.apply(
            query, scale.to(query.dtype), segment_keys, segment_values, retrieved.memory_found, segment_found,
            _same_dtype(retrieved.scores, query), segment_scores, reader, len(keys), *keys, *values,
        )  # fmt: skip


def _same_dtype(scores: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor | None:
    """The search's scores where they were computed in the query's dtype (else None: computed again)."""
    return scores if scores is not None and scores.dtype == query.dtype else None


def gathered_knn_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, found: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """Twin of `knn_attention` over the rank-ordered pairs (`Retrieved.gathered`): keys, values ``(B, H, T, K, Dh)``,
    ``found`` ``(B, H, T, K)``; returns ``(B, H, T, Dh)``."""
    logits = torch.einsum("bhtd,bhtkd->bhtk", query, keys.to(query.dtype)) * scale[:, None, None]
    probs = torch.softmax(logits.masked_fill(~found, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhtk,bhtkd->bhtd", probs, values.to(query.dtype))


def dense_knn_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """Twin of retrieval + `knn_attention` when ``k`` covers every slot: a softmax over all allowed entries.
    ``keys, values`` ``(B, H, N, Dh)``, ``allowed`` bool broadcastable to ``(B, H, T, N)``; returns ``(B, H, T, Dh)``."""
    logits = torch.einsum("bhtd,bhnd->bhtn", query, keys.to(query.dtype)) * scale[:, None, None]
    probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhtn,bhnd->bhtd", probs, values.to(query.dtype))


def retrieve(
    query: torch.Tensor,
    memory: tuple[torch.Tensor, torch.Tensor],
    memory_allowed: torch.Tensor | MemoryAllowed,
    *,
    k: int,
    kind: str = "exact",
    segment: tuple[torch.Tensor, torch.Tensor] | None = None,
    segment_allowed: torch.Tensor | None = None,
    indexes: Sequence | None = None,
) -> Retrieved:
    """The ``k`` best pairs per query among the memory's allowed slots (searched with backend ``kind``, one of
    `knn_search.SEARCH_KINDS`) and, when ``segment`` is given, the allowed positions of the query's own segment
    (scored exactly).

    Args:
        query: ``(B, H, T, Dh)`` L2-normalised queries.
        memory: keys and values ``(B, H, N, Dh)``; memory_allowed: bool broadcastable to ``(B, H, T, N)``, or a
            `MemoryAllowed` (that and the expired (slot, query) pairs, `exact_top_k`).
        segment: keys and values ``(B, H, T, Dh)`` of the segment itself, or None; segment_allowed: bool
            broadcastable to ``(B, H, T, T)`` (which earlier positions each query may retrieve).
        indexes: the memory's persistent faiss indexes for ``kind="faiss"`` (`KNNMemory.faiss_indexes`).

    Returns:
        A `Retrieved`. Pairs retrieved from the memory carry no gradient; pairs retrieved from ``segment`` carry its
        gradient (they are this forward's keys and values).
    """
    if isinstance(memory_allowed, torch.Tensor):
        memory_allowed = MemoryAllowed(memory_allowed)
    elif not isinstance(memory_allowed, MemoryAllowed):
        raise TypeError(
            f"memory_allowed must be a bool tensor or a MemoryAllowed(valid, expired), got {type(memory_allowed)}."
        )
    allowed, expired = memory_allowed
    batch, heads, length, _ = query.shape
    with torch.no_grad():
        if kind == "exact":  # candidates only: one selection below covers them and the segment
            scores, index = exact_candidates(query.detach(), memory[0], allowed, k, expired)  # (B, H, T, M)
        else:
            scores, index = knn_top_k(kind, query, memory[0], allowed, k, expired, indexes)  # (B, H, T, K1)
        from_memory = scores.shape[-1]
        bound = grouped_bound(scores, index, k)
        segment_scores = None
        if segment is not None:
            segment_scores = torch.einsum("bhtd,bhsd->bhts", query.detach(), segment[0].detach().to(query.dtype))
            allowed_scores = segment_scores.masked_fill(~segment_allowed, float("-inf"))  # (B, H, T, T)
            scores = torch.cat([scores, allowed_scores], -1)
        # (B, H, T, K): the grouped search's candidates come with a bound on the k-th best (the least chosen group
        # maximum), which leaves a few more than k candidates per query to select from
        scores, position = select_top_k_above(scores, bound, k)
        found = scores > float("-inf")
        in_memory = position < from_memory
        slot = position.clamp(0, max(from_memory - 1, 0))
        if from_memory and index is not None:
            slot = index.gather(-1, slot)
        segment_index = torch.where(found & ~in_memory, position - from_memory, -1)  # (B, H, T, K)
        segment_found = None
        if segment is not None:  # position s retrieved by query t; index `length` collects the other ranks
            target = torch.where(segment_index >= 0, segment_index, length)
            segment_found = torch.zeros(batch, heads, length, length + 1, dtype=torch.bool, device=query.device)
            segment_found = segment_found.scatter_(-1, target, True)[..., :length]
    if kind == "faiss":  # faiss's scores: float32, computed apart
        scores = segment_scores = None
    return Retrieved(
        memory=memory,
        memory_slots=slot,
        memory_found=found & in_memory,
        found=found,
        segment_index=segment_index,
        segment=segment,
        segment_found=segment_found,
        scores=scores,
        segment_scores=segment_scores,
        dtype=query.dtype,
    )


# ------------------------------------------------------------------------------------------------------------ memory
@dataclass(eq=False)
class SharedBuffers:
    """What every `KNNMemory` over the same key and value buffers shares: a reset of a memory, and the memory a
    write in place returns, hold the buffers of the memory they came from, and this state with them.

    Attributes:
        readers: per kNN layer, the live readers of its buffers (`ReaderRegistry`), which a write in place asks to
            keep the rows it overwrites while a backward still has to read them.
        faiss: per kNN layer, the persistent faiss indexes of its keys (`KNNMemory.faiss_indexes`), kept in step
            by the writes in place.
        writes: how many writes in place the buffers have had. A memory records the count it was made at
            (`KNNMemory.written_at`): once the count has moved past it, the buffers hold entries newer than that
            memory's (it is `KNNMemory.consumed`).
    """

    readers: tuple[ReaderRegistry, ...]
    faiss: dict[int, list] = field(default_factory=dict)
    writes: int = 0

    @classmethod
    def of(cls, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> SharedBuffers:
        """The state of fresh buffers: no readers, no faiss indexes, no writes."""
        return cls(tuple(ReaderRegistry(k, v) for k, v in zip(keys, values, strict=True)))


@dataclass
class KNNMemory:
    """Per kNN layer, batch row and head, a FIFO ring buffer of ``capacity`` (key, value) pairs.

    Attributes:
        keys: per kNN layer ``(B, H, N, Dh)``, L2-normalised keys; ``N`` is the capacity.
        values: per kNN layer ``(B, H, N, Dh)``.
        mask: ``(B, N)`` bool, True where a slot holds an entry of the row's current document.
        next_slot: the slot the next entry goes to (shared by the rows, which are written in step).
        shared: the state of the buffers, shared with every memory over them (`SharedBuffers`): their readers,
            faiss indexes and count of writes in place. Set by the memory itself (fresh for new buffers).
        written_at: ``shared.writes`` when this memory was made (`consumed` once they differ).
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    mask: torch.Tensor
    next_slot: int = 0
    shared: SharedBuffers = field(init=False, repr=False, compare=False)
    written_at: int = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.keys, self.values = tuple(self.keys), tuple(self.values)
        if len(self.keys) != len(self.values):
            raise ValueError(f"KNNMemory needs as many key as value tensors, got {len(self.keys)} and "
                             f"{len(self.values)}.")  # fmt: skip
        if self.mask.dim() != 2:
            raise ValueError(f"KNNMemory.mask must have shape (B, N), got {tuple(self.mask.shape)}.")
        shape = (self.mask.shape[0], *self.keys[0].shape[1:2], self.mask.shape[1]) if self.keys else None
        if any(
            t.dim() != 4 or t.shape[:3] != shape or t.shape != self.keys[0].shape for t in (*self.keys, *self.values)
        ):
            raise ValueError(
                f"KNNMemory.keys and .values must all be (B, H, N, Dh) with (B, N) = {tuple(self.mask.shape)}."
            )
        self.mask = self.mask.to(torch.bool)
        if not isinstance(self.next_slot, torch.SymInt):  # (a traced write's slot stays symbolic in the graph)
            self.next_slot = int(self.next_slot)
        self.shared, self.written_at = SharedBuffers.of(self.keys, self.values), 0
        if not 0 <= self.next_slot < max(self.capacity, 1):
            raise ValueError(f"KNNMemory.next_slot must be in [0, {self.capacity}), got {self.next_slot}.")

    @classmethod
    def empty(
        cls,
        batch_size: int,
        num_layers: int,
        num_heads: int,
        head_dim: int,
        capacity: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> KNNMemory:
        """A memory with ``capacity`` free slots per row and head (``0``: a memory that keeps nothing)."""
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 (0 keeps nothing), got {capacity}.")
        shape = (batch_size, num_heads, capacity, head_dim)
        keys = tuple(torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers))
        values = tuple(torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers))
        return cls(keys, values, torch.zeros(batch_size, capacity, dtype=torch.bool, device=device))

    @property
    def capacity(self) -> int:
        return self.mask.shape[1]

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def size(self) -> torch.Tensor:
        """``(B,)`` entries held per row."""
        return self.mask.sum(-1)

    def __len__(self) -> int:
        return len(self.keys)

    def ages(self) -> torch.Tensor:
        """``(N,)`` long: how many writes ago each slot was written (0 = the newest)."""
        slots = torch.arange(self.capacity, device=self.mask.device)
        return (self.next_slot - 1 - slots) % max(self.capacity, 1)

    def reset(self, rows: torch.Tensor) -> KNNMemory:
        """Forget the entries of the rows where ``rows`` (``(B,)`` bool) is True (a document starts). The key and
        value tensors are shared with this memory."""
        rows = torch.as_tensor(rows, device=self.mask.device)
        if rows.dtype != torch.bool or rows.shape != (self.batch_size,):
            raise ValueError(
                f"reset rows must be a bool tensor of shape ({self.batch_size},), got {rows.dtype} {tuple(rows.shape)}."
            )
        self.check_current()
        return self._sharing(KNNMemory(self.keys, self.values, self.mask & ~rows[:, None], self.next_slot))

    @property
    def readers(self) -> tuple[ReaderRegistry, ...]:
        """Per kNN layer, the live readers of its buffers (pass ``readers[layer]`` to `fused_knn_attention`)."""
        return self.shared.readers

    @property
    def consumed(self) -> bool:
        """True once a write in place into this memory's buffers has made them hold newer entries."""
        return self.written_at != self.shared.writes

    def _sharing(self, other: KNNMemory) -> KNNMemory:
        """``other`` (a memory over this memory's buffers) sharing their state, current as of now."""
        other.shared, other.written_at = self.shared, self.shared.writes
        return other

    def faiss_indexes(self, layer: int, index_type: str = "flat", **params) -> list:
        """The persistent faiss indexes of kNN layer ``layer``, one per (row, head) (`knn_faiss.FaissSlotIndex`):
        built from the written slots on first use, then updated by every write in place (a copy-written, cloned or
        reordered memory builds its own). ``params``: ``nlist``, ``nprobe``, ``pq_m`` of an IVF index."""
        from .knn_faiss import build_slot_indexes

        indexes = self.shared.faiss.get(layer)
        if indexes is None or any(index.provisional for index in indexes[:1]):
            indexes = self.shared.faiss[layer] = build_slot_indexes(self.keys[layer], self.mask, index_type, **params)
        return indexes

    def check_current(self) -> None:
        """Raise if a write in place has moved this memory's buffers on (they now hold newer entries)."""
        if self.consumed:
            raise ValueError(
                "this kNN memory was updated in place by a later forward (its buffers now hold newer entries): pass "
                "the mems that forward returned, clone() the memory before reusing it, or set knn_write='copy'."
            )

    def clone(self) -> KNNMemory:
        """A copy that later writes (in place or not) leave unchanged."""
        self.check_current()
        return KNNMemory(
            tuple(k.clone() for k in self.keys), tuple(v.clone() for v in self.values), self.mask.clone(),
            self.next_slot,
        )  # fmt: skip

    def index_select(self, index: torch.Tensor) -> KNNMemory:
        """Reorder or repeat batch rows (beam search, several samples per prompt): a copy."""
        self.check_current()
        index = index.to(self.mask.device)
        return KNNMemory(
            tuple(k.index_select(0, index) for k in self.keys),
            tuple(v.index_select(0, index) for v in self.values),
            self.mask.index_select(0, index),
            self.next_slot,
        )

    def write(
        self,
        keys: Sequence[torch.Tensor],
        values: Sequence[torch.Tensor],
        mask: torch.Tensor | None = None,
        in_place: bool = False,
    ) -> KNNMemory:
        """The memory after a segment's pairs (per kNN layer ``(B, H, T, Dh)``, keys already normalised) are written
        over the oldest slots. ``mask`` ``(B, T)`` bool marks real positions (padding is written as masked slots so
        that the rows stay in step). Only the last ``capacity`` positions of a long segment stay.

        ``in_place=False``: returns a new memory and leaves this one as it is (a layer recomputed under gradient
        checkpointing, or another beam, still reads what it read), at the price of a copy of every buffer per write
        (at 32k entries that copy cost as much as the search). ``in_place=True``: the ``T`` new pairs go into this
        memory's preallocated buffers (nothing else is copied); the returned memory shares them and this one is
        marked consumed (`check_current` raises on it).
        """
        self.check_current()
        if len(keys) != len(self.keys) or len(values) != len(self.values):
            raise ValueError(f"the memory has {len(self.keys)} kNN layers, the segment {len(keys)}.")
        if self.capacity == 0 or not keys:
            return self
        length = keys[0].shape[2]
        if mask is None:
            mask = torch.ones(self.batch_size, length, dtype=torch.bool, device=self.mask.device)
        if mask.shape != (self.batch_size, length):
            raise ValueError(f"the write mask must have shape {(self.batch_size, length)}, got {tuple(mask.shape)}.")
        kept = length if length <= self.capacity else self.capacity  # min, decided from ranges when traced
        slots = (self.next_slot + torch.arange(kept, device=self.mask.device)) % self.capacity
        with torch.no_grad():
            if in_place:  # a backward still to come may read these slots by index (`MemoryReader`)
                for readers in self.readers:
                    readers.stash_before_write(slots)
            written = [
                (memory.index_copy_ if in_place else memory.index_copy)(
                    2, slots, new[:, :, length - kept :].detach().to(memory.dtype)
                )
                for memory, new in zip((*self.keys, *self.values), (*keys, *values), strict=True)
            ]
            new_mask = mask[:, length - kept :].to(torch.bool)
            mask = self.mask.index_copy_(1, slots, new_mask) if in_place else self.mask.index_copy(1, slots, new_mask)
        layers = len(self.keys)
        memory = KNNMemory(written[:layers], written[layers:], mask, (self.next_slot + kept) % self.capacity)
        if in_place:
            self.shared.writes += 1
            if self.shared.faiss:
                from .knn_faiss import update_slot_indexes

                for layer, indexes in self.shared.faiss.items():
                    update_slot_indexes(indexes, slots, keys[layer][:, :, length - kept :].detach())
            memory = self._sharing(memory)
        return memory

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors for a checkpoint: ``mask``, ``next_slot``, ``keys.<layer>``, ``values.<layer>`` (the buffers
        themselves, not copies: save them before the next write in place)."""
        self.check_current()
        tensors = {"mask": self.mask, "next_slot": torch.tensor(self.next_slot)}
        tensors.update({f"keys.{i}": k for i, k in enumerate(self.keys)})
        tensors.update({f"values.{i}": v for i, v in enumerate(self.values)})
        return tensors

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor]) -> KNNMemory:
        """Rebuild a memory saved with `state_dict`."""
        if "mask" not in tensors or "keys.0" not in tensors:
            raise ValueError(f"not a KNNMemory state dict: keys {sorted(tensors)}.")
        layers = sum(1 for key in tensors if key.startswith("keys."))
        return cls(
            tuple(tensors[f"keys.{i}"] for i in range(layers)),
            tuple(tensors[f"values.{i}"] for i in range(layers)),
            tensors["mask"],
            int(tensors["next_slot"]),
        )


@dataclass
class MemorizingMemory:
    """What a Memorizing Transformer carries between calls: the Transformer-XL memory of every layer (``segment``,
    ``None`` with ``mem_len=0``) and the kNN memory of its kNN-augmented layers (``knn``)."""

    segment: SegmentMemory | None
    knn: KNNMemory

    def __post_init__(self):
        if self.segment is not None and self.segment.batch_size != self.knn.batch_size:
            raise ValueError(
                f"the segment memory holds {self.segment.batch_size} rows and the kNN memory {self.knn.batch_size}."
            )

    @property
    def batch_size(self) -> int:
        return self.knn.batch_size

    def reset(self, rows: torch.Tensor) -> MemorizingMemory:
        """Forget both memories of the rows where ``rows`` (``(B,)`` bool) is True (a document starts)."""
        segment = None if self.segment is None else self.segment.reset(rows)
        return MemorizingMemory(segment, self.knn.reset(rows))

    def clone(self) -> MemorizingMemory:
        """A copy that later writes leave unchanged (to read the same memory twice with ``knn_write="in_place"``)."""
        return MemorizingMemory(self.segment, self.knn.clone())

    def index_select(self, index: torch.Tensor) -> MemorizingMemory:
        """Reorder or repeat batch rows of both memories (beam search)."""
        segment = None if self.segment is None else self.segment.index_select(index)
        return MemorizingMemory(segment, self.knn.index_select(index))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors for a checkpoint: ``knn.*`` and, with a segment memory, ``segment.*``."""
        tensors = {f"knn.{k}": v for k, v in self.knn.state_dict().items()}
        if self.segment is not None:
            tensors.update({f"segment.{k}": v for k, v in self.segment.state_dict().items()})
        return tensors

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor]) -> MemorizingMemory:
        """Rebuild a memory saved with `state_dict`."""
        knn = {k[4:]: v for k, v in tensors.items() if k.startswith("knn.")}
        segment = {k[8:]: v for k, v in tensors.items() if k.startswith("segment.")}
        if not knn:
            raise ValueError(f"not a MemorizingMemory state dict: keys {sorted(tensors)}.")
        return cls(SegmentMemory.from_state_dict(segment) if segment else None, KNNMemory.from_state_dict(knn))


__all__ = [
    "KNNMemory",
    "MemorizingMemory",
    "Retrieved",
    "SharedBuffers",
    "dense_knn_attention",
    "fused_knn_attention",
    "gather_blocks",
    "gather_neighbours",
    "gathered_knn_attention",
    "knn_attention",
    "retrieve",
]
