"""Parity with performer-pytorch 1.1.4 (MIT, lucidrains; PyPI ``performer-pytorch``): its ``PerformerLM`` (absolute
positions, pre-layer-norm blocks, FAVOR+ softmax kernel) with weights and projection matrices copied into tf_family's
Performer gives the same encodings (bidirectional) and logits (causal), in eval, on unpadded inputs.

The causal model differs by design in its key features (tf_family: the data-independent bound and no ``+eps``, so
that generation can cache and later keys never leak; performer-pytorch: a max over the whole sequence and ``+eps``)
and performer-pytorch's ``+1e-6`` on the prefix sums: its logits agree within 0.3 % (relative norm), the attention
kernels exactly when given the same features; the bidirectional model agrees within 1e-5."""

import pytest
import torch

from tf_family import TffPerformerConfig, TffPerformerForCausalLM, TffPerformerModel

performer_pytorch = pytest.importorskip("performer_pytorch")

pytestmark = pytest.mark.parity

VOCAB, LENGTH, WIDTH, HEADS, LAYERS, FEATURES = 64, 32, 16, 2, 2, 16


def _reference(causal: bool):
    torch.manual_seed(0)
    model = performer_pytorch.PerformerLM(
        num_tokens=VOCAB,
        max_seq_len=LENGTH,
        dim=WIDTH,
        depth=LAYERS,
        heads=HEADS,
        dim_head=WIDTH // HEADS,
        nb_features=FEATURES,
        causal=causal,
        rotary_position_emb=False,
        tie_embed=True,
        attn_out_bias=True,
    ).eval()
    with torch.no_grad():  # move every weight away from its init so that each one matters
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _copy_weights(reference, ours) -> None:
    """performer-pytorch's state dict into tf_family's names, key by key and shape by shape."""
    theirs = reference.state_dict()
    mapping = {
        "embeddings.word_embeddings.weight": "token_emb.weight",
        "embeddings.position_embeddings.weight": "pos_emb.emb.weight",
        "final_norm.weight": "norm.weight",
        "final_norm.bias": "norm.bias",
    }
    for layer in range(LAYERS):
        prefix, attention = f"layers.{layer}.", f"performer.net.layers.{layer}.0."
        feed_forward = f"performer.net.layers.{layer}.1."
        mapping.update(
            {
                f"{prefix}attention_norm.weight": f"{attention}norm.weight",
                f"{prefix}attention_norm.bias": f"{attention}norm.bias",
                f"{prefix}attention.projection": f"{attention}fn.fast_attention.projection_matrix",
                f"{prefix}attention.query.weight": f"{attention}fn.to_q.weight",
                f"{prefix}attention.key.weight": f"{attention}fn.to_k.weight",
                f"{prefix}attention.value.weight": f"{attention}fn.to_v.weight",
                f"{prefix}attention.out_proj.weight": f"{attention}fn.to_out.weight",
                f"{prefix}attention.out_proj.bias": f"{attention}fn.to_out.bias",
                f"{prefix}feed_forward_norm.weight": f"{feed_forward}norm.weight",
                f"{prefix}feed_forward_norm.bias": f"{feed_forward}norm.bias",
                f"{prefix}feed_forward.fc_in.weight": f"{feed_forward}fn.fn.w1.weight",
                f"{prefix}feed_forward.fc_in.bias": f"{feed_forward}fn.fn.w1.bias",
                f"{prefix}feed_forward.fc_out.weight": f"{feed_forward}fn.fn.w2.weight",
                f"{prefix}feed_forward.fc_out.bias": f"{feed_forward}fn.fn.w2.bias",
            }
        )
    state = ours.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if name in mapping:
                source = theirs[mapping[name]]
                assert source.shape == tensor.shape, f"{name}: {tuple(source.shape)} vs {tuple(tensor.shape)}"
                tensor.copy_(source)
            elif name.endswith(("query.bias", "key.bias", "value.bias", "token_type_embeddings.weight")):
                tensor.zero_()  # performer-pytorch has no q/k/v biases and no token types
            elif not name.endswith(("redraws", "calls_since_redraw")):
                raise AssertionError(f"{name} has no performer-pytorch counterpart")


