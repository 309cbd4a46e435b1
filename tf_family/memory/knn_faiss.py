"""Persistent faiss indexes over the slots of a kNN memory (the Memorizing Transformer's ``knn_search="faiss"``).

One index per (kNN layer, batch row, head), built once from the slots written so far and then kept in step with
the memory: every write in place removes the overwritten slots from it and adds the new keys under their slot
numbers (faiss ids), so nothing is rebuilt per call. ``index_type`` chooses the index: ``"flat"`` (exact inner
product), ``"ivf_flat"`` or ``"ivf_pq"`` (an inverted file over ``nlist`` k-means cells, ``nprobe`` of them visited
per query; PQ stores each key in ``pq_m`` bytes instead of ``4 * Dh``). An IVF index is trained once, on the keys
present when it is first built (at least ``nlist`` of them; until then the flat index stands in and is replaced
once enough keys are written). Its recall is below 1 (tested against brute force in
``tests/memory/test_knn_faiss.py``).

Which slots a query may see (the memory's mask, resets, the token rule's evictions) is applied after the search,
as in `tf_family.memory.knn_memory.faiss_top_k`: each query asks for enough neighbours to cover the indexed slots it
may not see.
"""

from __future__ import annotations

import numpy as np
import torch

from .knn import FaissKNNStore, _require_faiss

FAISS_MEMORY_INDEXES = ("flat", "ivf_flat", "ivf_pq")


def _array(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).contiguous().numpy()


class FaissSlotIndex:
    """A faiss inner-product index over the written slots of one (row, head) of a kNN memory.

    Args:
        keys: ``(N, Dh)`` the memory's keys; written: ``(N,)`` bool, the slots that hold an entry.
        index_type: one of `FAISS_MEMORY_INDEXES`. nlist, nprobe, pq_m: the IVF / PQ parameters.
        seed: k-means seed (training is deterministic given it).
    """

    def __init__(
        self,
        keys: torch.Tensor,
        written: torch.Tensor,
        index_type: str = "flat",
        nlist: int = 64,
        nprobe: int = 8,
        pq_m: int = 8,
        seed: int = 1234,
    ):
        if index_type not in FAISS_MEMORY_INDEXES:
            raise ValueError(f"index_type={index_type!r} is unknown; choose one of {list(FAISS_MEMORY_INDEXES)}.")
        slots = written.nonzero().flatten()
        self.wanted = index_type
        # an IVF index needs nlist training keys; with fewer, the exact index stands in until enough are written
        self.index_type = index_type if slots.numel() >= nlist else "flat"
        store = FaissKNNStore(keys.shape[1], "ip", self.index_type, nlist=nlist, nprobe=nprobe, pq_m=pq_m, seed=seed)
        index = store.index
        if self.index_type == "flat":
            index = _require_faiss().IndexIDMap2(index)
            self._inner = store.index  # faiss keeps a raw pointer: the flat index must live as long as the map
        else:
            store.train(keys[slots])
            self._store = store  # keeps the IVF quantizer alive
        self.index = index
        self.count = 0
        self.add(slots, keys[slots])

    @property
    def provisional(self) -> bool:
        """True while the exact index stands in for an IVF one that could not be trained yet."""
        return self.index_type != self.wanted

    def add(self, slots: torch.Tensor, keys: torch.Tensor) -> None:
        if slots.numel():
            self.index.add_with_ids(_array(keys), slots.to("cpu", torch.int64).numpy())
            self.count = int(self.index.ntotal)

    def update(self, slots: torch.Tensor, keys: torch.Tensor) -> None:
        """The slots ``(C,)`` were overwritten with ``keys`` ``(C, Dh)``: drop their old entries, add the new."""
        ids = slots.to("cpu", torch.int64).numpy()
        self.index.remove_ids(_require_faiss().IDSelectorBatch(ids))
        self.add(slots, keys)

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(T, Dh)`` queries -> scores and slots ``(T, k')`` with ``k' = min(k, indexed slots)`` (slot -1 and score
        ``-inf`` where the index found fewer)."""
        k = min(k, self.count)
        if k == 0:
            empty = torch.zeros(queries.shape[0], 0)
            return empty, empty.long()
        scores, ids = self.index.search(_array(queries), k)
        scores, ids = torch.from_numpy(scores), torch.from_numpy(ids)
        return scores.masked_fill(ids < 0, float("-inf")), ids


def build_slot_indexes(
    keys: torch.Tensor, written: torch.Tensor, index_type: str = "flat", **params
) -> list[FaissSlotIndex]:
    """One `FaissSlotIndex` per (row, head) of ``keys`` ``(B, H, N, Dh)``, over the slots ``written`` ``(B, N)``."""
    batch, heads = keys.shape[:2]
    return [FaissSlotIndex(keys[b, h], written[b], index_type, **params) for b in range(batch) for h in range(heads)]


def update_slot_indexes(indexes: list[FaissSlotIndex], slots: torch.Tensor, keys: torch.Tensor) -> None:
    """Keep every (row, head) index in step with a write of ``keys`` ``(B, H, C, Dh)`` into ``slots`` ``(C,)``."""
    heads = keys.shape[1]
    for position, index in enumerate(indexes):
        index.update(slots, keys[position // heads, position % heads])


__all__ = ["FAISS_MEMORY_INDEXES", "FaissSlotIndex", "build_slot_indexes", "update_slot_indexes"]
