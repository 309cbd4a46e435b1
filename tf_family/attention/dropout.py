"""Dropout that is cheap on CPU, and masked softmax attention with dropout whose backward is written out by hand.

PyTorch's CPU dropout draws one Bernoulli sample per element (``bernoulli_``, about 6 ns each on this project's
2-core machine). On the attention probabilities of a long sequence that costs more than the attention's matrix
products. `dropout_mask` draws 64 random bits at a time from the same generator and compares each 16-bit slice
with a threshold, four elements per draw (about 1 ns each). The drop probability is therefore rounded to a multiple
of ``1 / 65536`` (0.1 becomes 0.100006); the kept values are scaled by ``1 / (1 - rounded p)``, so the expected value
is exactly preserved, as with `torch.nn.functional.dropout`. The mask is applied as a product with its 0/1 float
image (a bool ``masked_fill`` or ``where`` over the same tensor is 4-6x slower on CPU). Seeding (`torch.manual_seed`,
a ``generator``) makes it reproducible. On other devices `dropout` is `torch.nn.functional.dropout`, whose fused
kernels are already fast.

`masked_attention` is ``softmax(q k^T / sqrt(Dh) + bias)`` with dropout on the probabilities, times ``v``. Its
backward needs only the probabilities and the dropout mask (``P * dP = P_kept * dP_kept``), which saves the
element-wise passes and the copies of PyTorch's math attention (the path `scaled_dot_product_attention` takes on
CPU whenever dropout is on). `masked_attention_reference` is its plain-autograd twin.

`attention_under_mask` is the one place the kernels choose how to attend: PyTorch's SDPA in eval, and for CPU
training tf_family's native fused kernel (`native.fused_attention`, compiled on first use) or, where that cannot be
built or ``TF_FAMILY_NATIVE=0``, `masked_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 65536  # 16-bit slices of the random words


def _check_p(p: float) -> None:
    if not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1), got {p!r}.")


def _dropout_levels(p: float) -> tuple[int, float]:
    """How many of the 65536 levels a drop probability rounds to, and the scale that keeps the expectation (the rule of
    both CPU dropout paths: `dropout_mask` and the native kernel's hashed mask)."""
    dropped = round(p * _LEVELS)
    return dropped, _LEVELS / (_LEVELS - dropped)


def dropout_mask(
    shape: tuple[int, ...] | torch.Size,
    p: float,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, float]:
    """A bool mask of ``shape``, True where a value is *kept*, and the scale for the kept values.

    Each element is dropped with probability ``round(p * 65536) / 65536``; the scale is ``1 / (1 - that)``.
    """
    _check_p(p)
    numel = 1
    for size in shape:
        numel *= int(size)
    words = -(-numel // 4)
    bits = torch.randint(-(2**63), 2**63 - 1, (words,), dtype=torch.int64, device=device, generator=generator)
    num_dropped, scale = _dropout_levels(p)
    kept = bits.view(torch.int16)[:numel] >= num_dropped - _LEVELS // 2
    return kept.view(shape), scale


def _kept_factor(kept: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The mask as a fresh 0/1 tensor of ``dtype`` (through ``uint8``: the direct bool cast is slower on CPU)."""
    return kept.view(torch.uint8).to(dtype)


def _apply_mask(tensor: torch.Tensor, kept: torch.Tensor, scale: float) -> torch.Tensor:
    return _kept_factor(kept, tensor.dtype).mul_(tensor).mul_(scale)


class _DropoutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, kept: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(kept)
        ctx.scale = scale
        return _apply_mask(tensor, kept, scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (kept,) = ctx.saved_tensors
        return _apply_mask(grad, kept, ctx.scale), None, None


def dropout(tensor: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    """`torch.nn.functional.dropout` (not in place), with `dropout_mask` on CPU."""
    _check_p(p)
    if not training or p == 0.0:
        return tensor
    if tensor.device.type != "cpu":
        return F.dropout(tensor, p, training=True)
    kept, scale = dropout_mask(tensor.shape, p, tensor.device)
    return _DropoutFunction.apply(tensor, kept, scale)


class Dropout(nn.Dropout):
    """`torch.nn.Dropout` computed by `dropout` (same ``p``, no state; ``inplace`` is not supported)."""

    def __init__(self, p: float = 0.5):
        _check_p(p)
        super().__init__(p)

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return dropout(tensor, self.p, self.training)


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


def takes_masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """Whether `attention_under_mask` computes with `masked_attention`: on CPU in float32/64, under dropout (PyTorch
    then takes its unfused math path) or when a gradient is needed (PyTorch's fused CPU backward is slower: measured
    1.2-1.35x ours forward+backward at the chunk shapes of Longformer and BigBird, 2 cores)."""
    if query.device.type != "cpu" or query.dtype not in (torch.float32, torch.float64):
        return False
    return dropout_p > 0.0 or (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))


def attention_backend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> str:
    """Which function `attention_under_mask` computes with: ``"sdpa"`` (PyTorch's), or where our own is faster
    (`takes_masked_attention`) ``"native"`` (the fused kernel, `native.fused_attention`; 4-D inputs, when built) or
    ``"masked"`` (`masked_attention`)."""
    from . import native  # imported here: native imports this module

    if not takes_masked_attention(query, key, value, dropout_p):
        return "sdpa"
    return "native" if query.dim() == 4 and native.extension() is not None else "masked"


def attention_under_mask(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor, dropout_p: float = 0.0
) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention` under a bool mask (True: may attend), or our native kernel or
    `masked_attention` where those are faster (`attention_backend`). Every row of ``allowed`` needs one True entry."""
    backend = attention_backend(query, key, value, dropout_p)
    if backend == "sdpa":
        return F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, dropout_p=dropout_p)
    everything = bool(allowed.all())
    if backend == "native":
        from . import native

        return native.fused_attention(query, key, value, None if everything else allowed, dropout_p)
    bias = None  # nothing masked (e.g. BigBird's middle blocks without padding): no pass over the scores for it
    if not everything:
        bias = allowed.view(torch.uint8).to(query.dtype).log_()  # 0 where allowed, -inf elsewhere
    kept, scale = None, 1.0
    if dropout_p > 0.0:
        kept, scale = dropout_mask((*query.shape[:-1], key.shape[-2]), dropout_p, query.device)
    return masked_attention(query, key, value, bias, kept, scale)


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


__all__ = [
    "Dropout",
    "attention_backend",
    "attention_under_mask",
    "dropout",
    "dropout_mask",
    "masked_attention",
    "masked_attention_reference",
    "takes_masked_attention",
]
