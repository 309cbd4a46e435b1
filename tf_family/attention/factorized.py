"""The Sparse Transformer's factorised causal attention patterns (Child, Gray, Radford & Sutskever 2019,
arXiv:1904.10509, section 4), each a pure mask function with a dense twin and an efficient kernel.

A pattern says, for a query at position ``i`` and a key at position ``j <= i`` (every pattern here is causal), whether
the query attends to the key. With stride ``l`` and ``d = i - j``:

- ``"local"`` (the strided pattern's A(1)): ``d < l``, the previous ``l`` positions;
- ``"strided"`` (its A(2)): ``d % l == 0``, every ``l``-th earlier position;
- ``"block"`` (the fixed pattern's A(1)): ``i // l == j // l``, the query's own block of ``l`` positions;
- ``"summary"`` (its A(2)): ``j % l`` in ``[s, s + c)`` (the summary columns of every block, ``c`` of them
  starting at ``s``), plus the query itself. The paper gives different heads different summary sub-blocks; the
  query itself is added so that no row is empty (a position before the first summary column) and so that, one layer
  after a ``"block"`` layer, a query reaches its own block through itself: the two-hop coverage of section 4.2
  (`tests/attention/test_factorized.py` proves it for both patterns and both ways of combining them).

`build_factorized_mask` evaluates a pattern on any positions (the dense twin, and a decoding step's row over the
cache); `factorized_attention_reference` is plain attention under that mask. `factorized_attention` computes the same
without a ``T x T`` tensor, by regrouping the sequence (positions ``0 .. T - 1``, padded inside to a multiple of ``l``):

- ``"local"``: blocks of ``l`` queries against their own and the previous block (``2l`` keys): ``O(T l)``;
- ``"strided"``: the sequence as an ``(T / l, l)`` grid, attention down each column (the paper's transposed
  sequence): ``O(T^2 / l)``;
- ``"block"``: attention inside each block: ``O(T l)``;
- ``"summary"``: the ``c T / l`` summary keys gathered, plus the query's own key: ``O(c T^2 / l)``, in slabs of
  whole blocks of queries (`SUMMARY_SLAB_ROWS`), each against the summary keys up to its own last block only, so the
  later blocks' scores (half of one ``T x (c T / l)`` product) are never computed.

The first three have a native kernel of their own: with ``implementation="tff_native"`` on CPU (float32/64, no
dropout, no DA-Transformer weights), ``csrc/factor_attention.cpp`` reads each group's rows in place from the
``(B, H, T, Dh)`` tensors at their step in memory (a block's rows one apart, a column's ``l`` apart: no padding, no
regrouped or transposed copy), in chunks of `NATIVE_FACTOR_ROWS` queries each scored against the keys its rows can
see, and saves only each row's log-sum-exp. Otherwise they go through `backend.attend` (PyTorch's SDPA, or on CPU
under a gradient the fused native kernel) on the regrouped 4-D tensors, whose batch axis holds (heads x groups).
The summary keys' softmax with the query's own key has kernels of
its own: with ``implementation="tff_native"`` on CPU (float32/64, no dropout), the native summary kernel
(``csrc/summary_attention.cpp``: blocks of `NATIVE_SUMMARY_ROWS` queries, each row's log-sum-exp saved, the backward
recomputing the probabilities); otherwise the same slabs written out here with PyTorch products
(`_SummaryAttention`, saving the probabilities); under attention dropout, DA-Transformer's weights or a reduced dtype,
plain autograd over the whole ``T x (c T / l)`` scores. The heads of one call may each read their own summary columns
(one pattern per head, `head_patterns`), so the fixed pattern's summary heads of a layer are one call. An optional ALiBi slope per head
adds ``-m_h (i - j)`` to the scores (`alibi.alibi_bias`) in both paths; or, given a `distance_aware.DistanceAware` in
its place, every kernel computes DA-Transformer's re-normalised distance-aware weights
(`distance_aware.distance_aware_attention`) on the same groups instead of the softmax.
Tensors are ``(B, H, T, Dh)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import backend, native
from .backend import NATIVE, attend
from .distance_aware import ROW_SUM_FLOOR, DistanceAware, distance_aware_attention, reference_attention
from .dropout import dropout

PATTERN_KINDS = ("local", "strided", "block", "summary")


@dataclass(frozen=True)
class FactorizedPattern:
    """One head's factorised pattern.

    Attributes:
        kind: one of `PATTERN_KINDS`.
        stride: ``l``, the block length / stride.
        summary_start: ``s``, the first summary column inside a block (``"summary"`` only).
        summary_size: ``c``, summary columns per block (``"summary"`` only).
    """

    kind: str
    stride: int
    summary_start: int = 0
    summary_size: int = 0

    def __post_init__(self):
        if self.kind not in PATTERN_KINDS:
            raise ValueError(f"kind must be one of {PATTERN_KINDS}, got {self.kind!r}.")
        if not isinstance(self.stride, int) or isinstance(self.stride, bool) or self.stride < 1:
            raise ValueError(f"stride must be an int >= 1, got {self.stride!r}.")
        if self.kind == "summary":
            size, start = self.summary_size, self.summary_start
            if not isinstance(size, int) or not 1 <= size <= self.stride:
                raise ValueError(f"summary_size must be an int in [1, stride={self.stride}], got {size!r}.")
            if not isinstance(start, int) or not 0 <= start <= self.stride - size:
                raise ValueError(
                    f"summary_start must be an int in [0, stride - summary_size = {self.stride - size}], got {start!r}."
                )


def build_factorized_mask(
    pattern: FactorizedPattern, query_positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """Where a query may attend under ``pattern``: bool ``(..., T, S)`` from positions ``(..., T)`` and ``(..., S)``
    (any matching leading shape); causal (``j <= i``) included."""
    query = query_positions[..., :, None]  # (..., T, 1)
    key = key_positions[..., None, :]  # (..., 1, S)
    distance = query - key
    stride = pattern.stride
    if pattern.kind == "local":
        allowed = distance < stride
    elif pattern.kind == "strided":
        allowed = distance % stride == 0
    elif pattern.kind == "block":
        allowed = torch.div(query, stride, rounding_mode="floor") == torch.div(key, stride, rounding_mode="floor")
    else:
        column = key % stride
        summary = (column >= pattern.summary_start) & (column < pattern.summary_start + pattern.summary_size)
        allowed = summary | (distance == 0)
    return allowed & (distance >= 0)


def head_patterns(pattern, heads: int) -> tuple[FactorizedPattern, ...]:
    """``pattern`` for each of ``heads`` heads: one `FactorizedPattern` for all, or a sequence of one per head. The
    heads of one call share ``kind``, ``stride`` and ``summary_size``; only ``summary_start`` may differ (the fixed
    pattern's summary heads each read their own sub-block of columns, and are one call)."""
    if isinstance(pattern, FactorizedPattern):
        return (pattern,) * heads
    patterns = tuple(pattern)
    if len(patterns) != heads or not all(isinstance(p, FactorizedPattern) for p in patterns):
        raise ValueError(
            f"pattern must be a FactorizedPattern or a sequence of one per head ({heads} heads), got {pattern!r}."
        )
    shared = {(p.kind, p.stride, p.summary_size) for p in patterns}
    if len(shared) != 1:
        raise ValueError(
            "the heads of one factorized_attention call must share kind, stride and summary_size (only "
            f"summary_start may differ per head), got {sorted(shared)}; call it once per group of alike heads."
        )
    return patterns


def factorized_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: FactorizedPattern | tuple[FactorizedPattern, ...],
    slopes: torch.Tensor | DistanceAware | None = None,
) -> torch.Tensor:
    """Dense twin of `factorized_attention`: plain attention under `build_factorized_mask` over positions
    ``0 .. T - 1`` (plus the ALiBi bias of ``slopes`` ``(H,)``; or, for a `DistanceAware`, the distance-aware
    attention). ``pattern``: one for every head, or one per head (`head_patterns`). ``(B, H, T, Dh)``."""
    positions = torch.arange(query.shape[2], device=query.device)
    patterns = head_patterns(pattern, query.shape[1])
    masks = {p: build_factorized_mask(p, positions, positions) for p in set(patterns)}  # (T, T) each
    allowed = masks[patterns[0]] if len(masks) == 1 else torch.stack([masks[p] for p in patterns])  # (H |, T, T)
    return reference_attention(query, key, value, allowed, slopes)


