"""Kernelised attention (tf_family.attention.kernelized): each fast path against its dense twin, the feature maps
against the kernels they estimate, the recurrent step against the whole sequence."""

import math

import pytest
import torch

from tf_family.attention.kernelized import (
    causal_linear_attention,
    causal_linear_attention_reference,
    draw_random_projection,
    elu_features,
    favor_causal_key_features,
    favor_key_features,
    favor_query_features,
    linear_attention,
    linear_attention_reference,
    mask_key_features,
    random_fourier_features,
)

B, H, T, DH = 2, 3, 21, 8  # a length that is no multiple of the chunk sizes used below


def _qkv(seed=0, length=T, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64).to(dtype) for _ in range(3))


def _projection(num_features=16, orthogonal=True, seed=1):
    return draw_random_projection(num_features, DH, torch.Generator().manual_seed(seed), orthogonal=orthogonal)


def _feature_pairs(query, key):
    """(name, query features, non-causal key features, causal key features) for every feature map."""
    projection = _projection()
    return [
        ("elu", elu_features(query), elu_features(key), elu_features(key)),
        (
            "favor",
            favor_query_features(query, projection),
            favor_key_features(key, projection),
            favor_causal_key_features(key, projection),
        ),
        ("rfa", random_fourier_features(query, projection), *[random_fourier_features(key, projection)] * 2),
    ]


def test_orthogonal_projection_rows_are_orthogonal_within_a_block():
    projection = _projection(num_features=2 * DH + 3)
    assert projection.shape == (2 * DH + 3, DH)
    block = projection[:DH]
    gram = block @ block.T
    off_diagonal = gram - torch.diag(torch.diagonal(gram))
    assert off_diagonal.abs().max() < 1e-4
    again = _projection(num_features=2 * DH + 3)
    assert torch.equal(projection, again), "the projection must depend on the generator only"


@pytest.mark.parametrize("index", range(3))
def test_linear_attention_matches_dense_twin(index):
    query, key, value = _qkv()
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, 15:] = False
    name, query_features, key_features, _ = _feature_pairs(query, key)[index]
    key_features = mask_key_features(key_features, valid)
    fast = linear_attention(query_features, key_features, value)
    torch.testing.assert_close(fast, linear_attention_reference(query_features, key_features, value), msg=name)


@pytest.mark.parametrize("index", range(3))
@pytest.mark.parametrize("gated", [False, True])
def test_causal_linear_attention_matches_dense_twin_values_and_gradients(index, gated):
    query, key, value = (x.requires_grad_() for x in _qkv())
    name, query_features, _, key_features = _feature_pairs(query, key)[index]
    log_decay = None
    if gated:
        gate_logits = torch.randn(B, H, T, generator=torch.Generator().manual_seed(5), requires_grad=True)
        log_decay = torch.nn.functional.logsigmoid(gate_logits)
    fast, _ = causal_linear_attention(query_features, key_features, value, log_decay=log_decay, chunk_size=8)
    dense = causal_linear_attention_reference(query_features, key_features, value, log_decay=log_decay)
    torch.testing.assert_close(fast, dense, rtol=1e-4, atol=1e-5, msg=name)
    grads = torch.autograd.grad(fast.square().sum(), (query, key, value), retain_graph=True)
    dense_grads = torch.autograd.grad(dense.square().sum(), (query, key, value))
    for got, expected in zip(grads, dense_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("gated", [False, True])
def test_recurrent_steps_equal_the_whole_sequence(gated):
    query, key, value = _qkv()
    query_features, key_features = elu_features(query), elu_features(key)
    log_decay = -torch.rand(B, H, T, generator=torch.Generator().manual_seed(2)) if gated else None
    whole, final = causal_linear_attention(query_features, key_features, value, log_decay=log_decay)
    state, steps = None, []
    for t in range(T):
        step_decay = None if log_decay is None else log_decay[:, :, t : t + 1]
        out, state = causal_linear_attention(
            query_features[:, :, t : t + 1], key_features[:, :, t : t + 1], value[:, :, t : t + 1], step_decay, state
        )
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=2), whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.kv, final.kv, rtol=1e-5, atol=1e-5)
    assert state.kv.shape == (B, H, DH, DH), "the state's size does not depend on the length"


