"""The Memorizing Transformer's kNN memory: ring buffer, resets, beam reordering, checkpoints, and the retrieval
backends against their brute-force twin."""

import pytest
import torch
import torch.nn.functional as F

from tf_family.memory import (
    Expired,
    KNNMemory,
    MemorizingMemory,
    MemoryAllowed,
    SegmentMemory,
    bucketed_top_k,
    dense_knn_attention,
    exact_top_k,
    faiss_top_k,
    gathered_knn_attention,
    grouped_top_k,
    knn_attention,
    knn_memory,
    retrieve,
    top_k_reference,
)


def unit(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), dim=-1)


def random_allowed(batch, length, slots, seed=1):
    allowed = torch.rand(batch, 1, length, slots, generator=torch.Generator().manual_seed(seed)) > 0.3
    allowed[0, 0, 0] = False  # a query that may see nothing
    return allowed


@pytest.mark.parametrize("slots", [5, 37])
def test_exact_top_k_matches_brute_force_twin(slots):
    queries, keys = unit(2, 3, 4, 8), unit(2, 3, slots, 8, seed=1)
    allowed = random_allowed(2, 4, slots)
    scores, index = exact_top_k(queries, keys, allowed, 6)
    expected_scores, expected_index = top_k_reference(queries, keys, allowed, 6)
    torch.testing.assert_close(scores, expected_scores)
    finite = expected_scores > float("-inf")
    assert torch.equal(index[finite], expected_index[finite])
    assert not finite[0, :, 0].any()  # nothing allowed, nothing found


@pytest.mark.parametrize("block", [None, 1, 60, 250])
@pytest.mark.parametrize("slots,groups", [(37, None), (37, 5), (100, 7), (64, 1), (9, 4)])
def test_grouped_top_k_is_exact(monkeypatch, slots, groups, block):
    """The two-stage search (group maxima, then the best groups' members) equals the brute-force twin, with masks,
    expired pairs (runs of slots, masked through a view, and scattered ones), a query that may see nothing, and a
    last chunk shorter than the others; also when the (row, query) pairs are scored in blocks (``block``: a score
    budget forcing one query at a time, or blocks that cut the queries and the rows unevenly)."""
    from tf_family.memory import knn_search
    from tf_family.memory.knn_search import expand_expired

    if block is not None:
        monkeypatch.setattr(knn_search, "SEARCH_BLOCK_SCORES", block)
        monkeypatch.setattr(knn_search, "SEARCH_BLOCK_MAX", block)
    queries, keys = unit(2, 3, 5, 8), unit(2, 3, slots, 8, seed=1)
    allowed = random_allowed(2, 5, slots)
    gone = torch.rand(5, 5, generator=torch.Generator().manual_seed(3)) > 0.3  # runs of slots and scattered ones
    expired = (torch.tensor([slots - 1, 0, 1, 5, 3]), gone)
    scores, index = grouped_top_k(queries, keys, allowed, 6, expired, groups=groups)
    expected_scores, expected_index = top_k_reference(queries, keys, expand_expired(allowed, expired, 5), 6)
    torch.testing.assert_close(scores, expected_scores)
    finite = expected_scores > float("-inf")
    assert torch.equal(index[finite], expected_index[finite]) and not finite[0, :, 0].any()
    assert (index >= 0).all() and (index < slots).all()


@pytest.mark.parametrize("halved_from", [1, 10**6])
def test_grouped_top_k_default_groups_are_exact(monkeypatch, halved_from):
    """The default group count (sqrt(N / k), halved for large memories) gives the brute-force twin's neighbours."""
    from tf_family.memory import knn_search

    monkeypatch.setattr(knn_search, "GROUPS_HALVED_FROM", halved_from)
    queries, keys = unit(2, 2, 5, 8), unit(2, 2, 300, 8, seed=1)
    allowed = random_allowed(2, 5, 300)
    scores, index = grouped_top_k(queries, keys, allowed, 4)
    expected_scores, expected_index = top_k_reference(queries, keys, allowed, 4)
    torch.testing.assert_close(scores, expected_scores)
    finite = expected_scores > float("-inf")
    assert torch.equal(index[finite], expected_index[finite])


