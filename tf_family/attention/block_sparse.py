"""BigBird block-sparse attention (Zaheer et al. 2020, arXiv:2007.14062, section 2 and appendix D, "ITC").

The sequence is cut into ``N`` blocks of ``block_size`` tokens. The first and the last block are global: they attend
to every key and every query attends to them. Every other query block ``q`` attends to the blocks of its sliding
window ``q - w .. q + w`` (``w = window_blocks``; 1 gives the paper's 3 blocks), to the two global blocks, and to
``R`` random blocks chosen per head and per query block.

Random blocks are data, not hidden state: `random_block_indices` draws them as a hash of a seed the caller gives,
on the device, so a forward pass never touches the global RNG and the same seed gives the same pattern everywhere. A random block may
repeat a block the query already sees (transformers' BigBird, in eval mode, points every random slot at block 0);
a repeated key block then counts as many times as it appears in the softmax, exactly as in that implementation.

The fast path (`block_sparse_attention`) gathers each query block's key blocks and attends to them through
`backend.attend` with the caller's implementation (for ``"sdpa"``, PyTorch's scaled-dot-product attention, or on
CPU under a gradient or dropout tf_family's native kernel or `masked_attention`; for ``"eager"``, the dense twin), so time and memory grow linearly with the length; the dense twin
(`block_sparse_attention_reference`) applies the block multiplicities of `build_block_sparse_counts` to full scores.
Tensors are ``(B, H, T, Dh)``; ``T`` need not be a multiple of ``block_size`` (the tail block is padded and masked).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import FLEX, attend
from .dense import dense_attention
from .flex import BlockMaskCache, flex_block_sparse_attention, flex_or_sdpa

# CPU score buffers are kept under this size: glibc hands larger fresh allocations out as new pages (mmap), and
# faulting them in cost more than the products that fill them (docs/benchmarks.md, "Measurements behind choices in
# the code").
_SLAB_BYTES = 8 * 2**20


def _window_blocks_valid(num_blocks: int, window_blocks: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-block table of the sliding window for the middle query blocks: ``(N-2, 2w+1)`` ids and validity (a window
    slot is dropped when it falls outside the sequence or onto a global block, which every query sees anyway)."""
    query_blocks = torch.arange(1, num_blocks - 1, device=device)  # (N-2,)
    offsets = torch.arange(-window_blocks, window_blocks + 1, device=device)  # (2w+1,)
    blocks = query_blocks[:, None] + offsets[None, :]  # (N-2, 2w+1)
    valid = (blocks >= 1) & (blocks <= num_blocks - 2)
    return blocks.clamp(0, num_blocks - 1), valid


_MASK31 = 2**31 - 1


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer hash of an int64 tensor (xor-shift-multiply rounds; every product stays below 2**62)."""
    x = x & _MASK31
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK31
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK31
    return (x >> 16) ^ x


def random_block_indices(
    num_blocks: int,
    num_heads: int,
    num_random_blocks: int,
    window_blocks: int,
    seed: int,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Draw the random key blocks of every head and query block: ``(H, N, R)`` on ``device``.

    Each middle query block gets ``R`` distinct blocks, uniformly among those outside its window and the two global
    blocks; rows 0 and ``N - 1`` (global queries) hold zeros and are not used. The draw is a hash of ``(seed, head,
    query block, key block)`` computed on ``device`` (no generator, no copy from the CPU, nothing read back): the
    same seed gives the same blocks on every device and inside a `torch.compile` graph (`layer_seed` gives each
    layer its own seed).

    Raises:
        ValueError: when a query block has fewer than ``R`` blocks to choose from (the input is too short).
    """
    if num_random_blocks == 0 or num_blocks < 3:
        return torch.zeros(num_heads, num_blocks, num_random_blocks, dtype=torch.long, device=device)
    fewest = (num_blocks - 2) - min(2 * window_blocks + 1, num_blocks - 2)  # keys outside a middle block's window
    if fewest < num_random_blocks:
        raise ValueError(
            f"num_random_blocks={num_random_blocks} needs at least that many blocks outside every window, but an input "
            f"of {num_blocks} blocks leaves {fewest}; use block-sparse attention only for inputs longer than "
            f"{(2 * window_blocks + 3 + 2 * num_random_blocks)} blocks."
        )
    query = torch.arange(num_blocks, device=device)[:, None]
    key = torch.arange(num_blocks, device=device)[None, :]
    allowed = ((query - key).abs() > window_blocks) & (key > 0) & (key < num_blocks - 1)  # (N, N)
    heads = torch.arange(num_heads, device=device)[:, None, None]
    scores = _mix(_mix(_mix(heads + seed % _MASK31) ^ query[None]) ^ key[None])  # (H, N, N), uniform 31-bit
    scores = scores.masked_fill(~allowed, -1)
    chosen = scores.topk(num_random_blocks, dim=-1).indices  # (H, N, R), a uniform R-subset of the allowed blocks
    chosen[:, 0] = 0
    chosen[:, -1] = 0
    return chosen


