"""ETC's global-local attention (`tf_family.attention.etc`; Ainslie et al. 2020): each rule of the paper as a test
(there is no PyTorch reference), and the efficient path against its dense twin (values and gradients, float64,
padding, lengths that are not multiples of the chunk)."""

import pytest
import torch

from tf_family.attention.dense import dense_attention
from tf_family.attention.etc import (
    EtcPattern,
    build_etc_mask,
    build_etc_relative_labels,
    etc_attention,
    etc_attention_reference,
)


def _qkv(pattern: EtcPattern, long_length: int, batch=2, heads=3, head_dim=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    total = pattern.num_global + long_length
    tensors = [
        torch.randn(batch, heads, total, head_dim, generator=generator, dtype=torch.float64).requires_grad_()
        for _ in range(3)
    ]
    relative_keys = torch.randn(pattern.num_labels, heads, head_dim, generator=generator, dtype=torch.float64)
    return (*tensors, relative_keys.requires_grad_())


@pytest.mark.parametrize("implementation", ["sdpa", "eager", "tff_native"])
@pytest.mark.parametrize(("long_length", "radius", "max_distance"), [(150, 5, 3), (37, 2, 4), (9, 20, 20)])
def test_efficient_path_equals_the_dense_twin_values_and_gradients(implementation, long_length, radius, max_distance):
    """Float64, with left and right padding, on lengths that are not multiples of the chunk (150 long tokens: three
    64-query chunks, the last partly padding), a radius wider than the input, and with and without relative keys."""
    pattern = EtcPattern(num_global=3, radius=radius, max_distance=max_distance)
    query, key, value, relative_keys = _qkv(pattern, long_length)
    valid = torch.ones(2, long_length, dtype=torch.bool)
    valid[0, : long_length // 5] = False  # left padding
    valid[1, long_length - long_length // 3 :] = False  # right padding
    for keys in (relative_keys, None):
        inputs = (query, key, value) if keys is None else (query, key, value, keys)
        fast = etc_attention(query, key, value, keys, pattern, valid, implementation=implementation)
        dense, _ = etc_attention_reference(query, key, value, keys, pattern, valid)
        torch.testing.assert_close(fast, dense, rtol=1e-10, atol=1e-10)
        weights = torch.randn(fast.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        fast_grads = torch.autograd.grad((fast * weights).sum(), inputs)
        dense_grads = torch.autograd.grad((dense * weights).sum(), inputs)
        for got, expected in zip(fast_grads, dense_grads, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_a_long_token_outside_the_radius_has_zero_weight_and_global_tokens_see_everything():
    pattern = EtcPattern(num_global=2, radius=3, max_distance=2)
    long_length = 20
    query, key, value, relative_keys = _qkv(pattern, long_length)
    valid = torch.ones(2, long_length, dtype=torch.bool)
    valid[1, 15:] = False
    _, probs = etc_attention_reference(query, key, value, relative_keys, pattern, valid)  # (B, H, S, S)
    g = pattern.num_global
    i, j = torch.meshgrid(torch.arange(long_length), torch.arange(long_length), indexing="ij")
    outside = (i - j).abs() > 3
    long_to_long = probs[:, :, g:, g:]
    assert (long_to_long[:, :, outside] == 0).all()
    assert (long_to_long[0][:, ~outside] > 0).all()  # within the radius (no padding in row 0)
    assert (probs[:, :, g:, :g] > 0).all()  # every long token sees every global token
    assert (probs[0, :, :g] > 0).all()  # global tokens see every real key
    assert (probs[1, :, :, g + 15 :] == 0).all() and (probs[1, :, :g, g : g + 15] > 0).all()  # padding has none

    # the efficient path: a long value outside every query's radius changes nothing of that query's output
    changed = value.detach().clone()
    changed[:, :, g + 15] += 100.0
    before = etc_attention(query, key, value, relative_keys, pattern, valid)
    after = etc_attention(query, key, changed, relative_keys, pattern, valid)
    near = (torch.arange(long_length) - 15).abs() <= 3
    assert torch.equal(before[0, :, g:][:, ~near], after[0, :, g:][:, ~near])
    assert not torch.allclose(before[0, :, g:][:, near], after[0, :, g:][:, near])
    assert not torch.allclose(before[0, :, :g], after[0, :, :g])  # the global tokens read it


def test_relative_labels_follow_the_documented_convention_and_are_clipped():
    """An independent statement of the rule: g2g and l2l ``clamp(j - i, -K, K) + K`` inside each sequence, l2g
    ``2K + 1``, g2l ``2K + 2``."""
    pattern = EtcPattern(num_global=2, radius=3, max_distance=1)
    labels = build_etc_relative_labels(pattern, 5)
    expected = torch.tensor(
        [
            [1, 2, 4, 4, 4, 4, 4],
            [0, 1, 4, 4, 4, 4, 4],
            [3, 3, 1, 2, 2, 2, 2],
            [3, 3, 0, 1, 2, 2, 2],
            [3, 3, 0, 0, 1, 2, 2],
            [3, 3, 0, 0, 0, 1, 2],
            [3, 3, 0, 0, 0, 0, 1],
        ]
    )
    assert torch.equal(labels, expected)
    # clipped: in the scores, offset +3 (label 2K) carries the same relative key as +1
    query, key, value, relative_keys = _qkv(pattern, 5)
    zero = torch.zeros_like(key)
    _, probs = etc_attention_reference(query, zero, value, relative_keys, pattern, None)
    row = probs[0, 0, 2]  # long query 0: keys at +1, +2, +3 share label 2K, so the same probability
    torch.testing.assert_close(row[3], row[4], rtol=0, atol=1e-12)
    torch.testing.assert_close(row[3], row[5], rtol=0, atol=1e-12)
    assert row[6] == 0  # +4 lies outside the radius


def test_a_covering_radius_without_relative_keys_is_full_attention_over_both_inputs():
    pattern = EtcPattern(num_global=2, radius=30, max_distance=3)
    query, key, value, _ = _qkv(pattern, 17)
    valid = torch.ones(2, 17, dtype=torch.bool)
    valid[1, 11:] = False
    key_valid = torch.cat([torch.ones(2, 2, dtype=torch.bool), valid], dim=1)
    expected, _ = dense_attention(query, key, value, key_valid[:, None, None, :])
    torch.testing.assert_close(etc_attention(query, key, value, None, pattern, valid), expected)
    assert build_etc_mask(pattern, valid)[0].all()


def test_the_pattern_and_the_kernel_refuse_bad_shapes():
    with pytest.raises(ValueError, match="num_global"):
        EtcPattern(num_global=0, radius=1, max_distance=1)
    pattern = EtcPattern(num_global=2, radius=1, max_distance=1)
    query, key, value, relative_keys = _qkv(pattern, 4)
    with pytest.raises(ValueError, match="relative_keys must have shape"):
        etc_attention(query, key, value, relative_keys[:3], pattern)
    with pytest.raises(ValueError, match="long_valid must have shape"):
        etc_attention(query, key, value, relative_keys, pattern, torch.ones(2, 5, dtype=torch.bool))


def test_the_efficient_path_never_materialises_s_by_s():
    """Every tensor the forward and backward create stays below ``S * S`` elements (the dense twin's scores are
    ``B * H * S * S``): 1,000 long tokens, radius 2, so the chunked tensors (``T * (G + chunk + 2r)`` per head)
    are far smaller."""
    from torch.utils._python_dispatch import TorchDispatchMode

    pattern = EtcPattern(num_global=2, radius=2, max_distance=2)
    query, key, value, relative_keys = _qkv(pattern, 1000)
    total = pattern.num_global + 1000
    largest = []

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor):
                    largest.append((tensor.numel(), str(func)))
            return out

    with Sizes():
        out = etc_attention(query, key, value, relative_keys, pattern)
        out.sum().backward()
    biggest = max(largest)
    assert biggest[0] < total * total, biggest
