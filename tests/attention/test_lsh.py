"""Reformer's kernels agree with their dense twins (values and gradients, float64, ragged lengths, padding)."""

import pytest
import torch

from tf_family.attention import (
    ChunkPattern,
    auto_num_buckets,
    chunked_local_attention,
    chunked_local_attention_reference,
    hash_vectors,
    lsh_attention,
    lsh_attention_reference,
    lsh_rotations,
    normalize_shared_keys,
    shared_qk_attention,
)

B, H, DH = 3, 2, 8


def _inputs(length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64, requires_grad=True)
    value = torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64, requires_grad=True)
    valid = torch.ones(B, length, dtype=torch.bool)  # rows: full, right-padded, left-padded
    valid[1, length - min(5, length - 1) :] = False
    valid[2, : min(3, length - 1)] = False
    return query, value, valid


def _compare(fast_fn, reference_fn, tensors, valid):
    weights = torch.randn(B, H, valid.shape[1], DH, dtype=torch.float64) * valid[:, None, :, None]
    fast = fast_fn(*tensors)
    reference = reference_fn(*tensors)
    select = valid[:, None, :, None].expand_as(fast)
    torch.testing.assert_close(fast[select], reference[select], rtol=1e-9, atol=1e-10)
    fast_grads = torch.autograd.grad((fast * weights).sum(), tensors)
    reference_grads = torch.autograd.grad((reference * weights).sum(), tensors)
    for got, expected in zip(fast_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


# (length, num_hashes, num_buckets, causal, chunks after, wrap_around, correct_duplicates)
LSH_CASES = [
    (5, 2, 4, False, 0, False, False),  # a right-padded row with one real token: self-only in every round
    (23, 1, 4, True, 0, False, False),
    (23, 2, 4, False, 1, False, False),
    (23, 4, [2, 4], True, 0, False, False),
    (16, 2, [2, 4], False, 0, False, True),
    (23, 4, 4, True, 0, False, True),
    (16, 2, 4, False, 1, True, False),
    (16, 4, [2, 4], True, 0, True, False),
    (23, 1, 2, False, 0, True, False),
]


@pytest.mark.parametrize(
    ("length", "num_hashes", "num_buckets", "causal", "after", "wrap_around", "correct_duplicates"), LSH_CASES
)
def test_lsh_attention_matches_dense_twin(length, num_hashes, num_buckets, causal, after, wrap_around,
                                          correct_duplicates):  # fmt: skip
    query, value, valid = _inputs(length)
    rotations = lsh_rotations(3, H, DH, num_hashes, num_buckets, torch.float64)
    buckets = hash_vectors(query, rotations, num_buckets)
    pattern = ChunkPattern(4, before=1, after=after, causal=causal, wrap_around=wrap_around)

    def fast(q, v):
        return lsh_attention(
            q, normalize_shared_keys(q), v, buckets, pattern, valid, correct_duplicates=correct_duplicates
        )

    def reference(q, v):
        return lsh_attention_reference(q, normalize_shared_keys(q), v, buckets, pattern, valid, correct_duplicates)[0]

    _compare(fast, reference, (query, value), valid)


@pytest.mark.parametrize(
    ("length", "num_hashes", "num_buckets", "before", "correct_duplicates"),
    [(23, 2, 4, 1, False), (23, 4, [2, 4], 1, True), (30, 2, 4, 2, False), (9, 1, 2, 1, True)],
)
def test_causal_buckets_kernel_matches_dense_twin(length, num_hashes, num_buckets, before, correct_duplicates):
    query, value, valid = _inputs(length)
    buckets = hash_vectors(query, lsh_rotations(3, H, DH, num_hashes, num_buckets, torch.float64), num_buckets)
    pattern = ChunkPattern(4, before=before, causal=True, causal_buckets=True)

    def fast(q, v):
        return lsh_attention(
            q, normalize_shared_keys(q), v, buckets, pattern, valid, correct_duplicates=correct_duplicates
        )

    def reference(q, v):
        return lsh_attention_reference(q, normalize_shared_keys(q), v, buckets, pattern, valid, correct_duplicates)[0]

    _compare(fast, reference, (query, value), valid)


@pytest.mark.parametrize("causal_buckets", [True, False])
def test_causal_buckets_make_outputs_independent_of_later_tokens(causal_buckets):
    """Changing every token after ``t`` (their vectors, hence their buckets, and how many there are) leaves the
    outputs up to ``t`` unchanged with ``causal_buckets``: later tokens sort after every earlier token of their bucket.
    The chunked rule is causal only in what it attends to: later tokens move the chunk boundaries."""
    query, value, _ = _inputs(40)
    cut = 17
    changed_query, changed_value, _ = _inputs(48, seed=5)
    changed_query = torch.cat([query[:, :, :cut], changed_query[:, :, cut:]], dim=2).detach()
    changed_value = torch.cat([value[:, :, :cut], changed_value[:, :, cut:]], dim=2).detach()
    pattern = ChunkPattern(4, before=1, causal=True, causal_buckets=causal_buckets)
    rotations = lsh_rotations(3, H, DH, 2, 8, torch.float64)
    outputs = []
    for q, v in ((query.detach(), value.detach()), (changed_query, changed_value)):
        buckets = hash_vectors(q, rotations, 8)
        outputs.append(lsh_attention(q, normalize_shared_keys(q), v, buckets, pattern)[:, :, :cut])
    if causal_buckets:
        torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-12, atol=1e-12)
    else:
        assert not torch.allclose(outputs[1], outputs[0])


