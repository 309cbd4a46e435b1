"""kNN stores: chunked exact search == dense search; faiss Flat == exact; approximate indexes recall; save/load."""

import json

import pytest
import torch

from tf_family.memory.knn import (
    ExactKNNStore,
    FaissKNNStore,
    chunked_knn_search,
    dense_knn_search,
    load_knn_store,
    neighbour_scores,
    pairwise_scores,
)
from tf_family.memory.knn_lm import dense_knn_log_probs, interpolate_log_probs, knn_log_probs, knn_target_log_probs


def clustered(n: int, dim: int = 16, seed: int = 0) -> torch.Tensor:
    """Keys around 32 centres, so that nearest neighbours are well separated (no near ties)."""
    generator = torch.Generator().manual_seed(seed)
    centres = 4 * torch.randn(32, dim, generator=generator)
    return centres[torch.randint(0, 32, (n,), generator=generator)] + torch.randn(n, dim, generator=generator)


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_pairwise_scores_match_the_definition(metric):
    queries, keys = torch.randn(5, 7), torch.randn(9, 7)
    expected = queries @ keys.T if metric == "ip" else -torch.cdist(queries, keys).pow(2)
    torch.testing.assert_close(pairwise_scores(queries, keys, metric), expected, rtol=1e-5, atol=1e-4)
    neighbours = keys[torch.tensor([[0, 3], [1, 1], [8, 2], [4, 5], [6, 7]])]  # (5, 2, 7)
    torch.testing.assert_close(
        neighbour_scores(queries, neighbours, metric),
        torch.stack([expected[i, [[0, 3], [1, 1], [8, 2], [4, 5], [6, 7]][i]] for i in range(5)]),
        rtol=1e-5,
        atol=1e-4,
    )


@pytest.mark.parametrize("metric", ["l2", "ip"])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
def test_chunked_search_equals_dense_search(metric, chunk_size):
    keys, queries = clustered(300), clustered(11, seed=1)
    dense_scores, dense_ids = dense_knn_search(queries, keys, 10, metric)
    scores, ids = chunked_knn_search(queries, keys, 10, metric, chunk_size)
    assert torch.equal(ids, dense_ids)
    torch.testing.assert_close(scores, dense_scores)


def test_exact_store_over_several_shards_and_float16_keys():
    keys = clustered(500)
    store = ExactKNNStore(16, "l2", chunk_size=64)
    for shard in keys.half().split(150):  # shards of unequal size, float16 as in a datastore
        store.add(shard)
    assert store.size == len(store) == 500
    queries = clustered(9, seed=2)
    scores, ids = store.search(queries, 5)
    expected_scores, expected_ids = dense_knn_search(queries, keys.half().float(), 5)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(scores, expected_scores)
    # k larger than the store returns every key
    assert store.search(queries, 10_000)[1].shape == (9, 500)


def test_exact_store_round_trip(tmp_path):
    store = ExactKNNStore(16, "ip", keys=clustered(100))
    store.save(tmp_path)
    assert json.loads((tmp_path / "knn_store.json").read_text())["backend"] == "exact"
    loaded = load_knn_store(tmp_path)
    queries = clustered(4, seed=3)
    assert torch.equal(loaded.search(queries, 3)[1], store.search(queries, 3)[1])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="metric='cosine'"):
        ExactKNNStore(4, "cosine")
    store = ExactKNNStore(4)
    with pytest.raises(ValueError, match="empty"):
        store.search(torch.randn(2, 4), 1)
    with pytest.raises(ValueError, match=r"shape \(S, 4\)"):
        store.add(torch.randn(3, 5))
    store.add(torch.randn(3, 4))
    with pytest.raises(ValueError, match="k must be >= 1"):
        store.search(torch.randn(2, 4), 0)


# ------------------------------------------------------------------------------------------------------------ faiss
@pytest.mark.faiss
@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_faiss_flat_returns_what_the_exact_store_returns(metric):
    pytest.importorskip("faiss")
    keys, queries = clustered(2000), clustered(50, seed=4)
    exact = ExactKNNStore(16, metric, keys=keys)
    flat = FaissKNNStore(16, metric, "flat", chunk_size=300)  # added in 7 chunks
    flat.add(keys)
    exact_scores, exact_ids = exact.search(queries, 8)
    scores, ids = flat.search(queries, 8)
    assert torch.equal(ids, exact_ids)
    torch.testing.assert_close(scores, exact_scores, rtol=1e-4, atol=1e-3)


