"""The Image Transformer's local 1-D and 2-D attention: the gathered-block kernel agrees with its dense twin (values
and gradients, lengths that are not multiples of the block); the 2-D mask follows block-raster order; the memory is
what the paper draws."""

import pytest
import torch

from tf_family.attention.image_local import (
    Local1DPattern,
    Local2DPattern,
    block_raster_order,
    build_image_local_mask,
    image_local_attention,
    image_local_attention_reference,
)

PATTERNS = [
    Local1DPattern(block_length=4, memory_length=4),
    Local1DPattern(block_length=3, memory_length=5),
    Local2DPattern(image_width=8, block_height=2, block_width=4, memory_height=2, memory_width=2),
    Local2DPattern(image_width=6, block_height=3, block_width=2, memory_height=1, memory_width=1),
]


@pytest.mark.parametrize("length", [1, 10, 24, 29])
@pytest.mark.parametrize("pattern", PATTERNS, ids=repr)
def test_kernel_matches_dense_twin(pattern, length):
    generator = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(2, 3, length, 8, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "qkv"
    ]
    weights = torch.randn(2, 3, length, 8, dtype=torch.float64)
    fast = image_local_attention(*tensors, pattern)
    reference = image_local_attention_reference(*tensors, pattern)
    torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)
    for got, expected in zip(
        torch.autograd.grad((fast * weights).sum(), tensors),
        torch.autograd.grad((reference * weights).sum(), tensors),
        strict=True,
    ):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(image_local_attention(*tensors, pattern), reference, rtol=1e-6, atol=1e-6)


def test_1d_memory_is_the_block_and_the_positions_before_it():
    positions = torch.arange(12)
    mask = build_image_local_mask(Local1DPattern(block_length=4, memory_length=3), positions, positions)
    assert mask[9].nonzero().flatten().tolist() == [5, 6, 7, 8, 9]  # block 8..11 from position 8, memory 5..7
    assert mask[11].nonzero().flatten().tolist() == [5, 6, 7, 8, 9, 10, 11]


def test_2d_order_and_mask_follow_block_raster_order():
    pattern = Local2DPattern(image_width=4, block_height=2, block_width=2, memory_height=1, memory_width=1)
    # a 4x4 image: raster index of each sequence position (blocks of 2x2 in raster order)
    assert block_raster_order(pattern, 4).tolist() == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    positions = torch.arange(16)
    mask = build_image_local_mask(pattern, positions, positions)
    order = block_raster_order(pattern, 4)
    # the query at sequence position 13 is pixel 11 (row 2, column 3), in the block of rows 2-3, columns 2-3;
    # its memory is rows 1-3, columns 1-3 (one column left, the image's edge right), generated before it: the whole
    # block to its left (rows 2-3, columns 0-1: pixel 13, row 3, comes before it) but not the rest of its own block
    seen = sorted(order[mask[13]].tolist())
    assert seen == [5, 6, 7, 9, 10, 11, 13]
    assert mask.diagonal().all()


def test_patterns_refuse_bad_fields():
    with pytest.raises(ValueError, match="block_length"):
        Local1DPattern(0, 2)
    with pytest.raises(ValueError, match="image_width"):
        Local2DPattern(image_width=6, block_height=2, block_width=4, memory_height=1, memory_width=1)
    with pytest.raises(ValueError, match="height"):
        block_raster_order(Local2DPattern(4, 2, 2, 1, 1), 3)


@pytest.mark.parametrize(
    "pattern",
    [
        Local2DPattern(image_width=16, block_height=2, block_width=2, memory_height=2, memory_width=1),
        Local2DPattern(image_width=8, block_height=2, block_width=4, memory_height=2, memory_width=2),
        Local2DPattern(image_width=6, block_height=3, block_width=2, memory_height=1, memory_width=1),
    ],
    ids=repr,
)
def test_2d_mask_equals_the_papers_rule_pixel_by_pixel(pattern):
    """Parmar et al. 2018, section 3.2: query blocks generated in raster order of blocks, raster order inside a block;
    a query reads the pixels of its memory block (its query block extended ``memory_height`` rows up and
    ``memory_width`` columns left and right) that were generated before it, or itself. Written out here by
    enumerating the blocks, independently of `Local2DPattern.pixel` / `position`."""
    height = 2 * pattern.block_height * 2
    generation = {}  # pixel (row, column) -> its step in the generation order
    for top in range(0, height, pattern.block_height):
        for left in range(0, pattern.image_width, pattern.block_width):
            for row in range(top, top + pattern.block_height):
                for column in range(left, left + pattern.block_width):
                    generation[row, column] = len(generation)
    pixels = sorted(generation, key=generation.get)  # sequence position -> pixel
    assert [row * pattern.image_width + column for row, column in pixels] == block_raster_order(
        pattern, height
    ).tolist()
    expected = torch.zeros(len(pixels), len(pixels), dtype=torch.bool)
    for i, (row, column) in enumerate(pixels):
        top = row - row % pattern.block_height
        left = column - column % pattern.block_width
        for j, (key_row, key_column) in enumerate(pixels):
            inside = top - pattern.memory_height <= key_row < top + pattern.block_height and (
                left - pattern.memory_width <= key_column < left + pattern.block_width + pattern.memory_width
            )
            expected[i, j] = inside and generation[key_row, key_column] <= generation[row, column]
    positions = torch.arange(len(pixels))
    assert torch.equal(build_image_local_mask(pattern, positions, positions), expected)
