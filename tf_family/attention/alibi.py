"""ALiBi, attention with linear biases (Press, Smith & Lewis, ICLR 2022, arXiv:2108.12409): no position embeddings;
head ``h`` adds ``-m_h * (i - j)`` to the score of query position ``i`` and key position ``j``.

The slopes ``m_h`` are the geometric sequence that starts at ``2^(-8 / n)`` with that ratio, for ``n`` heads a power
of two. For other head counts the paper's code (ofirpress/attention_with_linear_biases, ``get_slopes``) takes the
slopes of the nearest lower power of two ``p`` and then every other slope of ``2p`` heads (``[0::2]``), up to ``n``;
`alibi_slopes` follows it (for 12 heads: ``2^-1 … 2^-8`` then ``2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5``, the vector of the
reference repository's issue #17, which `tests/attention/test_alibi.py` checks).

The paper defines ALiBi for causal attention (``i >= j``); `alibi_bias` takes the signed distance as it is, so a
key after the query gets a positive bias. Pure functions: tensors and plain numbers in, tensors out.
"""

from __future__ import annotations

import math

import torch


def _power_of_two_slopes(num_heads: int) -> list[float]:
    start = 2.0 ** (-8.0 / num_heads)
    return [start ** (head + 1) for head in range(num_heads)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The slopes ``m_h`` of ``num_heads`` heads, ``(H,)`` float32 (see the module docstring for head counts that are
    not powers of two)."""
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"num_heads must be an int >= 1, got {num_heads!r}.")
    lower = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _power_of_two_slopes(lower)
    if lower < num_heads:
        slopes += _power_of_two_slopes(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """``-m_h * (i - j)`` for every head, query and key: ``(B, H, T, S)`` float32.

    Args:
        slopes: ``(H,)`` from `alibi_slopes`.
        query_positions: ``(B, T)`` positions ``i`` of the queries.
        key_positions: ``(B, S)`` positions ``j`` of the keys.
    """
    distance = (query_positions[:, :, None] - key_positions[:, None, :]).to(torch.float32)  # (B, T, S)
    return -slopes.to(distance.device)[None, :, None, None] * distance[:, None]  # (B, H, T, S)


__all__ = ["alibi_bias", "alibi_slopes"]