def test_causal_buckets_needs_causal_chunks_kept_apart():
    with pytest.raises(ValueError, match="causal_buckets needs causal=True"):
        ChunkPattern(4, causal=False, causal_buckets=True)
    with pytest.raises(ValueError, match="causal_buckets needs causal=True"):
        ChunkPattern(4, causal=True, wrap_around=True, causal_buckets=True)


@pytest.mark.parametrize("causal", [False, True])
def test_one_bucket_is_full_shared_qk_attention(causal):
    """With every position in one bucket and a chunk covering the input, LSH attention is full shared-QK attention,
    for the chunked kernel and its dense twin alike."""
    query, value, valid = _inputs(11)
    key = normalize_shared_keys(query)
    buckets = torch.zeros(B, H, 2, 11, dtype=torch.long)
    pattern = ChunkPattern(16, before=1, causal=causal)
    full = shared_qk_attention(query, key, value, valid, causal, implementation="eager")[0]
    select = valid[:, None, :, None].expand_as(full)
    for got in (
        lsh_attention(query, key, value, buckets, pattern, valid),
        lsh_attention_reference(query, key, value, buckets, pattern, valid, correct_duplicates=True)[0],
    ):
        torch.testing.assert_close(got[select], full[select], rtol=1e-9, atol=1e-10)


def test_self_attention_only_without_other_keys():
    """The first position of a causal sequence has only itself; every other query never attends to itself."""
    query, value, _ = _inputs(6)
    _, probs = shared_qk_attention(query, normalize_shared_keys(query), value, None, True, implementation="eager")
    assert torch.allclose(probs[..., 0, 0], torch.ones(()).double())
    assert torch.all(probs.diagonal(dim1=-2, dim2=-1)[..., 1:] == 0)


@pytest.mark.parametrize(
    ("length", "before", "after", "causal", "wrap_around", "implementation"),
    [
        (3, 1, 0, True, False, "sdpa"),
        (13, 1, 0, True, False, "sdpa"),
        (13, 1, 1, False, False, "eager"),
        (13, 2, 0, False, False, "sdpa"),
        (24, 0, 0, True, False, "sdpa"),
        (13, 1, 1, False, True, "sdpa"),
        (24, 1, 0, True, True, "eager"),
    ],
)
def test_chunked_local_attention_matches_dense_twin(length, before, after, causal, wrap_around, implementation):
    query, value, valid = _inputs(length)
    generator = torch.Generator().manual_seed(1)
    key = torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64, requires_grad=True)
    pattern = ChunkPattern(4, before, after, causal, wrap_around)
    if wrap_around:  # transformers wraps over whole chunks: compare on a chunk multiple
        length = 4 * (-(-length // 4))
        query, value, valid = _inputs(length)
        key = torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64, requires_grad=True)

    _compare(
        lambda q, k, v: chunked_local_attention(q, k, v, pattern, valid, 0.0, implementation),
        lambda q, k, v: chunked_local_attention_reference(q, k, v, pattern, valid)[0],
        (query, key, value),
        valid,
    )


def test_bidirectional_local_attention_does_not_wrap_unless_asked():
    """Position 0 never sees the last chunk, except in the transformers-compatible mode."""
    query, value, _ = _inputs(16)
    key = query.detach().clone()
    for wrap_around in (False, True):
        pattern = ChunkPattern(4, 1, 0, False, wrap_around)
        _, probs = chunked_local_attention_reference(query, key, value, pattern)
        assert bool((probs[..., 0, 12:] > 0).any()) is wrap_around


def test_rotations_come_from_a_generator_and_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    first = lsh_rotations(7, H, DH, 2, [2, 4])
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.manual_seed(7)
    assert torch.equal(first, torch.randn(H, DH, 2, 3))  # transformers' draw after torch.manual_seed(hash_seed)


def test_factorised_buckets_and_auto_count():
    query, _, _ = _inputs(10)
    buckets = hash_vectors(query, lsh_rotations(0, H, DH, 3, [4, 6]), [4, 6])
    assert buckets.shape == (B, H, 3, 10) and int(buckets.min()) >= 0 and int(buckets.max()) < 24
    assert auto_num_buckets(4096, 64, 65536) == 128
    assert auto_num_buckets(65536, 64, 65536) == [32, 64]
    assert auto_num_buckets(8, 64, 1024) == 2


def test_mask_values_follow_the_dtype():
    """Half-precision scores give finite outputs (no stored float32 constants that overflow)."""
    query, value, valid = (t.detach() for t in _inputs(13))
    query, value = query.to(torch.bfloat16), value.to(torch.bfloat16)
    buckets = hash_vectors(query.double(), lsh_rotations(0, H, DH, 2, 4, torch.float64), 4)
    out = lsh_attention(query, normalize_shared_keys(query), value, buckets, ChunkPattern(4, causal=True), valid)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
