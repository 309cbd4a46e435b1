"""Linformer: self-attention with linear complexity (Wang, Li, Khabsa, Fang & Ma 2020, arXiv:2006.04768).

An encoder whose self-attention projects keys and values along the sequence axis with learned ``E``, ``F``
``(n, k)`` (section 4), then attends over the ``k`` projected slots: time and memory ``O(n k)``
(`tf_family.attention.low_rank`). Sharing of ``E`` / ``F`` as in the paper: none, headwise, key-value, layerwise
(`TffLinformerConfig.projection_sharing`). Blocks are pre-layer-norm without a final norm, as the reference.

Parity reference: the ``linformer`` package 0.2.3 (lucidrains, MIT) on copied weights, unpadded inputs
(``tests/models/linformer/test_parity_linformer.py``).

Deviations from the ``linformer`` package:
- padding is left out of the projection (its keys and values are zeroed before ``E^T k``, ``F^T v``; the package
  mixes padded positions in) and each real token takes the row of ``E`` / ``F`` of its position among the real
  tokens, so left and right padding give what the row alone gives;
- inputs shorter than ``n`` use the first rows (the package slices too); longer ones are a ValueError naming
  `max_position_embeddings` (the package asserts);
- q / k / v projections have biases (copied as zeros for parity); token-type embeddings (zeros for parity).

Config field <-> paper symbol: `max_position_embeddings` = n, `projected_length` = k.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput

from ...attention.backend import attend
from ...attention.dropout import dropout
from ...attention.low_rank import low_rank_attention, project_along_sequence, project_prefix_along_sequence
from ...modeling.heads import GenericForMaskedLM, GenericForSequenceClassification, GenericForTokenClassification
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.utils import Dropout, build_activation
from .configuration_linformer import TffLinformerConfig


class TffLinformerEmbeddings(nn.Module):
    """Word + learned position + token-type embeddings and dropout. Positions count real tokens from 0."""

    def __init__(self, config: TffLinformerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, inputs_embeds, token_type_ids, position_ids) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, D)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(position_ids)
        embeddings = (
            inputs_embeds + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(embeddings)


def _projection(config: TffLinformerConfig, per_head: bool) -> nn.Parameter:
    """An uninitialised ``(P, n, k)`` projection (`_init_weights` fills it)."""
    heads = config.num_attention_heads if per_head else 1
    return nn.Parameter(torch.empty(heads, config.max_position_embeddings, config.projected_length))


class TffLinformerAttention(nn.Module):
    """Low-rank self-attention with its output projection. Holds ``key_projection`` ``E`` and (unless shared)
    ``value_projection`` ``F``; with layerwise sharing the model passes its one projection in."""

    def __init__(self, config: TffLinformerConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.sharing = config.projection_sharing
        self.attention_dropout = config.attention_probs_dropout_prob
        self.config = config  # `config._attn_implementation` is read at every call
        width = config.hidden_size
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.out_proj = nn.Linear(width, width)
        if self.sharing != "layerwise":
            self.key_projection = _projection(config, per_head=self.sharing == "none")
        if self.sharing in ("none", "headwise"):
            self.value_projection = _projection(config, per_head=self.sharing == "none")

    def _heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(*tensor.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def projections(self, shared: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(E, F)`` of this layer under its sharing."""
        if self.sharing == "layerwise":
            return shared, shared
        if self.sharing == "key_value":
            return self.key_projection, self.key_projection
        return self.key_projection, self.value_projection

    def forward(self, hidden, key_valid, position_ids, shared_projection=None, output_attentions=False):
        """``position_ids`` ``(B, T)`` pick the rows of ``E`` / ``F``; ``None`` where each real token's position is its
        index (the rows are sliced); ``key_valid`` ``(B, T)``, or ``None`` without padding."""
        batch, length, _ = hidden.shape
        query, key, value = (self._heads(linear(hidden)) for linear in (self.query, self.key, self.value))
        key_projection, value_projection = self.projections(shared_projection)
        if position_ids is None:
            projected_key = project_prefix_along_sequence(key, key_projection, key_valid)  # (B, H, K, Dh)
            projected_value = project_prefix_along_sequence(value, value_projection, key_valid)
        else:
            projected_key = project_along_sequence(key, key_projection, position_ids, key_valid)  # (B, H, K, Dh)
            projected_value = project_along_sequence(value, value_projection, position_ids, key_valid)
        if output_attentions or self.config._attn_implementation == "eager":  # the explicit twin, with probabilities
            attended, probs = low_rank_attention(
                query,
                projected_key,
                projected_value,
                dropout=lambda p: dropout(p, self.attention_dropout, self.training),
            )
        else:  # softmax over the K slots by PyTorch's fused SDPA (no (B, H, T, K) tensors kept for backward)
            # `cpu_kernels=False`: the native CPU kernel's tiles suit long key axes, not K slots; it was the slower
            # of the two on the Linformer training step (bench/results/linformer_vs_reference.md)
            attended, probs = attend(
                query,
                projected_key,
                projected_value,
                dropout_p=self.attention_dropout if self.training else 0.0,
                implementation=self.config._attn_implementation,
                cpu_kernels=False,
            )
        attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        return self.out_proj(attended), (probs if output_attentions else None)


class TffLinformerFeedForward(nn.Module):
    def __init__(self, config: TffLinformerConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.activation(self.fc_in(hidden)))


