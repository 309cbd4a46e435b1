"""Chunked window attention with a hand-written backward: the shared core of Reformer's LSH and local attention.

Vectors arrive cut into chunks, ``(B, A, N, C, Dh)`` (``A``: heads, or heads x hashing rounds). Chunk ``n``'s
queries attend to the keys of chunks ``n - before .. n + after`` of the same ``(b, a)`` row. Nothing is copied to
build those windows: the keys are padded with ``before`` chunks in front and ``after`` behind (zeros, or, with
``wrap``, the last / first chunks of the row, the roll transformers uses) and `Tensor.unfold` gives every chunk's
window as a view, which the matrix products read in place (one ``bmm`` per ``(b, a)`` row).

The scores are masked (``blocked`` -> ``masked``, ``self_slot`` -> ``self_only``), a ``bias`` may be added first,
and the softmax runs in place over one buffer (with ``wrap``, transformers' ``exp(score - logsumexp)``, whose
rounding it reproduces); the forward returns the outputs and each query's log-sum-exp (LSH
attention combines its rounds with it). The backward uses only the saved probabilities (dropout mask included):

    dS = P * (dO V^T * keep / (1 - p) - rowsum(dO * O) + dLSE),    dQ = dS K,    dK = dS^T Q,    dV = P_dropped^T dO

and folds the window gradients back onto the chunks with ``span`` slice additions. Dense twins: the kernels built
on this (`lsh.lsh_attention`, `lsh.chunked_local_attention`) are tested against theirs in tests/attention/test_lsh.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dropout import dropout_mask

# exp arguments are clamped at the first number (exp of it is still a normal number); terms below the second are 0
_EXP_FLOOR = {torch.float32: (-80.0, 1e-20), torch.float64: (-700.0, 1e-200)}


def pad_chunks(tensor: torch.Tensor, before: int, after: int, wrap: bool, fill=0.0) -> torch.Tensor:
    """``(B, A, N, C, Dh)`` -> ``(B, A, (before + N + after) * C, Dh)``: ``fill`` (or the row's own chunks,
    rolled, with ``wrap``) around the chunks."""
    batch, rows, num_chunks, size, width = tensor.shape
    if wrap:
        index = torch.arange(-before, num_chunks + after, device=tensor.device) % num_chunks
        padded = tensor.index_select(2, index)
    else:
        padded = torch.nn.functional.pad(tensor, (0, 0, 0, 0, before, after), value=fill)
    return padded.view(batch, rows, -1, width)


def window_view(padded: torch.Tensor, span: int, size: int) -> torch.Tensor:
    """Every chunk's window of ``span * C`` rows as a view: ``(B, A, N, Dh, span * C)`` (the keys transposed)."""
    return padded.unfold(2, span * size, size)


def _fold(window_grad: torch.Tensor, num_chunks: int, before: int, after: int, wrap: bool) -> torch.Tensor:
    """The gradient of `_pad_chunks` + `_windows`: window rows ``(B, A, N, span * C, Dh)`` summed back onto the
    ``(B, A, N, C, Dh)`` chunks."""
    batch, rows, _, window, width = window_grad.shape
    span = before + 1 + after
    size = window // span
    padded = window_grad.new_zeros(batch, rows, num_chunks + before + after, size, width)
    for slot in range(span):
        padded[:, :, slot : slot + num_chunks] += window_grad[:, :, :, slot * size : (slot + 1) * size]
    if not wrap:
        return padded[:, :, before : before + num_chunks]
    grad = padded[:, :, before : before + num_chunks].clone()
    index = torch.arange(-before, num_chunks + after, device=grad.device) % num_chunks
    outside = torch.cat([torch.arange(before), torch.arange(before + num_chunks, num_chunks + before + after)])
    grad.index_add_(2, index[outside.to(index.device)], padded[:, :, outside.to(grad.device)])
    return grad


def _rows(tensor: torch.Tensor):
    """The ``(b, a)`` rows of a ``(B, A, ...)`` tensor, in order."""
    for b in range(tensor.shape[0]):
        for a in range(tensor.shape[1]):
            yield b, a


