"""Rotary positions (`tf_family.attention.rotary`) against transformers' Llama rotary, and their relative property."""

import torch

from tf_family.attention.rotary import apply_rotary, rotary_cos_sin


def test_rotary_matches_transformers_llama_on_copied_weights():
    """Pairing convention: Llama's ``rotate_half`` (dimension ``k`` pairs with ``k + Dh / 2``), not GPT-J's
    interleaved pairs. The same projection weights give the same rotated queries and keys and scores."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    heads, head_dim, width = 2, 8, 16
    config = LlamaConfig(hidden_size=width, num_attention_heads=heads, head_dim=head_dim, rope_theta=500.0)
    torch.manual_seed(0)
    projection = torch.nn.Linear(width, 2 * heads * head_dim, bias=False)
    hidden = torch.randn(2, 6, width)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])  # the second row left-padded
    query, key = projection(hidden).view(2, 6, 2, heads, head_dim).permute(2, 0, 3, 1, 4)  # (B, H, T, Dh) each
    cos, sin = LlamaRotaryEmbedding(config)(hidden, positions)
    expected_query, expected_key = apply_rotary_pos_emb(query, key, cos, sin)
    our_cos, our_sin = rotary_cos_sin(positions, head_dim, 500.0, torch.float32)
    torch.testing.assert_close(apply_rotary(query, our_cos, our_sin), expected_query)
    torch.testing.assert_close(apply_rotary(key, our_cos, our_sin), expected_key)


def test_rotary_scores_depend_only_on_the_offset():
    query, key = torch.randn(2, 1, 1, 8, dtype=torch.float64).unbind(0)
    scores = []
    for shift in (0, 5, 11):
        positions = torch.tensor([[3 + shift, 1 + shift]])
        cos, sin = rotary_cos_sin(positions, 8, 10000.0, torch.float64)
        rotated_query = apply_rotary(query.expand(1, 1, 2, 8), cos, sin)[:, :, :1]
        rotated_key = apply_rotary(key.expand(1, 1, 2, 8), cos, sin)[:, :, 1:]
        scores.append((rotated_query * rotated_key).sum())
    torch.testing.assert_close(scores[0], scores[1])
    torch.testing.assert_close(scores[0], scores[2])
