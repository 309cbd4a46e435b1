"""Low-rank (Linformer) attention (tf_family.attention.low_rank): the projected path against its dense twin, padding
left out of the projection, rows picked by position."""

import torch

from tf_family.attention.low_rank import (
    low_rank_attention,
    low_rank_attention_reference,
    project_along_sequence,
    project_prefix_along_sequence,
)

B, H, S, DH, N, K = 2, 3, 11, 4, 16, 5


def _inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    query, key, value = (torch.randn(B, H, S, DH, generator=generator) for _ in range(3))
    projections = tuple(0.4 * torch.randn(1, N, K, generator=generator) for _ in range(2))
    return query, key, value, projections


def _fast(query, key, value, projections, positions, valid):
    projected_key = project_along_sequence(key, projections[0], positions, valid)
    projected_value = project_along_sequence(value, projections[1], positions, valid)
    return low_rank_attention(query, projected_key, projected_value)[0]


def test_low_rank_attention_matches_dense_twin_values_and_gradients():
    query, key, value, projections = _inputs()
    query, key, value = (x.requires_grad_() for x in (query, key, value))
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[1, :3] = False  # left padding
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)
    fast = _fast(query, key, value, projections, positions, valid)
    dense = low_rank_attention_reference(query, key, value, projections, positions, valid)
    torch.testing.assert_close(fast, dense, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(fast.square().sum(), (query, key, value))
    dense_grads = torch.autograd.grad(dense.square().sum(), (query, key, value))
    for got, expected in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_per_head_projections_match_dense_twin():
    query, key, value, _ = _inputs()
    generator = torch.Generator().manual_seed(4)
    projections = tuple(0.4 * torch.randn(H, N, K, generator=generator) for _ in range(2))
    valid = torch.ones(B, S, dtype=torch.bool)
    positions = torch.arange(S).expand(B, -1)
    torch.testing.assert_close(
        _fast(query, key, value, projections, positions, valid),
        low_rank_attention_reference(query, key, value, projections, positions, valid),
        rtol=1e-5,
        atol=1e-6,
    )


def test_padding_is_left_out_and_rows_follow_positions():
    """A row padded on the left with garbage equals the row alone (its real tokens take rows 0.. of E and F)."""
    query, key, value, projections = _inputs()
    short = 7
    alone_valid = torch.ones(1, short, dtype=torch.bool)
    alone = _fast(
        query[:1, :, :short],
        key[:1, :, :short],
        value[:1, :, :short],
        projections,
        torch.arange(short)[None],
        alone_valid,
    )
    pad = S - short
    shifted = [
        torch.cat([torch.full_like(x[:1, :, :pad], 30.0), x[:1, :, :short]], dim=2) for x in (query, key, value)
    ]
    valid = torch.cat([torch.zeros(1, pad, dtype=torch.bool), torch.ones(1, short, dtype=torch.bool)], dim=1)
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)
    padded = _fast(*shifted, projections, positions, valid)
    torch.testing.assert_close(padded[:, :, pad:], alone, rtol=1e-5, atol=1e-5)


def test_prefix_projection_equals_the_gathered_one_values_and_gradients():
    """Real tokens at positions 0.. (no padding, or right padding): slicing the rows of E / F
    (`project_prefix_along_sequence`) equals gathering them per row, for the states and the projections' gradients;
    shared and per-head projections; the attention on top equals the dense twin."""
    query, key, value, _ = _inputs()
    valid = torch.ones(B, S, dtype=torch.bool)
    valid[1, S - 4 :] = False  # right padding in the second row
    positions = (valid.long().cumsum(1) - 1).clamp_min(0)
    generator = torch.Generator().manual_seed(7)
    for heads in (1, H):
        projection = (0.4 * torch.randn(heads, N, K, generator=generator)).requires_grad_()
        for mask in (None, valid):
            states = key.clone().requires_grad_()
            sliced = project_prefix_along_sequence(states, projection, mask)
            all_valid = torch.ones(B, S, dtype=torch.bool)
            gathered = project_along_sequence(
                states, projection, positions if mask is not None else torch.arange(S).expand(B, -1),
                all_valid if mask is None else mask,
            )  # fmt: skip
            torch.testing.assert_close(sliced, gathered, rtol=1e-5, atol=1e-6)
            weights = torch.randn(sliced.shape, generator=generator)
            got = torch.autograd.grad((sliced * weights).sum(), (states, projection))
            want = torch.autograd.grad((gathered * weights).sum(), (states, projection))
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    projections = tuple(0.4 * torch.randn(1, N, K, generator=generator) for _ in range(2))
    fast = low_rank_attention(
        query,
        project_prefix_along_sequence(key, projections[0], valid),
        project_prefix_along_sequence(value, projections[1], valid),
    )[0]
    dense = low_rank_attention_reference(query, key, value, projections, positions, valid)
    torch.testing.assert_close(fast, dense, rtol=1e-5, atol=1e-5)


def test_fused_softmax_over_the_slots_equals_the_explicit_twin():
    """The Linformer's sdpa path (`backend.attend` over the projected slots) equals `low_rank_attention`, values and
    gradients."""
    from tf_family.attention.backend import attend

    query, key, value, projections = _inputs()
    valid = torch.ones(B, S, dtype=torch.bool)
    positions = torch.arange(S).expand(B, -1)
    slots = [project_along_sequence(x, p, positions, valid) for x, p in zip((key, value), projections, strict=True)]
    inputs = [t.detach().requires_grad_() for t in (query, *slots)]
    explicit = low_rank_attention(*inputs)[0]
    fused = attend(*inputs, implementation="sdpa")[0]
    torch.testing.assert_close(fused, explicit, rtol=1e-5, atol=1e-6)
    weights = torch.randn(explicit.shape, generator=torch.Generator().manual_seed(3))
    for g, w in zip(
        torch.autograd.grad((fused * weights).sum(), inputs),
        torch.autograd.grad((explicit * weights).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
