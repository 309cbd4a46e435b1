"""Parity with the ``linformer`` package 0.2.3 (MIT, lucidrains; PyPI ``linformer``): its ``Linformer`` stack with
weights copied into tf_family's Linformer gives the same encodings on unpadded inputs, at the full length ``n`` and
shorter, with and without its key-value sharing. Beyond it: padding is left out of the projection (the package mixes
it in), and too-long inputs are refused naming the config field."""

import pytest
import torch

from tf_family import TffLinformerConfig, TffLinformerModel

linformer = pytest.importorskip("linformer")

pytestmark = pytest.mark.parity

VOCAB, LENGTH, WIDTH, HEADS, LAYERS, PROJECTED = 64, 24, 16, 2, 2, 6


def _pair(share_kv: bool):
    torch.manual_seed(0)
    reference = linformer.LinformerLM(
        num_tokens=VOCAB, dim=WIDTH, seq_len=LENGTH, depth=LAYERS, k=PROJECTED, heads=HEADS, share_kv=share_kv
    ).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    config = TffLinformerConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * WIDTH,
        max_position_embeddings=LENGTH,
        projected_length=PROJECTED,
        projection_sharing="key_value" if share_kv else "headwise",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ours = TffLinformerModel(config).eval()
    theirs = reference.state_dict()
    mapping = {
        "embeddings.word_embeddings.weight": "token_emb.weight",
        "embeddings.position_embeddings.weight": "pos_emb.weight",
    }
    for layer in range(LAYERS):
        attention, feed_forward = f"linformer.net.layers.{layer}.0.", f"linformer.net.layers.{layer}.1."
        ours_prefix = f"layers.{layer}."
        mapping.update(
            {
                f"{ours_prefix}attention_norm.weight": f"{attention}norm.weight",
                f"{ours_prefix}attention_norm.bias": f"{attention}norm.bias",
                f"{ours_prefix}attention.query.weight": f"{attention}fn.to_q.weight",
                f"{ours_prefix}attention.key.weight": f"{attention}fn.to_k.weight",
                f"{ours_prefix}attention.out_proj.weight": f"{attention}fn.to_out.weight",
                f"{ours_prefix}attention.out_proj.bias": f"{attention}fn.to_out.bias",
                f"{ours_prefix}feed_forward_norm.weight": f"{feed_forward}norm.weight",
                f"{ours_prefix}feed_forward_norm.bias": f"{feed_forward}norm.bias",
                f"{ours_prefix}feed_forward.fc_in.weight": f"{feed_forward}fn.w1.weight",
                f"{ours_prefix}feed_forward.fc_in.bias": f"{feed_forward}fn.w1.bias",
                f"{ours_prefix}feed_forward.fc_out.weight": f"{feed_forward}fn.w2.weight",
                f"{ours_prefix}feed_forward.fc_out.bias": f"{feed_forward}fn.w2.bias",
            }
        )
        # the package shares values with keys (share_kv: no to_v, values are the keys)
        mapping[f"{ours_prefix}attention.value.weight"] = f"{attention}fn.to_{'k' if share_kv else 'v'}.weight"
    with torch.no_grad():
        for name, tensor in ours.state_dict().items():
            if name in mapping:
                source = theirs[mapping[name]]
                assert source.shape == tensor.shape, f"{name}: {tuple(source.shape)} vs {tuple(tensor.shape)}"
                tensor.copy_(source)
            elif name.endswith(("key_projection", "value_projection")):  # (n, k) there, (1, n, k) here
                layer = name.split(".")[1]
                which = "proj_k" if name.endswith("key_projection") else "proj_v"
                tensor.copy_(theirs[f"linformer.net.layers.{layer}.0.fn.{which}"][None])
            elif name.endswith(("query.bias", "key.bias", "value.bias", "token_type_embeddings.weight")):
                tensor.zero_()  # the package has no q/k/v biases and no token types
            else:
                raise AssertionError(f"{name} has no counterpart in the linformer package")
    return reference, ours


def _encode_reference(reference, ids):
    hidden = reference.token_emb(ids) + reference.pos_emb(torch.arange(ids.shape[1]))
    return reference.linformer(hidden)


@pytest.mark.parametrize("share_kv", [False, True])
@pytest.mark.parametrize("length", [LENGTH, 13])
def test_encodings_match_the_linformer_package(share_kv, length):
    reference, ours = _pair(share_kv)
    ids = torch.randint(0, VOCAB, (3, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(input_ids=ids).last_hidden_state, _encode_reference(reference, ids), rtol=1e-5, atol=1e-5
        )


def test_padding_is_left_out_of_the_projection_unlike_the_package():
    reference, ours = _pair(share_kv=False)
    ids = torch.randint(1, VOCAB, (1, 13), generator=torch.Generator().manual_seed(3))
    padded = torch.cat([ids, torch.zeros(1, 5, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 13), torch.zeros(1, 5)], dim=1).long()
    with torch.no_grad():
        alone = ours(input_ids=ids).last_hidden_state
        torch.testing.assert_close(
            ours(input_ids=padded, attention_mask=mask).last_hidden_state[:, :13], alone, rtol=1e-5, atol=1e-5
        )
        theirs = _encode_reference(reference, padded)[:, :13]  # the package has no mask: padding is mixed in
        theirs_alone = _encode_reference(reference, ids)
    assert float((theirs - theirs_alone).abs().max()) > 1e-3


def test_longer_inputs_are_refused_naming_the_field():
    _, ours = _pair(share_kv=False)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        ours(input_ids=torch.ones(1, LENGTH + 1, dtype=torch.long))