def build_block_sparse_counts(
    num_blocks: int, random_blocks: torch.Tensor | None, window_blocks: int = 1, num_heads: int = 1
) -> torch.Tensor:
    """How many times each query block attends to each key block: ``(H, N, N)`` integer counts.

    Global query blocks (first, last) see every block once; a middle block sees its window and the global blocks
    once, plus one more time per random slot pointing at a block.
    """
    device = random_blocks.device if random_blocks is not None else None
    heads = random_blocks.shape[0] if random_blocks is not None else num_heads
    counts = torch.zeros(heads, num_blocks, num_blocks, dtype=torch.long, device=device)
    counts[:, 0] = 1
    counts[:, -1] = 1
    if num_blocks > 2:
        blocks, valid = _window_blocks_valid(num_blocks, window_blocks, device)
        middle = torch.zeros(num_blocks - 2, num_blocks, dtype=torch.long, device=device)
        middle.scatter_add_(1, blocks, valid.long())
        middle[:, 0] += 1
        middle[:, -1] += 1
        counts[:, 1:-1] = middle
        if random_blocks is not None and random_blocks.shape[-1]:
            counts[:, 1:-1].scatter_add_(-1, random_blocks[:, 1:-1], torch.ones_like(random_blocks[:, 1:-1]))
    return counts


