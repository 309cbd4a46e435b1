"""Linformer: each projection-sharing option of the paper (section 4) holds the projections it names, and under each a
row padded on the right (rows of E / F sliced) or on the left (rows gathered by position) inside a batch equals the row
alone, with the explicit twin (eager) and the fused softmax (sdpa) alike; the gradients reach every projection."""

import pytest
import torch

from tf_family import TffLinformerConfig, TffLinformerModel

# sharing -> projection tensors: (in each layer's attention, on the model)
SHARING = {"none": (2, 0), "headwise": (2, 0), "key_value": (1, 0), "layerwise": (0, 1)}


def _model(sharing: str, implementation: str) -> TffLinformerModel:
    torch.manual_seed(0)
    config = TffLinformerConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=12, projected_length=5, projection_sharing=sharing, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = TffLinformerModel(config).eval()
    model.set_attn_implementation(implementation)
    return model


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("sharing", list(SHARING))
def test_sharing_options_and_padding_on_either_side(sharing, implementation):
    model = _model(sharing, implementation)
    per_layer, on_model = SHARING[sharing]
    attention = model.layers[0].attention
    assert sum(hasattr(attention, n) for n in ("key_projection", "value_projection")) == per_layer
    assert (model.shared_projection is not None) == bool(on_model)
    heads = 2 if sharing == "none" else 1
    for projection in (*attention.projections(model.shared_projection),):
        assert projection.shape == (heads, 12, 5)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (1, 7), generator=generator)
    with torch.no_grad():
        alone = model(ids).last_hidden_state[0]  # (7, D)
        filler = torch.randint(1, 64, (1, 3), generator=generator)
        for side in ("right", "left"):
            row = torch.cat([ids, filler] if side == "right" else [filler, ids], dim=1)
            mask = torch.ones(1, 10, dtype=torch.long)
            if side == "right":
                mask[:, 7:] = 0
            else:
                mask[:, :3] = 0
            batch = torch.cat([row, torch.randint(1, 64, (1, 10), generator=generator)])
            out = model(batch, attention_mask=torch.cat([mask, torch.ones_like(mask)])).last_hidden_state[0]
            real = out[:7] if side == "right" else out[3:]
            torch.testing.assert_close(real, alone, rtol=1e-5, atol=1e-5)
    model.train()
    model(torch.randint(1, 64, (2, 9), generator=generator)).last_hidden_state.square().sum().backward()
    for name, parameter in model.named_parameters():
        if "projection" in name:
            assert parameter.grad is not None and bool(parameter.grad[:, :9].abs().sum() > 0), name
            assert bool((parameter.grad[:, 9:] == 0).all()), f"{name}: rows past the input got a gradient"
