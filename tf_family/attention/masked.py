"""Masked softmax attention with dropout whose backward is written out by hand.

`masked_attention` is ``softmax(q k^T / sqrt(Dh) + bias)`` with dropout on the probabilities, times ``v``. Its
backward needs only the probabilities and the dropout mask (``P * dP = P_kept * dP_kept``), which saves the
element-wise passes and the copies of PyTorch's math attention (the path `scaled_dot_product_attention` takes on
CPU whenever dropout is on). `masked_attention_reference` is its plain-autograd twin. `backend.attend` chooses it
for CPU training where the native kernel (`native.fused_attention`) is not available.
"""

from __future__ import annotations

import torch

from .dropout import _kept_factor


def _batched(tensor: torch.Tensor) -> torch.Tensor:
    """``(..., X, Y)`` -> ``(batch, X, Y)`` (a view when the leading dims allow it), for `torch.bmm`."""
    return tensor.reshape(-1, *tensor.shape[-2:])


class _MaskedAttention(torch.autograd.Function):
    # Few fresh (..., T, S) buffers and in-place passes: on CPU every new buffer of that size costs page faults.
    # Products go through `torch.bmm` on 3-D views, which takes transposed operands without copying them. The dropout
    # scale is applied to the (..., T, Dh) side (the output and its gradient), not to the (..., T, S) probabilities.
    @staticmethod
    def forward(ctx, query, key, value, bias, kept, scale):
        shape = query.shape
        scaled_query = _batched(query * shape[-1] ** -0.5)  # (B*, T, Dh)
        key, value = _batched(key), _batched(value)  # (B*, S, Dh)
        probs = torch.bmm(scaled_query, key.transpose(1, 2)).view(*shape[:-1], key.shape[1])  # scores (..., T, S)
        if bias is not None:
            probs.add_(bias)
        torch.softmax(probs, dim=-1, out=probs)
        ctx.save_for_backward(scaled_query, key, value, probs, kept)
        ctx.scale = scale
        if kept is None:
            return torch.bmm(_batched(probs), value).view(shape)
        return torch.bmm(_batched(_kept_factor(kept, probs.dtype).mul_(probs)), value).mul_(scale).view(shape)

    @staticmethod
    def backward(ctx, grad_out):
        scaled_query, key, value, probs, kept = ctx.saved_tensors
        shape = grad_out.shape
        grad_out = _batched(grad_out if kept is None else grad_out * ctx.scale)  # (B*, T, Dh), dropout scale in
        probs = _batched(probs)
        masked = probs if kept is None else _kept_factor(_batched(kept), probs.dtype).mul_(probs)  # unscaled
        grad_value = torch.bmm(masked.transpose(1, 2), grad_out) if ctx.needs_input_grad[2] else None
        # softmax backward through the dropout: P * dP = P_kept * dP_kept
        grad_scores = torch.bmm(grad_out, value.transpose(1, 2)).mul_(masked)  # (B*, T, S)
        del masked
        grad_scores.addcmul_(probs, grad_scores.sum(dim=-1, keepdim=True), value=-1)
        scale = shape[-1] ** -0.5
        key_shape = (*shape[:-2], key.shape[1], shape[-1])
        grad_query = torch.bmm(grad_scores, key).mul_(scale).view(shape) if ctx.needs_input_grad[0] else None
        grad_key = None
        if ctx.needs_input_grad[1]:
            grad_key = torch.bmm(grad_scores.transpose(1, 2), scaled_query).view(key_shape)
        if grad_value is not None:
            grad_value = grad_value.view(key_shape)
        return grad_query, grad_key, grad_value, None, None, None


def _check_shapes(query, key, value, kept) -> None:
    if key.shape != value.shape or query.shape[:-2] != key.shape[:-2] or query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query (..., T, Dh), key and value (..., S, Dh) must share their leading dims and Dh, got "
            f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}."
        )
    expected = (*query.shape[:-1], key.shape[-2])
    if kept is not None and (kept.dtype != torch.bool or tuple(kept.shape) != expected):
        raise ValueError(
            f"kept must be a bool tensor of shape {expected} (one entry per attention probability), got "
            f"{kept.dtype} {tuple(kept.shape)}; build it with dropout_mask."
        )


def masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None = None,
    kept: torch.Tensor | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Softmax attention with an additive score bias and an explicit dropout mask on the probabilities.

    Args:
        query: ``(..., T, Dh)``; key, value: ``(..., S, Dh)`` with the same leading dims.
        bias: float, broadcastable to ``(..., T, S)``; ``-inf`` masks a key. Every row needs one finite entry.
        kept: ``(..., T, S)`` bool, False for the probabilities dropout zeroes (`dropout_mask`); None: no dropout.
        scale: the factor for the kept probabilities (``1 / (1 - p)``).

    Returns:
        ``(..., T, Dh)``. No gradient flows to ``bias``.
    """
    _check_shapes(query, key, value, kept)
    return _MaskedAttention.apply(query, key, value, bias, kept, scale)


def masked_attention_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor | None = None,
    kept: torch.Tensor | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Plain-autograd twin of `masked_attention`."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * query.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    probs = scores.softmax(dim=-1)
    if kept is not None:
        probs = probs * kept * scale
    return torch.matmul(probs, value)


__all__ = ["masked_attention", "masked_attention_reference"]