def _padded(query, key, value, key_padding_mask, block_size):
    batch, _, length, _ = query.shape
    num_blocks = -(-length // block_size)
    tail = num_blocks * block_size - length
    valid = (
        torch.ones(batch, length, dtype=torch.bool, device=query.device)
        if key_padding_mask is None
        else key_padding_mask.to(torch.bool)
    )
    if key_padding_mask is not None and key_padding_mask.shape != (batch, length):
        raise ValueError(f"key_padding_mask must have shape {(batch, length)}, got {tuple(key_padding_mask.shape)}.")
    if tail:
        query, key, value = (F.pad(t, (0, 0, 0, tail)) for t in (query, key, value))
        valid = F.pad(valid, (0, tail), value=False)
    # a row without any real token would give empty softmax rows; let it see everything instead (finite garbage)
    valid = valid | ~valid.any(dim=1, keepdim=True)
    return query, key, value, valid, num_blocks, tail


def block_sparse_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_size: int,
    random_blocks: torch.Tensor | None = None,
    window_blocks: int = 1,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense twin of `block_sparse_attention`: full scores plus ``log(count)`` of each key block's multiplicity."""
    length = query.shape[2]
    query, key, value, valid, num_blocks, _ = _padded(query, key, value, key_padding_mask, block_size)
    counts = build_block_sparse_counts(num_blocks, random_blocks, window_blocks, query.shape[1])  # (H, N, N)
    counts = counts.repeat_interleave(block_size, 1).repeat_interleave(block_size, 2)  # (H, T', T')
    allowed = (counts > 0)[None] & valid[:, None, None, :]  # (B, H, T', T')
    bias = counts.clamp(min=1).to(torch.promote_types(query.dtype, torch.float32)).log()[None]
    return dense_attention(query, key, value, allowed, key_bias=bias)[0][:, :, :length]


def block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_size: int,
    random_blocks: torch.Tensor | None = None,
    window_blocks: int = 1,
    key_padding_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
    block_masks: BlockMaskCache | None = None,
    plan_key: tuple = (),
) -> torch.Tensor:
    """BigBird attention in time and memory linear in ``T``.

    Eleven parameters, positional in the order of the dense twin (`block_sparse_attention_reference`, whose first
    seven they are) and of transformers' BigBird: the three tensors, the pattern (block size, random blocks, window),
    the padding, then dropout and the implementation, and the FlexAttention route's cache and the key of the random
    plan in it (BigBird's model passes the last four by keyword). Grouping the pattern into an object would change a
    public signature the tests and the FlexAttention route share, for no new check.

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        block_size: tokens per block.
        random_blocks: ``(H, N, R)`` key blocks per head and query block (`random_block_indices`), or ``None``.
        window_blocks: one-sided window in blocks.
        key_padding_mask: ``(B, T)`` bool/0-1, True at real tokens.
        dropout_p: dropout on the attention probabilities.
        implementation: ``"sdpa"``, ``"tff_native"`` or ``"eager"``, how each slab of query blocks attends
            (`backend.attend`); ``"flex_attention"``: the whole pattern in one FlexAttention call
            (`flex.flex_block_sparse_attention`; under dropout, the ``"sdpa"`` path: `flex.flex_or_sdpa`).
        block_masks, plan_key: the model's `flex.BlockMaskCache` and what identifies ``random_blocks`` in it (layer,
            seed, mode): ``"flex_attention"`` keeps its block mask there (``None``: built for this call).

    Returns:
        ``(B, H, T, Dh)``, equal to `block_sparse_attention_reference` up to float rounding.
    """
    batch, heads, length, head_dim = query.shape
    query, key, value, valid, num_blocks, _ = _padded(query, key, value, key_padding_mask, block_size)
    padded_length = num_blocks * block_size
    if random_blocks is not None and random_blocks.shape[:2] != (heads, num_blocks):
        raise ValueError(
            f"random_blocks must have shape ({heads}, {num_blocks}, R) for {heads} heads and {num_blocks} blocks, got "
            f"{tuple(random_blocks.shape)}."
        )
    implementation = flex_or_sdpa(implementation, dropout_p)
    if implementation == FLEX and num_blocks > 2:  # the whole pattern in one FlexAttention call

        def counts():  # (H, N, N), built when the cache does not hold the block mask yet
            blocks = None if random_blocks is None else random_blocks.to(query.device)
            return build_block_sparse_counts(num_blocks, blocks, window_blocks, heads).to(query.device)

        out = flex_block_sparse_attention(query, key, value, block_size, counts, valid, block_masks, plan_key)
        return out[:, :, :length]
    if num_blocks <= 2:  # every block is global
        out = attend(query, key, value, valid[:, None, None, :], None, dropout_p, implementation)[0]
        return out[:, :, :length]

    # Without a padding mask and with whole blocks, every key a global row or an interior middle block gathers is
    # allowed: those calls carry no mask, so PyTorch may choose its flash kernel for them. Decided from the
    # arguments and shapes alone (a look at the values of a mask would be a host sync and a graph break).
    unpadded = key_padding_mask is None and padded_length == length

    # global query blocks: the first and the last, against every key
    global_rows = torch.cat([query[:, :, :block_size], query[:, :, -block_size:]], dim=2)  # (B, H, 2b, Dh)
    global_allowed = None if unpadded else valid[:, None, None, :]
    global_out = attend(global_rows, key, value, global_allowed, None, dropout_p, implementation)[0]  # (B, H, 2b, Dh)

    # middle query blocks: window blocks + the two global blocks + random blocks, gathered per head
    device = query.device
    window, window_valid = _window_blocks_valid(num_blocks, window_blocks, device)  # (N-2, 2w+1)
    middle = num_blocks - 2
    globals_ = (torch.arange(2, device=device) * (num_blocks - 1)).expand(middle, 2)  # blocks 0 and N - 1
    table = torch.cat([globals_, window], dim=1)[None].expand(heads, -1, -1)  # (H, N-2, 2w+3)
    slot_valid = torch.cat([torch.ones(middle, 2, dtype=torch.bool, device=device), window_valid], 1)
    slot_valid = slot_valid[None].expand(heads, -1, -1)
    if random_blocks is not None and random_blocks.shape[-1]:
        random_blocks = random_blocks.to(device)
        table = torch.cat([table, random_blocks[:, 1:-1]], dim=-1)  # (H, N-2, K)
        slot_valid = torch.cat([slot_valid, torch.ones_like(random_blocks[:, 1:-1], dtype=torch.bool)], dim=-1)
    slots = table.shape[-1]

    # flat (head, block) ids of every slot, ordered (N-2, H, K): an index_select gathers a slab's key blocks
    head_offset = torch.arange(heads, device=device)[None, :, None] * num_blocks  # (1, H, 1)
    flat_index = (table.transpose(0, 1) + head_offset).reshape(-1)  # ((N-2)*H*K,)

    key_valid = valid.view(batch, num_blocks, block_size)[:, table.transpose(0, 1)]  # (B, N-2, H, K, b)
    # a copy in the standard layout: the layout PyTorch gives `&` of these broadcast operands differs between the
    # fake tensors `torch.compile` traces with and the real ones, and a traced reshape of it then fails as a view
    mask = (key_valid & slot_valid.transpose(0, 1)[None, :, :, :, None]).clone(memory_format=torch.contiguous_format)
    middle_query = query.view(batch, heads, num_blocks, block_size, head_dim)[:, :, 1:-1].transpose(1, 2)
    flat_keys, flat_values = (t.reshape(batch, heads * num_blocks, block_size * head_dim) for t in (key, value))

    # On CPU, query blocks go in slabs whose score buffers (unfused path) stay under _SLAB_BYTES (see there), which
    # also bounds the gathered key and value blocks (as large when block_size == Dh); elsewhere, and in a
    # `torch.compile` graph (whose slab count would otherwise specialise on the length), in one piece
    score_bytes = batch * heads * block_size * slots * block_size * query.element_size()  # per query block
    per_slab = None
    if device.type == "cpu" and not torch.compiler.is_compiling():
        per_slab = max(1, _SLAB_BYTES // score_bytes)
    pieces = []
    for first, last, interior in _slabs(middle, window_blocks, per_slab, unpadded):
        count = last - first
        index = flat_index[first * heads * slots : last * heads * slots]  # the slab's (block, head, slot) ids

        def blocks(flat, index=index, count=count):  # the slab's key blocks: (B*count, H, K*b, Dh)
            return flat.index_select(1, index).view(batch * count, heads, slots * block_size, head_dim)

        slab_query = middle_query[:, first:last].reshape(batch * count, heads, block_size, head_dim)
        slab_mask = None if interior else mask[:, first:last].reshape(batch * count, heads, 1, slots * block_size)
        slab_keys, slab_values = blocks(flat_keys), blocks(flat_values)
        slab_out = attend(slab_query, slab_keys, slab_values, slab_mask, None, dropout_p, implementation)[0]
        pieces.append(slab_out.view(batch, count, heads, block_size, head_dim))
    middle_out = torch.cat(pieces, dim=1).transpose(1, 2).reshape(batch, heads, middle * block_size, head_dim)
    out = torch.cat([global_out[:, :, :block_size], middle_out, global_out[:, :, block_size:]], dim=2)
    return out[:, :, :length] if padded_length != length else out


def _slabs(middle: int, window_blocks: int, per_slab: int | None, unpadded: bool) -> list[tuple[int, int, bool]]:
    """The slabs ``(first, last, interior)`` of the ``middle`` query blocks, at most ``per_slab`` each (``None``:
    no limit, no loop over the block count, which may be a symbolic size in a compiled graph). ``interior``:
    every key the slab gathers is allowed (``unpadded`` and no window slot of its blocks falls outside the sequence
    or onto a global block: the blocks ``w .. middle - 1 - w``); the ``w`` edge blocks at each end go in slabs of
    their own, with a mask."""
    edge = min(window_blocks, middle)
    ranges = [(0, middle, False)]
    if unpadded and middle > 2 * edge:
        ranges = [(0, edge, False), (edge, middle - edge, True), (middle - edge, middle, False)]
    if per_slab is None:
        return ranges
    return [
        (first, min(first + per_slab, stop), interior)
        for start, stop, interior in ranges
        for first in range(start, stop, per_slab)
    ]


def min_sparse_blocks(num_random_blocks: int, window_blocks: int = 1) -> int:
    """Fewest blocks for which block-sparse attention differs from (and is cheaper than) full attention in
    transformers' rule: more than ``2w + 3 + 2R`` blocks (``5 + 2R`` for the paper's 3-block window)."""
    return 2 * window_blocks + 3 + 2 * num_random_blocks + 1


def layer_seed(seed: int, layer_index: int) -> int:
    """One layer's random-block seed, derived from a base seed (different per layer)."""
    return (seed * 1_000_003 + layer_index) % (2**63 - 1)


__all__ = [
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "build_block_sparse_counts",
    "min_sparse_blocks",
    "random_block_indices",
    "layer_seed",
]
