"""Sliding-window attention with global tokens (Longformer, Beltagy et al. 2020, arXiv:2004.05150, section 3.1).

Every query ``i`` attends to the keys of its window -- ``j = i + k * dilation`` for ``|k| <= W`` (bidirectional) or
``0 <= -k <= W`` (causal) -- and to every *global* token; global tokens attend to every key (`global_attention`).
A global key that also lies in a window is counted once.

The fast path (`sliding_window_attention`) cuts the queries into chunks and lets each chunk attend to the keys its
window can reach plus the global keys, so time and memory grow linearly with the length. The chunks go through
`backend.attend` with the caller's implementation: for ``"sdpa"``, PyTorch's `scaled_dot_product_attention` in eval;
when a CPU forward needs a gradient or dropout, tf_family's native kernel, or where that is not built
`masked_attention`; for ``"eager"``, the dense twin per chunk. The chunk length is `backend.preferred_chunk`'s. Dilation ``d`` is handled by regrouping the sequence into ``d`` interleaved streams
(positions ``r, r + d, r + 2d, ...``): a dilated window is an ordinary window inside each stream. The dense twin
(`sliding_window_attention_reference`) materialises the full ``(B, T, T)`` mask of `build_sliding_window_mask`.

ALiBi (Press et al. 2022, `alibi`): with ``slopes`` ``(H,)`` a window pair ``(i, j)`` gets the bias
``-m_h * |i - j|``, ``|i - j|`` the distance in the sequence (dilation included; symmetric in a bidirectional window,
the paper's ``-m_h (i - j)`` in a causal one). Pairs with a global key get no bias: a global token is reached from any
distance, so its score carries no distance penalty (nor do the global tokens' own rows, `global_attention`).
`sliding_window_alibi_bias` is the dense twin's bias; FlexAttention has no bias here, so ``"flex_attention"`` with
slopes runs the ``"sdpa"`` chunks.

Conventions: tensors are ``(B, H, T, Dh)``; masks are bool with ``True`` meaning "may attend" / "real token". A
padded query attends to itself (its output is meaningless but finite, so padding never produces NaN).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backend import FLEX, attend, preferred_chunk
from .dense import dense_attention
from .flex import BlockMaskCache, flex_or_sdpa, flex_sliding_window_attention
from .patterns import WindowPattern


@dataclass(frozen=True)
class GlobalTokens:
    """The global tokens of a batch, gathered to ``G`` slots per row (``G`` = the largest count in the batch).

    Attributes:
        mask: ``(B, T)`` bool, True at global tokens (never at padding).
        indices: ``(B, G)`` positions of each row's global tokens, in order; unused slots hold 0.
        valid: ``(B, G)`` bool, False for unused slots.
    """

    mask: torch.Tensor
    indices: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def from_mask(
        cls, global_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None = None
    ) -> GlobalTokens | None:
        """Build from a ``(B, T)`` 0/1 mask; padding tokens are never global. ``None`` when no token is global."""
        if global_mask is None:
            return None
        mask = global_mask.to(torch.bool)
        if key_padding_mask is not None:
            mask = mask & key_padding_mask.to(torch.bool)
        counts = mask.sum(dim=1)  # (B,)
        if torch.compiler.is_exporting():
            # the number of global tokens is data: an exported graph gets one slot per position (unused ones are
            # masked), the same values at the cost of the global attention of every position
            num_slots = mask.shape[1]
        else:
            num_slots = int(counts.max()) if mask.numel() else 0
            if num_slots == 0:
                return None
        length = mask.shape[1]
        # the global positions first, in order: sorting unique keys (non-global positions count from T up) is the
        # stable sort of the 0/1 mask, and exports to ONNX (which has no stable sort)
        positions = torch.arange(length, device=mask.device)
        order = ((~mask).to(torch.long) * length + positions).argsort(dim=1)  # (B, T)
        indices = order[:, :num_slots]  # (B, G)
        valid = torch.arange(num_slots, device=mask.device)[None, :] < counts[:, None]  # (B, G)
        indices = torch.where(valid, indices, torch.zeros_like(indices)).clamp(max=length - 1)
        return cls(mask=mask, indices=indices, valid=valid)

    @property
    def num_slots(self) -> int:
        return self.indices.shape[1]

    def gather(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The rows of ``tensor`` at the global tokens: ``dim`` (length ``T``) becomes ``G``."""
        shape = [1] * tensor.dim()
        shape[0], shape[dim] = self.indices.shape
        index = self.indices.view(shape).expand(*tensor.shape[:dim], self.num_slots, *tensor.shape[dim + 1 :])
        return tensor.gather(dim, index)

    def scatter(self, tensor: torch.Tensor, values: torch.Tensor, dim: int = 2) -> torch.Tensor:
        """``tensor`` with its rows at the global tokens replaced by ``values`` (``dim`` has length ``G`` there)."""
        length = tensor.shape[dim]
        shape = [1] * tensor.dim()
        shape[0], shape[dim] = self.indices.shape
        # unused slots write into one extra row that is dropped afterwards
        target = torch.where(self.valid, self.indices, torch.full_like(self.indices, length))
        index = target.view(shape).expand(*values.shape)
        padded = torch.cat([tensor, tensor.narrow(dim, 0, 1)], dim=dim)
        return padded.scatter(dim, index, values.to(tensor.dtype)).narrow(dim, 0, length)


