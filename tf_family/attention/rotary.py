"""Rotary positions (Su et al. 2021, arXiv:2104.09864) in Llama's layout: the two halves of a head's vector are
rotated pairwise by angles ``position * base^(-2i / Dh)``. Shared by CALM (Llama-style decoders) and Reformer's
``"rotary"`` positions."""

from __future__ import annotations

import torch


def rotary_cos_sin(
    positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for ``positions`` ``(B, T)``: ``cos``, ``sin`` ``(B, 1, T, Dh)`` (Llama's default rope)."""
    inv_freq = 1.0 / (
        base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim)
    )
    freqs = positions[..., None].float() * inv_freq  # (B, T, Dh / 2)
    angles = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, Dh)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(tensor: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
    """``tensor`` ``(B, H, T, Dh)`` rotated by the tables of `rotary_cos_sin` (``None``: no rotary positions, the
    tensor as it is)."""
    if cos is None:
        return tensor
    first, second = tensor.chunk(2, dim=-1)
    cos, sin = cos.to(tensor.dtype), sin.to(tensor.dtype)  # under autocast the projections come out in bf16
    return tensor * cos + torch.cat([-second, first], dim=-1) * sin
