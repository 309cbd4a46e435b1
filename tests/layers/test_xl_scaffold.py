"""The Transformer-XL family's scaffold (`tf_family.layers.xl_scaffold`): the masks its three models share."""

import pytest
import torch

from tf_family import create_model
from tf_family.attention import build_causal_memory_mask
from tf_family.layers.xl_scaffold import build_segment_masks


@pytest.fixture(scope="module")
def compressive():
    return create_model("compressive", "base", mem_len=4, cmem_len=3).eval()


def test_compressed_slots_are_visible_to_every_query_subject_to_their_mask(compressive):
    embeddings = torch.zeros(2, 3, compressive.config.d_model)  # (B, T, D)
    memory_mask = torch.tensor([[True, True, False, True], [True, True, True, True]])  # (B, M)
    compressed_mask = torch.tensor([[False, True, True], [True, True, True]])  # (B, C)
    masks = build_segment_masks(embeddings, None, memory_mask, compressed_mask, max_span=None)
    assert masks.allowed.shape == (2, 1, 3, 3 + 4 + 3)
    assert torch.equal(masks.allowed[:, 0, :, :3], compressed_mask[:, None, :].expand(2, 3, 3))
    causal = build_causal_memory_mask(3, 4, None, "cpu")  # (T, M + T)
    expected = causal[None] & torch.cat([memory_mask, torch.ones(2, 3, dtype=torch.bool)], 1)[:, None, :]
    assert torch.equal(masks.allowed[:, 0, :, 3:], expected)
    # without a compressed memory the masks are Transformer-XL's
    plain = build_segment_masks(embeddings, None, memory_mask, max_span=None)
    assert torch.equal(plain.allowed, masks.allowed[..., 3:])
    assert torch.equal(plain.segment, torch.ones(2, 3, dtype=torch.bool))


def test_a_4d_mask_of_the_wrong_width_names_the_layout(compressive):
    embeddings = torch.zeros(1, 2, compressive.config.d_model)
    wrong = torch.ones(1, 1, 2, 7, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\(B, 1, 2, 8\) \(compressed memory 3 \+ memory 3 \+ segment 2\)"):
        build_segment_masks(
            embeddings, wrong, torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool), max_span=None
        )
