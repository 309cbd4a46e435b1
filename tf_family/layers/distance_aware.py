"""DA-Transformer's learned distance re-scaling (Wu, Wu & Huang, NAACL 2021, arXiv:2010.06925): the per-head
parameters of one attention layer, ``w_h`` (weight on the real distance ``|i - j|``) and ``v_h`` (the learnable
sigmoid's offset). The math is `tf_family.attention.distance_aware` (its module docstring has the formula).

Initial values (the paper's are not stated in what we read): ``w_h`` evenly spread over ``[-1, 1]`` across the heads
(from heads that prefer near keys to heads that prefer far ones; one head: ``-1``), ``v_h = 0`` (``f`` in
``(0, 2)``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.distance_aware import DistanceAware


def initial_distance_weights(num_heads: int) -> torch.Tensor:
    """``(H,)``: ``w_h`` evenly spread over ``[-1, 1]`` (``-1`` for one head)."""
    return torch.linspace(-1.0, 1.0, num_heads) if num_heads > 1 else torch.full((1,), -1.0)


class DistanceAwareScaling(nn.Module):
    """``weight`` ``w`` ``(H,)`` and ``offset`` ``v`` ``(H,)`` of one layer; `heads` hands a slice of them to the
    attention kernels as a `DistanceAware`."""

    def __init__(self, num_heads: int):
        super().__init__()
        self.weight = nn.Parameter(initial_distance_weights(num_heads))
        self.offset = nn.Parameter(torch.zeros(num_heads))

    def heads(self, first: int = 0, end: int | None = None) -> DistanceAware:
        """The re-scaling of heads ``first .. end - 1`` (all by default)."""
        return DistanceAware(self.weight[first:end], self.offset[first:end])

    def extra_repr(self) -> str:
        return f"num_heads={self.weight.shape[0]}"


__all__ = ["DistanceAwareScaling", "initial_distance_weights"]
