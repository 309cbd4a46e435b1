"""BERT's sublayers that Longformer and BigBird use unchanged (Devlin et al. 2019, arXiv:1810.04805)."""

from __future__ import annotations

import torch
from torch import nn

from ..modeling.utils import Dropout, build_activation


class BertFeedForward(nn.Module):
    """BERT's position-wise feed-forward block with a post-layer-norm residual:
    ``layer_norm(x + dropout(fc_out(activation(fc_in(x)))))`` (any activation, dropout on the output only; the
    Transformer-XL family's block, with ReLU and an inner dropout, is `PositionwiseFeedForward`).

    Args:
        hidden_size: model width D.
        intermediate_size: inner width (4 D in BERT).
        activation: a key of `transformers.activations.ACT2FN` (see `tf_family.modeling.utils.build_activation`).
        layer_norm_eps: epsilon of the layer norm.
        dropout_prob: dropout on the block's output, before the residual.
    """

    def __init__(
        self, hidden_size: int, intermediate_size: int, activation: str, layer_norm_eps: float, dropout_prob: float
    ):
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, intermediate_size)
        self.activation = build_activation(activation)
        self.fc_out = nn.Linear(intermediate_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = Dropout(dropout_prob)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(hidden + self.dropout(self.fc_out(self.activation(self.fc_in(hidden)))))  # (B, T, D)


__all__ = ["BertFeedForward"]