@pytest.mark.faiss
@pytest.mark.parametrize(
    ("index_type", "params", "min_recall"),
    [
        ("ivf_flat", {"nlist": 16, "nprobe": 16}, 1.0),  # every list probed: exact
        ("ivf_flat", {"nlist": 16, "nprobe": 4}, 0.8),
        ("ivf_pq", {"nlist": 16, "nprobe": 16, "pq_m": 8, "pq_bits": 6}, 0.3),
        ("hnsw", {"hnsw_m": 16, "ef_search": 64}, 0.9),
    ],
)
def test_approximate_indexes_find_the_true_neighbours(index_type, params, min_recall, tmp_path):
    pytest.importorskip("faiss")
    keys, queries = clustered(3000), clustered(40, seed=5)
    store = FaissKNNStore(16, "l2", index_type, **params)
    if index_type.startswith("ivf"):
        assert not store.is_trained
        with pytest.raises(ValueError, match="not trained"):
            store.add(keys[:10])
    store.train(keys)
    store.add(keys)
    _, true_ids = dense_knn_search(queries, keys, 10)
    _, ids = store.search(queries, 10)
    recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ids, true_ids, strict=True)) / true_ids.numel()
    assert recall >= min_recall, f"{index_type} recall@10 {recall:.2f}"
    # save / load through faiss.write_index (no pickle) gives the same answers
    store.save(tmp_path)
    assert (tmp_path / "index.faiss").is_file() and not list(tmp_path.glob("*.tmp"))
    loaded = load_knn_store(tmp_path)
    assert type(loaded) is FaissKNNStore and loaded.index_type == index_type
    assert torch.equal(loaded.search(queries, 10)[1], ids)


@pytest.mark.faiss
def test_faiss_rejects_bad_settings():
    pytest.importorskip("faiss")
    with pytest.raises(ValueError, match="index_type='lsh'"):
        FaissKNNStore(16, "l2", "lsh")
    with pytest.raises(ValueError, match="pq_m=5 must divide"):
        FaissKNNStore(16, "l2", "ivf_pq", pq_m=5)
    with pytest.raises(ValueError, match="needs at least 64 training keys"):
        FaissKNNStore(16, "l2", "ivf_flat", nlist=64).train(torch.randn(10, 16))


# ------------------------------------------------------------------------------------------------ kNN-LM math
def test_knn_log_probs_equal_the_dense_one_hot_twin():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 5, generator=generator) * 3
    tokens = torch.randint(0, 7, (6, 5), generator=generator)
    tokens[0, 2] = -1  # a missing neighbour
    scores[1, :] = float("-inf")  # a row without neighbours
    tokens[1, :] = -1
    for temperature in (1.0, 0.3):
        got = knn_log_probs(scores, tokens, 7, temperature)
        torch.testing.assert_close(got, dense_knn_log_probs(scores, tokens, 7, temperature))
        assert torch.isneginf(got[1]).all()
        torch.testing.assert_close(got[[0, 2, 3, 4, 5]].exp().sum(-1), torch.ones(5))


def test_target_log_probs_equal_the_gathered_distribution():
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(8, 6, generator=generator)
    tokens = torch.randint(0, 5, (8, 6), generator=generator)
    tokens[0, 1] = -1
    targets = torch.randint(0, 5, (8,), generator=generator)
    full = knn_log_probs(scores, tokens, 5, 0.7)
    torch.testing.assert_close(knn_target_log_probs(scores, tokens, targets, 0.7), full.gather(1, targets[:, None])[:, 0])


def test_knn_log_probs_by_hand():
    # neighbours with scores -1, -2, -3 (squared distances 1, 2, 3) carry tokens 2, 0, 2 (vocabulary 3)
    scores, tokens = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[2, 0, 2]])
    e = torch.tensor([-1.0, -2.0, -3.0]).exp()
    expected = torch.stack([e[1], torch.tensor(0.0), e[0] + e[2]]) / e.sum()
    torch.testing.assert_close(knn_log_probs(scores, tokens, 3).exp()[0], expected)


def test_interpolation_limits_and_mixture():
    lm = torch.log_softmax(torch.randn(4, 6), -1)
    knn = knn_log_probs(torch.randn(4, 3), torch.randint(0, 6, (4, 3)), 6)
    assert interpolate_log_probs(lm, knn, 0.0) is lm
    assert interpolate_log_probs(lm, knn, 1.0) is knn
    mixed = interpolate_log_probs(lm, knn, 0.3)
    torch.testing.assert_close(mixed.exp(), 0.3 * knn.exp() + 0.7 * lm.exp())
    # a row without neighbours keeps the LM distribution
    empty = knn.clone()
    empty[2] = float("-inf")
    torch.testing.assert_close(interpolate_log_probs(lm, empty, 0.3)[2], lm[2])
    with pytest.raises(ValueError, match="lmbda must be in"):
        interpolate_log_probs(lm, knn, 1.5)