def padded_blocks(tensor: torch.Tensor, stride: int) -> torch.Tensor:
    """``(B, H, T, Dh)`` padded to ``N * l`` positions and cut into blocks: ``(B, H, N, l, Dh)``."""
    batch, heads, length, head_dim = tensor.shape
    padded = -(-length // stride) * stride
    tensor = F.pad(tensor, (0, 0, 0, padded - length)) if padded != length else tensor
    return tensor.view(batch, heads, padded // stride, stride, head_dim)


# The fewest query rows per tile that `grouped_attend` hands to the fused native kernel under ``tff_native`` (the
# blockwise tiles; the factorised ones under dropout): tiles of one block of ``l`` queries ran faster through it than
# through `masked_attention` at 64 rows (`bench/results/sparse_transformer_tiles_ab_{strided,fixed}.md`), where
# BigBird's did not (`backend.NATIVE_MIN_ROWS`).
NATIVE_TILE_ROWS = 64


def grouped_attend(query, key, value, allowed, distance, slopes, dropout_p, implementation):
    """`attend` on ``(B, H, N, Tq, Dh)`` queries and ``(B, H, N, Tk, Dh)`` keys/values (groups ``N`` merged into the
    head axis), with ``allowed`` / ``distance`` ``(N | 1, Tq, Tk)`` shared by the heads (``distance``: ``i - j``, for
    the ALiBi bias of ``slopes`` ``(H,)``; or, when ``slopes`` is a `DistanceAware`, `distance_aware_attention` in
    place of `attend`). Returns ``(B, H, N, Tq, Dh)``."""
    batch, heads, groups, queries, head_dim = query.shape
    keys = key.shape[3]

    def merged(tensor):  # (B, H, N, ., Dh) -> (B, H * N, ., Dh)
        return tensor.reshape(batch, heads * groups, tensor.shape[3], head_dim)

    if allowed.shape[0] == 1 and slopes is None:  # one mask for every group and head: (1, 1, Tq, Tk), broadcast
        allowed = allowed[None]
    else:
        allowed = allowed.expand(groups, queries, keys)[None].expand(heads, -1, -1, -1)
        allowed = allowed.reshape(1, heads * groups, queries, keys)
    if isinstance(slopes, DistanceAware):
        work = torch.promote_types(query.dtype, torch.float32)
        coefficients = slopes.coefficients(distance, work).transpose(0, 1)  # (H, N | 1, Tq, Tk)
        coefficients = coefficients.expand(heads, groups, queries, keys).reshape(1, heads * groups, queries, keys)
        out, _ = distance_aware_attention(merged(query), merged(key), merged(value), allowed, coefficients, dropout_p)
        return out.view(batch, heads, groups, queries, head_dim)
    bias = None
    if slopes is not None:
        bias = -slopes.to(query.device, torch.float32)[:, None, None, None] * distance.to(torch.float32)[None]
        bias = bias.expand(heads, groups, queries, keys).reshape(1, heads * groups, queries, keys).to(query.dtype)
    out, _ = attend(
        merged(query),
        merged(key),
        merged(value),
        allowed,
        bias,
        dropout_p=dropout_p,
        implementation=implementation,
        native_min_rows=min(NATIVE_TILE_ROWS, backend.NATIVE_MIN_ROWS),
    )
    return out.view(batch, heads, groups, queries, head_dim)


def _local(query, key, value, stride, slopes, dropout_p, implementation):
    blocks_q, blocks_k, blocks_v = (padded_blocks(t, stride) for t in (query, key, value))  # (B, H, N, l, Dh)
    offsets_q = torch.arange(stride, device=query.device)[:, None]  # (l, 1): a
    offsets_k = torch.arange(2 * stride, device=query.device)[None, :]  # (1, 2l): b, key j = (n - 1) l + b
    distance = (stride + offsets_q - offsets_k)[None]  # (1, l, 2l): i - j
    allowed = (distance >= 0) & (distance < stride)
    # block 0 has no previous block: its queries against its own keys (the mask's second half); every later block
    # against the previous block and its own, under one (l, 2l) mask that all of them and all heads share
    first = grouped_attend(
        blocks_q[:, :, :1],
        blocks_k[:, :, :1],
        blocks_v[:, :, :1],
        allowed[..., stride:],
        distance[..., stride:],
        slopes,
        dropout_p,
        implementation,
    )
    if blocks_q.shape[2] == 1:
        return first.flatten(2, 3)
    rest = grouped_attend(
        blocks_q[:, :, 1:],
        torch.cat([blocks_k[:, :, :-1], blocks_k[:, :, 1:]], dim=3),  # (B, H, N - 1, 2l, Dh)
        torch.cat([blocks_v[:, :, :-1], blocks_v[:, :, 1:]], dim=3),
        allowed,
        distance,
        slopes,
        dropout_p,
        implementation,
    )
    return torch.cat([first, rest], dim=2).flatten(2, 3)


def _strided(query, key, value, stride, slopes, dropout_p, implementation):
    # the (N, l) grid read down its columns: (B, H, l, N, Dh), position i = n l + a sits at column a, row n
    columns = [padded_blocks(t, stride).transpose(2, 3) for t in (query, key, value)]
    rows = torch.arange(columns[0].shape[3], device=query.device)
    distance = (rows[:, None] - rows[None, :]) * stride  # (N, N)
    allowed = distance >= 0
    out = grouped_attend(*columns, allowed[None], distance[None], slopes, dropout_p, implementation)
    return out.transpose(2, 3).flatten(2, 3)


def _block(query, key, value, stride, slopes, dropout_p, implementation):
    blocks = [padded_blocks(t, stride) for t in (query, key, value)]
    offsets = torch.arange(stride, device=query.device)
    distance = offsets[:, None] - offsets[None, :]  # (l, l)
    out = grouped_attend(*blocks, (distance >= 0)[None], distance[None], slopes, dropout_p, implementation)
    return out.flatten(2, 3)


# queries per slab of the summary kernel: each slab is scored against the summary keys up to its own last block only
# (the causal prefix), so the scores of later blocks, half of a single T x (N c) product, are never computed
SUMMARY_SLAB_ROWS = 256


def _summary_positions(stride: int, starts: torch.Tensor, size: int, first: int, end: int) -> torch.Tensor:
    """Positions of the summary keys ``first .. end - 1`` of each head, ``(H, end - first)``: key ``s`` of head ``h``
    is column ``starts[h] + s % c`` of block ``s // c``."""
    index = torch.arange(first, end, device=starts.device)
    return (torch.div(index, size, rounding_mode="floor") * stride + index % size)[None] + starts[:, None]


def _summary_slabs(length: int, stride: int, size: int, slab_blocks: int) -> list[tuple[int, int, int, int]]:
    """The query slabs of the summary kernel: ``(t0, t1, s0, s1)``, queries ``t0 .. t1 - 1`` (whole blocks of
    ``stride``, ``slab_blocks`` of them) against summary keys ``0 .. s1 - 1``; only keys ``s0 .. s1 - 1`` (the slab's
    own blocks) can lie at or after a query of the slab and need a mask."""
    rows = slab_blocks * stride
    return [
        (t0, min(t0 + rows, length), (t0 // stride) * size, -(-min(t0 + rows, length) // stride) * size)
        for t0 in range(0, length, rows)
    ]


def _late_keys(stride: int, starts: torch.Tensor, size: int, rows: int) -> torch.Tensor:
    """Bool ``(H, rows, ceil(rows / l) c)``: whether the ``u``-th summary key of a slab's own blocks lies at or after
    its ``r``-th query (key ``u`` of head ``h`` sits ``(u // c) l + starts[h] + u % c`` positions after the slab's
    first query). The same for every slab of whole blocks; a shorter last slab reads its top-left corner."""
    keys = _summary_positions(stride, starts, size, 0, -(-rows // stride) * size)  # (H, keys)
    return keys[:, None, :] >= torch.arange(rows, device=starts.device)[None, :, None]


def _alibi_slab(scores, t0, stride, starts, size, slopes):
    """Add ALiBi's ``-m_h (i - j)`` (``slopes`` ``(H,)``) to a slab's scores ``(B, H, R, s1)`` of queries ``t0 ..``."""
    device, dtype = scores.device, scores.dtype
    rows = torch.arange(t0, t0 + scores.shape[2], device=device)[None, :, None]
    distance = (rows - _summary_positions(stride, starts, size, 0, scores.shape[3])[:, None, :]).to(dtype)
    scores.add_(-slopes.to(device, dtype)[:, None, None] * distance)


@dataclass(frozen=True)
class _SummaryCall:
    """What a summary-kernel call needs besides its tensors: each head's first summary column ``starts`` ``(H,)``,
    the stride ``l``, the columns per block ``c``, the ALiBi ``slopes`` ``(H,)`` or ``None``, and the query rows per
    slab (Python kernel) or block (native kernel)."""

    starts: torch.Tensor
    stride: int
    size: int
    slopes: torch.Tensor | None
    rows: int


class _SummaryAttention(torch.autograd.Function):
    # The summary factor as slabs of queries, each against its causal prefix of the shared summary keys plus every
    # query's own key, the softmax over both written out. Like `masked._MaskedAttention`: products through `torch.bmm`
    # on 3-D views, the probabilities computed in place and kept for the backward pass, no (T, N c) tensor built.
    # Whatever concerns the own key (its score, probability and gradients) is computed for all queries at once,
    # outside the loop over slabs, whose Python calls are the kernel's overhead.
    @staticmethod
    def forward(ctx, query, key, value, summary_keys, summary_values, call: _SummaryCall):
        batch, heads, length, head_dim = query.shape
        starts, stride, size, slopes = call.starts, call.stride, call.size, call.slopes
        scaled = (query * head_dim**-0.5).reshape(batch * heads, length, head_dim)  # (B H, T, Dh), a fresh tensor
        key, value = key.reshape(batch * heads, length, head_dim), value.reshape(batch * heads, length, head_dim)
        summary_keys = summary_keys.reshape(batch * heads, -1, head_dim)  # (B H, N c, Dh)
        summary_values = summary_values.reshape(batch * heads, -1, head_dim)
        out = torch.empty_like(scaled)
        own = (scaled * key).sum(-1, keepdim=True)  # (B H, T, 1): each query's score of its own key
        own_probs = torch.empty_like(own)
        slabs, probs_of = _summary_slabs(length, stride, size, max(1, call.rows // stride)), []
        late = _late_keys(stride, starts, size, slabs[0][1] - slabs[0][0])  # (H, R, own keys)
        for t0, t1, s0, s1 in slabs:
            probs = torch.bmm(scaled[:, t0:t1], summary_keys[:, :s1].transpose(1, 2))  # scores (B H, R, s1)
            scores = probs.view(batch, heads, t1 - t0, s1)
            if slopes is not None:
                _alibi_slab(scores, t0, stride, starts, size, slopes)
            scores[..., s0:].masked_fill_(late[:, : t1 - t0, : s1 - s0], float("-inf"))
            peak = torch.maximum(probs.amax(-1, keepdim=True), own[:, t0:t1])
            probs.sub_(peak).exp_()
            own_exp = own[:, t0:t1].sub(peak).exp_()
            total = probs.sum(-1, keepdim=True).add_(own_exp)
            probs.div_(total)
            torch.div(own_exp, total, out=own_probs[:, t0:t1])
            torch.bmm(probs, summary_values[:, :s1], out=out[:, t0:t1])
            probs_of.append(probs)
        out.addcmul_(own_probs, value)
        ctx.save_for_backward(scaled, key, value, summary_keys, summary_values, own_probs, *probs_of)
        ctx.slabs = slabs
        return out.view(batch, heads, length, head_dim)

    @staticmethod
    def backward(ctx, grad_out):
        scaled, key, value, summary_keys, summary_values, own_probs, *probs_of = ctx.saved_tensors
        shape = grad_out.shape
        grad_out = grad_out.reshape(scaled.shape)
        grad_scaled = torch.empty_like(scaled)
        grad_value = own_probs * grad_out
        grad_own = (grad_out * value).sum(-1, keepdim=True).mul_(own_probs)  # p dp of the own keys, (B H, T, 1)
        row_sum = torch.empty_like(grad_own)  # sum P dP over each query's summary keys and own key
        grad_summary_keys = torch.zeros_like(summary_keys)
        grad_summary_values = torch.zeros_like(summary_values)
        for (t0, t1, _, s1), probs in zip(ctx.slabs, probs_of, strict=True):
            grad_rows = grad_out[:, t0:t1]
            grad_summary_values[:, :s1].baddbmm_(probs.transpose(1, 2), grad_rows)
            grad_scores = torch.bmm(grad_rows, summary_values[:, :s1].transpose(1, 2)).mul_(probs)  # P dP
            torch.add(grad_scores.sum(-1, keepdim=True), grad_own[:, t0:t1], out=row_sum[:, t0:t1])
            grad_scores.addcmul_(probs, row_sum[:, t0:t1], value=-1)  # dS = P (dP - sum P dP)
            torch.bmm(grad_scores, summary_keys[:, :s1], out=grad_scaled[:, t0:t1])
            grad_summary_keys[:, :s1].baddbmm_(grad_scores.transpose(1, 2), scaled[:, t0:t1])
        grad_own.addcmul_(own_probs, row_sum, value=-1)
        grad_query = grad_scaled.addcmul_(grad_own, key).mul_(shape[-1] ** -0.5).view(shape)
        summary_shape = (*shape[:2], -1, shape[-1])
        return (
            grad_query,
            (grad_own * scaled).view(shape),
            grad_value.view(shape),
            grad_summary_keys.view(summary_shape),
            grad_summary_values.view(summary_shape),
            None,
        )


class _NativeSummaryAttention(torch.autograd.Function):
    # The summary factor through the native kernel (`csrc/summary_attention.cpp`): the same slabs, softmax and
    # gradients as `_SummaryAttention`, one call forward and one backward; only each row's log-sum-exp is saved.
    @staticmethod
    def forward(ctx, query, key, value, summary_keys, summary_values, call: _SummaryCall):
        tensors = [t.contiguous() for t in (query, key, value, summary_keys, summary_values)]
        slopes = _native_slopes(call.slopes)
        starts = call.starts.cpu()
        out, lse = native.extension().summary_forward(*tensors, starts, slopes, call.stride, call.size, call.rows)
        ctx.save_for_backward(*tensors, lse)
        ctx.geometry = (call.stride, call.size, call.rows)
        ctx.slopes, ctx.starts = slopes, starts
        return out

    @staticmethod
    def backward(ctx, grad_out):
        *tensors, lse = ctx.saved_tensors
        grads = native.extension().summary_backward(
            grad_out.contiguous(), *tensors, ctx.starts, ctx.slopes, lse, *ctx.geometry
        )
        return (*grads, None)


# query rows per block of the native summary kernel (two 64-position blocks of the default stride; a block's scores
# against the 512 summary keys of a 4,096-token sequence stay within 256 KiB)
NATIVE_SUMMARY_ROWS = 128


def _takes_native(query: torch.Tensor, slopes, dropout_p: float, implementation: str | None) -> bool:
    """Whether a factor runs on its native kernel: `backend.NATIVE` chosen, a CPU float32/64 call without
    dropout or DA-Transformer's weights, outside `torch.compile` / `torch.export`, and the kernel built."""
    if implementation != NATIVE or query.device.type != "cpu" or query.dtype not in (torch.float32, torch.float64):
        return False
    if dropout_p > 0.0 or isinstance(slopes, DistanceAware):
        return False
    if torch.compiler.is_exporting() or torch.compiler.is_compiling():
        return False
    return native.extension() is not None


# query rows per chunk of the native local / strided / block kernel: each chunk is scored against the keys its rows
# can see only (a local chunk of r rows: l + r - 1 keys, not 2 l; a strided or block chunk: its causal prefix), so
# fewer rows waste fewer scores but make smaller products; 32 was the fastest of 16, 32 and 64 at stride 64
NATIVE_FACTOR_ROWS = 32
_NATIVE_FACTOR_KINDS = {"local": 0, "strided": 1, "block": 2}  # csrc/factor_attention.cpp's kind codes


def _native_slopes(slopes: torch.Tensor | None) -> torch.Tensor | None:
    """ALiBi slopes as the native kernels read them: ``(H,)`` float64 on the CPU, contiguous, outside the graph."""
    return None if slopes is None else slopes.detach().to("cpu", torch.float64).contiguous()


def _rows_readable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when the native kernels can read its rows in place (a contiguous last dim, rows at least
    ``Dh`` apart: the BLAS leading dimension), else a contiguous copy."""
    if tensor.stride(3) == 1 and tensor.stride(2) >= max(1, tensor.shape[3]):
        return tensor
    return tensor.contiguous()


class _NativeFactorAttention(torch.autograd.Function):
    # The local, strided and block factors through the native kernel (`csrc/factor_attention.cpp`): each group of
    # queries read in place from the (B, H, T, Dh) tensors at its step in memory (no padding, no regrouped copy), one
    # call forward and one backward; only each row's log-sum-exp is saved.
    @staticmethod
    def forward(ctx, query, key, value, slopes, kind: str, stride: int):
        tensors = [_rows_readable(t) for t in (query, key, value)]
        ctx.slopes = _native_slopes(slopes)
        ctx.geometry = (_NATIVE_FACTOR_KINDS[kind], stride, NATIVE_FACTOR_ROWS)
        out, lse = native.extension().factor_forward(*tensors, ctx.slopes, *ctx.geometry)
        ctx.save_for_backward(*tensors, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        *tensors, lse = ctx.saved_tensors
        grads = native.extension().factor_backward(_rows_readable(grad_out), *tensors, ctx.slopes, lse, *ctx.geometry)
        return (*grads, None, None, None)


def _summary(query, key, value, patterns, slopes, dropout_p, implementation):
    first = patterns[0]
    stride, size = first.stride, first.summary_size
    batch, heads, length, head_dim = query.shape
    starts = torch.tensor([p.summary_start for p in patterns], device=query.device)  # (H,)
    columns = (starts[:, None] + torch.arange(size, device=query.device))[None, :, None, :, None]  # (1, H, 1, c, 1)
    summary_keys, summary_values = (
        padded_blocks(t, stride).gather(3, columns.expand(batch, heads, -(-length // stride), size, head_dim))
        for t in (key, value)
    )  # (B, H, N, c, Dh): each head's own summary columns
    summary_keys, summary_values = summary_keys.flatten(2, 3), summary_values.flatten(2, 3)  # (B, H, N * c, Dh)
    if _takes_native(query, slopes, dropout_p, implementation):
        same = [t.to(query.dtype) for t in (key, value, summary_keys, summary_values)]
        call = _SummaryCall(starts, stride, size, slopes, NATIVE_SUMMARY_ROWS)
        return _NativeSummaryAttention.apply(query, *same, call)
    plain = slopes is None or isinstance(slopes, torch.Tensor)
    if plain and dropout_p == 0.0 and query.dtype in (torch.float32, torch.float64):
        same = [t.to(query.dtype) for t in (key, value, summary_keys, summary_values)]
        return _SummaryAttention.apply(query, *same, _SummaryCall(starts, stride, size, slopes, SUMMARY_SLAB_ROWS))
    # dropout on the probabilities, DA-Transformer's weights, reduced precision: plain autograd over (T, N c) scores
    positions = torch.arange(length, device=query.device)
    summary_positions = _summary_positions(stride, starts, size, 0, summary_keys.shape[2])  # (H, N * c)
    distance = positions[None, :, None] - summary_positions[:, None, :]  # (H, T, N * c)
    work = torch.promote_types(query.dtype, torch.float32)
    scale = head_dim**-0.5
    scores = torch.einsum("bhtd,bhsd->bhts", query.to(work), summary_keys.to(work)) * scale  # (B, H, T, N * c)
    own = (query.to(work) * key.to(work)).sum(-1, keepdim=True) * scale  # (B, H, T, 1): the query's own key
    # strictly earlier summary keys: a query that is itself a summary column is counted once, as its own key
    earlier = distance > 0
    if isinstance(slopes, DistanceAware):  # ReLU'd scores re-scaled by f(w |i - j|; v), f(0) = 1 for the own key
        coefficients = slopes.coefficients(distance, work).diagonal(dim1=0, dim2=1).permute(2, 0, 1)  # (H, T, N * c)
        weights = F.relu(scores) * coefficients.masked_fill(~earlier, 0.0)
        weights = torch.cat([weights, F.relu(own)], dim=-1)  # (B, H, T, N * c + 1)
        probs = weights / weights.sum(dim=-1, keepdim=True).clamp_min(ROW_SUM_FLOOR)
    else:
        if slopes is not None:
            scores = scores - slopes.to(query.device, work)[:, None, None] * distance.to(work)
        scores = scores.masked_fill(~earlier, float("-inf"))
        probs = torch.cat([scores, own], dim=-1).softmax(dim=-1)  # (B, H, T, N * c + 1)
    probs = dropout(probs, dropout_p, dropout_p > 0.0).to(value.dtype)
    out = torch.einsum("bhts,bhsd->bhtd", probs[..., :-1], summary_values) + probs[..., -1:] * value
    return out


def factorized_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: FactorizedPattern | tuple[FactorizedPattern, ...],
    slopes: torch.Tensor | DistanceAware | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
) -> torch.Tensor:
    """Causal attention under ``pattern`` over positions ``0 .. T - 1``, without a ``T x T`` tensor (module docstring).

    Args:
        query, key, value: ``(B, H, T, Dh)``.
        pattern: the heads' `FactorizedPattern`, or one per head that differ only in ``summary_start``
            (`head_patterns`: the fixed pattern's summary heads, one call).
        slopes: ``(H,)`` ALiBi slopes, a `DistanceAware` (DA-Transformer's ``w_h``, ``v_h``), or ``None``.
        dropout_p: dropout on the probabilities (0 in eval).
        implementation: ``config._attn_implementation``, for `backend.attend`.

    Returns:
        ``(B, H, T, Dh)``, equal to `factorized_attention_reference` up to float rounding.
    """
    length = query.shape[2]
    patterns = head_patterns(pattern, query.shape[1])
    if patterns[0].kind == "summary":
        return _summary(query, key, value, patterns, slopes, dropout_p, implementation)
    if _takes_native(query, slopes, dropout_p, implementation):
        key, value = key.to(query.dtype), value.to(query.dtype)
        return _NativeFactorAttention.apply(query, key, value, slopes, patterns[0].kind, patterns[0].stride)
    function = {"local": _local, "strided": _strided, "block": _block}[patterns[0].kind]
    return function(query, key, value, patterns[0].stride, slopes, dropout_p, implementation)[:, :, :length]


__all__ = [
    "PATTERN_KINDS",
    "FactorizedPattern",
    "build_factorized_mask",
    "factorized_attention",
    "factorized_attention_reference",
    "grouped_attend",
    "head_patterns",
    "padded_blocks",
]
