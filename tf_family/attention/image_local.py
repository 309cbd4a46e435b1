"""The Image Transformer's local self-attention (Parmar, Vaswani, Uszkoreit, Kaiser, Shazeer, Ku & Tran 2018, arXiv:
1802.05751, section 3.2), causal, as pure functions: a mask function with a dense twin and a gathered-block kernel.

Queries are grouped into blocks; each block attends to its *memory block*, the positions around it, and only to
those generated before the query (or the query itself):

- **1-D** (`Local1DPattern`): the sequence is the image in raster order; query blocks of ``block_length``
  consecutive positions; the memory is the block itself and the ``memory_length`` positions before it.
- **2-D** (`Local2DPattern`): the image (``image_width`` positions per row; channels flattened into the row) is cut
  into rectangular query blocks of ``block_height x block_width``; the sequence is the image in *block-raster order*
  (blocks in raster order, raster order inside a block: the order the paper generates in, `block_raster_order`); the
  memory of a block extends it by ``memory_height`` rows above and ``memory_width`` columns on each side. Causal in
  that generation order: a key is seen if it is in the memory and was generated before the query.

`build_image_local_mask` evaluates a pattern on sequence positions (the dense twin's mask, and a decoding step's row
over the cache). `image_local_attention` gathers each query block's memory positions (a fixed count ``M`` per block,
from `memory_positions`) and attends to them: ``O(T M)`` time and memory, never ``T x T``;
`image_local_attention_reference` is plain attention under the dense mask. Tensors are ``(B, H, T, Dh)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backend import attend
from .dense import dense_attention


def _check_positive(name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}.")


@dataclass(frozen=True)
class Local1DPattern:
    """1-D local attention: query blocks of ``block_length`` positions, memory = the block and the
    ``memory_length`` positions before it."""

    block_length: int
    memory_length: int

    def __post_init__(self):
        _check_positive("block_length", self.block_length)
        _check_positive("memory_length", self.memory_length, minimum=0)

    @property
    def queries_per_block(self) -> int:
        return self.block_length


@dataclass(frozen=True)
class Local2DPattern:
    """2-D local attention over an image ``image_width`` positions wide, in block-raster order: query blocks of
    ``block_height x block_width``, memory extended by ``memory_height`` rows above and ``memory_width`` columns on
    each side."""

    image_width: int
    block_height: int
    block_width: int
    memory_height: int
    memory_width: int

    def __post_init__(self):
        for name in ("image_width", "block_height", "block_width"):
            _check_positive(name, getattr(self, name))
        for name in ("memory_height", "memory_width"):
            _check_positive(name, getattr(self, name), minimum=0)
        if self.image_width % self.block_width:
            raise ValueError(
                f"image_width={self.image_width} must be a multiple of block_width={self.block_width} (query blocks "
                "tile each row)."
            )

    @property
    def queries_per_block(self) -> int:
        return self.block_height * self.block_width

    def pixel(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of sequence positions (block-raster order)."""
        blocks_per_row = self.image_width // self.block_width
        block, inside = positions // self.queries_per_block, positions % self.queries_per_block
        row = (block // blocks_per_row) * self.block_height + inside // self.block_width
        column = (block % blocks_per_row) * self.block_width + inside % self.block_width
        return row, column

    def position(self, row: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
        """Sequence position (block-raster order) of pixels ``(row, column)``."""
        blocks_per_row = self.image_width // self.block_width
        block = (row // self.block_height) * blocks_per_row + column // self.block_width
        inside = (row % self.block_height) * self.block_width + column % self.block_width
        return block * self.queries_per_block + inside


ImageLocalPattern = Local1DPattern | Local2DPattern


def block_raster_order(pattern: Local2DPattern, height: int) -> torch.Tensor:
    """``(height * image_width,)``: for each sequence position (block-raster order), the raster index of its pixel.
    ``images.flatten(1)[:, order]`` puts raster-order images into the sequence order of ``pattern``; ``height`` must
    be a multiple of ``block_height``."""
    if height % pattern.block_height:
        raise ValueError(f"height={height} must be a multiple of block_height={pattern.block_height}.")
    row, column = pattern.pixel(torch.arange(height * pattern.image_width))
    return row * pattern.image_width + column


def build_image_local_mask(
    pattern: ImageLocalPattern, query_positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """Where a query may attend: bool ``(..., T, S)`` from sequence positions ``(..., T)`` and ``(..., S)``; causal
    (``j <= i``) included."""
    query = query_positions[..., :, None]  # (..., T, 1)
    key = key_positions[..., None, :]  # (..., 1, S)
    causal = key <= query
    if isinstance(pattern, Local1DPattern):
        block_start = (query // pattern.block_length) * pattern.block_length
        return causal & (key >= block_start - pattern.memory_length)
    query_row, query_column = pattern.pixel(query)
    key_row, key_column = pattern.pixel(key)
    top = (query_row // pattern.block_height) * pattern.block_height
    left = (query_column // pattern.block_width) * pattern.block_width
    rows = (key_row >= top - pattern.memory_height) & (key_row < top + pattern.block_height)
    columns = (key_column >= left - pattern.memory_width) & (
        key_column < left + pattern.block_width + pattern.memory_width
    )
    return causal & rows & columns


def memory_positions(pattern: ImageLocalPattern, num_blocks: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query block's memory: sequence positions ``(N, M)`` and whether each slot exists ``(N, M)`` (inside the
    image, not before the sequence start); slots that do not exist hold position 0."""
    blocks = torch.arange(num_blocks, device=device)[:, None]  # (N, 1)
    if isinstance(pattern, Local1DPattern):
        offsets = torch.arange(-pattern.memory_length, pattern.block_length, device=device)[None]  # (1, M)
        positions = blocks * pattern.block_length + offsets
        valid = positions >= 0
        return positions.clamp(min=0), valid
    first = blocks * pattern.queries_per_block
    top_row, left_column = (t[:, :, None] for t in pattern.pixel(first))  # (N, 1, 1): the block's top-left pixel
    rows = torch.arange(-pattern.memory_height, pattern.block_height, device=device)
    columns = torch.arange(-pattern.memory_width, pattern.block_width + pattern.memory_width, device=device)
    row = (top_row + rows[None, :, None]).expand(-1, -1, columns.shape[0]).flatten(1)  # (N, M)
    column = (left_column + columns[None, None, :]).expand(-1, rows.shape[0], -1).flatten(1)
    valid = (row >= 0) & (column >= 0) & (column < pattern.image_width)
    positions = pattern.position(row.clamp(min=0), column.clamp(0, pattern.image_width - 1))
    return torch.where(valid, positions, 0), valid


def image_local_attention_reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, pattern: ImageLocalPattern
) -> torch.Tensor:
    """Dense twin of `image_local_attention`: plain attention under `build_image_local_mask` over positions
    ``0 .. T - 1``. ``(B, H, T, Dh)``."""
    positions = torch.arange(query.shape[2], device=query.device)
    return dense_attention(query, key, value, build_image_local_mask(pattern, positions, positions))[0]


def image_local_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: ImageLocalPattern,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> torch.Tensor:
    """Causal local attention under ``pattern`` over positions ``0 .. T - 1``: each query block against its gathered
    memory block (``O(T M)``; module docstring).

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        pattern: a `Local1DPattern` or `Local2DPattern`.
        dropout_p: dropout on the probabilities (0 in eval).
        implementation: ``config._attn_implementation``, for `backend.attend`.

    Returns:
        ``(B, H, T, Dh)``, equal to `image_local_attention_reference` up to float rounding.
    """
    batch, heads, length, head_dim = query.shape
    size = pattern.queries_per_block
    num_blocks = -(-length // size)
    padded = num_blocks * size
    if padded != length:
        query, key, value = (F.pad(t, (0, 0, 0, padded - length)) for t in (query, key, value))
    slots, exists = memory_positions(pattern, num_blocks, query.device)  # (N, M)
    query_positions = torch.arange(padded, device=query.device).view(num_blocks, size)  # (N, Q)
    allowed = exists[:, None, :] & (slots[:, None, :] <= query_positions[:, :, None])  # (N, Q, M)
    allowed = allowed & (slots[:, None, :] < padded)
    memory = slots.clamp(max=padded - 1).flatten()  # (N * M,)
    memory_keys, memory_values = (
        t.index_select(2, memory).view(batch, heads * num_blocks, -1, head_dim) for t in (key, value)
    )  # (B, H * N, M, Dh)
    blocks = query.reshape(batch, heads * num_blocks, size, head_dim)  # (B, H * N, Q, Dh)
    allowed = allowed[None].expand(heads, -1, -1, -1).reshape(1, heads * num_blocks, size, -1)
    out, _ = attend(blocks, memory_keys, memory_values, allowed, dropout_p=dropout_p, implementation=implementation)
    return out.view(batch, heads, padded, head_dim)[:, :, :length]


__all__ = [
    "ImageLocalPattern",
    "Local1DPattern",
    "Local2DPattern",
    "block_raster_order",
    "build_image_local_mask",
    "image_local_attention",
    "image_local_attention_reference",
    "memory_positions",
]
