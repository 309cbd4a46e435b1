"""Routing attention (Roy, Saffar, Vaswani & Grangier 2021, "Efficient Content-Based Sparse Attention with Routing
Transformers", arXiv:2003.05997), as pure functions: online k-means over shared, normalised queries/keys, cluster
membership, the gathered per-cluster kernel and its dense twin.

With shared QK a head's keys are its normalised queries, ``k = q / |q|``; the same unit vectors are clustered against
the head's centroids ``mu`` ``(H, K, Dh)`` (``centroid_similarity``). Two ways to form clusters:

- **nearest** (the paper's definition, section 4.1: ``Q_i`` attends to ``K_j`` when both are nearest to the same
  centroid): every token joins its nearest centroid (`nearest_centroid`). A token's cluster depends on that token
  alone, so the attention is strictly causal and a decoding step can re-derive the cached keys' clusters.
- **balanced** (the implementations': google-research ``routing_transformer`` and lucidrains' package): every centroid
  takes the ``W`` tokens most similar to it (`balanced_members`, a top-k along the sequence), so each cluster has
  exactly ``W`` members; a token may belong to several clusters (its outputs are averaged) or to none (its output is
  zero). Membership ranks a token against the whole sequence, so a later token can push an earlier one out of a
  cluster: the *attention* is causal (masked on the original positions) but membership is not.

Inside a cluster a query attends to the members at or before its own position; its own key scores `SELF_SCORE`
(shared QK makes ``q . k_self`` the largest score; Reformer's rule), so a token attends to itself only when nothing
earlier shares its cluster.

`routing_attention` gathers each cluster's members (a ``(B, H, K, W)`` index, `nearest_members` packs the nearest
clusters into such a grid), attends within each cluster and scatters the outputs back (``O(T W)`` per head, never
``T x T``); `routing_attention_reference` is its dense twin: every cluster as a ``(T, S)`` mask of full attention
(`nearest_routing_attention`: the same for nearest clusters as one ``(T, S)`` mask, the decoding step's path).
`kmeans_statistics`, `kmeans_centroids` (together `kmeans_step`) and `ema_update` are the online k-means (section
4.1: centroids move by an exponential moving average of the normalised sums of their members). Tensors are ``(B, H, T, Dh)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# the score of a token's own key (lucidrains' TOKEN_SELF_ATTN_VALUE): below every real score, above a masked one
SELF_SCORE = -5e4


def centroid_similarity(normalized: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``(B, H, T, K)`` dot products of unit vectors ``(B, H, T, Dh)`` with each head's centroids ``(H, K, Dh)``."""
    return torch.einsum("bhtd,hkd->bhtk", normalized, centroids.to(normalized.dtype))


def nearest_centroid(similarity: torch.Tensor) -> torch.Tensor:
    """``(B, H, T)`` index of each token's nearest centroid, from `centroid_similarity`."""
    return similarity.argmax(dim=-1)