def test_favor_key_stabiliser_is_per_batch_and_head_not_across_the_batch():
    """Scaling one batch row's keys must not change another row's output (a global max would couple them)."""
    query, key, value = _qkv()
    projection = _projection()
    query_features = favor_query_features(query, projection)
    out = linear_attention(query_features, favor_key_features(key, projection), value)
    louder = key.clone()
    louder[0] *= 4.0
    out_louder = linear_attention(query_features, favor_key_features(louder, projection), value)
    torch.testing.assert_close(out_louder[1], out[1], rtol=0, atol=0)


def test_favor_padding_does_not_set_the_stabiliser():
    query, key, value = _qkv()
    projection = _projection()
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[:, 12:] = False
    garbage = key.clone()
    garbage[:, :, 12:] = 50.0  # padded keys with huge values
    query_features = favor_query_features(query[:, :, :12], projection)
    short = linear_attention(query_features, favor_key_features(key[:, :, :12], projection), value[:, :, :12])
    padded = linear_attention(query_features, favor_key_features(garbage, projection, valid), value)
    torch.testing.assert_close(padded, short, rtol=1e-6, atol=1e-7)


def test_favor_causal_features_ignore_later_keys():
    _, key, _ = _qkv()
    projection = _projection()
    features = favor_causal_key_features(key, projection)
    prefix = favor_causal_key_features(key[:, :, :5], projection)
    torch.testing.assert_close(features[:, :, :5], prefix, rtol=0, atol=0)


def _softmax_attention(query, key, value):
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
    return scores.softmax(-1) @ value


def _favor_error(num_features, orthogonal, seeds=8):
    query, key, value = (x * 0.5 for x in _qkv(length=32, dtype=torch.float64))
    exact = _softmax_attention(query, key, value)
    errors = []
    for seed in range(seeds):
        projection = _projection(num_features, orthogonal, seed=seed).double()
        approx = linear_attention(favor_query_features(query, projection), favor_key_features(key, projection), value)
        errors.append(float((approx.double() - exact).norm() / exact.norm()))
    return sum(errors) / len(errors)


def test_favor_converges_to_softmax_attention_as_features_grow():
    errors = [_favor_error(m, orthogonal=True) for m in (16, 256, 4096)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.04, errors


def test_orthogonal_features_err_less_than_iid_ones_at_few_features():
    """The paper's ORF claim, averaged over 8 draws; also catches a non-Haar QR (rows not isotropic: a bias that
    stops the error from falling with more features)."""
    for num_features in (16, 64):
        assert _favor_error(num_features, orthogonal=True) < _favor_error(num_features, orthogonal=False)


def test_random_fourier_features_estimate_the_gaussian_kernel():
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 1, 1, 1, DH, generator=generator).unbind(0)
    projection = draw_random_projection(4096, DH, generator)
    estimate = (random_fourier_features(x, projection) * random_fourier_features(y, projection)).sum()
    xn, yn = torch.nn.functional.normalize(x, dim=-1), torch.nn.functional.normalize(y, dim=-1)
    exact = torch.exp(-(xn - yn).pow(2).sum() / 2)
    assert abs(float(estimate - exact)) < 0.05


def test_bfloat16_inputs_are_computed_in_float32():
    query, key, value = _qkv(dtype=torch.bfloat16)
    out, state = causal_linear_attention(elu_features(query), elu_features(key), value)
    assert out.dtype == torch.bfloat16 and state.kv.dtype == torch.float32
    expected = causal_linear_attention_reference(elu_features(query), elu_features(key), value.float())
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


def test_chunk_size_must_be_positive():
    query, key, value = _qkv()
    with pytest.raises(ValueError, match="chunk_size"):
        causal_linear_attention(elu_features(query), elu_features(key), value, chunk_size=0)