class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, blocked, self_slot, bias, options):
        before, after, wrap, masked, self_only, dropout_p = options
        batch, rows, num_chunks, size, width = query.shape
        span = before + 1 + after
        query = query.contiguous()
        scaled = query * width**-0.5
        keys = window_view(pad_chunks(key.contiguous(), before, after, wrap), span, size)  # (B, A, N, Dh, K)
        values = window_view(pad_chunks(value.contiguous(), before, after, wrap), span, size)
        # one bmm per row into a preallocated buffer; under torch.export one batched product instead (an exported
        # graph cannot hold out= products, which refuse inputs that require a gradient)
        exporting = torch.compiler.is_exporting()
        if exporting:
            scores = torch.matmul(scaled, keys)  # (B, A, N, C, K)
        else:
            scores = query.new_empty(batch, rows, num_chunks, size, span * size)
            for b, a in _rows(scores):
                torch.bmm(scaled[b, a], keys[b, a], out=scores[b, a])
        if bias is not None:
            scores += bias
        if blocked is not None:
            scores.masked_fill_(blocked, masked)
        if isinstance(self_slot, str):  # "diagonal": each query's own slot in its own chunk
            scores[..., before * size : (before + 1) * size].diagonal(dim1=-2, dim2=-1).fill_(self_only)
        elif self_slot is not None:
            scores.masked_fill_(self_slot, self_only)
        top = scores.amax(dim=-1, keepdim=True)
        # exp is ~10x slower on CPU for arguments far below its range: clamp them; then zero the negligible terms,
        # whose products with small gradients would be denormal numbers (a ~50x slower matrix product on x86)
        floor, negligible = _EXP_FLOOR[scores.dtype]
        probs = torch.nn.functional.threshold_(scores.sub_(top).clamp_(min=floor).exp_(), negligible, 0.0)
        total = probs.sum(dim=-1, keepdim=True)
        lse = top + total.log()  # (B, A, N, C, 1)
        # wrap (transformers' arithmetic): probabilities exp(score - lse) with lse rounded, whose sum can miss 1
        probs *= (top - lse).exp_() if wrap else total.reciprocal_()
        lse = lse.squeeze(-1)
        kept, scale = None, 1.0
        attended = probs
        if dropout_p > 0.0:
            kept, scale = dropout_mask(probs.shape, dropout_p, probs.device)
            attended = kept.view(torch.uint8).to(probs.dtype).mul_(probs).mul_(scale)
        if exporting:
            out = torch.matmul(attended, values.transpose(-1, -2))  # (B, A, N, C, Dh)
        else:
            out = query.new_empty(batch, rows, num_chunks, size, width)
            for b, a in _rows(out):
                torch.bmm(attended[b, a], values[b, a].transpose(-1, -2), out=out[b, a])
        # a self-only score is a constant: no gradient. Elsewhere its probability is 0, or (a row with only itself)
        # its gradient vanishes in exact arithmetic, but not under transformers' rounding (wrap)
        frozen = self_slot if wrap and not isinstance(self_slot, str) else None
        ctx.save_for_backward(scaled, keys, values, probs, out, kept, frozen)
        ctx.options, ctx.scale = options, scale
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        scaled, keys, values, probs, out, kept, frozen = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        before, after, wrap, *_ = ctx.options
        num_chunks, width = scaled.shape[2], scaled.shape[-1]
        grad_out = grad_out.contiguous()
        attended = probs if kept is None else kept.view(torch.uint8).to(probs.dtype).mul_(probs).mul_(ctx.scale)
        grad_value = values.new_empty(*probs.shape[:3], probs.shape[-1], width)  # (B, A, N, K, Dh)
        grad_scores = torch.empty_like(probs)
        for b, a in _rows(probs):
            torch.bmm(attended[b, a].transpose(-1, -2), grad_out[b, a], out=grad_value[b, a])
            torch.bmm(grad_out[b, a], values[b, a], out=grad_scores[b, a])
        del attended
        if kept is not None:
            grad_scores.mul_(kept.view(torch.uint8).to(probs.dtype)).mul_(ctx.scale)
        row = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, A, N, C, 1)
        if grad_lse is not None:
            row = row - grad_lse[..., None]
        grad_scores.sub_(row).mul_(probs)
        if frozen is not None:
            grad_scores.masked_fill_(frozen, 0.0)
        grad_query = torch.empty_like(scaled)
        grad_key = values.new_empty(grad_value.shape)
        for b, a in _rows(probs):
            torch.bmm(grad_scores[b, a], keys[b, a].transpose(-1, -2), out=grad_query[b, a])
            torch.bmm(grad_scores[b, a].transpose(-1, -2), scaled[b, a], out=grad_key[b, a])
        grad_query *= width**-0.5
        grad_key = _fold(grad_key, num_chunks, before, after, wrap)
        grad_value = _fold(grad_value, num_chunks, before, after, wrap)
        return grad_query, grad_key, grad_value, None, None, None, None


@dataclass(frozen=True)
class WindowScores:
    """How `chunked_window_attention` marks the scores ``(B, A, N, C, K)`` of each chunk's window.

    Attributes:
        blocked: bool, broadcastable to the scores: True -> score ``masked``.
        self_slot: bool, broadcastable to the scores: True -> score ``self_only`` (after ``blocked``); or
            ``"diagonal"``: each query's own position in its own chunk (cheaper; the same where every position
            appears once per row, as in LSH rounds kept apart).
        bias: float, broadcastable to the scores, added before masking (no gradient).
        masked, self_only: the scores given to ``blocked`` keys and to the ``self_slot`` keys.
    """

    blocked: torch.Tensor | None = None
    self_slot: torch.Tensor | str | None = None
    bias: torch.Tensor | None = None
    masked: float = float("-inf")
    self_only: float = float("-inf")


def chunked_window_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    before: int,
    after: int,
    wrap: bool = False,
    scores: WindowScores | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each chunk to its window of neighbouring chunks (module docstring).

    Args:
        query, key, value: ``(B, A, N, C, Dh)`` (float32 or float64); scores are ``q . k / sqrt(Dh)``.
        before, after: neighbouring chunks in each window (``K = (before + 1 + after) * C`` keys).
        wrap: the neighbours of the first / last chunks are the row's last / first chunks (else zeros, which the
            caller must mark blocked).
        scores: the masks and bias of the scores (`WindowScores`; None: nothing masked).
        dropout_p: dropout on the probabilities (the global RNG, as `dropout.dropout`).

    Returns:
        ``(B, A, N, C, Dh)`` outputs and ``(B, A, N, C)`` log-sum-exp of each query's masked scores.
    """
    if query.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"chunked_window_attention takes float32 or float64 vectors, got {query.dtype}.")
    scores = WindowScores() if scores is None else scores
    options = (before, after, wrap, scores.masked, scores.self_only, float(dropout_p))
    return _ChunkedAttention.apply(query, key, value, scores.blocked, scores.self_slot, scores.bias, options)


__all__ = ["WindowScores", "chunked_window_attention", "pad_chunks", "window_view"]