def balanced_members(similarity: torch.Tensor, cluster_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """``(B, H, K, W)``: each centroid's ``W = min(cluster_size, T)`` most similar tokens (sequence indices).

    Args:
        similarity: ``(B, H, T, K)`` from `centroid_similarity`.
        cluster_size: ``W``, members per cluster.
        valid: ``(B, T)`` bool, False at padding; padding is chosen only after every real token.
    """
    if valid is not None:
        similarity = similarity.masked_fill(~valid[:, None, :, None], float("-inf"))
    width = min(cluster_size, similarity.shape[2])
    return similarity.topk(width, dim=2).indices.transpose(2, 3)  # (B, H, K, W)


def nearest_members(clusters: torch.Tensor, num_clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The nearest-centroid clusters as a grid: members ``(B, H, K, C)`` (sequence indices in position order) and
    whether each slot holds a token ``(B, H, K, C)``; ``C`` is the largest cluster (read on the host), so attention
    over the grid costs ``K C^2``: ``T^2 / K`` for even clusters, up to ``K T^2`` when one cluster takes every token.

    Args:
        clusters: ``(B, H, T)`` from `nearest_centroid`.
        num_clusters: ``K``.
    """
    batch, heads, length = clusters.shape
    positions = torch.arange(length, device=clusters.device)
    order = (clusters * length + positions).argsort(dim=-1)  # (B, H, T): by cluster, then by position
    counts = torch.zeros(batch, heads, num_clusters, dtype=torch.long, device=clusters.device)
    counts.scatter_add_(2, clusters, torch.ones_like(clusters))  # (B, H, K)
    capacity = max(int(counts.max()), 1)
    sorted_clusters = clusters.gather(2, order)  # (B, H, T)
    starts = counts.cumsum(-1) - counts  # (B, H, K): where each cluster starts in the sorted order
    rank = positions - starts.gather(2, sorted_clusters)  # (B, H, T): slot within the cluster
    slots = sorted_clusters * capacity + rank
    members = torch.full((batch, heads, num_clusters * capacity), length, device=clusters.device)
    members.scatter_(2, slots, order)  # (B, H, K * C), `length` where no token
    members = members.view(batch, heads, num_clusters, capacity)
    exists = members < length
    return members.clamp(max=length - 1), exists


def routing_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    members: torch.Tensor,
    member_exists: torch.Tensor | None = None,
    key_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Attention within clusters: each cluster's members attend to the members at or before their own position;
    a token's output is the mean over the clusters it belongs to (zero if none). ``O(T W)``.

    Args:
        query, key, value: ``(B, H, T, Dh)`` (with shared QK, ``key`` is the normalised ``query``).
        members: ``(B, H, K, W)`` sequence indices (`balanced_members`, `nearest_members`); causal masking reads
            these original positions.
        member_exists: ``(B, H, K, W)`` bool, False at empty slots (``None``: every slot holds a token).
        key_valid: ``(B, T)`` bool, False at padding keys.
        dropout_p: dropout on the probabilities (0 in eval).

    Returns:
        ``(B, H, T, Dh)``, equal to `routing_attention_reference` up to float rounding.
    """
    batch, heads, length, head_dim = query.shape
    num_clusters, width = members.shape[2:]
    flat = members.reshape(batch, heads, num_clusters * width)  # (B, H, K * W)
    index = flat[..., None].expand(-1, -1, -1, head_dim)
    gathered_query, gathered_key, gathered_value = (
        t.gather(2, index).view(batch, heads, num_clusters, width, head_dim) for t in (query, key, value)
    )  # (B, H, K, W, Dh)
    scores = torch.einsum("bhkid,bhkjd->bhkij", gathered_query, gathered_key) * head_dim**-0.5  # (B, H, K, W, W)
    query_position, key_position = members[..., :, None], members[..., None, :]
    allowed = key_position <= query_position  # causal on the original positions
    if member_exists is not None:
        allowed = allowed & member_exists[..., None, :]
    if key_valid is not None:
        allowed = allowed & key_valid.gather(1, flat.flatten(1)).view(members.shape)[..., None, :]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    scores = scores.masked_fill((query_position == key_position) & allowed, SELF_SCORE)
    probs = scores.softmax(dim=-1)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    out = torch.einsum("bhkij,bhkjd->bhkid", probs, gathered_value).reshape(batch, heads, -1, head_dim)
    weight = torch.ones_like(flat, dtype=out.dtype)
    if member_exists is not None:
        weight = member_exists.reshape(flat.shape).to(out.dtype)
        out = out * weight[..., None]
    sums = out.new_zeros(batch, heads, length, head_dim).scatter_add(2, index, out)  # (B, H, T, Dh)
    counts = weight.new_zeros(batch, heads, length).scatter_add(2, flat, weight)  # (B, H, T)
    return sums / counts.clamp(min=1.0)[..., None]


def routing_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_membership: torch.Tensor,
    key_membership: torch.Tensor,
    positions: tuple[torch.Tensor, torch.Tensor],
    key_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense twin of `routing_attention` (and the decoding step's path): every cluster as full ``T x S`` attention
    under the mask "same cluster and causal", averaged over the clusters each query belongs to.

    Args:
        query: ``(B, H, T, Dh)``; key, value: ``(B, H, S, Dh)``.
        query_membership: ``(B, H, K, T)`` bool; key_membership: ``(B, H, K, S)`` bool.
        positions: query positions ``(B, T)`` and key positions ``(B, S)`` (causal: key position <= query's).
        key_valid: ``(B, S)`` bool, False at padding keys.
        dropout_p: dropout on the effective probabilities (0 in eval).

    Returns:
        ``(B, H, T, Dh)`` and the effective probabilities ``(B, H, T, S)`` (the cluster average of each cluster's).
    """
    query_positions, key_positions = positions
    scores = torch.einsum("bhtd,bhsd->bhts", query, key) * query.shape[-1] ** -0.5  # (B, H, T, S)
    causal = key_positions[:, None, :] <= query_positions[:, :, None]  # (B, T, S)
    if key_valid is not None:
        causal = causal & key_valid[:, None, :]
    own = key_positions[:, None, :] == query_positions[:, :, None]  # (B, T, S)
    allowed = query_membership[..., :, None] & key_membership[..., None, :] & causal[:, None, None]  # (B, H, K, T, S)
    scores = scores[:, :, None].masked_fill(~allowed, torch.finfo(scores.dtype).min)
    scores = scores.masked_fill(allowed & own[:, None, None], SELF_SCORE)
    weight = query_membership.to(scores.dtype)  # (B, H, K, T)
    counts = weight.sum(2).clamp(min=1.0)  # (B, H, T)
    probs = (scores.softmax(dim=-1) * weight[..., None]).sum(2) / counts[..., None]  # (B, H, T, S)
    attended = F.dropout(probs, p=dropout_p) if dropout_p > 0.0 else probs
    return torch.einsum("bhts,bhsd->bhtd", attended.to(value.dtype), value), probs


def nearest_routing_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    clusters: tuple[torch.Tensor, torch.Tensor],
    positions: tuple[torch.Tensor, torch.Tensor],
    key_valid: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`routing_attention_reference` for nearest-centroid clusters (one cluster per token) as one ``T x S`` mask
    "same cluster and causal": ``K`` times cheaper than the per-cluster twin (a decoding step: ``O(S)``).

    Args:
        query: ``(B, H, T, Dh)``; key, value: ``(B, H, S, Dh)``.
        clusters: the queries' ``(B, H, T)`` and the keys' ``(B, H, S)`` nearest centroids.
        positions: query positions ``(B, T)`` and key positions ``(B, S)``.
        key_valid: ``(B, S)`` bool, False at padding keys; dropout_p: on the probabilities.

    Returns:
        ``(B, H, T, Dh)`` and the probabilities ``(B, H, T, S)``.
    """
    query_clusters, key_clusters = clusters
    query_positions, key_positions = positions
    scores = torch.einsum("bhtd,bhsd->bhts", query, key) * query.shape[-1] ** -0.5  # (B, H, T, S)
    causal = key_positions[:, None, :] <= query_positions[:, :, None]  # (B, T, S)
    if key_valid is not None:
        causal = causal & key_valid[:, None, :]
    own = key_positions[:, None, :] == query_positions[:, :, None]  # (B, T, S)
    allowed = (query_clusters[..., :, None] == key_clusters[..., None, :]) & causal[:, None]  # (B, H, T, S)
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = scores.masked_fill(allowed & own[:, None], SELF_SCORE).softmax(dim=-1)
    attended = F.dropout(probs, p=dropout_p) if dropout_p > 0.0 else probs
    return torch.einsum("bhts,bhsd->bhtd", attended.to(value.dtype), value), probs


@torch.no_grad()
def kmeans_statistics(
    normalized: torch.Tensor, clusters: torch.Tensor, num_clusters: int, valid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """What a k-means step needs: per head and centroid, the sum of the unit vectors nearest to it ``(H, K, Dh)`` and
    their count ``(H, K)``, over the batch and sequence (sums that data-parallel ranks add up).

    Args:
        normalized: ``(B, H, T, Dh)`` unit vectors; clusters: ``(B, H, T)`` from `nearest_centroid`.
        num_clusters: ``K``; valid: ``(B, T)`` bool, False at padding (left out).
    """
    head_dim = normalized.shape[-1]
    dtype = torch.promote_types(normalized.dtype, torch.float32)
    vectors = normalized.to(dtype)
    weight = torch.ones(clusters.shape, dtype=dtype, device=clusters.device)
    if valid is not None:
        weight = weight * valid[:, None, :].to(dtype)
        vectors = vectors * weight[..., None]
    batch, heads = clusters.shape[:2]
    sums = vectors.new_zeros(batch, heads, num_clusters, head_dim)
    sums.scatter_add_(2, clusters[..., None].expand(-1, -1, -1, head_dim), vectors)
    counts = weight.new_zeros(batch, heads, num_clusters).scatter_add_(2, clusters, weight)
    return sums.sum(0), counts.sum(0)


@torch.no_grad()
def kmeans_centroids(sums: torch.Tensor, counts: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """The k-means step from `kmeans_statistics`: each centroid moves to the normalised sum of its members; a centroid
    with none stays. ``(H, K, Dh)`` in the centroids' dtype."""
    moved = F.normalize(sums, dim=-1).to(centroids.dtype)
    return torch.where(counts[..., None] > 0, moved, centroids)


@torch.no_grad()
def kmeans_step(
    normalized: torch.Tensor, clusters: torch.Tensor, centroids: torch.Tensor, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """One k-means step on one process's tokens (`kmeans_statistics` then `kmeans_centroids`). ``(H, K, Dh)``."""
    sums, counts = kmeans_statistics(normalized, clusters, centroids.shape[1], valid)
    return kmeans_centroids(sums, counts, centroids)


@torch.no_grad()
def ema_update(centroids: torch.Tensor, new: torch.Tensor, decay: float) -> None:
    """In place: ``centroids <- decay * centroids + (1 - decay) * new`` (section 4.1's moving average)."""
    centroids.mul_(decay).add_(new.to(centroids.dtype), alpha=1.0 - decay)


__all__ = [
    "SELF_SCORE",
    "balanced_members",
    "centroid_similarity",
    "ema_update",
    "kmeans_centroids",
    "kmeans_statistics",
    "kmeans_step",
    "nearest_centroid",
    "nearest_members",
    "nearest_routing_attention",
    "routing_attention",
    "routing_attention_reference",
]