def _config(causal: bool) -> TffPerformerConfig:
    return TffPerformerConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * WIDTH,
        max_position_embeddings=LENGTH,
        num_random_features=FEATURES,
        hidden_dropout_prob=0.0,
        causal=causal,
        chunk_size=7,
    )


def _ids(length=LENGTH - 3):
    return torch.randint(0, VOCAB, (3, length), generator=torch.Generator().manual_seed(1))


def test_bidirectional_encodings_match_performer_pytorch():
    reference = _reference(causal=False)
    ours = TffPerformerModel(_config(causal=False)).eval()
    _copy_weights(reference, ours)
    ids = _ids()
    with torch.no_grad():
        expected = reference(ids, return_encodings=True)
        got = ours(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_causal_logits_match_performer_pytorch():
    """The whole causal LM: within 0.3 % (relative norm; measured 0.1 %) and the same greedy tokens; what differs is
    only the key stabiliser and its ``+eps`` (see the next test for the attention with equal features)."""
    reference = _reference(causal=True)
    ours = TffPerformerForCausalLM(_config(causal=True)).eval()
    _copy_weights(reference, ours.performer)
    ids = _ids()
    with torch.no_grad():
        expected = reference(ids)
        got = ours(input_ids=ids).logits
    relative = float((got - expected).norm() / expected.norm())
    assert relative < 3e-3, relative
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_attention_kernels_match_performer_pytorch_given_the_same_features():
    """FAVOR+ feature maps and both attentions, function by function: bidirectional features are performer-pytorch's
    ``softmax_kernel`` exactly; our chunked causal prefix sums over its features equal its
    ``causal_linear_attention_noncuda`` (with its ``+1e-6`` on the normaliser set to 0)."""
    from performer_pytorch.performer_pytorch import (
        causal_linear_attention_noncuda,
        gaussian_orthogonal_random_matrix,
        softmax_kernel,
    )
    from performer_pytorch.performer_pytorch import linear_attention as reference_linear_attention

    from tf_family.attention.kernelized import (
        causal_linear_attention,
        favor_key_features,
        favor_query_features,
        linear_attention,
    )

    generator = torch.Generator().manual_seed(2)
    query, key, value = (torch.randn(3, HEADS, 29, WIDTH // HEADS, generator=generator) for _ in range(3))
    torch.manual_seed(3)
    projection = gaussian_orthogonal_random_matrix(FEATURES, WIDTH // HEADS)
    query_features = favor_query_features(query, projection)
    key_features = favor_key_features(key, projection)
    expected_query = softmax_kernel(query, projection_matrix=projection, is_query=True)
    expected_key = softmax_kernel(key, projection_matrix=projection, is_query=False)
    torch.testing.assert_close(query_features, expected_query, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(key_features, expected_key, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        linear_attention(query_features, key_features, value),
        reference_linear_attention(expected_query, expected_key, value),
        rtol=1e-5,
        atol=1e-5,
    )
    got, _ = causal_linear_attention(expected_query, expected_key, value, chunk_size=7)
    expected = causal_linear_attention_noncuda(expected_query, expected_key, value, eps=0.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_padded_batch_is_not_coupled_like_performer_pytorch_s():
    """Our bidirectional model: a row's encodings do not depend on another row of the batch, nor on its own padding
    (performer-pytorch zeroes padded values but keeps padded keys in the normaliser and the key stabiliser)."""
    reference = _reference(causal=False)
    ours = TffPerformerModel(_config(causal=False)).eval()
    _copy_weights(reference, ours)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 20:] = 0
    with torch.no_grad():
        alone = ours(input_ids=ids[:1, :20]).last_hidden_state
        batched = ours(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs_alone = reference(ids[:1, :20], return_encodings=True)
        theirs_batched = reference(ids, mask=mask.bool(), return_encodings=True)
    torch.testing.assert_close(batched[:1, :20], alone, rtol=1e-5, atol=1e-5)
    # performer-pytorch's padded row differs from the row alone: padding enters its normaliser
    assert float((theirs_batched[:1, :20] - theirs_alone).abs().max()) > 1e-3
