"""Routing attention (`tf_family.attention.routing`): the gathered per-cluster kernel equals its dense twin (values and
gradients, nearest and balanced clusters, a length that is not a multiple of the cluster size, padding); balanced
clusters have equal sizes and hold each centroid's nearest tokens; nearest clusters partition the tokens in position
order; one k-means step and its EMA."""

import pytest
import torch

from tf_family.attention.routing import (
    balanced_members,
    centroid_similarity,
    ema_update,
    kmeans_step,
    nearest_centroid,
    nearest_members,
    nearest_routing_attention,
    routing_attention,
    routing_attention_reference,
)

MEMBERSHIPS = ["nearest", "balanced"]


def _kernel_inputs(seed=0, batch=2, heads=3, length=11, head_dim=8, clusters=3):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, length, head_dim, generator=generator, dtype=torch.float64)
    value = torch.randn(batch, heads, length, head_dim, generator=generator, dtype=torch.float64)
    centroids = torch.nn.functional.normalize(
        torch.randn(heads, clusters, head_dim, generator=generator, dtype=torch.float64), dim=-1
    )
    return query.requires_grad_(), value.requires_grad_(), centroids


@pytest.mark.parametrize("membership", MEMBERSHIPS)
@pytest.mark.parametrize("padded", [False, True])
def test_gathered_kernel_equals_dense_twin(membership, padded):
    """values and gradients, shared QK, 11 tokens (not a multiple of the cluster size 4), right padding."""
    query, value, centroids = _kernel_inputs()
    batch, heads, length = query.shape[:3]
    valid = torch.ones(batch, length, dtype=torch.bool)
    if padded:
        valid[1, -3:] = False
    key = torch.nn.functional.normalize(query, dim=-1)
    similarity = centroid_similarity(key.detach(), centroids)
    if membership == "balanced":
        members, exists = balanced_members(similarity, 4, valid), None
        membership_mask = torch.zeros(batch, heads, 3, length, dtype=torch.bool).scatter_(3, members, True)
    else:
        clusters = nearest_centroid(similarity)
        members, exists = nearest_members(clusters, 3)
        membership_mask = torch.nn.functional.one_hot(clusters, 3).bool().transpose(2, 3)
    positions = torch.arange(length).expand(batch, length)
    fast = routing_attention(query, key, value, members, exists, valid)
    dense, _ = routing_attention_reference(
        query, key, value, membership_mask, membership_mask, (positions, positions), valid
    )
    real = valid[:, None, :, None].expand_as(fast)
    torch.testing.assert_close(fast[real], dense[real], rtol=1e-12, atol=1e-12)
    weights = torch.randn(fast.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * real
    fast_grads = torch.autograd.grad((fast * weights).sum(), (query, value), retain_graph=True)
    dense_grads = torch.autograd.grad((dense * weights).sum(), (query, value))
    for got, expected in zip(fast_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_balanced_clusters_have_equal_sizes_and_nearest_clusters_partition():
    query, _, centroids = _kernel_inputs(length=17)
    similarity = centroid_similarity(torch.nn.functional.normalize(query.detach(), dim=-1), centroids)
    members = balanced_members(similarity, 5)
    assert members.shape == (2, 3, 3, 5)  # every cluster exactly w = 5 members
    assert all(len(set(row.tolist())) == 5 for row in members.reshape(-1, 5))  # distinct tokens per cluster
    # each centroid's members are its 5 most similar tokens
    expected = similarity.topk(5, dim=2).indices.transpose(2, 3).sort(-1).values
    assert torch.equal(members.sort(-1).values, expected)
    assert balanced_members(similarity, 40).shape[-1] == 17  # w is capped at T
    clusters = nearest_centroid(similarity)
    grid, exists = nearest_members(clusters, 3)
    assert int(exists.sum()) == 2 * 3 * 17  # every token in exactly one cluster
    for b, h in ((0, 0), (1, 2)):
        for k in range(3):
            got = grid[b, h, k][exists[b, h, k]].tolist()
            assert got == (clusters[b, h] == k).nonzero().flatten().tolist()  # in position order


def test_kmeans_step_moves_each_centroid_to_its_members_mean_direction():
    normalized = torch.nn.functional.normalize(torch.randn(2, 1, 6, 4, dtype=torch.float64), dim=-1)
    centroids = torch.nn.functional.normalize(torch.randn(1, 3, 4, dtype=torch.float64), dim=-1)
    clusters = torch.tensor([[[0, 0, 1, 1, 1, 0]], [[1, 0, 0, 0, 1, 1]]])  # centroid 2 has no member: it stays
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 5] = False  # padding is left out
    moved = kmeans_step(normalized, clusters, centroids, valid)
    for k in range(2):
        members = torch.cat([normalized[b, 0][(clusters[b, 0] == k) & valid[b]] for b in range(2)])
        torch.testing.assert_close(moved[0, k], torch.nn.functional.normalize(members.sum(0), dim=-1))
    assert torch.equal(moved[0, 2], centroids[0, 2])
    ema = centroids.clone()
    ema_update(ema, moved, 0.9)
    torch.testing.assert_close(ema, 0.9 * centroids + 0.1 * moved)


def test_nearest_dense_path_equals_the_per_cluster_twin_over_a_cache():
    """The decoding step's path: new queries (the last 3 positions) over every key, left padding."""
    query, value, centroids = _kernel_inputs(length=10)
    key = torch.nn.functional.normalize(query, dim=-1)
    clusters = nearest_centroid(centroid_similarity(key.detach(), centroids))  # (B, H, S)
    valid = torch.ones(2, 10, dtype=torch.bool)
    valid[1, :2] = False
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
    new = slice(7, 10)
    one_hot = torch.nn.functional.one_hot(clusters, 3).bool().transpose(2, 3)  # (B, H, K, S)
    got, got_probs = nearest_routing_attention(
        query[:, :, new], key, value, (clusters[:, :, new], clusters), (positions[:, new], positions), valid
    )
    expected, expected_probs = routing_attention_reference(
        query[:, :, new], key, value, one_hot[..., new], one_hot, (positions[:, new], positions), valid
    )
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_probs, expected_probs, rtol=1e-12, atol=1e-12)
