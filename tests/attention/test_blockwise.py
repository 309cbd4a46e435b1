"""Blockwise self-attention (BlockBERT): the gathered-block kernel agrees with its dense twin (values and gradients in
float64, causal and cyclic shifts, with and without ALiBi, lengths that are not multiples of the block); the masks are
the paper's block permutations (cyclic) and their causal partial shifts; bad fields are named."""

import pytest
import torch

from tf_family.attention.alibi import alibi_slopes
from tf_family.attention.blockwise import (
    BlockwisePattern,
    blockwise_attention,
    blockwise_attention_reference,
    build_blockwise_mask,
    key_blocks,
)

B, H, DH = 2, 3, 8
PATTERNS = [BlockwisePattern(4, shift, causal) for causal in (True, False) for shift in (0, 1, 2)]


def _inputs(length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "qkv"]


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize("length", [1, 7, 12, 13])
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: f"l{p.block_length}-k{p.shift}-causal{p.causal}")
def test_kernel_matches_dense_twin(pattern, length, alibi):
    tensors = _inputs(length)
    slopes = alibi_slopes(H).double() if alibi else None
    weights = torch.randn(B, H, length, DH, dtype=torch.float64)
    fast = blockwise_attention(*tensors, pattern, slopes)
    reference = blockwise_attention_reference(*tensors, pattern, slopes)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)
    for got, expected in zip(
        torch.autograd.grad((fast * weights).sum(), tensors),
        torch.autograd.grad((reference * weights).sum(), tensors),
        strict=True,
    ):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    with torch.no_grad():  # the no-gradient route (SDPA / the native kernel)
        torch.testing.assert_close(blockwise_attention(*tensors, pattern, slopes), reference, rtol=1e-6, atol=1e-6)


def _block_map(pattern, num_blocks):
    """Which key blocks each query block sees, from the dense mask: {query block: sorted key blocks}."""
    positions = torch.arange(num_blocks * pattern.block_length)
    mask = build_blockwise_mask(pattern, positions, positions, num_blocks)
    blocks = positions // pattern.block_length
    return {b: sorted(set(blocks[mask[positions[blocks == b]].any(0)].tolist())) for b in range(num_blocks)}


def test_cyclic_shifts_are_the_papers_permutations():
    """n = 3 blocks: shift k maps block b to (b + k) mod 3, every one a permutation, and they differ."""
    maps = [_block_map(BlockwisePattern(2, shift, causal=False), 3) for shift in range(3)]
    assert maps == [{0: [0], 1: [1], 2: [2]}, {0: [1], 1: [2], 2: [0]}, {0: [2], 1: [0], 2: [1]}]
    for shift in range(3):
        source, _ = key_blocks(BlockwisePattern(2, shift, causal=False), 3)
        assert sorted(source.tolist()) == [0, 1, 2]  # a bijection of the blocks


def test_causal_shifts_look_back_and_never_ahead():
    positions = torch.arange(12)
    for shift in range(4):
        pattern = BlockwisePattern(3, shift)
        mask = build_blockwise_mask(pattern, positions, positions)
        assert not mask.triu(1).any()  # no key after its query
        assert mask.any(-1).all()  # no empty row
    assert _block_map(BlockwisePattern(3, 1), 4) == {0: [0], 1: [0], 2: [1], 3: [2]}
    mask = build_blockwise_mask(BlockwisePattern(3, 1), positions, positions)
    assert mask[1].nonzero().flatten().tolist() == [1]  # block 0 has no block back: the query itself
    assert mask[7].nonzero().flatten().tolist() == [3, 4, 5]  # block 2 reads all of block 1
    own = build_blockwise_mask(BlockwisePattern(3, 0), positions, positions)
    assert own[7].nonzero().flatten().tolist() == [6, 7]  # shift 0: the own block up to the query


def test_patterns_refuse_bad_fields():
    with pytest.raises(ValueError, match="block_length"):
        BlockwisePattern(0, 1)
    with pytest.raises(ValueError, match="shift"):
        BlockwisePattern(4, -1)
    with pytest.raises(TypeError, match="causal"):
        BlockwisePattern(4, 1, causal="yes")
    positions = torch.arange(4)
    with pytest.raises(ValueError, match="num_blocks"):
        build_blockwise_mask(BlockwisePattern(2, 1, causal=False), positions, positions)
