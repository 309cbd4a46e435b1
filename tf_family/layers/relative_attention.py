"""Transformer-XL's attention and decoder layer (Dai et al. 2019, arXiv:1901.02860, section 3.3), shared by the
Transformer-XL family: Transformer-XL, the Compressive Transformer (which passes ``[compressed memory, memory]`` as
the memory) and the Memorizing Transformer (whose kNN-augmented layer calls the steps one by one).

Multi-head attention over ``[memory, segment]`` with relative positions: the score of query ``i`` and key ``j`` is
``(q_i + u) . k_j + (q_i + v) . r_(i-j)`` scaled by ``1 / sqrt(Dh)``. The attention goes through
`tf_family.attention.attend` with the implementation the caller passes (``config._attn_implementation``).

What every layer of one forward pass reads besides its own hidden states and memory (the position embedding, the
mask, the shared biases, the attention implementation) travels in one `RelativeAttentionInputs`, passed by keyword.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from ..attention import attend, relative_position_scores
from .feed_forward import PositionwiseFeedForward

# the config fields (of every Transformer-XL-family config) that `RelativeMultiHeadAttention` takes, by name
_ATTENTION_FIELDS = ("d_model", "n_head", "d_head", "dropout", "dropatt", "pre_lnorm", "layer_norm_epsilon", "untie_r")


@dataclass(frozen=True, eq=False)
class RelativeAttentionInputs:
    """What every layer of one forward pass reads besides its hidden states and memory (the same for all layers)."""

    position_embedding: torch.Tensor  # (S, D): sinusoids of the relative distances S - 1, ..., 0
    allowed: torch.Tensor  # (B or 1, 1, T, S) bool: the query-key pairs that may attend
    shared_biases: tuple[torch.Tensor, torch.Tensor] | None = None  # (u, v) of all layers (untie_r=False), or None
    output_attentions: bool = False  # return the probabilities (computed by the eager dense twin)
    implementation: str | None = "sdpa"  # config._attn_implementation


class RelativeMultiHeadAttention(nn.Module):
    """Multi-head attention over ``[memory, segment]`` with relative positions; residual and layer norm included.

    Args:
        d_model: residual width D. n_head: heads H. d_head: head width Dh.
        dropout: dropout on the output. dropatt: dropout on the attention probabilities.
        pre_lnorm: layer norm before the block (True) or after the residual (False, the paper).
        layer_norm_epsilon: layer norm epsilon.
        untie_r: this module owns its position biases ``u, v`` (False: the caller passes shared ones).

    Eight plain numbers (more than STYLE's six: each is one of the attention's hyperparameters); `from_config`
    reads them from a family config by name.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_head: int,
        dropout: float,
        dropatt: float,
        pre_lnorm: bool,
        layer_norm_epsilon: float,
        untie_r: bool,
    ):
        super().__init__()
        self.num_heads, self.head_dim = n_head, d_head
        self.scale = d_head**-0.5
        self.pre_lnorm = pre_lnorm
        inner = n_head * d_head
        self.qkv = nn.Linear(d_model, 3 * inner, bias=False)
        self.position_proj = nn.Linear(d_model, inner, bias=False)
        self.out_proj = nn.Linear(inner, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=layer_norm_epsilon)
        self.dropout = nn.Dropout(dropout)
        self.attention_dropout = nn.Dropout(dropatt)
        if untie_r:
            self.content_bias = nn.Parameter(torch.zeros(n_head, d_head))
            self.position_bias = nn.Parameter(torch.zeros(n_head, d_head))

    @classmethod
    def from_config(cls, config) -> RelativeMultiHeadAttention:
        """The attention a Transformer-XL-family config describes (its field names: ``d_model``, ``n_head``, …)."""
        return cls(**{name: getattr(config, name) for name in _ATTENTION_FIELDS})

    def project(
        self, hidden: torch.Tensor, memory: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Query ``(B, H, T, Dh)`` of the segment, key and value ``(B, H, S, Dh)`` of ``[memory, segment]``."""
        batch, query_length, _ = hidden.shape
        inputs = hidden if memory is None else torch.cat([memory.to(hidden.dtype), hidden], dim=1)  # (B, S, D)
        key_length = inputs.shape[1]
        if self.pre_lnorm:
            inputs = self.layer_norm(inputs)
        query, key, value = self.qkv(inputs).chunk(3, dim=-1)  # 3 x (B, S, H*Dh)
        query = query[:, -query_length:].reshape(batch, query_length, self.num_heads, self.head_dim).transpose(1, 2)
        key = key.reshape(batch, key_length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        value = value.reshape(batch, key_length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        return query, key, value

    def position_scores(
        self, query: torch.Tensor, inputs: RelativeAttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The scaled position term, masked with ``finfo.min`` where ``inputs.allowed`` is False, ``(B, H, T, S)``,
        and the content bias ``u`` ``(H, Dh)`` to fold into the query."""
        key_length = inputs.position_embedding.shape[0]
        position_keys = self.position_proj(inputs.position_embedding)  # (S, H*Dh), projected at every call
        position_keys = position_keys.view(key_length, self.num_heads, self.head_dim).transpose(0, 1)  # (H, S, Dh)
        content_bias, position_bias = inputs.shared_biases or (self.content_bias, self.position_bias)
        position = relative_position_scores(query, position_keys, position_bias)  # (B, H, T, S)
        bias = (position * self.scale).masked_fill(~inputs.allowed, torch.finfo(position.dtype).min)
        return bias, content_bias

    def local_attention(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, inputs: RelativeAttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-head attention output ``(B, H, T, Dh)`` (before the output projection) and, with
        ``inputs.output_attentions``, the probabilities ``(B, H, T, S)``."""
        # The content term is the ordinary q.k product with u folded into the query; the position term enters as an
        # additive score bias, masked with finfo.min (a row with no allowed key, a padded query, attends uniformly).
        # Attention maps come from the eager dense twin, whatever the configured implementation.
        bias, content_bias = self.position_scores(query, inputs)
        return attend(
            query + content_bias[:, None, :].to(query.dtype),
            key,
            value,
            None,
            bias.to(query.dtype),
            self.attention_dropout.p if self.training else 0.0,
            "eager" if inputs.output_attentions else inputs.implementation,
        )  # (B, H, T, Dh), (B, H, T, S) or None

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Output projection, dropout, residual and layer norm of the per-head output ``(B, H, T, Dh)``."""
        batch, query_length, _ = hidden.shape
        attended = attended.transpose(1, 2).reshape(batch, query_length, -1)  # (B, T, H*Dh)
        out = self.dropout(self.out_proj(attended))  # (B, T, D)
        return hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)

    def forward(
        self, hidden: torch.Tensor, memory: torch.Tensor | None, *, inputs: RelativeAttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(B, T, D)`` segment and ``(B, M, D)`` memory (or None) -> ``(B, T, D)`` and the probabilities."""
        query, key, value = self.project(hidden, memory)
        attended, probs = self.local_attention(query, key, value, inputs)
        return self.finish(hidden, attended), probs


class RelativeDecoderLayer(GradientCheckpointingLayer):
    """`RelativeMultiHeadAttention` followed by the `PositionwiseFeedForward` block (one Transformer-XL layer),
    built from the two modules (`from_config`: from a family config)."""

    def __init__(self, attention: RelativeMultiHeadAttention, feed_forward: PositionwiseFeedForward):
        super().__init__()
        self.attention = attention
        self.feed_forward = feed_forward

    @classmethod
    def from_config(cls, config) -> RelativeDecoderLayer:
        """The layer a Transformer-XL-family config describes (its field names: ``d_model``, ``n_head``, …)."""
        return cls(RelativeMultiHeadAttention.from_config(config), PositionwiseFeedForward.from_config(config))

    def forward(
        self,
        hidden: torch.Tensor,
        memory: torch.Tensor | None = None,
        *,
        inputs: RelativeAttentionInputs | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer on ``(B, T, D)`` ``hidden`` over ``[memory, hidden]``: ``(B, T, D)`` and the probabilities.
        The tensors are positional (a checkpointed layer, `GradientCheckpointingLayer`, passes gradients to its
        positional tensors only), the rest by keyword."""
        hidden, probs = self.attention(hidden, memory, inputs=inputs)
        return self.feed_forward(hidden), probs

    def project_detached(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The query, key and value ``(B, N, H*Dh)`` of ``hidden`` ``(B, N, D)`` under this layer's attention weights
        (its layer norm first when ``pre_lnorm``), detached from those weights: what the Compressive Transformer's
        auxiliary losses compare.

        A second forward method of the layer: when FSDP2 shards the layer (``fully_shard``, by `shard_model` or
        accelerate), the first call registers it with FSDP (``register_fsdp_forward_method``), so that FSDP gathers
        the weights around it as around ``forward``: before the projection, and again in the backward (the gradient
        reaching ``hidden`` reads them).
        """
        if torch.distributed.is_available() and "project_detached" not in self.__dict__:
            from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

            if isinstance(self, FSDPModule):
                register_fsdp_forward_method(self, "project_detached")  # replaces this method on this instance
                return self.project_detached(hidden)
        attention = self.attention
        if attention.pre_lnorm:
            norm = attention.layer_norm
            hidden = F.layer_norm(hidden, norm.normalized_shape, norm.weight.detach(), norm.bias.detach(), norm.eps)
        return F.linear(hidden, attention.qkv.weight.detach()).chunk(3, dim=-1)


__all__ = ["RelativeAttentionInputs", "RelativeDecoderLayer", "RelativeMultiHeadAttention"]
