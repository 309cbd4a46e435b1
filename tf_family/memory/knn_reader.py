"""Products of queries with the kNN memory pairs they retrieved, read by slot from the memory's buffers by the
native pair kernels (``csrc/knn_pairs.cpp``) instead of gathered copies: `MemoryReader`, which
`tf_family.memory.knn_memory.fused_knn_attention` uses where it can and `KNNMemory.write` keeps correct across a write
in place (the gathered copies, `tf_family.memory.knn_memory.gather_blocks`, are its twin).

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``N`` memory slots, ``K`` neighbours, ``Dh`` head width,
``R = B * H``.
"""

from __future__ import annotations

import weakref

import torch

from ..attention import native

_READERS: dict[int, weakref.WeakSet] = {}  # id of a memory key buffer -> the live readers of it


class MemoryReader:
    """The memory pairs the queries retrieved, read by slot from the memory's buffers by the native pair kernels
    (``csrc/knn_pairs.cpp``: ``knn_pair_scores``, ``knn_pair_mix``) instead of gathered copies, as they were at
    retrieval.

    The model writes the segment into the memory in place at the end of its forward, before the backward reads
    the retrieved pairs again. While a reader is alive (its autograd graph holds it), such a write first copies the
    rows it overwrites aside (`KNNMemory.write` calls `stash_before_write`: ``T`` slots per row and head, against
    ``k`` gathered copies per query), and the kernels read those slots from the copies. A reader that no graph holds
    is gone, and writes copy nothing."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, extension):
        self.keys, self.values, self.extension = keys, values, extension
        batch, heads, capacity, width = keys.shape
        self.shape = (batch * heads, capacity, width)
        self.slots = slots.reshape(batch * heads, slots.shape[2], slots.shape[3]).contiguous()  # (R, T, K)
        self.remap: torch.Tensor | None = None  # (N,) int32: a stashed slot's row in the copies, else -1
        self.stashed: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, H, C, Dh) keys and values copied aside
        if len(_READERS) > 64:  # forget buffers no live reader reads any more
            for key in [key for key, readers in _READERS.items() if not readers]:
                del _READERS[key]
        _READERS.setdefault(id(keys), weakref.WeakSet()).add(self)

    @classmethod
    def of(
        cls, memory: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, dtype: torch.dtype
    ) -> MemoryReader | None:
        """A reader of the pairs at ``slots`` ``(B, H, T, K)`` of ``memory`` (its key and value buffers) for queries
        of ``dtype``, or None where the native pair kernels do not run: not float32 on CPU, an empty memory, under
        `torch.compile` / export, or no kernel."""
        keys, values = memory
        if keys.shape[2] == 0 or dtype != torch.float32 or not (keys.is_contiguous() and values.is_contiguous()):
            return None
        extension = native.float32_cpu_extension(keys, values)
        return None if extension is None else cls(keys, values, slots, extension)

    @staticmethod
    def stash_before_write(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """Called by a write in place about to overwrite ``slots`` (``(C,)``) of these key and value buffers: every
        live reader of them keeps the rows it has not kept yet."""
        readers = _READERS.get(id(keys))
        if not readers:
            _READERS.pop(id(keys), None)
            return
        for reader in list(readers):
            if reader.keys is keys and reader.values is values:
                reader._stash(slots)

    def _stash(self, slots: torch.Tensor) -> None:
        if self.remap is None:
            self.remap = torch.full((self.shape[1],), -1, dtype=torch.int32, device=slots.device)
        fresh = slots[self.remap[slots] < 0].unique()
        if fresh.numel() == 0:
            return
        kept = 0 if self.stashed is None else self.stashed[0].shape[2]
        self.remap[fresh] = torch.arange(kept, kept + fresh.numel(), dtype=torch.int32, device=slots.device)
        rows = (self.keys[:, :, fresh], self.values[:, :, fresh])  # advanced indexing: copies
        if self.stashed is not None:
            rows = tuple(torch.cat(pair, 2) for pair in zip(self.stashed, rows, strict=True))
        self.stashed = rows

    def _memory(self, part: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        buffer = (self.keys, self.values)[part].view(self.shape)
        if self.stashed is None:
            return buffer, None, None
        return buffer, self.remap, self.stashed[part].reshape(self.shape[0], -1, self.shape[2])

    def scores(self, x: torch.Tensor, part: int) -> torch.Tensor:
        """``(R, T, Dh)`` -> ``(R, T, K)``: ``x`` against each query's retrieved keys (``part=0``) or values (1)."""
        buffer, remap, stash = self._memory(part)
        return self.extension.knn_pair_scores(x.contiguous(), buffer, self.slots, remap, stash)

    def mix(self, weights: torch.Tensor, part: int) -> torch.Tensor:
        """``(R, T, K)`` -> ``(R, T, Dh)``: each query's weighted sum of its retrieved keys (0) or values (1)."""
        buffer, remap, stash = self._memory(part)
        return self.extension.knn_pair_mix(weights.contiguous(), buffer, self.slots, remap, stash)


__all__ = ["MemoryReader"]
