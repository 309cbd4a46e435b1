"""GTrXL's gated residual (Parisotto et al. 2020, arXiv:1910.06764, "Stabilizing Transformers for Reinforcement
Learning"): a GRU-type gate in place of each residual connection of a Transformer-XL layer, with the layer norm moved
to the sublayer's input ("identity map reordering") and a ReLU on the sublayer's output.

The gate (section 3, eq. 5-8; ``x`` the residual stream, ``y`` the sublayer's output):

    r = sigmoid(W_r y + U_r x)
    z = sigmoid(W_z y + U_z x - b_g)
    h = tanh(W_g y + U_g (r * x))
    g(x, y) = (1 - z) * x + z * h

``b_g`` (``gate_bias``, 2 in the paper) is *subtracted*, so a fresh block keeps ``z`` near ``sigmoid(-2)`` = 0.12 and
passes the residual stream almost unchanged: the layer starts near the identity. The six matrices start Xavier-uniform
(`GRUGate.reset_parameters`, as ray's RLlib ``GRUGate`` does; DI-engine keeps PyTorch's default, of the same scale),
not at a model's small normal init (0.02): with ``W_g`` that small, a fresh gate passes a sublayer's output scaled by
about 0.02·√d, and the gated model learns several times slower than the ungated one
(``bench/bench_gtrxl_memory.py``). Reference: DI-engine
``ding/torch_utils/network/gtrxl.py`` (``GRUGatingUnit``, ``GatedTransformerXLLayer``), read, not copied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer

from .feed_forward import PositionwiseFeedForward
from .relative_attention import RelativeAttentionInputs, RelativeMultiHeadAttention


class GRUGate(nn.Module):
    """The GRU-type gate ``g(x, y)`` ``(..., D), (..., D) -> (..., D)``; ``gate_bias`` initialises ``b_g``."""

    def __init__(self, d_model: int, gate_bias: float):
        super().__init__()
        self.gate_bias_init = gate_bias
        self.reset_y = nn.Linear(d_model, d_model, bias=False)  # W_r
        self.reset_x = nn.Linear(d_model, d_model, bias=False)  # U_r
        self.update_y = nn.Linear(d_model, d_model, bias=False)  # W_z
        self.update_x = nn.Linear(d_model, d_model, bias=False)  # U_z
        self.candidate_y = nn.Linear(d_model, d_model, bias=False)  # W_g
        self.candidate_x = nn.Linear(d_model, d_model, bias=False)  # U_g
        self.gate_bias = nn.Parameter(torch.full((d_model,), float(gate_bias)))  # b_g
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Xavier-uniform matrices and ``b_g = gate_bias``: what a model's ``_init_weights`` calls for this module
        (after its linear layers got the model's normal init, which this overrides). Through transformers'
        ``initialization`` functions, which leave a parameter loaded by ``from_pretrained`` as it was loaded."""
        for linear in (self.reset_y, self.reset_x, self.update_y, self.update_x, self.candidate_y, self.candidate_x):
            init.xavier_uniform_(linear.weight)
        init.constant_(self.gate_bias, self.gate_bias_init)

    def forward(self, residual: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        reset = torch.sigmoid(self.reset_y(update) + self.reset_x(residual))
        keep = torch.sigmoid(self.update_y(update) + self.update_x(residual) - self.gate_bias)  # z
        candidate = torch.tanh(self.candidate_y(update) + self.candidate_x(reset * residual))
        return (1 - keep) * residual + keep * candidate  # (..., D)


class GatedRelativeDecoderLayer(GradientCheckpointingLayer):
    """One GTrXL layer: ``x1 = g1(x, ReLU(attention(LN(x))))``, ``out = g2(x1, ReLU(FF(LN(x1))))`` with
    Transformer-XL's relative attention over ``[memory, x]`` and its position-wise feed-forward block, each used
    without its own residual (the gates replace them). The attention and feed-forward modules must be pre-norm
    (``pre_lnorm=True``: their layer norms sit at the sublayer input)."""

    def __init__(self, attention: RelativeMultiHeadAttention, feed_forward: PositionwiseFeedForward, gate_bias: float):
        super().__init__()
        if not (attention.pre_lnorm and feed_forward.pre_lnorm):
            raise ValueError(
                "GatedRelativeDecoderLayer needs pre-norm sublayers (pre_lnorm=True): GTrXL puts the layer norm at "
                "each sublayer's input; set pre_lnorm=True."
            )
        d_model = attention.layer_norm.normalized_shape[0]
        self.attention = attention
        self.feed_forward = feed_forward
        self.attention_gate = GRUGate(d_model, gate_bias)
        self.feed_forward_gate = GRUGate(d_model, gate_bias)

    @classmethod
    def from_config(cls, config) -> GatedRelativeDecoderLayer:
        """The layer a Transformer-XL-family config with ``gate_bias`` describes."""
        return cls(
            RelativeMultiHeadAttention.from_config(config),
            PositionwiseFeedForward.from_config(config),
            config.gate_bias,
        )

    def forward(
        self,
        hidden: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        inputs: RelativeAttentionInputs | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(B, T, D)`` segment and ``(B, M, D)`` memory (or None) -> ``(B, T, D)`` and the probabilities."""
        attention = self.attention
        query, key, value = attention.project(hidden, memory)  # layer norm inside (pre_lnorm)
        attended, probs = attention.local_attention(query, key, value, inputs)  # (B, H, T, Dh)
        attended = attended.transpose(1, 2).reshape(*hidden.shape[:2], -1)  # (B, T, H*Dh)
        hidden = self.attention_gate(hidden, F.relu(attention.dropout(attention.out_proj(attended))))
        ff = self.feed_forward
        inner = ff.dropout(F.relu(ff.fc_in(ff.layer_norm(hidden))))  # (B, T, d_inner)
        return self.feed_forward_gate(hidden, F.relu(ff.dropout(ff.fc_out(inner)))), probs


__all__ = ["GRUGate", "GatedRelativeDecoderLayer"]
