"""Segment-level recurrence memory (Transformer-XL, Dai et al. 2019, section 3.2).

Per layer the model remembers the hidden states that *entered* that layer for the last ``M`` positions. The memory
is explicit state: it goes into ``forward`` as an argument and comes back in the output, never hides on a module.
A boolean mask per slot records which slots hold real positions, so that a batch row can be reset at a document
boundary (its old slots are masked, not zeroed: a zero vector is still a key) and left padding stays invisible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def update_segment_memory(
    memory_states: Sequence[torch.Tensor] | None,
    memory_mask: torch.Tensor | None,
    new_states: Sequence[torch.Tensor],
    new_mask: torch.Tensor,
    mem_len: int,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor] | None:
    """Append a segment's per-layer states to the memory and keep the ``mem_len`` most recent positions.

    Args:
        memory_states: per layer ``(B, M, D)``, or ``None`` for an empty memory.
        memory_mask: ``(B, M)`` bool, ``True`` for real positions; ``None`` with ``memory_states=None``.
        new_states: per layer ``(B, T, D)``: the hidden states that entered each layer for the new segment.
        new_mask: ``(B, T)`` bool, ``True`` for real (non-padding) positions of the new segment.
        mem_len: memory capacity; ``0`` returns ``None`` (no recurrence).

    Returns:
        ``(states, mask)`` with ``states`` per layer ``(B, min(M + T, mem_len), D)``, detached from the graph
        (the paper's stop-gradient), or ``None`` when ``mem_len == 0``.
    """
    if mem_len < 0:
        raise ValueError(f"mem_len must be >= 0, got {mem_len}.")
    if mem_len == 0:
        return None
    with torch.no_grad():
        if memory_states is None:
            states = tuple(state[:, -mem_len:].detach() for state in new_states)
            mask = new_mask[:, -mem_len:]
        else:
            if len(memory_states) != len(new_states):
                raise ValueError(f"memory has {len(memory_states)} layers but the segment has {len(new_states)}.")
            states = tuple(
                torch.cat([old, new.to(old.dtype)], dim=1)[:, -mem_len:].detach()  # (B, min(M + T, mem_len), D)
                for old, new in zip(memory_states, new_states, strict=True)
            )
            mask = torch.cat([memory_mask, new_mask], dim=1)[:, -mem_len:]
    return states, mask


@dataclass
class SegmentMemory:
    """Recurrence state of a segment-level memory model, passed in and returned by ``forward``.

    Attributes:
        states: per layer a ``(B, M, D)`` tensor: the hidden states that entered the layer.
        mask: ``(B, M)`` bool, ``True`` where a slot holds a real position of the current stream.
    """

    states: tuple[torch.Tensor, ...]
    mask: torch.Tensor

    def __post_init__(self):
        self.states = tuple(self.states)
        if not self.states:
            raise ValueError("SegmentMemory needs at least one layer of states.")
        batch, length = self.states[0].shape[:2]
        if self.mask.shape != (batch, length):
            raise ValueError(f"SegmentMemory.mask must have shape {(batch, length)}, got {tuple(self.mask.shape)}.")
        if any(state.shape[:2] != (batch, length) for state in self.states):
            raise ValueError("SegmentMemory.states must all have the same batch size and length.")
        self.mask = self.mask.to(torch.bool)

    @classmethod
    def from_states(cls, states: Sequence[torch.Tensor]) -> SegmentMemory:
        """Wrap per-layer ``(B, M, D)`` tensors whose every slot is real."""
        states = tuple(states)
        if not states:
            raise ValueError("SegmentMemory.from_states needs at least one layer of states.")
        mask = torch.ones(states[0].shape[:2], dtype=torch.bool, device=states[0].device)
        return cls(states, mask)

    @classmethod
    def empty_like(cls, new_states: Sequence[torch.Tensor]) -> SegmentMemory:
        """A memory with no slots yet, for per-layer ``(B, T, D)`` states like ``new_states``: the start of a
        stream, which `update` then fills."""
        states = tuple(state[:, :0].detach() for state in new_states)  # (B, 0, D) per layer
        if not states:
            raise ValueError("SegmentMemory.empty_like needs at least one layer of states.")
        return cls(states, torch.zeros(states[0].shape[:2], dtype=torch.bool, device=states[0].device))

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, layer: int) -> torch.Tensor:
        return self.states[layer]

    def reset(self, rows: torch.Tensor) -> SegmentMemory:
        """Forget the memory of the batch rows where ``rows`` (``(B,)`` bool) is True, e.g. at a document start."""
        rows = torch.as_tensor(rows, device=self.mask.device)
        if rows.dtype != torch.bool or rows.shape != (self.batch_size,):
            raise ValueError(
                f"reset rows must be a bool tensor of shape ({self.batch_size},), got {rows.dtype} {tuple(rows.shape)}."
            )
        return SegmentMemory(self.states, self.mask & ~rows[:, None])

    def index_select(self, index: torch.Tensor) -> SegmentMemory:
        """Reorder or repeat batch rows (beam search, expanding a prompt to several samples)."""
        index = index.to(self.mask.device)
        return SegmentMemory(tuple(state.index_select(0, index) for state in self.states), self.mask[index])

    def update(
        self, new_states: Sequence[torch.Tensor], *, mem_len: int, new_mask: torch.Tensor | None = None
    ) -> SegmentMemory | None:
        """The memory after a segment: ``new_states`` (per layer ``(B, T, D)``, the hidden states that entered each
        layer) appended and the ``mem_len`` most recent positions kept, detached (`update_segment_memory`).

        ``new_mask`` ``(B, T)`` bool marks the real (non-padding) positions of the segment (default: all). Returns a
        new memory (this one is left as it is), or ``None`` when ``mem_len == 0`` (no recurrence).
        """
        if new_mask is None:
            new_mask = torch.ones(new_states[0].shape[:2], dtype=torch.bool, device=new_states[0].device)
        updated = update_segment_memory(self.states, self.mask, new_states, new_mask, mem_len)
        return None if updated is None else SegmentMemory(*updated)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors for saving (e.g. with safetensors in a training checkpoint): ``mask`` and ``states.<layer>``."""
        return {"mask": self.mask, **{f"states.{i}": state for i, state in enumerate(self.states)}}

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor]) -> SegmentMemory:
        """Rebuild a memory saved with `state_dict`."""
        if "mask" not in tensors or "states.0" not in tensors:
            raise ValueError(f"not a SegmentMemory state dict: keys {sorted(tensors)}.")
        layers = sum(1 for key in tensors if key.startswith("states."))
        return cls(tuple(tensors[f"states.{i}"] for i in range(layers)), tensors["mask"])

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> SegmentMemory:
        """Move the states (and mask) to ``device`` and cast the states to ``dtype``."""
        states = tuple(state.to(device=device, dtype=dtype) for state in self.states)
        return SegmentMemory(states, self.mask.to(device=device))
