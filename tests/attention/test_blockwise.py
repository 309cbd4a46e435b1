"""Blockwise self-attention (BlockBERT): the gathered-block kernel agrees with its dense twin (values and gradients in
float64, causal and cyclic shifts, with and without ALiBi, lengths that are not multiples of the block); the masks are
the paper's block permutations (cyclic) and their causal partial shifts; a padded batch of the cyclic shift cycles each
row over its own blocks (kernel = twin, and padding changes no real output); bad fields are named."""

import pytest
import torch

from tf_family.attention.alibi import alibi_slopes
from tf_family.attention.blockwise import (
    BlockwisePattern,
    blockwise_attention,
    blockwise_attention_reference,
    build_blockwise_mask,
    key_blocks,
    num_blocks_of,
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


# a padded batch of the cyclic shift: rows of 13, 7, 3 and 1 real tokens (blocks of 4: n = 4, 2, 1, 1)
LENGTHS = torch.tensor([13, 7, 3, 1])


@pytest.mark.parametrize("shift", [0, 1, 2, 3])
def test_per_row_lengths_match_the_dense_twin_on_real_queries(shift):
    pattern = BlockwisePattern(4, shift, causal=False)
    generator = torch.Generator().manual_seed(shift)
    tensors = [torch.randn(4, H, 13, DH, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "qkv"]
    real = (torch.arange(13)[None, :] < LENGTHS[:, None])[:, None, :, None]  # (B, 1, T, 1)
    weights = torch.randn(4, H, 13, DH, generator=generator, dtype=torch.float64) * real  # padded outputs unused
    fast = blockwise_attention(*tensors, pattern, lengths=LENGTHS)
    reference = blockwise_attention_reference(*tensors, pattern, lengths=LENGTHS)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast * real, reference * real, rtol=1e-10, atol=1e-10)
    for got, expected in zip(
        torch.autograd.grad((fast * weights).sum(), tensors),
        torch.autograd.grad((reference * weights).sum(), tensors),
        strict=True,
    ):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shift", [1, 2])
def test_padding_changes_no_real_output(shift):
    """Each row equals the same real tokens alone (``n`` from the row's own length), whatever the padding holds."""
    pattern = BlockwisePattern(4, shift, causal=False)
    tensors = _inputs(13)
    garbage = [t.detach().clone() for t in tensors]
    for t, original in zip(garbage, tensors, strict=True):
        t[:, :, 7:] = 100.0  # padding of row 1 (7 real tokens): any values
        t[:, :, :7] = original[:, :, :7]
    lengths = torch.tensor([7, 7])
    padded = blockwise_attention(*garbage, pattern, lengths=lengths)
    alone = blockwise_attention(*(t[:, :, :7] for t in tensors), pattern)  # n = ceil(7 / 4) = 2
    torch.testing.assert_close(padded[:, :, :7], alone, rtol=1e-12, atol=1e-12)
    full_length = blockwise_attention(*tensors, pattern, lengths=torch.tensor([13, 13]))
    torch.testing.assert_close(full_length, blockwise_attention(*tensors, pattern), rtol=1e-12, atol=1e-12)


def test_mask_takes_a_block_count_per_row():
    pattern = BlockwisePattern(2, 1, causal=False)
    positions = torch.arange(6).expand(2, 6)
    num_blocks = num_blocks_of(torch.tensor([6, 3]), 2)
    assert num_blocks.tolist() == [3, 2]
    masks = build_blockwise_mask(pattern, positions, positions, num_blocks)  # (2, 6, 6)
    for row, blocks in enumerate((3, 2)):
        torch.testing.assert_close(masks[row], build_blockwise_mask(pattern, positions[0], positions[0], blocks))
    with pytest.raises(ValueError, match="num_blocks"):
        build_blockwise_mask(pattern, positions, positions, torch.tensor([3, 0]))
    with pytest.raises(TypeError, match="num_blocks"):
        build_blockwise_mask(pattern, positions, positions, torch.tensor([3.0, 2.0]))


def test_lengths_refuse_bad_values():
    tensors = _inputs(7)
    cyclic = BlockwisePattern(4, 1, causal=False)
    with pytest.raises(ValueError, match="causal=False"):
        blockwise_attention(*tensors, BlockwisePattern(4, 1), lengths=torch.tensor([7, 7]))
    with pytest.raises(NotImplementedError, match="slopes"):
        blockwise_attention(*tensors, cyclic, alibi_slopes(H).double(), lengths=torch.tensor([7, 7]))
    with pytest.raises(ValueError, match=r"lengths must be an integer tensor of shape \(2,\)"):
        blockwise_attention(*tensors, cyclic, lengths=torch.tensor([7]))
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 7\]"):
        blockwise_attention(*tensors, cyclic, lengths=torch.tensor([8, 0]))