@pytest.mark.parametrize("width,k", [(600, 32), (1280, 32), (1283, 7), (700, 700), (40, 64)])
def test_select_top_k_equals_topk(monkeypatch, width, k):
    """The selection through group maxima gives torch.topk's values, sorted, and indices that hold them, also with
    rows of -inf (nothing allowed), a width the chunks do not divide, k equal to or above the width, and a direct
    threshold forcing the grouped path on short rows."""
    from tf_family.memory import knn_search

    scores = torch.randn(3, 5, width, generator=torch.Generator().manual_seed(width))
    scores[0, 0] = float("-inf")
    scores[0, 1, width // 3 :] = float("-inf")  # fewer allowed scores than k
    for direct in (512, 0):
        monkeypatch.setattr(knn_search, "DIRECT_SELECT", direct)
        values, index = knn_search.select_top_k(scores, k)
        expected = scores.topk(min(k, width), dim=-1).values
        assert torch.equal(values, expected)
        assert ((index >= 0) & (index < width)).all()
        finite = expected > float("-inf")
        assert torch.equal(scores.gather(-1, index)[finite], values[finite])
        assert all(
            len(set(row[keep].tolist())) == int(keep.sum())
            for row, keep in zip(index.flatten(0, 1), finite.flatten(0, 1), strict=True)
        )
        unsorted, unsorted_index = knn_search.select_top_k(scores, k, sorted=False)  # the same set, any order
        assert torch.equal(unsorted.sort(-1, descending=True).values, expected)
        assert torch.equal(
            scores.gather(-1, unsorted_index)[unsorted > float("-inf")], unsorted[unsorted > float("-inf")]
        )


@pytest.mark.parametrize("case", ["packed", "ties", "fallback"])
def test_select_top_k_above_equals_topk(monkeypatch, case):
    """With a bound at or below each row's k-th best score, the selection over the packed scores >= bound gives
    torch.topk's values, sorted, and indices that hold them (each once): bounds below the k-th best, at it, ties at
    the bound, -inf scores and padding; rows whose bound is -inf go to select_top_k, the others stay packed."""
    from tf_family.memory import knn_search

    calls = []
    monkeypatch.setattr(
        knn_search, "select_top_k", lambda *args: calls.append(args[0].shape[0]) or torch.topk(args[0], args[1])
    )
    generator = torch.Generator().manual_seed(7)
    scores = torch.randn(4, 6, 300, generator=generator)
    scores[0, 1, 100:] = float("-inf")
    k = 8
    kth = scores.topk(k, dim=-1).values[..., -1:]
    bound = kth - 0.3 * torch.rand(4, 6, 1, generator=generator)  # a few more than k scores pass each bound
    if case == "ties":
        bound = kth.clone()
        scores[1, 2, 5:12] = kth[1, 2]  # the k-th best repeated: ties at the bound
        kth = scores.topk(k, dim=-1).values[..., -1:]
        bound = torch.minimum(bound, kth)
    if case == "fallback":
        bound[2, 3] = bound[0, 1] = float("-inf")
    values, index = knn_search.select_top_k_above(scores, bound, k)
    expected = scores.topk(k, dim=-1).values
    assert torch.equal(values, expected)
    assert torch.equal(scores.gather(-1, index), values)
    assert all(len(set(row.tolist())) == k for row in index.flatten(0, 1))
    assert calls == ([2] if case == "fallback" else [])  # the two rows of bound -inf, selected whole
    unsorted, unsorted_index = knn_search.select_top_k_above(scores, bound, k, sorted=False)
    assert torch.equal(unsorted.sort(-1, descending=True).values, expected)
    assert torch.equal(scores.gather(-1, unsorted_index), unsorted)


def test_grouped_bound_is_at_most_the_kth_best():
    """The least chosen group maximum is a lower bound of the k-th best candidate (and -inf where fewer than k
    groups hold an allowed slot); None when the groups hold fewer than k slots."""
    from tf_family.memory.knn_search import grouped_bound, grouped_candidates

    queries, keys = unit(2, 3, 5, 8), unit(2, 3, 200, 8, seed=1)
    allowed = random_allowed(2, 5, 200)
    allowed[1, 0, 2, 10:] = False  # 10 allowed slots: fewer groups than k hold one
    scores, slots = grouped_candidates(queries, keys, allowed, 6, groups=20)
    bound = grouped_bound(scores, slots, 6)
    kth = scores.topk(6, dim=-1).values[..., -1:]
    finite = kth > float("-inf")
    assert (bound <= kth).all() and (bound[finite] > float("-inf")).float().mean() > 0.9
    assert (bound[1, :, 2] == float("-inf")).all() and (bound[0, :, 0] == float("-inf")).all()
    scores, slots = grouped_candidates(queries, keys, allowed, 6, groups=50)  # groups of 4 slots < k
    assert grouped_bound(scores, slots, 6) is None


@pytest.mark.parametrize("slots", [200, 9])
def test_retrieve_over_the_grouped_search_merges_the_segment_exactly(monkeypatch, slots):
    """The grouped search's candidates and the segment's scores selected through their bound
    (`select_top_k_above`) == one brute-force search over the memory and the segment together, including expired
    pairs, a query that may see nothing and one that may see fewer than k memory slots."""
    from tf_family.memory import knn_search
    from tf_family.memory.knn_search import expand_expired

    monkeypatch.setattr(knn_search, "DIRECT_SEARCH_SCORES", 1)  # the grouped path even for small memories
    query = unit(2, 2, 5, 8)
    memory = (unit(2, 2, slots, 8, seed=1), unit(2, 2, slots, 8, seed=2))
    segment = (unit(2, 2, 5, 8, seed=3), unit(2, 2, 5, 8, seed=4))
    memory_allowed = random_allowed(2, 5, slots)
    memory_allowed[1, 0, 3, 3:] = False
    expired = Expired(torch.tensor([0, 1, 2]), torch.ones(5, 3, dtype=torch.bool).tril(-1))
    segment_allowed = torch.ones(5, 5, dtype=torch.bool).tril(-1)[None, None]
    retrieved = retrieve(
        query, memory, MemoryAllowed(memory_allowed, expired), k=4, segment=segment, segment_allowed=segment_allowed
    )
    keys, _, found = retrieved.gathered()
    all_keys = torch.cat([memory[0], segment[0]], 2)
    all_allowed = torch.cat([expand_expired(memory_allowed, expired, 5), segment_allowed.expand(2, 1, 5, 5)], -1)
    scores, index = top_k_reference(query, all_keys, all_allowed, 4)
    assert torch.equal(found, scores > float("-inf"))
    torch.testing.assert_close(torch.einsum("bhtd,bhtkd->bhtk", query, keys)[found], scores[found])
    expected = all_keys[torch.arange(2)[:, None, None, None], torch.arange(2)[None, :, None, None], index]
    torch.testing.assert_close(keys[found], expected[found])


@pytest.mark.parametrize("search", [exact_top_k, grouped_top_k, bucketed_top_k])
def test_searches_take_queries_that_require_grad(search):
    """A search called in grad mode with queries that require grad (the grouped path wrote its products with out=,
    which autograd refuses) returns the same slots, and scores without gradient."""
    queries, keys = unit(1, 2, 40, 8).float(), unit(1, 2, 3000, 8, seed=1).float()
    allowed = random_allowed(1, 40, 3000)
    expected_scores, expected_index = search(queries, keys, allowed, 6)
    scores, index = search(queries.requires_grad_(), keys, allowed, 6)
    assert torch.equal(index, expected_index) and torch.equal(scores, expected_scores)
    assert not scores.requires_grad and (scores[0, :, 1:] > float("-inf")).all()


def test_exact_top_k_takes_the_grouped_path_for_large_memories(monkeypatch):
    import tf_family.memory.knn_search as knn_search

    calls = []
    monkeypatch.setattr(knn_search, "grouped_candidates", lambda *args: calls.append(1) or (None, None))
    queries, keys = unit(1, 1, 4, 8), unit(1, 1, 300, 8, seed=1)
    allowed = torch.ones(1, 1, 1, 300, dtype=torch.bool)
    knn_search.exact_top_k(queries, keys, allowed, 4)
    assert not calls  # 1,200 scores: scored at once
    monkeypatch.setattr(knn_search, "DIRECT_SEARCH_SCORES", 100)
    with pytest.raises(AttributeError):
        knn_search.exact_top_k(queries, keys, allowed, 4)
    assert calls == [1]


def recall(index, expected_index, expected_scores):
    hits = total = 0
    for found, truth, score in zip(
        index.flatten(0, 2), expected_index.flatten(0, 2), expected_scores.flatten(0, 2), strict=True
    ):
        truth = set(truth[score > float("-inf")].tolist())
        hits += len(truth & set(found.tolist()))
        total += len(truth)
    return hits / total


def test_bucketed_top_k_is_exact_when_small_and_recalls_the_true_neighbours():
    queries, keys = unit(1, 2, 3, 8), unit(1, 2, 6, 8, seed=1)
    allowed = torch.ones(1, 1, 3, 6, dtype=torch.bool)
    torch.testing.assert_close(bucketed_top_k(queries, keys, allowed, 8), exact_top_k(queries, keys, allowed, 8))
    queries, keys = unit(2, 2, 16, 16), unit(2, 2, 1000, 16, seed=1)
    allowed = random_allowed(2, 16, 1000)
    scores, index = bucketed_top_k(queries, keys, allowed, 32)
    expected_scores, expected_index = exact_top_k(queries, keys, allowed, 32)
    assert (scores[..., :-1] >= scores[..., 1:]).all()  # sorted
    assert allowed.expand(2, 2, 16, 1000).gather(-1, index)[scores > float("-inf")].all()  # only allowed slots
    assert torch.equal(scores[..., 0], expected_scores[..., 0])  # the best one is always found
    assert recall(index, expected_index, expected_scores) >= 0.55  # meliad measured 0.63 for its buckets


@pytest.mark.parametrize("block,chunk", [(None, None), (1, 8), (70, 16)])
def test_bucketed_top_k_is_the_best_slot_of_each_bucket(monkeypatch, block, chunk):
    """Twin of the bucketed search: slot s in bucket s mod k, each bucket's best allowed slot, sorted; also when the
    scores come in blocks and chunks (a last chunk past the memory, expired pairs, a query that may see nothing)."""
    from tf_family.memory import knn_search
    from tf_family.memory.knn_search import expand_expired

    if block is not None:
        monkeypatch.setattr(knn_search, "SEARCH_BLOCK_SCORES", block)
        monkeypatch.setattr(knn_search, "SEARCH_BLOCK_MAX", block)
        monkeypatch.setattr(knn_search, "BUCKET_CHUNK_SLOTS", chunk)
    queries, keys = unit(2, 3, 5, 8), unit(2, 3, 37, 8, seed=1)
    allowed = random_allowed(2, 5, 37)
    expired = (torch.tensor([36, 0, 1]), torch.ones(5, 3, dtype=torch.bool).tril(-1))
    scores, index = bucketed_top_k(queries, keys, allowed, 4, expired)
    full = torch.einsum("bhtd,bhnd->bhtn", queries, keys).masked_fill(~expand_expired(allowed, expired, 5), -torch.inf)
    expected = torch.stack([full[..., bucket::4].amax(-1) for bucket in range(4)], -1).sort(-1, descending=True)[0]
    torch.testing.assert_close(scores, expected)
    finite = scores > float("-inf")
    torch.testing.assert_close(full.gather(-1, index)[finite], scores[finite])
    assert ((index >= 0) & (index < 37)).all()
    assert not finite[0, :, 0].any()


def test_faiss_top_k_flat_equals_exact():
    pytest.importorskip("faiss")
    queries, keys = unit(2, 2, 5, 8).float(), unit(2, 2, 40, 8, seed=1).float()
    allowed = random_allowed(2, 5, 40)
    scores, index = faiss_top_k(queries, keys, allowed, 7)
    expected_scores, expected_index = exact_top_k(queries, keys, allowed, 7)
    torch.testing.assert_close(scores, expected_scores, rtol=1e-5, atol=1e-5)
    finite = expected_scores > float("-inf")
    assert torch.equal(index[finite], expected_index[finite])


def test_knn_attention_with_k_covering_the_memory_equals_dense_attention_over_it():
    query, keys, values = unit(2, 3, 4, 8), unit(2, 3, 10, 8, seed=1), unit(2, 3, 10, 8, seed=2)
    allowed = random_allowed(2, 4, 10)
    scale = torch.tensor([1.0, 5.0, 20.0], dtype=torch.float64)
    retrieved = retrieve(query, (keys, values), allowed, k=64)
    out, logits = knn_attention(query, retrieved, scale)
    torch.testing.assert_close(out, dense_knn_attention(query, keys, values, allowed, scale))
    assert (out[0, :, 0] == 0).all() and torch.isinf(logits[0, :, 0]).all()  # found nothing: contributes nothing


@pytest.mark.parametrize("block_bytes", [None, 3 * 5 * 4 * 8 * 8])
def test_retrieve_merges_the_segment_exactly(monkeypatch, block_bytes):
    """Memory + in-segment candidates == one search over their concatenation (the memory's pairs gathered whole,
    or in blocks of 3 of the 4 (row, head) pairs: `gather_blocks`)."""
    if block_bytes is not None:
        monkeypatch.setattr(knn_memory, "GATHER_BLOCK_BYTES", block_bytes)
    query = unit(2, 2, 5, 8)
    memory = (unit(2, 2, 9, 8, seed=1), unit(2, 2, 9, 8, seed=2))
    segment = (unit(2, 2, 5, 8, seed=3), unit(2, 2, 5, 8, seed=4))
    memory_allowed = random_allowed(2, 5, 9)
    segment_allowed = torch.ones(5, 5, dtype=torch.bool).tril(-1)[None, None]
    retrieved = retrieve(query, memory, memory_allowed, k=4, segment=segment, segment_allowed=segment_allowed)
    assert len(retrieved.memory_keys) == (1 if block_bytes is None else 2)
    keys, values, found = retrieved.gathered()
    all_keys = torch.cat([memory[0], segment[0]], 2)
    all_values = torch.cat([memory[1], segment[1]], 2)
    all_allowed = torch.cat([memory_allowed, segment_allowed.expand(2, 1, 5, 5)], -1)
    scores, index = top_k_reference(query, all_keys, all_allowed, 4)
    assert torch.equal(found, scores > float("-inf"))
    for b in range(2):
        for h in range(2):
            for t in range(5):
                for r in range(int(found[b, h, t].sum())):
                    torch.testing.assert_close(keys[b, h, t, r], all_keys[b, h, index[b, h, t, r]])
                    torch.testing.assert_close(values[b, h, t, r], all_values[b, h, index[b, h, t, r]])


def _attention_case(with_segment: bool):
    """Queries, the segment's keys and values, a per-head scale (with gradients) and what they retrieve (k = 5)
    from an 11-slot memory: the case the kNN attention tests share."""
    query = unit(2, 3, 6, 8).requires_grad_()
    memory = (unit(2, 3, 11, 8, seed=1), unit(2, 3, 11, 8, seed=2))
    segment = (unit(2, 3, 6, 8, seed=3).requires_grad_(), unit(2, 3, 6, 8, seed=4).requires_grad_())
    memory_allowed = random_allowed(2, 6, 11)
    segment_allowed = torch.ones(6, 6, dtype=torch.bool).tril(-1)[None, None] if with_segment else None
    scale = torch.tensor([1.0, 5.0, 20.0], dtype=torch.float64, requires_grad=True)
    retrieved = retrieve(
        query, memory, memory_allowed, k=5, segment=segment if with_segment else None, segment_allowed=segment_allowed
    )
    return query, segment, scale, retrieved


@pytest.mark.parametrize(("with_segment", "block_bytes"), [(True, None), (False, None), (True, 4 * 6 * 5 * 8 * 8)])
def test_knn_attention_over_the_split_pairs_equals_attention_over_the_gathered_pairs(
    monkeypatch, with_segment, block_bytes
):
    """`knn_attention` scores the segment's own pairs in place (a (T, T) product and a mask) instead of gathering them
    per rank: outputs and the gradients of the query, the scale and the segment's keys and values are those of the
    attention over the rank-ordered gathered pairs (`gathered_knn_attention`), including a query that found nothing
    and queries that retrieved from both the memory and the segment; the memory's pairs gathered whole or in blocks
    of 4 and 2 of the 6 (row, head) pairs (`gather_blocks`)."""
    if block_bytes is not None:
        monkeypatch.setattr(knn_memory, "GATHER_BLOCK_BYTES", block_bytes)
    query, segment, scale, retrieved = _attention_case(with_segment)
    assert [block.shape[0] for block in retrieved.memory_keys] == ([6] if block_bytes is None else [4, 2])
    assert not retrieved.found[0, :, 0].any()  # the first query of row 0 may see nothing
    if with_segment:  # some queries mix pairs of both origins
        assert ((retrieved.segment_index >= 0) & retrieved.memory_found.any(-1, keepdim=True)).any()
    inputs = (query, scale, *segment) if with_segment else (query, scale)
    weights = torch.randn(2, 3, 6, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out, _ = knn_attention(query, retrieved, scale)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    expected = gathered_knn_attention(query, *retrieved.gathered(), scale)
    expected_grads = torch.autograd.grad((expected * weights).sum(), inputs)
    torch.testing.assert_close(out, expected)
    assert (out[0, :, 0] == 0).all()
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize(("with_segment", "block_bytes"), [(True, None), (False, None), (True, 4 * 6 * 5 * 8 * 8)])
def test_fused_knn_attention_equals_knn_attention(monkeypatch, with_segment, block_bytes, reuse):
    """The attention with its backward written out (`fused_knn_attention`) gives `knn_attention`'s outputs and
    gradients (query, scale, the segment's keys and values), with a query that found nothing, pairs of both
    origins, blocks of (row, head) pairs and an upstream gradient in the layer's transposed-heads layout; with the
    search's scores reused or computed again."""
    import dataclasses

    from tf_family.memory import fused_knn_attention

    if block_bytes is not None:
        monkeypatch.setattr(knn_memory, "GATHER_BLOCK_BYTES", block_bytes)
    query, segment, scale, retrieved = _attention_case(with_segment)
    assert not retrieved.found[0, :, 0].any()
    assert retrieved.scores is not None and (retrieved.segment_scores is not None) == with_segment
    inputs = (query, scale, *segment) if with_segment else (query, scale)
    weights = torch.randn(2, 6, 3, 8, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    fused_input = retrieved if reuse else dataclasses.replace(retrieved, scores=None, segment_scores=None)
    out = fused_knn_attention(query, fused_input, scale)
    grads = torch.autograd.grad((out.transpose(1, 2) * weights).sum(), inputs)
    expected, _ = knn_attention(query, retrieved, scale)
    expected_grads = torch.autograd.grad((expected.transpose(1, 2) * weights).sum(), inputs)
    torch.testing.assert_close(out, expected)
    assert (out[0, :, 0] == 0).all() and out.abs().sum() > 0
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, expected_grad)


def test_ring_buffer_evicts_the_oldest_and_resets_rows():
    memory = KNNMemory.empty(2, 1, 1, 1, capacity=4, dtype=torch.float64)
    for start in (0, 3):
        positions = torch.arange(start, start + 3, dtype=torch.float64).view(1, 1, 3, 1).expand(2, 1, 3, 1)
        before = memory
        memory = memory.write([positions], [positions + 100])
        assert before.size.tolist() == [min(start, 4)] * 2  # the memory written to is left as it is
    # positions 0..5 written into 4 slots: 0 and 1 evicted, the rest kept in order of age
    assert sorted(memory.keys[0][0, 0, :, 0].tolist()) == [2.0, 3.0, 4.0, 5.0]
    order = memory.ages().argsort()
    assert memory.keys[0][0, 0, order, 0].tolist() == [5.0, 4.0, 3.0, 2.0]
    torch.testing.assert_close(memory.values[0] - 100, memory.keys[0])
    reset = memory.reset(torch.tensor([False, True]))
    assert reset.size.tolist() == [4, 0] and memory.size.tolist() == [4, 4]
    # a segment longer than the capacity keeps its last positions only; padding is written masked
    mask = torch.tensor([[True] * 6, [True] * 5 + [False]])
    long = torch.arange(6, dtype=torch.float64).view(1, 1, 6, 1).expand(2, 1, 6, 1)
    reset = reset.write([long], [long], mask)
    assert sorted(reset.keys[0][0, 0, :, 0].tolist()) == [2.0, 3.0, 4.0, 5.0]
    assert reset.size.tolist() == [4, 3]
    empty = KNNMemory.empty(1, 1, 1, 1, capacity=0)
    empty = empty.write([torch.ones(1, 1, 3, 1)], [torch.ones(1, 1, 3, 1)])
    assert empty.capacity == 0


def test_index_select_state_dict_and_validation():
    knn = KNNMemory.empty(2, 2, 3, 4, capacity=5)
    knn = knn.write([unit(2, 3, 3, 4).float()] * 2, [unit(2, 3, 3, 4, seed=1).float()] * 2)
    segment = SegmentMemory.from_states([torch.randn(2, 3, 6)] * 2)
    memory = MemorizingMemory(segment, knn)
    beams = memory.index_select(torch.tensor([1, 1, 0]))
    assert beams.batch_size == 3 and torch.equal(beams.knn.keys[1][0], knn.keys[1][1])
    assert beams.knn.keys[0] is not knn.keys[0]  # a copy: writing one beam leaves the others alone
    rebuilt = MemorizingMemory.from_state_dict(memory.state_dict())
    assert rebuilt.knn.next_slot == knn.next_slot == 3
    for a, b in zip(rebuilt.knn.state_dict().values(), knn.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(rebuilt.segment.states[1], segment.states[1])
    assert MemorizingMemory.from_state_dict(MemorizingMemory(None, knn).state_dict()).segment is None
    with pytest.raises(ValueError, match="capacity"):
        KNNMemory.empty(1, 1, 1, 1, capacity=-1)
    with pytest.raises(ValueError, match="reset rows"):
        knn.reset(torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="rows"):
        MemorizingMemory(SegmentMemory.from_states([torch.randn(3, 2, 6)]), knn)
    with pytest.raises(ValueError, match="unknown"):
        from tf_family.memory import knn_top_k

        knn_top_k("hnsw", unit(1, 1, 1, 4), unit(1, 1, 2, 4), torch.ones(1, 1, 1, 2, dtype=torch.bool), 1)


@pytest.mark.parametrize("search", [exact_top_k, bucketed_top_k, faiss_top_k])
def test_expired_pairs_equal_the_expanded_mask(search):
    if search is faiss_top_k:
        pytest.importorskip("faiss")
    from tf_family.memory.knn_search import expand_expired

    queries, keys = unit(2, 2, 5, 8).float(), unit(2, 2, 40, 8, seed=1).float()
    allowed = random_allowed(2, 1, 40)
    expired = (torch.tensor([7, 8, 9]), torch.ones(5, 3, dtype=torch.bool).tril(-1))
    scores, index = search(queries, keys, allowed, 4, expired)
    expected_scores, expected_index = search(queries, keys, expand_expired(allowed, expired, 5), 4)
    torch.testing.assert_close(scores, expected_scores)
    assert torch.equal(index[scores > float("-inf")], expected_index[scores > float("-inf")])
    reference_scores, _ = top_k_reference(queries, keys, expand_expired(allowed, expired, 5), 4)
    if search is not bucketed_top_k:
        torch.testing.assert_close(scores, reference_scores)


# ------------------------------------------------------------------------------------------- native search kernel
def _native_or_skip():
    from tf_family.attention import native

    if native.extension() is None:
        pytest.skip("the native kernel could not be built here")


@pytest.mark.parametrize(
    "batch,heads,length,slots,k",
    [(2, 3, 5, 37, 4), (1, 2, 300, 1000, 32), (2, 1, 3, 5, 8), (1, 2, 1, 200, 1), (1, 1, 130, 64, 64)],
    ids=["small", "query_blocks_and_chunks", "k_over_slots", "one_query", "k_equals_slots"],
)
def test_native_top_k_matches_brute_force_twin(batch, heads, length, slots, k):
    """The native search kernel against the brute-force twin: masks broadcast over heads and queries, expired
    pairs (a run of slots), a query that may see nothing, ``k`` beyond the allowed or the existing slots, several
    query blocks and slot chunks with a ragged last one."""
    from tf_family.memory.knn_search import expand_expired, native_top_k

    _native_or_skip()
    queries, keys = unit(batch, heads, length, 8).float(), unit(batch, heads, slots, 8, seed=1).float()
    allowed = random_allowed(batch, length, slots)
    expired = (torch.arange(2, 5) % slots, torch.ones(length, 3, dtype=torch.bool).tril(-1))
    if slots < 5:
        expired = None
    scores, index = native_top_k(queries, keys, allowed, k, expired)
    expected_scores, expected_index = top_k_reference(
        queries.double(), keys.double(), expand_expired(allowed, expired, length), k
    )
    assert scores.dtype == torch.float32 and index.dtype == torch.long and scores.shape == expected_scores.shape
    torch.testing.assert_close(scores.double(), expected_scores, rtol=0, atol=1e-6)
    finite = expected_scores > float("-inf")
    assert torch.equal(index[finite], expected_index[finite])
    assert torch.equal(scores > float("-inf"), finite) and not finite[0, :, 0].any()
    assert (index[~finite] == 0).all()


def test_native_top_k_keeps_the_earlier_of_equal_scores():
    """Duplicated keys give equal scores: the kernel keeps the earlier slots, in order, whatever the chunking."""
    from tf_family.memory.knn_search import native_top_k

    _native_or_skip()
    queries = unit(1, 1, 3, 8).float()
    keys = unit(1, 1, 10, 8, seed=1).float().repeat(1, 1, 300, 1)  # slot s and s + 10 m are equal
    scores, index = native_top_k(queries, keys, torch.ones(1, 1, 1, 3000, dtype=torch.bool), 7)
    best = (queries @ keys[..., :10, :].transpose(-1, -2)).argmax(-1)  # (1, 1, 3)
    assert torch.equal(index[..., :7], best[..., None] + 10 * torch.arange(7))
    assert (scores == scores[..., :1]).all()


def test_native_top_k_steps_aside_where_it_does_not_apply(monkeypatch):
    """float64, repeated expired slots, an empty memory or no kernel: None, and `exact_top_k` takes the PyTorch
    path (the same results)."""
    from tf_family.attention import native
    from tf_family.memory import knn_search

    _native_or_skip()
    queries, keys = unit(1, 2, 4, 8), unit(1, 2, 50, 8, seed=1)
    allowed = torch.ones(1, 1, 1, 50, dtype=torch.bool)
    assert knn_search.native_top_k(queries, keys, allowed, 3) is None
    queries, keys = queries.float(), keys.float()
    repeated = (torch.tensor([3, 3]), torch.ones(4, 2, dtype=torch.bool))
    assert knn_search.native_top_k(queries, keys, allowed, 3, repeated) is None
    assert knn_search.native_top_k(queries, keys[:, :, :0], allowed[..., :0], 3) is None
    found = knn_search.exact_top_k(queries, keys, allowed, 3)
    monkeypatch.setattr(native, "_state", {"module": None})
    assert knn_search.native_top_k(queries, keys, allowed, 3) is None
    expected = knn_search.exact_top_k(queries, keys, allowed, 3)
    torch.testing.assert_close(found, expected)


@pytest.mark.parametrize("slots", [9, 200])
def test_retrieve_through_the_native_kernel_equals_the_pytorch_path(monkeypatch, slots):
    """`retrieve` with the kernel's top k and its bound merged with the segment == the PyTorch search's."""
    from tf_family.memory import knn_search

    _native_or_skip()
    query = unit(2, 2, 5, 8).float()
    memory = (unit(2, 2, slots, 8, seed=1).float(), unit(2, 2, slots, 8, seed=2).float())
    segment = (unit(2, 2, 5, 8, seed=3).float(), unit(2, 2, 5, 8, seed=4).float())
    memory_allowed = random_allowed(2, 5, slots)
    memory_allowed[1, 0, 3, 3:] = False  # fewer than k memory slots: the bound is -inf
    expired = Expired(torch.tensor([0, 1, 2]), torch.ones(5, 3, dtype=torch.bool).tril(-1))
    segment_allowed = torch.ones(5, 5, dtype=torch.bool).tril(-1)[None, None]
    arguments = {"k": 4, "segment": segment, "segment_allowed": segment_allowed}
    allowed = MemoryAllowed(memory_allowed, expired)
    native_keys, native_values, native_found = retrieve(query, memory, allowed, **arguments).gathered()
    monkeypatch.setattr(knn_search, "native_top_k", lambda *args, **kwargs: None)
    keys, values, found = retrieve(query, memory, allowed, **arguments).gathered()
    assert torch.equal(native_found, found)
    torch.testing.assert_close(native_keys[found], keys[found])
    torch.testing.assert_close(native_values[found], values[found])


@pytest.mark.parametrize("writes", [0, 1, 3, "copy"])
@pytest.mark.parametrize("with_segment", [True, False])
def test_fused_knn_attention_reading_pairs_by_slot_equals_the_gathered_pairs(monkeypatch, with_segment, writes):
    """Float32 on CPU, `fused_knn_attention` reads the memory's pairs by slot (`MemoryReader`, the native pair
    kernels) instead of gathering them: the same outputs and gradients as over the gathered pairs, also when the
    memory is written in place (once, or three times: slots overwritten twice) or by copy between the forward and
    the backward (the model writes at the end of its forward), also through a reset of the memory (which shares its
    buffers and their readers); and a reader no graph holds any more leaves the memory's registry."""
    import gc

    from tf_family.memory import fused_knn_attention
    from tf_family.memory.knn_reader import MemoryReader

    _native_or_skip()

    def run(by_slot: bool):
        generator = torch.Generator().manual_seed(0)
        memory = KNNMemory.empty(2, 1, 3, 8, capacity=11)
        memory = memory.write([unit(2, 3, 11, 8, seed=1).float()], [unit(2, 3, 11, 8, seed=2).float()], in_place=True)
        query = unit(2, 3, 6, 8).float().requires_grad_()
        segment = (
            unit(2, 3, 6, 8, seed=3).float().requires_grad_(),
            unit(2, 3, 6, 8, seed=4).float().requires_grad_(),
        )
        scale = torch.tensor([1.0, 5.0, 20.0], requires_grad=True)
        segment_allowed = torch.ones(6, 6, dtype=torch.bool).tril(-1)[None, None] if with_segment else None
        allowed = random_allowed(2, 6, 11)
        pairs = (memory.keys[0], memory.values[0])
        retrieved = retrieve(
            query, pairs, allowed, k=5, segment=segment if with_segment else None, segment_allowed=segment_allowed
        )
        if not by_slot:
            monkeypatch.setattr(MemoryReader, "of", classmethod(lambda cls, *args: None))
        readers = memory.readers[0]
        out = fused_knn_attention(query, retrieved, scale, readers)
        monkeypatch.undo()
        assert (out.grad_fn.reader is not None) == by_slot and len(readers) == by_slot
        for write in range(writes if isinstance(writes, int) else 1):
            if write == 1:
                memory = memory.reset(torch.zeros(2, dtype=torch.bool))
            new = [torch.randn(2, 3, 4, 8, generator=generator)]
            memory = memory.write(new, [torch.randn(2, 3, 4, 8, generator=generator)], in_place=writes != "copy")
        inputs = (query, scale, *segment) if with_segment else (query, scale)
        weights = torch.randn(2, 6, 3, 8, generator=generator)
        grads = torch.autograd.grad((out.transpose(1, 2) * weights).sum(), inputs)
        return out, grads, readers

    out, grads, readers = run(by_slot=True)
    expected, expected_grads, _ = run(by_slot=False)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        assert grad.abs().sum() > 0
        torch.testing.assert_close(grad, expected_grad)
    assert len(readers) == 1
    del out, grads
    gc.collect()
    assert len(readers) == 0  # the graph is gone, and so is its reader


def test_the_reader_registry_belongs_to_the_memory_and_refuses_other_buffers():
    """A memory's readers are its own (`KNNMemory.readers`, shared with a reset and with the memory a write in place
    returns, not with a clone); a reader of other buffers is refused; without a registry the pairs are gathered."""
    from tf_family.memory import fused_knn_attention
    from tf_family.memory.knn_reader import MemoryReader

    _native_or_skip()
    memory = KNNMemory.empty(2, 2, 3, 8, capacity=11)
    memory = memory.write([unit(2, 3, 11, 8, seed=s).float() for s in (1, 2)], [unit(2, 3, 11, 8).float()] * 2)
    assert memory.reset(torch.ones(2, dtype=torch.bool)).readers is memory.readers
    assert memory.clone().readers[0] is not memory.readers[0]
    query = unit(2, 3, 6, 8).float()
    retrieved = retrieve(query, (memory.keys[0], memory.values[0]), random_allowed(2, 6, 11), k=5)
    with pytest.raises(ValueError, match=r"KNNMemory.readers\[layer\]"):
        MemoryReader.of(retrieved.memory, retrieved.memory_slots, query.dtype, memory.readers[1])
    out = fused_knn_attention(query.requires_grad_(), retrieved, torch.ones(3))
    assert out.grad_fn.reader is None and len(memory.readers[0]) == 0
    with pytest.raises(TypeError, match="memory_allowed must be a bool tensor or a MemoryAllowed"):
        retrieve(query, (memory.keys[0], memory.values[0]), (random_allowed(2, 6, 11), None), k=5)


@pytest.mark.parametrize("reuse", [True, False])
def test_fused_knn_attention_under_bf16_autocast_computes_in_the_query_dtype(reuse):
    """Under autocast the fused attention computes in its inputs' dtype, as without it (on CUDA an autocast product
    made the attended values bf16 and the in-place segment product then refused its float32 operands)."""
    import dataclasses

    from tf_family.memory import fused_knn_attention

    query = unit(2, 3, 6, 8).float().requires_grad_()
    memory = (unit(2, 3, 11, 8, seed=1).float(), unit(2, 3, 11, 8, seed=2).float())
    segment = (unit(2, 3, 6, 8, seed=3).float(), unit(2, 3, 6, 8, seed=4).float())
    segment_allowed = torch.ones(6, 6, dtype=torch.bool).tril(-1)[None, None]
    retrieved = retrieve(
        query, memory, random_allowed(2, 6, 11), k=5, segment=segment, segment_allowed=segment_allowed
    )
    if not reuse:
        retrieved = dataclasses.replace(retrieved, scores=None, segment_scores=None)
    scale = torch.tensor([1.0, 5.0, 20.0])
    expected = fused_knn_attention(query, retrieved, scale)
    (expected_grad,) = torch.autograd.grad(expected.sum(), query)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fused_knn_attention(query, retrieved, scale)
    (grad,) = torch.autograd.grad(out.sum(), query)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, expected_grad)
