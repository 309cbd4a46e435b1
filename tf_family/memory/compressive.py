"""The two FIFO memories of the Compressive Transformer (Rae et al. 2019, arXiv:1911.05507, algorithm 1).

Per layer the model keeps a memory of the most recent hidden states (``mem_len`` = ``n_m``) and, behind it, a
compressed memory of ``cmem_len`` = ``n_cm`` slots. After every segment:

1. the segment's states are appended to the memory;
2. the oldest states beyond ``mem_len`` leave the memory **in whole groups of c** (the compression rate): with
   ``M`` remembered states and ``T`` new ones, ``c * floor((M + T - mem_len) / c)`` states leave, so the memory
   holds between ``mem_len`` and ``mem_len + c - 1`` states (``mem_len`` exactly when segment and memory lengths
   are multiples of ``c``, the paper's setting). Groups are therefore aligned with the start of the stream, and
   the compressed memory does not depend on how a stream is cut into segments (for group-local functions);
3. ``f_c`` compresses the states that left (``N`` of them) to ``N / c`` slots, which are appended to the
   compressed memory; its oldest slots beyond ``cmem_len`` are discarded.

With ``cmem_len = 0`` nothing is compressed and states leave one at a time: the memory is Transformer-XL's.
Everything stored is detached from the graph (the paper's stop-gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .segment import SegmentMemory


def evicted_length(memory_length: int, new_length: int, mem_len: int, rate: int | None) -> int:
    """How many of the oldest states leave a memory of capacity ``mem_len`` holding ``memory_length`` states when
    ``new_length`` are appended: all the overflow when ``rate`` is ``None`` (no compression, Transformer-XL), else
    the largest multiple of ``rate`` not above the overflow."""
    if mem_len < 0 or memory_length < 0 or new_length < 0:
        raise ValueError(f"lengths must be >= 0, got {memory_length=}, {new_length=}, {mem_len=}.")
    overflow = max(0, memory_length + new_length - mem_len)
    if rate is None:
        return overflow
    if rate < 1:
        raise ValueError(f"rate must be >= 1 or None, got {rate}.")
    return rate * (overflow // rate)  # (written so, a traced length is a known multiple of the rate)


def split_memory(
    memory_states: Sequence[torch.Tensor] | None,
    memory_mask: torch.Tensor | None,
    new_states: Sequence[torch.Tensor],
    new_mask: torch.Tensor,
    mem_len: int,
    rate: int | None,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """Append a segment's per-layer states to the memory and split off the states that leave it.

    Args:
        memory_states: per layer ``(B, M, D)``, or ``None`` for an empty memory.
        memory_mask: ``(B, M)`` bool, or ``None`` with ``memory_states=None``.
        new_states: per layer ``(B, T, D)``, the hidden states that entered each layer for the new segment.
        new_mask: ``(B, T)`` bool, ``True`` for real positions.
        mem_len: memory capacity ``n_m``.
        rate: compression rate ``c`` (states leave in whole groups of ``c``), or ``None`` (no compressed memory).

    Returns:
        ``(kept, kept_mask, evicted, evicted_mask)``: per layer ``(B, M', D)`` and ``(B, N, D)`` tensors (detached)
        with their ``(B, M')`` and ``(B, N)`` masks; ``evicted`` holds the oldest states, ``N`` a multiple of ``c``.
    """
    if memory_states is not None and len(memory_states) != len(new_states):
        raise ValueError(f"memory has {len(memory_states)} layers but the segment has {len(new_states)}.")
    with torch.no_grad():
        if memory_states is None:
            full = tuple(state.detach() for state in new_states)
            full_mask = new_mask
        else:
            full = tuple(
                torch.cat([old, new.to(old.dtype)], dim=1).detach()  # (B, M + T, D)
                for old, new in zip(memory_states, new_states, strict=True)
            )
            full_mask = torch.cat([memory_mask, new_mask], dim=1)  # (B, M + T)
        memory_length = 0 if memory_states is None else memory_mask.shape[1]
        count = evicted_length(memory_length, new_mask.shape[1], mem_len, rate)
        kept = tuple(state[:, count:] for state in full)
        evicted = tuple(state[:, :count] for state in full)
    return kept, full_mask[:, count:], evicted, full_mask[:, :count]


def append_compressed(
    compressed_states: Sequence[torch.Tensor] | None,
    compressed_mask: torch.Tensor | None,
    new_states: Sequence[torch.Tensor],
    new_mask: torch.Tensor,
    cmem_len: int,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Append newly compressed slots to the compressed memory, keep its ``cmem_len`` most recent slots, detach.

    Args:
        compressed_states: per layer ``(B, C, D)``, or ``None`` for an empty compressed memory.
        compressed_mask: ``(B, C)`` bool, or ``None``.
        new_states: per layer ``(B, G, D)``; new_mask: ``(B, G)``.

    Returns:
        per layer ``(B, min(C + G, cmem_len), D)`` states and their mask.
    """
    if cmem_len < 0:
        raise ValueError(f"cmem_len must be >= 0, got {cmem_len}.")
    with torch.no_grad():
        if compressed_states is None:
            states = tuple(state.detach() for state in new_states)
            mask = new_mask
        else:
            states = tuple(
                torch.cat([old, new.to(old.dtype)], dim=1).detach()
                for old, new in zip(compressed_states, new_states, strict=True)
            )
            mask = torch.cat([compressed_mask, new_mask], dim=1)
        start = max(0, mask.shape[1] - cmem_len)
        return tuple(state[:, start:] for state in states), mask[:, start:]


@dataclass
class CompressiveMemory:
    """Recurrence state of the Compressive Transformer, passed in and returned by ``forward`` (as ``mems``).

    Attributes:
        memory: the per-layer memory of recent hidden states, ``(B, M, D)`` per layer.
        compressed: the per-layer compressed memory, ``(B, C, D)`` per layer (``C`` may be 0).
        usage: only for "most-used" compression: per layer ``(B, M, 2)`` float, for every memory slot the summed
            attention probability it has received so far (mean over heads) and the number of queries that could
            attend to it; their ratio is the slot's average usage. ``None`` otherwise.
    """

    memory: SegmentMemory
    compressed: SegmentMemory
    usage: tuple[torch.Tensor, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.memory, SegmentMemory) or not isinstance(self.compressed, SegmentMemory):
            raise TypeError("CompressiveMemory.memory and .compressed must be SegmentMemory objects.")
        if len(self.memory) != len(self.compressed) or self.memory.batch_size != self.compressed.batch_size:
            raise ValueError(
                f"CompressiveMemory: memory ({len(self.memory)} layers, batch {self.memory.batch_size}) and "
                f"compressed memory ({len(self.compressed)} layers, batch {self.compressed.batch_size}) must match."
            )
        if self.usage is not None:
            self.usage = tuple(self.usage)
            expected = (self.memory.batch_size, self.memory.length, 2)
            if len(self.usage) != len(self.memory) or any(tuple(u.shape) != expected for u in self.usage):
                raise ValueError(f"CompressiveMemory.usage must hold one {expected} tensor per layer.")

    @classmethod
    def from_states(
        cls, memory_states: Sequence[torch.Tensor], compressed_states: Sequence[torch.Tensor] | None = None
    ) -> CompressiveMemory:
        """Wrap per-layer ``(B, M, D)`` memory and ``(B, C, D)`` compressed tensors whose every slot is real."""
        memory = SegmentMemory.from_states(memory_states)
        if compressed_states is None:
            compressed_states = [state[:, :0] for state in memory.states]
        return cls(memory, SegmentMemory.from_states(compressed_states))

    @classmethod
    def empty_like(cls, new_states: Sequence[torch.Tensor]) -> CompressiveMemory:
        """Both memories with no slots yet, for per-layer ``(B, T, D)`` states like ``new_states``: the start of a
        stream, which `update` then fills."""
        empty = SegmentMemory.empty_like(new_states)
        return cls(empty, empty)

    @property
    def batch_size(self) -> int:
        return self.memory.batch_size

    def __len__(self) -> int:
        return len(self.memory)

    def update(
        self,
        new_states: Sequence[torch.Tensor],
        *,
        mem_len: int,
        cmem_len: int,
        rate: int,
        compress: Sequence[LayerCompressFn] | None = None,
        new_mask: torch.Tensor | None = None,
        usage: Sequence[torch.Tensor] | None = None,
    ) -> CompressiveUpdate:
        """The memories after a segment (algorithm 1, `update_compressive_memory`); this memory is left as it is.

        Args:
            new_states: per layer ``(B, T, D)``, the hidden states that entered each layer for the segment.
            mem_len, cmem_len, rate: ``n_m`` (``>= 1``), ``n_cm`` and ``c``.
            compress: per layer the compression function ``f_c`` with that layer's parameters bound, called as
                ``compress[layer](states, mask, usage=usage)``: ``(B, N, D)`` states leaving the memory (mask
                ``(B, N)``) to ``(B, N / c, D)`` slots and their mask, e.g.
                ``functools.partial(compress_memory, "conv", rate=c, weights=(kernel,), biases=(bias,))``.
                Needed when ``cmem_len > 0``. Its output may carry gradients (for the auxiliary losses).
            new_mask: ``(B, T)`` bool, ``True`` for real positions (default: all).
            usage: only for "most-used" compression: per layer ``(B, M + T, 2)``, the attention that the memory
                slots and the new states received in this segment (summed over queries, mean over heads) and the
                number of queries that could attend to them. They are added to the statistics this memory
                carries; ``f_c`` ranks the leaving states by their ratio, and the kept slots carry theirs on.

        Returns:
            `CompressiveUpdate`: the next memory, and the states that left the memory with their compression (for
            the auxiliary losses; empty when nothing was compressed).
        """
        if new_mask is None:
            new_mask = torch.ones(new_states[0].shape[:2], dtype=torch.bool, device=new_states[0].device)
        if cmem_len > 0 and (compress is None or len(compress) != len(new_states)):
            raise ValueError(
                f"compress must hold one compression function per layer ({len(new_states)}) when cmem_len > 0 "
                f"(cmem_len={cmem_len}); pass cmem_len=0 for a memory without compressed slots."
            )
        if usage is not None:
            usage = self._gathered_usage(usage, new_mask.shape[1])

        def compress_layer(layer: int, states: torch.Tensor, mask: torch.Tensor):
            average = None
            if usage is not None:  # the leaving states are the oldest of [memory, segment]
                received, seen_by = usage[layer][:, : states.shape[1]].unbind(-1)
                average = received / seen_by.clamp(min=1)
            return compress[layer](states, mask, usage=average)

        step = update_compressive_memory(self, new_states, new_mask, (mem_len, cmem_len, rate), compress_layer)
        if usage is not None:  # the kept slots carry their usage statistics to the next segment
            kept_usage = tuple(layer_usage[:, step.evicted_mask.shape[1] :] for layer_usage in usage)
            step = step._replace(memory=CompressiveMemory(step.memory.memory, step.memory.compressed, kept_usage))
        return step

    def _gathered_usage(self, usage: Sequence[torch.Tensor], new_length: int) -> tuple[torch.Tensor, ...]:
        """A segment's usage statistics over ``[memory, segment]`` plus what the memory slots gathered before."""
        expected = (self.batch_size, self.memory.length + new_length, 2)
        if len(usage) != len(self) or any(tuple(u.shape) != expected for u in usage):
            raise ValueError(f"usage must hold one {expected} tensor per layer ({len(self)}).")
        if self.usage is None:
            return tuple(usage)
        return tuple(u + F.pad(old, (0, 0, 0, new_length)) for u, old in zip(usage, self.usage, strict=True))

    def reset(self, rows: torch.Tensor) -> CompressiveMemory:
        """Forget both memories of the batch rows where ``rows`` (``(B,)`` bool) is True (a document starts)."""
        return CompressiveMemory(self.memory.reset(rows), self.compressed.reset(rows), self.usage)

    def index_select(self, index: torch.Tensor) -> CompressiveMemory:
        """Reorder or repeat batch rows (beam search, expanding a prompt to several samples)."""
        usage = None if self.usage is None else tuple(u.index_select(0, index.to(u.device)) for u in self.usage)
        return CompressiveMemory(self.memory.index_select(index), self.compressed.index_select(index), usage)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors for saving (training checkpoints): ``memory.*``, ``compressed.*`` and ``usage.<layer>``."""
        tensors = {f"memory.{k}": v for k, v in self.memory.state_dict().items()}
        tensors.update({f"compressed.{k}": v for k, v in self.compressed.state_dict().items()})
        if self.usage is not None:
            tensors.update({f"usage.{i}": u for i, u in enumerate(self.usage)})
        return tensors

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor]) -> CompressiveMemory:
        """Rebuild a memory saved with `state_dict`."""
        parts = {"memory": {}, "compressed": {}, "usage": {}}
        for key, value in tensors.items():
            part, _, rest = key.partition(".")
            if part not in parts:
                raise ValueError(f"not a CompressiveMemory state dict: unexpected key {key!r}.")
            parts[part][rest] = value
        usage = tuple(parts["usage"][str(i)] for i in range(len(parts["usage"]))) if parts["usage"] else None
        return cls(
            SegmentMemory.from_state_dict(parts["memory"]), SegmentMemory.from_state_dict(parts["compressed"]), usage
        )

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> CompressiveMemory:
        """Move everything to ``device`` and cast the states to ``dtype`` (usage statistics stay float32)."""
        usage = None if self.usage is None else tuple(u.to(device) for u in self.usage)
        return CompressiveMemory(self.memory.to(device, dtype), self.compressed.to(device, dtype), usage)


CompressFn = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
LayerCompressFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class CompressiveUpdate(NamedTuple):
    """What one memory update returns: the next memory and, for the auxiliary losses, the states that left the
    memory ``(B, N, D)`` per layer (detached) with their ``(B, N)`` mask and their compression ``(B, N / c, D)``
    per layer with its ``(B, N / c)`` mask (empty tuples when nothing was compressed)."""

    memory: CompressiveMemory
    evicted: tuple[torch.Tensor, ...]
    evicted_mask: torch.Tensor
    compressed: tuple[torch.Tensor, ...]
    compressed_mask: torch.Tensor


def update_compressive_memory(
    memory: CompressiveMemory | None,
    new_states: Sequence[torch.Tensor],
    new_mask: torch.Tensor,
    sizes: tuple[int, int, int],
    compress: CompressFn,
) -> CompressiveUpdate:
    """One step of algorithm 1's memory update, for every layer.

    Args:
        memory: the state before the segment, or ``None`` at the start of the streams.
        new_states: per layer ``(B, T, D)``; new_mask: ``(B, T)``.
        sizes: ``(mem_len, cmem_len, rate)`` = ``(n_m, n_cm, c)``; ``mem_len >= 1``.
        compress: ``compress(layer, states, mask) -> (compressed, compressed_mask)`` maps ``(B, N, D)`` to
            ``(B, N / c, D)``; called only when states leave the memory and ``cmem_len > 0``. Its output may carry
            gradients (for the auxiliary losses); what is stored is detached.

    Returns:
        `CompressiveUpdate` ``(memory, evicted, evicted_mask, compressed, compressed_mask)``: the evicted states per
        layer ``(B, N, D)`` (detached) and their compression per layer ``(B, N / c, D)`` as returned by
        ``compress`` (empty tuples when nothing was compressed).
    """
    mem_len, cmem_len, rate = sizes
    if mem_len < 1:
        raise ValueError(f"mem_len must be >= 1 for a memory update, got {mem_len}.")
    kept, kept_mask, evicted, evicted_mask = split_memory(
        None if memory is None else memory.memory.states,
        None if memory is None else memory.memory.mask,
        new_states,
        new_mask,
        mem_len,
        rate if cmem_len > 0 else None,
    )
    batch = new_mask.shape[0]
    if memory is None:
        old_compressed = tuple(state[:, :0] for state in kept)
        old_compressed_mask = kept_mask[:, :0]
    else:
        old_compressed, old_compressed_mask = memory.compressed.states, memory.compressed.mask
    compressed, compressed_mask = (), torch.zeros(batch, 0, dtype=torch.bool, device=new_mask.device)
    if cmem_len > 0 and evicted_mask.shape[1] > 0:
        pieces = [compress(layer, states, evicted_mask) for layer, states in enumerate(evicted)]
        compressed = tuple(piece[0] for piece in pieces)
        compressed_mask = pieces[0][1]
        stored, stored_mask = append_compressed(
            old_compressed, old_compressed_mask, compressed, compressed_mask, cmem_len
        )
    else:
        stored, stored_mask = tuple(state.detach() for state in old_compressed), old_compressed_mask
    new_memory = CompressiveMemory(SegmentMemory(kept, kept_mask), SegmentMemory(stored, stored_mask))
    return CompressiveUpdate(new_memory, evicted, evicted_mask, compressed, compressed_mask)


__all__ = [
    "CompressiveMemory",
    "CompressiveUpdate",
    "append_compressed",
    "evicted_length",
    "split_memory",
    "update_compressive_memory",
]