class TffLinformerLayer(GradientCheckpointingLayer):
    """Pre-layer-norm block: ``x + attention(ln(x))``, then ``x + feed_forward(ln(x))``."""

    def __init__(self, config: TffLinformerConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = TffLinformerAttention(config)
        self.feed_forward_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feed_forward = TffLinformerFeedForward(config)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, key_valid, position_ids, shared_projection=None, output_attentions=False):
        attended, probs = self.attention(
            self.attention_norm(hidden),
            key_valid=key_valid,
            position_ids=position_ids,
            shared_projection=shared_projection,
            output_attentions=output_attentions,
        )
        hidden = hidden + self.dropout(attended)
        hidden = hidden + self.dropout(self.feed_forward(self.feed_forward_norm(hidden)))
        return hidden, probs


class TffLinformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffLinformerConfig
    config: TffLinformerConfig
    base_model_prefix = "linformer"
    carried_state = None
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffLinformerLayer"]
    # softmax over the projected slots through `attention.backend.attend`; eager (`low_rank_attention`, the explicit
    # twin) and sdpa agree: tests/attention/test_backend.py, tests/attention/test_low_rank.py
    _supports_sdpa = True
    _can_set_attn_implementation_cached_value = True  # read at every call, so switching it later is safe

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
        bound = self.config.projected_length**-0.5
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, TffLinformerAttention):
            for name in ("key_projection", "value_projection"):
                if hasattr(module, name):
                    init.uniform_(getattr(module, name), -bound, bound)
        elif isinstance(module, TffLinformerModel) and module.shared_projection is not None:
            init.uniform_(module.shared_projection, -bound, bound)


class TffLinformerModel(TffLinformerPreTrainedModel):
    """The Linformer encoder stack (no pooler: the heads pool the first real token)."""

    def __init__(self, config: TffLinformerConfig, add_pooling_layer: bool = False):
        super().__init__(config)
        if add_pooling_layer:
            raise ValueError("TffLinformerModel has no pooler; the heads pool the first real token themselves.")
        self.embeddings = TffLinformerEmbeddings(config)
        self.shared_projection = (
            _projection(config, per_head=False) if config.projection_sharing == "layerwise" else None
        )
        self.layers = nn.ModuleList(TffLinformerLayer(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module):
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids (or pass ``inputs_embeds`` ``(B, T, D)``), ``T <= n``
                (`max_position_embeddings`).
            attention_mask: ``(B, T)`` 1 for real tokens, 0 for padding (left or right): padding is left out of the
                projections.
            token_type_ids, position_ids: ``(B, T)``; positions (which also pick the rows of ``E`` and ``F``) default
                to the count of real tokens before each.
            output_attentions: return the ``(B, H, T, k)`` probabilities over the projected slots.

        transformers' encoder signature (heads and `Trainer` pass these by name), hence more than ~6 parameters.
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else config.return_dict
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        self._check_mask("attention_mask", attention_mask, batch, length)
        self._check_index_inputs(
            "token_type_ids", token_type_ids, batch, length, config.type_vocab_size, "type_vocab_size"
        )
        device = (input_ids if input_ids is not None else inputs_embeds).device
        if attention_mask is None:
            key_valid = torch.ones(batch, length, dtype=torch.bool, device=device)
        else:
            key_valid = attention_mask.to(torch.bool)
        # each real token's position is its index (no padding, or padding on the right only): the layers slice the
        # rows of E / F instead of gathering them per row (`project_prefix_along_sequence`); the check reads the
        # mask, so a traced forward (torch.compile / export) with a mask gathers
        prefix = position_ids is None and (
            attention_mask is None
            or (not torch.compiler.is_compiling() and bool((key_valid[:, 1:] <= key_valid[:, :-1]).all()))
        )
        if position_ids is None:
            position_ids = (key_valid.long().cumsum(dim=1) - 1).clamp_min(0)  # (B, T)
        else:
            self._check_index_inputs("position_ids", position_ids, batch, length, 2**62, "positions")
            position_ids = position_ids.expand(batch, -1)
        # a data-dependent check: skipped while torch.compile / torch.export trace the model
        if not torch.compiler.is_compiling() and int(position_ids.max()) >= config.max_position_embeddings:
            raise ValueError(
                f"The input needs position {int(position_ids.max())} but max_position_embeddings="
                f"{config.max_position_embeddings} (n, the rows of the E / F projections and of the positions); "
                f"shorten the input to at most {config.max_position_embeddings} real tokens or build the model with "
                "a larger max_position_embeddings."
            )
        hidden = self.embeddings(input_ids, inputs_embeds, token_type_ids, position_ids)
        all_hidden, all_attentions = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = layer(
                hidden,
                key_valid=None if prefix and attention_mask is None else key_valid,
                position_ids=None if prefix else position_ids,
                shared_projection=self.shared_projection,
                output_attentions=output_attentions,
            )
            if output_attentions:
                all_attentions += (probs,)
        if output_hidden_states:
            all_hidden += (hidden,)
        output = BaseModelOutput(
            last_hidden_state=hidden,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class TffLinformerForMaskedLM(GenericForMaskedLM, TffLinformerPreTrainedModel):
    """BERT's masked-LM head (dense, activation, layer norm, decoder tied to the input embeddings)."""

    base_model_class = TffLinformerModel
    _tied_weights_keys = {"lm_head.decoder.weight": "linformer.embeddings.word_embeddings.weight"}


class TffLinformerForSequenceClassification(GenericForSequenceClassification, TffLinformerPreTrainedModel):
    """Classifier (dense + tanh + linear) on the first real token."""

    base_model_class = TffLinformerModel


class TffLinformerForTokenClassification(GenericForTokenClassification, TffLinformerPreTrainedModel):
    """A label per token."""

    base_model_class = TffLinformerModel


__all__ = [
    "TffLinformerForMaskedLM",
    "TffLinformerForSequenceClassification",
    "TffLinformerForTokenClassification",
    "TffLinformerModel",
    "TffLinformerPreTrainedModel",
]
