"""Dropout that is cheap on CPU: the math only (the `nn.Module` is `tf_family.modeling.utils.Dropout`).

PyTorch's CPU dropout draws one Bernoulli sample per element (``bernoulli_``, about 6 ns each on this project's
2-core machine). On the attention probabilities of a long sequence that costs more than the attention's matrix
products. `dropout_mask` draws 64 random bits at a time from the same generator and compares each 16-bit slice
with a threshold, four elements per draw (about 1 ns each). The drop probability is therefore rounded to a multiple
of ``1 / 65536`` (0.1 becomes 0.100006); the kept values are scaled by ``1 / (1 - rounded p)``, so the expected value
is exactly preserved, as with `torch.nn.functional.dropout`. The mask is applied as a product with its 0/1 float
image (a bool ``masked_fill`` or ``where`` over the same tensor is 4-6x slower on CPU). Seeding (`torch.manual_seed`,
a ``generator``) makes it reproducible. On other devices `dropout` is `torch.nn.functional.dropout`, whose fused
kernels are already fast.

`_dropout_levels` is the rounding rule of both CPU dropout paths: `dropout_mask` (also the mask `backend.attend`
hands to `masked.masked_attention`) and the native kernel's hashed mask (`native.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


__all__ = ["dropout", "dropout_mask"]