def _key_valid(key_padding_mask: torch.Tensor | None, batch: int, length: int, device) -> torch.Tensor:
    if key_padding_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    if key_padding_mask.shape != (batch, length):
        raise ValueError(f"key_padding_mask must have shape {(batch, length)}, got {tuple(key_padding_mask.shape)}.")
    return key_padding_mask.to(torch.bool)


# ------------------------------------------------------------------------------------------------ dense reference
def build_sliding_window_mask(
    pattern: WindowPattern,
    key_padding_mask: torch.Tensor,
    global_tokens: GlobalTokens | None = None,
    query_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ``(B, T, T)`` bool mask of which key each (non-global) query attends to in `sliding_window_attention`.

    Args:
        pattern: the window.
        key_padding_mask: ``(B, T)`` bool, True at real tokens.
        global_tokens: tokens every query also attends to (causal: only those at or before it).
        query_positions: ``(Q,)`` the positions of the rows to build (default: all ``T``), giving ``(B, Q, T)``; a
            decoder with a key/value cache builds the rows of its new tokens only.
    """
    batch, length = key_padding_mask.shape
    device = key_padding_mask.device
    valid = key_padding_mask.to(torch.bool)
    position = torch.arange(length, device=device)
    rows = position if query_positions is None else query_positions.to(device)
    distance = rows[:, None] - position[None, :]  # (Q, T): query i minus key j
    steps = torch.div(distance, pattern.dilation, rounding_mode="floor")
    in_window = (distance % pattern.dilation == 0) & (steps.abs() <= pattern.window)
    if pattern.causal:
        in_window &= distance >= 0
    is_global = torch.zeros_like(valid) if global_tokens is None else global_tokens.mask
    allowed = in_window[None] & (valid & ~is_global)[:, None, :]  # (B, Q, T)
    if global_tokens is not None:
        see_global = is_global[:, None, :].expand(batch, rows.shape[0], length)
        if pattern.causal:
            see_global = see_global & (distance >= 0)[None]
        allowed |= see_global
    allowed |= (distance == 0)[None] & ~valid[:, rows, None]  # a padded query attends to itself
    return allowed


def sliding_window_alibi_bias(
    slopes: torch.Tensor,
    length: int,
    global_tokens: GlobalTokens | None = None,
    query_positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ALiBi bias of the dense twin: ``-m_h * |i - j|``, zero on the columns of global keys; ``(B | 1, H, Q, T)``
    float32 over the rows ``query_positions`` (default: all ``length``)."""
    position = torch.arange(length, device=slopes.device)
    rows = position if query_positions is None else query_positions.to(slopes.device)
    distance = (rows[:, None] - position[None, :]).abs().to(torch.float32)  # (Q, T)
    bias = -slopes.to(torch.float32)[None, :, None, None] * distance  # (1, H, Q, T)
    if global_tokens is not None:
        bias = bias.masked_fill(global_tokens.mask.to(slopes.device)[:, None, None, :], 0.0)  # (B, H, Q, T)
    return bias


def sliding_window_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: WindowPattern,
    key_padding_mask: torch.Tensor | None = None,
    global_tokens: GlobalTokens | None = None,
    slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense twin of `sliding_window_attention` (quadratic time and memory); ``slopes``: ALiBi's ``(H,)``."""
    batch, _, length, _ = query.shape
    valid = _key_valid(key_padding_mask, batch, length, query.device)
    allowed = build_sliding_window_mask(pattern, valid, global_tokens)[:, None]  # (B, 1, T, T)
    bias = None if slopes is None else sliding_window_alibi_bias(slopes, length, global_tokens)
    return dense_attention(query, key, value, allowed, key_bias=bias)[0]


def global_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    global_tokens: GlobalTokens,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Dense twin of `global_attention`: every query attends to every real key (causal: those at or before it).

    ``query`` covers all ``T`` positions; the result is meaningful at the global tokens only (zero elsewhere)."""
    batch, _, length, _ = query.shape
    valid = _key_valid(key_padding_mask, batch, length, query.device)
    allowed = valid[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool, device=query.device).tril()
    out = dense_attention(query, key, value, allowed)[0]
    return out * global_tokens.mask[:, None, :, None]


# ------------------------------------------------------------------------------------------------------ fast path
def _unfold(tensor: torch.Tensor, left: int, right: int, span: int, step: int) -> torch.Tensor:
    """``(B, T, ...)`` -> ``(B, N, ..., span)``: overlapping, zero-padded spans of ``span`` rows every ``step``."""
    return F.pad(tensor, [0, 0] * (tensor.dim() - 2) + [left, right]).unfold(1, span, step)


class _KeySpans(torch.autograd.Function):
    """``(B, T, H, Dh)`` -> ``(B*N, H, G + span, Dh)``: each query chunk's key span, zero-padded at the ends, after
    the ``G`` global keys ``(B, G, H, Dh)`` that every chunk also sees -- written in one copy, in the layout
    `masked_attention` and `scaled_dot_product_attention` take. The backward adds the spans back in a few strided
    passes (one per ``step``-sized piece of a span) instead of the generic backward of ``unfold`` and ``cat``."""

    @staticmethod
    def forward(ctx, tensor, global_rows, left: int, right: int, span: int, step: int):
        batch, length, heads, head_dim = tensor.shape
        windows = _unfold(tensor, left, right, span, step)  # (B, N, H, Dh, span)
        num_windows = windows.shape[1]
        num_global = 0 if global_rows is None else global_rows.shape[1]
        out = tensor.new_empty(batch, num_windows, heads, num_global + span, head_dim)
        out[:, :, :, num_global:] = windows.transpose(-1, -2)
        if global_rows is not None:
            out[:, :, :, :num_global] = global_rows.transpose(1, 2)[:, None]
        ctx.shape = (left, length, length + left + right, span, step, num_global, num_windows)
        return out.view(batch * num_windows, heads, num_global + span, head_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        left, length, padded_length, span, step, num_global, num_windows = ctx.shape
        _, heads, _, head_dim = grad.shape
        grad = grad.reshape(-1, num_windows, heads, num_global + span, head_dim)
        batch = grad.shape[0]
        grad_global = grad[:, :, :, :num_global].sum(1).transpose(1, 2) if ctx.needs_input_grad[1] else None
        grad_spans = grad[:, :, :, num_global:].transpose(2, 3)  # (B, N, span, H, Dh)
        total = grad.new_zeros(batch, max(padded_length, num_windows * step + span), heads, head_dim)
        for start in range(0, span, step):  # window n's keys [start, start + width) sit at n * step + start
            width = min(step, span - start)
            target = total[:, start : start + num_windows * step].view(batch, num_windows, step, heads, head_dim)
            target[:, :, :width] += grad_spans[:, :, start : start + width]
        return total[:, left : left + length], grad_global, None, None, None, None


def _banded_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    window: int,
    causal: bool,
    key_valid: torch.Tensor,
    is_global: torch.Tensor,
    global_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    query_positions: torch.Tensor,
    dropout_p: float,
    implementation: str | None,
    slopes: torch.Tensor | None = None,
    step: int = 1,
) -> torch.Tensor:
    """Contiguous-window attention on ``(B, T, H, Dh)`` tensors, chunk by chunk; returns ``(B, T, H, Dh)``.

    Thirteen parameters: the three tensors, then, by keyword only, the window's two numbers, the per-position masks
    and positions (which `sliding_window_attention` regroups into dilation streams before the call), the dispatch's
    two settings and ALiBi's slopes with the distance of one slot. A dataclass around them would be built on every
    call of every layer for these two callers only.

    ``global_kv`` is ``(keys (B, G, H, Dh), values (B, G, H, Dh), valid (B, G), positions (B, G))`` and
    ``query_positions`` ``(B, T)`` holds each query's position in the original sequence (for causal global keys).
    ``slopes``: ALiBi's ``(H,)`` (a window key ``k`` slots away is ``k * step`` tokens away; global keys: no bias).
    """
    batch, length, heads, head_dim = query.shape
    chunk = preferred_chunk(window, query, key, value, dropout_p, implementation)
    if not torch.compiler.is_compiling():
        # an input shorter than a chunk attends in one piece of its own length; a traced graph keeps the whole
        # chunk (padded queries), so that its shapes do not specialise on the length of a short input
        chunk = min(chunk, length)
    num_chunks = -(-length // chunk)
    padded_length = num_chunks * chunk
    right = 0 if causal else window
    span = chunk + window + right
    tail = padded_length - length

    query_chunks = F.pad(query, (0, 0, 0, 0, 0, tail)).view(batch, num_chunks, chunk, heads, head_dim)
    query_chunks = query_chunks.transpose(2, 3).reshape(batch * num_chunks, heads, chunk, head_dim)
    global_keys = global_values = None
    if global_kv is not None:
        global_keys, global_values, global_valid, global_positions = global_kv
    key_spans = _KeySpans.apply(key, global_keys, window, right + tail, span, chunk)  # (B*N, H, G + span, Dh)
    value_spans = _KeySpans.apply(value, global_values, window, right + tail, span, chunk)
    usable = _unfold(key_valid & ~is_global, window, right + tail, span, chunk)  # (B, N, span)
    query_valid = F.pad(key_valid, (0, tail)).view(batch, num_chunks, chunk)  # (B, N, c)

    offset = (
        torch.arange(span, device=query.device)[None, :] - window - torch.arange(chunk, device=query.device)[:, None]
    )
    band = offset <= 0 if causal else offset.abs() <= window  # (c, span): key j = i + offset
    band &= offset >= -window
    diagonal = offset == 0
    allowed = band & (usable[:, :, None, :] | (diagonal & ~query_valid[..., None]))  # (B, N, c, span)

    if global_kv is not None:
        num_global = global_keys.shape[1]
        see_global = global_valid[:, None, None, :].expand(batch, num_chunks, chunk, num_global)
        if causal:
            positions = F.pad(query_positions, (0, tail), value=-1).view(batch, num_chunks, chunk)
            see_global = see_global & (global_positions[:, None, None, :] <= positions[..., None])
            # a query that sees no key at all (possible only for chunk padding) keeps its diagonal
        allowed = torch.cat([see_global, allowed], dim=-1)  # (B, N, c, G + span)

    keys_total = key_spans.shape[2]
    allowed = allowed.reshape(batch * num_chunks, 1, chunk, keys_total)
    bias = None
    if slopes is not None:  # (1, H, c, G + span): the same for every chunk
        bias = -slopes.to(torch.float32)[:, None, None] * (offset.abs() * step).to(torch.float32)
        bias = F.pad(bias, (keys_total - span, 0))[None].to(query.dtype)
    out = attend(query_chunks, key_spans, value_spans, allowed, bias, dropout_p, implementation)[0]  # (B*N, H, c, Dh)
    out = out.view(batch, num_chunks, heads, chunk, head_dim).transpose(2, 3).reshape(batch, padded_length, heads, -1)
    return out[:, :length]


def sliding_window_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: WindowPattern,
    key_padding_mask: torch.Tensor | None = None,
    global_tokens: GlobalTokens | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
    block_masks: BlockMaskCache | None = None,
    slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Windowed attention plus attention to the global tokens, in time and memory linear in ``T``.

    Ten parameters: the three tensors, the pattern and the call's two masks (the dense twin's six), then the
    dispatch: dropout, the implementation and, for ``"flex_attention"``, where its block mask is kept; last,
    ALiBi's slopes (``(H,)``, module docstring; ``None``: no bias).

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        pattern: window size, dilation, causality.
        key_padding_mask: ``(B, T)`` bool/0-1, True at real tokens.
        global_tokens: keys every query also sees (causal: those at or before it). Rows of global tokens are
            computed like any other here; replace them with `global_attention` (Longformer uses separate
            projections for them).
        dropout_p: dropout on the attention probabilities.
        implementation: ``"sdpa"``, ``"tff_native"`` or ``"eager"``, how each chunk attends (`backend.attend`);
            ``"flex_attention"``: the whole pattern in one FlexAttention call (`flex.flex_sliding_window_attention`;
            under dropout, the ``"sdpa"`` path: `flex.flex_or_sdpa`).
        block_masks: the model's `flex.BlockMaskCache` (``"flex_attention"``; ``None``: built for this call).

    Returns:
        ``(B, H, T, Dh)``, equal to `sliding_window_attention_reference` up to float rounding.
    """
    implementation = flex_or_sdpa(implementation, dropout_p)
    if implementation == FLEX and slopes is not None:
        implementation = "sdpa"  # no bias in the FlexAttention route (module docstring)
    if implementation == FLEX:
        return flex_sliding_window_attention(query, key, value, pattern, key_padding_mask, global_tokens, block_masks)
    batch, heads, length, head_dim = query.shape
    device = query.device
    key_valid = _key_valid(key_padding_mask, batch, length, device)
    is_global = torch.zeros_like(key_valid) if global_tokens is None else global_tokens.mask
    positions = torch.arange(length, device=device).expand(batch, length)
    query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # (B, T, H, Dh)

    global_kv = None
    if global_tokens is not None:
        global_kv = (
            global_tokens.gather(key),
            global_tokens.gather(value),
            global_tokens.valid,
            global_tokens.indices,
        )

    dilation = pattern.dilation
    if dilation == 1:
        out = _banded_attention(
            query,
            key,
            value,
            window=pattern.window,
            causal=pattern.causal,
            key_valid=key_valid,
            is_global=is_global,
            global_kv=global_kv,
            query_positions=positions,
            dropout_p=dropout_p,
            implementation=implementation,
            slopes=slopes,
        )
        return out.transpose(1, 2)

    # regroup into `dilation` interleaved streams: position r + d*t goes to stream r, slot t
    stream_length = -(-length // dilation)
    tail = stream_length * dilation - length

    def to_streams(tensor: torch.Tensor, fill=0) -> torch.Tensor:  # (B, T, ...) -> (B*d, T/d, ...)
        pad = [0, 0] * (tensor.dim() - 2) + [0, tail]
        padded = F.pad(tensor, pad, value=fill) if tail else tensor
        grouped = padded.reshape(batch, stream_length, dilation, *tensor.shape[2:]).transpose(1, 2)
        return grouped.reshape(batch * dilation, stream_length, *tensor.shape[2:])

    stream_global = None
    if global_kv is not None:
        stream_global = tuple(t.repeat_interleave(dilation, dim=0) for t in global_kv)
    out = _banded_attention(
        to_streams(query),
        to_streams(key),
        to_streams(value),
        window=pattern.window,
        causal=pattern.causal,
        key_valid=to_streams(key_valid, False),
        is_global=to_streams(is_global, False),
        global_kv=stream_global,
        query_positions=to_streams(positions, length),
        dropout_p=dropout_p,
        implementation=implementation,
        slopes=slopes,
        step=dilation,
    )  # (B*d, T/d, H, Dh)
    out = out.view(batch, dilation, stream_length, heads, head_dim).transpose(1, 2)
    return out.reshape(batch, stream_length * dilation, heads, head_dim)[:, :length].transpose(1, 2)


def cached_window_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    pattern: WindowPattern,
    key_valid: torch.Tensor,
    global_tokens: GlobalTokens | None,
    slopes: torch.Tensor | None,
    dropout_p: float,
    implementation: str | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A decoder's new tokens over its cache (nine parameters: the three tensors, the window, the two masks, ALiBi's
    slopes and the dispatch's two settings, as `sliding_window_attention` takes them): ``query`` ``(B, H, t, Dh)`` (the last ``t`` of the ``P + t`` cached
    ``keys`` / ``values``) attends to the last ``window * dilation`` positions and the global tokens (none of the new
    tokens is global); ``key_valid`` ``(B, P + t)``; ``slopes``: ALiBi's ``(H,)`` or ``None``. ``"eager"`` attends
    over every cached key and returns the probabilities ``(B, H, t, P + t)``."""
    total, past_length = keys.shape[2], keys.shape[2] - query.shape[2]
    rows = torch.arange(past_length, total, device=query.device)
    allowed = build_sliding_window_mask(pattern, key_valid, global_tokens, rows)[:, None]  # (B, 1, t, P + t)
    bias = None if slopes is None else sliding_window_alibi_bias(slopes, total, global_tokens, rows).to(query.dtype)
    if implementation == "eager":  # the probabilities over every cached key
        return attend(query, keys, values, allowed, bias, dropout_p=dropout_p, implementation="eager")
    start = max(0, past_length - pattern.window * pattern.dilation)  # the oldest key a window reaches
    if global_tokens is not None:  # the global keys first, then the reachable span without them

        def gathered(tensor, fill):  # (B | 1, H | 1, t, P + t) -> the global columns, then the span's others
            index = global_tokens.indices[:, None, None, :].expand(*tensor.shape[:3], -1)
            span = tensor[..., start:].masked_fill(global_tokens.mask[:, None, None, start:], fill)
            return torch.cat([tensor.gather(3, index), span], dim=3)

        allowed = gathered(allowed, False) & F.pad(global_tokens.valid, (0, total - start), value=True)[:, None, None]
        bias = None if bias is None else gathered(bias.expand(allowed.shape[0], -1, -1, -1), 0.0)
        keys = torch.cat([global_tokens.gather(keys, dim=2), keys[:, :, start:]], dim=2)
        values = torch.cat([global_tokens.gather(values, dim=2), values[:, :, start:]], dim=2)
    else:
        allowed, keys, values = allowed[..., start:], keys[:, :, start:], values[:, :, start:]
        bias = None if bias is None else bias[..., start:]
    return attend(query, keys, values, allowed, bias, dropout_p=dropout_p, implementation=implementation)


def build_global_query_mask(
    global_tokens: GlobalTokens, key_padding_mask: torch.Tensor | None, causal: bool, length: int
) -> torch.Tensor:
    """``(B, G, T)`` bool: the keys each global slot attends to (every real key; causal: those at or before it).
    Unused slots attend to every key, so that no row is empty."""
    batch = global_tokens.indices.shape[0]
    valid = _key_valid(key_padding_mask, batch, length, global_tokens.indices.device)
    allowed = valid[:, None, :].expand(batch, global_tokens.num_slots, length)  # (B, G, T)
    if causal:
        position = torch.arange(length, device=valid.device)
        allowed = allowed & (position[None, None, :] <= global_tokens.indices[..., None])
    return allowed | ~global_tokens.valid[..., None]


def global_attention(
    global_query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    global_tokens: GlobalTokens,
    key_padding_mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> torch.Tensor:
    """The global tokens' own attention: each attends to every real key (causal: those at or before it).

    Args:
        global_query: ``(B, H, G, Dh)``, the queries of the global tokens (``global_tokens.gather`` of the queries).
        key, value: ``(B, H, T, Dh)``.
        implementation: ``"sdpa"`` or ``"eager"`` (`backend.attend`).

    Returns:
        ``(B, H, G, Dh)``; unused slots hold meaningless finite values. Put the rows back with
        ``global_tokens.scatter(output, result)``.
    """
    allowed = build_global_query_mask(global_tokens, key_padding_mask, causal, key.shape[2])  # (B, G, T)
    return attend(global_query, key, value, allowed[:, None], None, dropout_p, implementation)[0]


__all__ = [
    "GlobalTokens",
    "WindowPattern",
    "build_global_query_mask",
    "build_sliding_window_mask",
    "cached_window_attention",
    "global_attention",
    "global_attention_reference",
    "sliding_window_alibi_bias",
    "sliding_window_attention",
    "sliding_window_attention_reference",
]
