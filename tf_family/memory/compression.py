"""Memory compression of the Compressive Transformer (Rae et al. 2019, arXiv:1911.05507, section 3.1).

When states leave the (FIFO) memory, a compression function ``f_c`` maps every ``c`` of them (the compression rate)
to one compressed memory slot. The paper compares five functions, all here as pure tensor functions:

    max pooling, mean pooling          kernel = stride = c
    1D convolution                     kernel = stride = c (learned)
    dilated convolution                a stack of kernel-2 convolutions with dilations 1, 2, 4, ... inside each group
                                       of c states (learned; receptive field the whole group)
    most-used                          keep the ``N / c`` states that received the most attention, in order

Every function takes ``states`` ``(B, N, D)`` with ``N`` a multiple of ``c`` and a slot mask ``(B, N)`` (``True`` for
real states; reset or padded slots are ``False``), and returns ``(B, N / c, D)`` states plus their mask. Masked
states never reach a compressed slot (they are left out of the pooling / selection and zeroed before a
convolution), so a row reset at a document boundary cannot leak its old document into the compressed memory. A
compressed slot is real when at least one of its sources is real.

The auxiliary losses (section 3.2) live here too: the attention-reconstruction loss compares content-based attention
over the old memories with attention over their compression; the auto-encoding loss compares the old memories with
a decoding of their compression. Each efficient function has a slow ``*_reference`` twin that the tests compare it
against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

CompressionKind = Literal["max_pool", "mean_pool", "conv", "dilated_conv", "most_used"]
COMPRESSION_KINDS: tuple[str, ...] = ("max_pool", "mean_pool", "conv", "dilated_conv", "most_used")


def _check(states: torch.Tensor, mask: torch.Tensor, rate: int) -> None:
    if not isinstance(rate, int) or isinstance(rate, bool) or rate < 1:
        raise ValueError(f"rate must be an int >= 1 (the compression rate c), got {rate!r}.")
    if states.dim() != 3:
        raise ValueError(f"states must have shape (B, N, D), got {tuple(states.shape)}.")
    if states.shape[1] % rate:
        raise ValueError(
            f"states hold {states.shape[1]} slots, not a multiple of rate={rate}; compress whole groups of rate slots."
        )
    if mask.shape != states.shape[:2]:
        raise ValueError(f"mask must have shape {tuple(states.shape[:2])}, got {tuple(mask.shape)}.")


def _grouped_mask(mask: torch.Tensor, rate: int) -> torch.Tensor:
    """``(B, N)`` -> ``(B, N / c)``: a compressed slot is real when any of its ``c`` sources is real."""
    return mask.view(mask.shape[0], -1, rate).any(dim=-1)


def dilated_conv_layers(rate: int) -> int:
    """Number of kernel-2 layers (dilations ``1, 2, ..., 2**(L-1)``) whose receptive field covers ``rate`` states."""
    return math.ceil(math.log2(rate)) if rate > 1 else 0


# ------------------------------------------------------------------------------------------------------- pooling
def max_pool_compress(states: torch.Tensor, mask: torch.Tensor, rate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Element-wise maximum over each group of ``rate`` consecutive real states (0 for a group with none)."""
    _check(states, mask, rate)
    batch, length, width = states.shape
    lowest = torch.finfo(states.dtype).min
    grouped = states.masked_fill(~mask[..., None], lowest).view(batch, length // rate, rate, width)  # (B, N/c, c, D)
    compressed_mask = _grouped_mask(mask, rate)  # (B, N/c)
    compressed = grouped.amax(dim=2).masked_fill(~compressed_mask[..., None], 0.0)  # (B, N/c, D)
    return compressed, compressed_mask


def max_pool_compress_reference(states, mask, rate):
    """Slow twin of :func:`max_pool_compress`: one group at a time."""
    batch, length, width = states.shape
    out = states.new_zeros(batch, length // rate, width)
    out_mask = torch.zeros(batch, length // rate, dtype=torch.bool)
    for b in range(batch):
        for g in range(length // rate):
            real = [states[b, g * rate + k] for k in range(rate) if mask[b, g * rate + k]]
            if real:
                out[b, g] = torch.stack(real).max(dim=0).values
                out_mask[b, g] = True
    return out, out_mask


def mean_pool_compress(states: torch.Tensor, mask: torch.Tensor, rate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over the real states of each group of ``rate`` consecutive states (0 for a group with none)."""
    _check(states, mask, rate)
    batch, length, width = states.shape
    weights = mask.to(states.dtype).view(batch, length // rate, rate, 1)  # (B, N/c, c, 1)
    grouped = states.view(batch, length // rate, rate, width)  # (B, N/c, c, D)
    total = (grouped * weights).sum(dim=2)  # (B, N/c, D)
    count = weights.sum(dim=2).clamp(min=1.0)  # (B, N/c, 1)
    return total / count, _grouped_mask(mask, rate)


def mean_pool_compress_reference(states, mask, rate):
    """Slow twin of :func:`mean_pool_compress`."""
    batch, length, width = states.shape
    out = states.new_zeros(batch, length // rate, width)
    out_mask = torch.zeros(batch, length // rate, dtype=torch.bool)
    for b in range(batch):
        for g in range(length // rate):
            real = [states[b, g * rate + k] for k in range(rate) if mask[b, g * rate + k]]
            if real:
                out[b, g] = torch.stack(real).mean(dim=0)
                out_mask[b, g] = True
    return out, out_mask


# -------------------------------------------------------------------------------------------------- convolutions
def conv_compress(
    states: torch.Tensor, mask: torch.Tensor, rate: int, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """1D convolution with kernel = stride = ``rate``: compressed slot ``g`` is
    ``sum_k W[:, :, k] @ x[g*c + k] + b``. Masked states enter as zeros.

    Args:
        weight: ``(D_out, D, c)`` (the layout of ``nn.Conv1d``).
        bias: ``(D_out,)`` or ``None``.
    """
    _check(states, mask, rate)
    if weight.shape[1:] != (states.shape[-1], rate):
        raise ValueError(f"weight must have shape (D_out, {states.shape[-1]}, {rate}), got {tuple(weight.shape)}.")
    batch, length, width = states.shape
    grouped = states.masked_fill(~mask[..., None], 0.0).view(batch, length // rate, rate, width)  # (B, N/c, c, D)
    compressed = torch.einsum("bgkd,edk->bge", grouped, weight.to(states.dtype))  # (B, N/c, D_out)
    if bias is not None:
        compressed = compressed + bias.to(states.dtype)
    return compressed, _grouped_mask(mask, rate)


def conv_compress_reference(states, mask, rate, weight, bias):
    """Slow twin of :func:`conv_compress`: `torch.nn.functional.conv1d` with kernel = stride = rate."""
    inputs = states.masked_fill(~mask[..., None], 0.0).transpose(1, 2)  # (B, D, N)
    out = F.conv1d(inputs, weight, bias, stride=rate).transpose(1, 2)  # (B, N/c, D_out)
    return out, mask.view(mask.shape[0], -1, rate).any(-1)


def dilated_conv_compress(
    states: torch.Tensor,
    mask: torch.Tensor,
    rate: int,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """A stack of causal kernel-2 convolutions with dilations ``1, 2, 4, ...`` run inside each group of ``rate``
    states (zero padding on the left of the group), ReLU between layers; the compressed slot is the output at the
    group's last state, whose receptive field is the whole group (WaveNet-style dilation, so ``ceil(log2 c)``
    layers of ``2 D^2`` weights replace one ``c D^2`` kernel). Masked states enter as zeros.

    Args:
        weights: ``dilated_conv_layers(rate)`` tensors ``(D, D, 2)``; tap 0 reads ``x[t - dilation]``, tap 1 ``x[t]``.
        biases: as many ``(D,)`` tensors (or ``None``).
    """
    _check(states, mask, rate)
    if len(weights) != dilated_conv_layers(rate) or len(biases) != len(weights):
        raise ValueError(
            f"rate={rate} needs {dilated_conv_layers(rate)} dilated layers (weights and biases), got "
            f"{len(weights)} weights and {len(biases)} biases."
        )
    batch, length, width = states.shape
    groups = length // rate
    hidden = states.masked_fill(~mask[..., None], 0.0).reshape(batch * groups, rate, width).transpose(1, 2)
    for layer, (weight, bias) in enumerate(zip(weights, biases, strict=True)):  # hidden: (B*N/c, D, c)
        dilation = 2**layer
        hidden = F.conv1d(F.pad(hidden, (dilation, 0)), weight.to(hidden.dtype), bias, dilation=dilation)
        if layer < len(weights) - 1:
            hidden = F.relu(hidden)
    compressed = hidden[..., -1].reshape(batch, groups, -1)  # (B, N/c, D)
    return compressed, _grouped_mask(mask, rate)


def dilated_conv_compress_reference(states, mask, rate, weights, biases):
    """Slow twin of :func:`dilated_conv_compress`: every tap of every layer, one group at a time."""
    batch, length, width = states.shape
    out = states.new_zeros(batch, length // rate, width)
    for b in range(batch):
        for g in range(length // rate):
            hidden = [states[b, g * rate + t] * mask[b, g * rate + t] for t in range(rate)]
            for layer, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
                dilation = 2**layer
                new = []
                for t in range(rate):
                    value = weight[:, :, 1] @ hidden[t]
                    if t - dilation >= 0:
                        value = value + weight[:, :, 0] @ hidden[t - dilation]
                    if bias is not None:
                        value = value + bias
                    new.append(value.relu() if layer < len(weights) - 1 else value)
                hidden = new
            out[b, g] = hidden[-1]
    return out, mask.view(batch, -1, rate).any(-1)


# ---------------------------------------------------------------------------------------------------- most-used
def most_used_compress(
    states: torch.Tensor, mask: torch.Tensor, rate: int, usage: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the ``N / rate`` states with the highest ``usage`` (the attention they received), in their original
    order. Masked states are chosen last; ties go to the older state.

    Args:
        usage: ``(B, N)`` float, e.g. the mean attention probability each state received.
    """
    _check(states, mask, rate)
    if usage.shape != mask.shape:
        raise ValueError(f"usage must have shape {tuple(mask.shape)}, got {tuple(usage.shape)}.")
    keep = states.shape[1] // rate
    scores = usage.float().masked_fill(~mask, -math.inf)  # (B, N)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]  # (B, N/c)
    chosen = order.sort(dim=1).values  # (B, N/c) in memory order
    compressed = states.gather(1, chosen[..., None].expand(-1, -1, states.shape[-1]))  # (B, N/c, D)
    return compressed, mask.gather(1, chosen)


def most_used_compress_reference(states, mask, rate, usage):
    """Slow twin of :func:`most_used_compress`: a Python sort per row."""
    batch, length, width = states.shape
    keep = length // rate
    out = states.new_zeros(batch, keep, width)
    out_mask = torch.zeros(batch, keep, dtype=torch.bool)
    for b in range(batch):
        ranked = sorted(range(length), key=lambda j: (not bool(mask[b, j]), -float(usage[b, j]), j))
        for slot, j in enumerate(sorted(ranked[:keep])):
            out[b, slot] = states[b, j]
            out_mask[b, slot] = mask[b, j]
    return out, out_mask


def compress_memory(
    kind: str,
    states: torch.Tensor,
    mask: torch.Tensor,
    rate: int,
    *,
    weights: Sequence[torch.Tensor] = (),
    biases: Sequence[torch.Tensor | None] = (),
    usage: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compress ``states`` ``(B, N, D)`` to ``(B, N / rate, D)`` with the paper's function ``kind``.

    ``weights``/``biases`` are the learned parameters of ``"conv"`` (one ``(D, D, c)`` kernel) and
    ``"dilated_conv"`` (one ``(D, D, 2)`` kernel per layer); ``usage`` is needed by ``"most_used"``.
    """
    if kind == "max_pool":
        return max_pool_compress(states, mask, rate)
    if kind == "mean_pool":
        return mean_pool_compress(states, mask, rate)
    if kind == "conv":
        if len(weights) != 1:
            raise ValueError(f"compression 'conv' needs exactly one weight, got {len(weights)}.")
        return conv_compress(states, mask, rate, weights[0], biases[0] if biases else None)
    if kind == "dilated_conv":
        return dilated_conv_compress(states, mask, rate, weights, biases or [None] * len(weights))
    if kind == "most_used":
        if usage is None:
            raise ValueError("compression 'most_used' needs usage (the attention each state received).")
        return most_used_compress(states, mask, rate, usage)
    raise ValueError(f"Unknown compression {kind!r}; choose one of {COMPRESSION_KINDS}.")


# ------------------------------------------------------------------------------------------------------ decoding
def conv_transpose_decompress(
    compressed: torch.Tensor, rate: int, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Decoder ``g`` of the auto-encoding loss: a transposed convolution with kernel = stride = ``rate`` that maps
    every compressed slot back to ``rate`` states: ``out[g*c + k] = W[:, :, k]^T @ y[g] + b``.

    Args:
        compressed: ``(B, G, D)``.
        weight: ``(D, D_out, c)`` (the layout of ``nn.ConvTranspose1d``).

    Returns:
        ``(B, G * c, D_out)``.
    """
    if weight.shape[0] != compressed.shape[-1] or weight.shape[2] != rate:
        raise ValueError(f"weight must have shape ({compressed.shape[-1]}, D_out, {rate}), got {tuple(weight.shape)}.")
    batch, groups, _ = compressed.shape
    out = torch.einsum("bgd,dek->bgke", compressed, weight.to(compressed.dtype))  # (B, G, c, D_out)
    out = out.reshape(batch, groups * rate, -1)  # (B, G*c, D_out)
    return out if bias is None else out + bias.to(out.dtype)


def conv_transpose_decompress_reference(compressed, rate, weight, bias):
    """Slow twin of :func:`conv_transpose_decompress`: `torch.nn.functional.conv_transpose1d`."""
    return F.conv_transpose1d(compressed.transpose(1, 2), weight, bias, stride=rate).transpose(1, 2)


# -------------------------------------------------------------------------------------------------------- losses
def content_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_mask: torch.Tensor
) -> torch.Tensor:
    """Content-based attention ``softmax(q k^T / sqrt(Dh)) v`` over the real keys (no positions, no mask of the
    future: every query sees every real memory slot). Rows without a real key give zeros.

    Args:
        query: ``(B, H, T, Dh)``; key, value: ``(B, H, N, Dh)``; key_mask: ``(B, N)`` bool.

    Returns:
        ``(B, H, T, Dh)``.
    """
    scores = torch.einsum("bhtd,bhnd->bhtn", query, key).float() * query.shape[-1] ** -0.5  # (B, H, T, N)
    scores = scores.masked_fill(~key_mask[:, None, None, :], -math.inf)
    probs = torch.nan_to_num(scores.softmax(dim=-1), nan=0.0)  # rows with no real key: all -inf -> NaN -> 0
    return probs.to(value.dtype) @ value  # (B, H, T, Dh)


def attention_reconstruction_loss(
    query: torch.Tensor,
    old: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    compressed: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """The paper's attention-reconstruction loss for one layer:
    ``|| attn(h, old_mem) - attn(h, f_c(old_mem)) ||^2``, as a mean squared error.

    Args:
        query: ``(B, H, T, Dh)`` queries of the current segment.
        old: ``(key, value, mask)`` of the states that left the memory: ``(B, H, N, Dh)``, same, ``(B, N)``.
        compressed: ``(key, value, mask)`` of their compression: ``(B, H, N / c, Dh)``, same, ``(B, N / c)``.

    Returns:
        A scalar: the mean over the batch rows that had at least one real old state, the heads, the queries and
        the head width (0 when no row had one).
    """
    target = content_attention(query, *old)  # (B, H, T, Dh)
    estimate = content_attention(query, *compressed)  # (B, H, T, Dh)
    rows = old[2].any(dim=1)  # (B,)
    if not rows.any():
        return estimate.new_zeros(()).float()
    return (estimate[rows].float() - target[rows].float()).pow(2).mean()


def autoencoding_loss(original: torch.Tensor, reconstructed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The paper's auto-encoding loss ``|| old_mem - g(f_c(old_mem)) ||^2`` as a mean squared error over the real
    old states (``original``, ``reconstructed``: ``(B, N, D)``; ``mask``: ``(B, N)``); 0 when none is real."""
    if not mask.any():
        return reconstructed.new_zeros(()).float()
    return (reconstructed[mask].float() - original[mask].float()).pow(2).mean()


__all__ = [
    "COMPRESSION_KINDS",
    "CompressionKind",
    "attention_reconstruction_loss",
    "autoencoding_loss",
    "compress_memory",
    "content_attention",
    "conv_compress",
    "conv_transpose_decompress",
    "dilated_conv_compress",
    "dilated_conv_layers",
    "max_pool_compress",
    "mean_pool_compress",
    "most_used_compress",
]
