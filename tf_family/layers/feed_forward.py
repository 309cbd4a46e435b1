"""The position-wise feed-forward block of the Transformer-XL family (Dai et al. 2019), shared by Transformer-XL and
the Compressive Transformer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """``x + FF(LN(x))`` with ``pre_lnorm``, else ``LN(x + FF(x))`` (the paper); ``FF`` is
    ``Linear(d_model, d_inner) -> ReLU -> dropout -> Linear(d_inner, d_model) -> dropout``."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool, layer_norm_epsilon: float):
        super().__init__()
        self.pre_lnorm = pre_lnorm
        self.fc_in = nn.Linear(d_model, d_inner)
        self.fc_out = nn.Linear(d_inner, d_model)
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_epsilon)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def from_config(cls, config) -> PositionwiseFeedForward:
        """The block a Transformer-XL-family config describes (``d_model``, ``d_inner``, ``dropout``, …)."""
        return cls(config.d_model, config.d_inner, config.dropout, config.pre_lnorm, config.layer_norm_epsilon)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inputs = self.layer_norm(hidden) if self.pre_lnorm else hidden
        out = self.dropout(self.fc_out(self.dropout(F.relu(self.fc_in(inputs)))))  # (B, T, D)
        return hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)


__all__ = ["PositionwiseFeedForward"]
