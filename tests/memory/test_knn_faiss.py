"""The persistent faiss indexes of the kNN memory: kept in step with in-place writes (evictions included), exact
when flat, an IVF index's recall against brute force."""

import pytest
import torch
import torch.nn.functional as F

from tf_family.memory import KNNMemory, exact_top_k

faiss = pytest.importorskip("faiss")

from tf_family.memory.knn_faiss import FaissSlotIndex  # noqa: E402
from tf_family.memory.knn_search import faiss_top_k  # noqa: E402


def unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def test_flat_indexes_follow_in_place_writes_with_evictions():
    """A memory of 12 slots written 5 segments of 5 (evictions wrap around): after each write the persistent
    indexes, updated, not rebuilt, give exactly the exact search's neighbours."""
    memory = KNNMemory.empty(2, 1, 2, 8, 12)
    memory = memory.write([unit(2, 2, 3, 8, seed=9)], [unit(2, 2, 3, 8, seed=9)], in_place=True)
    indexes = memory.faiss_indexes(0)
    assert [index.count for index in indexes] == [3, 3, 3, 3]
    for step in range(5):
        keys = unit(2, 2, 5, 8, seed=step)
        memory = memory.write([keys], [keys], in_place=True)
        assert memory.faiss_indexes(0) is indexes  # the same indexes, kept in step
        queries = unit(2, 2, 4, 8, seed=100 + step)
        allowed = memory.mask[:, None, None, :]
        scores, index = faiss_top_k(queries, memory.keys[0], allowed, 5, indexes=indexes)
        expected_scores, expected_index = exact_top_k(queries, memory.keys[0], allowed, 5)
        torch.testing.assert_close(scores, expected_scores, rtol=1e-5, atol=1e-5)
        assert torch.equal(index, expected_index)
    assert all(index.count == 12 for index in indexes)  # overwritten slots were removed, not duplicated


def test_masked_slots_are_never_returned_and_copies_rebuild():
    memory = KNNMemory.empty(2, 1, 1, 8, 10)
    keys = unit(2, 1, 10, 8)
    memory = memory.write([keys], [keys], in_place=True)
    indexes = memory.faiss_indexes(0)
    reset = memory.reset(torch.tensor([True, False]))
    assert reset.faiss_indexes(0) is indexes  # a reset shares the buffers and the indexes
    scores, _ = faiss_top_k(unit(2, 1, 3, 8, seed=1), reset.keys[0], reset.mask[:, None, None, :], 4, indexes=indexes)
    assert torch.isinf(scores[0]).all() and torch.isfinite(scores[1]).all()
    assert memory.clone().faiss_indexes(0) is not indexes


def test_ivf_index_recall_against_brute_force():
    """An IVF index over 4,000 clustered keys (trained once, then 1,000 more written into it incrementally): recall
    of the exact top-10 at nprobe 8 of 32 cells."""
    centres = unit(40, 16, seed=5)
    generator = torch.Generator().manual_seed(6)

    def clustered(n):
        pick = torch.randint(0, 40, (n,), generator=generator)
        return F.normalize(centres[pick] + 0.15 * torch.randn(n, 16, generator=generator), dim=-1)

    keys = clustered(5000)
    written = torch.zeros(5000, dtype=torch.bool)
    written[:4000] = True
    index = FaissSlotIndex(keys, written, "ivf_flat", nlist=32, nprobe=8)
    assert not index.provisional and index.count == 4000
    index.update(torch.arange(4000, 5000), keys[4000:])
    queries = clustered(200)
    _, found = index.search(queries, 10)
    truth = (queries @ keys.T).topk(10, dim=-1).indices
    recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(found, truth, strict=True)) / truth.numel()
    assert recall >= 0.9
    small = FaissSlotIndex(keys, torch.arange(5000) < 10, "ivf_flat", nlist=32)
    assert small.provisional and small.count == 10  # too few keys to train: the exact index stands in
    with pytest.raises(ValueError, match="index_type"):
        FaissSlotIndex(keys, written, "hnsw")
