import pytest
import torch

from tf_family.attention import (
    build_causal_memory_mask,
    build_key_padding_mask,
    cached_position_embedding,
    rel_shift,
    rel_shift_reference,
    relative_attention_scores,
    relative_position_sequence,
    sinusoid_position_embedding,
)
from tf_family.layers import RelativeMultiHeadAttention
from tf_family.layers.relative_attention import RelativeAttentionInputs


@pytest.mark.parametrize(("query_length", "memory_length"), [(1, 0), (4, 0), (5, 3), (3, 7), (6, 6)])
def test_rel_shift_equals_naive_index_computation(query_length, memory_length):
    scores = torch.randn(2, 3, query_length, query_length + memory_length, requires_grad=True)
    visible = build_causal_memory_mask(query_length, memory_length)
    fast, slow = rel_shift(scores), rel_shift_reference(scores)
    torch.testing.assert_close(fast * visible, slow * visible, rtol=0, atol=0)
    # gradients flow to the same relative-distance entries
    (grad_fast,) = torch.autograd.grad((fast * visible).sum(), scores)
    (grad_slow,) = torch.autograd.grad((slow * visible).sum(), scores)
    torch.testing.assert_close(grad_fast, grad_slow)


def test_rel_shift_matches_relative_distance_semantics():
    # score[i, r] = distance (S - 1 - r); after the shift, entry (i, j) must hold the distance (M + i) - j
    query_length, memory_length = 4, 3
    key_length = query_length + memory_length
    distances = torch.arange(key_length - 1, -1, -1.0).expand(query_length, key_length)
    shifted = rel_shift(distances)
    for i in range(query_length):
        for j in range(memory_length + i + 1):
            assert shifted[i, j] == memory_length + i - j


def test_causal_memory_mask_and_same_length():
    mask = build_causal_memory_mask(3, 2)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    span = build_causal_memory_mask(3, 2, max_span=2)
    assert span.sum(-1).tolist() == [2, 2, 2]
    assert span.tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match="max_span"):
        build_causal_memory_mask(3, 2, max_span=0)


def test_key_padding_mask_layouts():
    memory_mask = torch.tensor([[True, False], [True, True]])
    segment = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert build_key_padding_mask(2, 3, memory_mask, segment).tolist() == [[1, 0, 1, 1, 0], [1, 1, 0, 1, 1]]
    whole = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 0, 1, 1, 1, 1]])  # generate()'s mask over all tokens so far
    assert build_key_padding_mask(2, 3, memory_mask, whole).tolist() == [[1, 0, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert build_key_padding_mask(2, 3, None, None) is None
    with pytest.raises(ValueError, match="attention_mask has 4 columns"):
        build_key_padding_mask(2, 3, memory_mask, torch.ones(2, 4))


def test_relative_scores_equal_explicit_formula():
    torch.manual_seed(0)
    batch, heads, query_length, memory_length, dim = 2, 2, 3, 2, 4
    key_length = query_length + memory_length
    query = torch.randn(batch, heads, query_length, dim)
    key = torch.randn(batch, heads, key_length, dim)
    r = torch.randn(heads, key_length, dim)  # embedding of distance key_length - 1 - index
    u, v = torch.randn(heads, dim), torch.randn(heads, dim)
    scores = relative_attention_scores(query, key, r, u, v)
    for i in range(query_length):
        for j in range(memory_length + i + 1):
            distance = memory_length + i - j
            expected = ((query[:, :, i] + u) * key[:, :, j]).sum(-1) + (
                (query[:, :, i] + v) * r[:, key_length - 1 - distance]
            ).sum(-1)
            torch.testing.assert_close(scores[:, :, i, j], expected)


def test_position_sequence_and_sinusoid():
    assert relative_position_sequence(5, 0).tolist() == [4, 3, 2, 1, 0]
    assert relative_position_sequence(5, 2).tolist() == [2, 2, 2, 1, 0]
    embedding = sinusoid_position_embedding(torch.tensor([0.0, 1.0]), 4)
    torch.testing.assert_close(embedding[0], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(embedding[1, 0], torch.tensor(1.0).sin())
    with pytest.raises(ValueError, match="even"):
        sinusoid_position_embedding(torch.tensor([0.0]), 3)


@pytest.mark.parametrize(("query_length", "memory_length"), [(1, 0), (4, 0), (5, 3), (3, 7), (6, 6)])
def test_rel_shift_without_autograd_is_a_view_equal_to_the_reference(query_length, memory_length):
    scores = torch.randn(2, 3, query_length, query_length + memory_length)
    visible = build_causal_memory_mask(query_length, memory_length)
    fast = rel_shift(scores)
    assert fast.untyped_storage().data_ptr() == scores.untyped_storage().data_ptr()  # no copy
    torch.testing.assert_close(fast * visible, rel_shift_reference(scores) * visible, rtol=0, atol=0)


def test_position_keys_follow_weights_changed_in_place_and_nothing_is_kept_on_the_layer():
    torch.manual_seed(0)
    layer = RelativeMultiHeadAttention(8, 2, 4, 0.0, 0.0, False, 1e-5, True).eval()
    embedding = cached_position_embedding(6, 0, 8, None, torch.float32)
    assert cached_position_embedding(6, 0, 8, None, torch.float32) is embedding
    positions = relative_position_sequence(6, 0)
    torch.testing.assert_close(embedding, sinusoid_position_embedding(positions, 8), rtol=0, atol=0)
    query = torch.randn(1, 2, 6, 4)
    allowed = torch.ones(6, 6, dtype=torch.bool)
    inputs = RelativeAttentionInputs(position_embedding=embedding, allowed=allowed)
    state = dict(vars(layer))
    with torch.no_grad():
        first, _ = layer.position_scores(query, inputs)
        layer.position_proj.weight.add_(1.0)  # weights changed in place: the next call reads them
        second, _ = layer.position_scores(query, inputs)
    assert not torch.equal(first, second)
    assert vars(layer).keys() == state.keys(), "a call left state on the layer"


def test_transfo_xl_evaluation_is_the_same_with_and_without_autograd():
    """No grad takes the cached projections and the strided shift; with autograd, the plain path."""
    from tf_family import create_model

    model = create_model("transfo_xl", mem_len=6).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 15), generator=torch.Generator().manual_seed(0))

    def run():
        mems, outputs = None, []
        for start in range(0, 15, 5):
            segment = ids[:, start : start + 5]
            scored = model(input_ids=segment, labels=segment, mems=mems)  # tail clusters: losses, no logits
            out = model(input_ids=segment, mems=mems)
            mems = out.mems
            outputs += [out.logits.detach(), scored.losses.detach()]
        return outputs

    with torch.no_grad():
        fast = run()
    slow = run()
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
