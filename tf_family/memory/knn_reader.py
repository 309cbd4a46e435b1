"""Products of queries with the kNN memory pairs they retrieved, read by slot from the memory's buffers by the
native pair kernels (``csrc/knn_pairs.cpp``) instead of gathered copies: `MemoryReader`, which
`tf_family.memory.knn_memory.fused_knn_attention` uses where it can, and `ReaderRegistry`, the live readers of one
kNN layer's buffers, which the memory that owns the buffers (`KNNMemory.readers`) holds and asks to keep what they
read before it writes over it in place (the gathered copies, `tf_family.memory.knn_memory.gather_blocks`, are the
readers' twin).

Shapes: ``B`` batch, ``H`` heads, ``T`` queries, ``N`` memory slots, ``K`` neighbours, ``Dh`` head width,
``R = B * H``.
"""

from __future__ import annotations

import weakref

import torch

from ..attention import native


class ReaderRegistry:
    """The live `MemoryReader`s of one kNN layer's key and value buffers.

    Owned by the `KNNMemory` that holds the buffers, and shared with the memories that share them (a reset, the
    memory a write in place returns): a write in place into the buffers first asks every reader registered here to
    keep the rows it is about to overwrite (`stash_before_write`). Readers are held weakly: a reader that no
    autograd graph holds any more is gone, and the write copies nothing for it."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values  # the buffers whose readers these are
        self._readers: weakref.WeakSet[MemoryReader] = weakref.WeakSet()

    def __len__(self) -> int:
        return len(self._readers)

    def add(self, reader: MemoryReader) -> None:
        if reader.keys is not self.keys or reader.values is not self.values:
            raise ValueError(
                "this MemoryReader reads other buffers than the ReaderRegistry passed with it: pass the registry of "
                "the memory layer the pairs were retrieved from (KNNMemory.readers[layer])."
            )
        self._readers.add(reader)

    def stash_before_write(self, slots: torch.Tensor) -> None:
        """Called by a write in place about to overwrite ``slots`` (``(C,)``) of the buffers: every live reader of
        them keeps the rows it has not kept yet."""
        for reader in list(self._readers):
            reader._stash(slots)


class MemoryReader:
    """The memory pairs the queries retrieved, read by slot from the memory's buffers by the native pair kernels
    (``csrc/knn_pairs.cpp``: ``knn_pair_scores``, ``knn_pair_mix``) instead of gathered copies, as they were at
    retrieval.

    The model writes the segment into the memory in place at the end of its forward, before the backward reads
    the retrieved pairs again. While a reader is alive (its autograd graph holds it), such a write first copies the
    rows it overwrites aside (`KNNMemory.write` calls `ReaderRegistry.stash_before_write` on the registry the reader
    was made with: ``T`` slots per row and head, against ``k`` gathered copies per query), and the kernels read those
    slots from the copies. A reader that no graph holds is gone, and writes copy nothing."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, extension):
        self.keys, self.values, self.extension = keys, values, extension
        batch, heads, capacity, width = keys.shape
        self.shape = (batch * heads, capacity, width)
        self.slots = slots.reshape(batch * heads, slots.shape[2], slots.shape[3]).contiguous()  # (R, T, K)
        self.remap: torch.Tensor | None = None  # (N,) int32: a stashed slot's row in the copies, else -1
        self.stashed: tuple[torch.Tensor, torch.Tensor] | None = None  # (B, H, C, Dh) keys and values copied aside

    @classmethod
    def of(
        cls,
        memory: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        dtype: torch.dtype,
        registry: ReaderRegistry,
    ) -> MemoryReader | None:
        """A reader of the pairs at ``slots`` ``(B, H, T, K)`` of ``memory`` (its key and value buffers) for queries
        of ``dtype``, registered with ``registry`` (the buffers' `ReaderRegistry`, whose writes in place keep it
        correct), or None where the native pair kernels do not run: not float32 on CPU, an empty memory, under
        `torch.compile` / export, or no kernel."""
        keys, values = memory
        if keys.shape[2] == 0 or dtype != torch.float32 or not (keys.is_contiguous() and values.is_contiguous()):
            return None
        extension = native.float32_cpu_extension(keys, values)
        if extension is None:
            return None
        reader = cls(keys, values, slots, extension)
        registry.add(reader)
        return reader

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

    def _operands(self, buffer: torch.Tensor, stashed: torch.Tensor | None):
        """The kernels' arguments after the product's left operand: ``buffer`` (the memory's keys or values) as
        ``(R, N, Dh)``, the slots, and the slot remap and the rows stashed before a write in place (None, None
        while nothing is stashed)."""
        if stashed is None:
            return buffer.view(self.shape), self.slots, None, None
        return buffer.view(self.shape), self.slots, self.remap, stashed.reshape(self.shape[0], -1, self.shape[2])

    @property
    def _keys(self):
        return self._operands(self.keys, None if self.stashed is None else self.stashed[0])

    @property
    def _values(self):
        return self._operands(self.values, None if self.stashed is None else self.stashed[1])

    def key_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``(R, T, Dh)`` -> ``(R, T, K)``: ``x`` against each query's retrieved keys."""
        return self.extension.knn_pair_scores(x.contiguous(), *self._keys)

    def value_scores(self, x: torch.Tensor) -> torch.Tensor:
        """``(R, T, Dh)`` -> ``(R, T, K)``: ``x`` against each query's retrieved values."""
        return self.extension.knn_pair_scores(x.contiguous(), *self._values)

    def mix_keys(self, weights: torch.Tensor) -> torch.Tensor:
        """``(R, T, K)`` -> ``(R, T, Dh)``: each query's weighted sum of its retrieved keys."""
        return self.extension.knn_pair_mix(weights.contiguous(), *self._keys)

    def mix_values(self, weights: torch.Tensor) -> torch.Tensor:
        """``(R, T, K)`` -> ``(R, T, Dh)``: each query's weighted sum of its retrieved values."""
        return self.extension.knn_pair_mix(weights.contiguous(), *self._values)


__all__ = ["MemoryReader", "ReaderRegistry"]
