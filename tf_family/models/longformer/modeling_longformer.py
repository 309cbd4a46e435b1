"""Longformer: the long-document transformer (Beltagy, Peters & Cohan 2020, arXiv:2004.05150).

A RoBERTa encoder whose self-attention is a sliding window (per-layer size, optional dilation; bidirectional, or
causal for language modelling) plus *global* tokens that attend to everything and are attended to by everything,
with their own query/key/value projections (section 3.1). Time and memory grow linearly with the length: the
window is computed chunk by chunk (`tf_family.attention.sliding_window`). The causal LM generates with a key/value
cache (`transformers.DynamicCache`): a new token attends to the last ``window * dilation`` cached positions and the
global tokens of the prompt, so each generation step costs the same at any length.

Parity reference: transformers 5 `LongformerModel` and its heads (`tests/models/longformer/test_parity_longformer.py`
loads random transformers checkpoints into these classes and compares outputs); `convert_longformer.py` maps their
checkpoints.

Deviations from transformers' Longformer:
- positions and the pooled / classified token come from `attention_mask` (the first real token), so left padding
  gives the same result as no padding; transformers counts positions from ``input_ids != pad_token_id`` and always
  pools position 0 (identical for right padding);
- causal and dilated windows (transformers has neither); no padding of the input to a window multiple;
- `attentions` (with ``output_attentions=True``, which runs the dense path) are full ``(B, H, T, T)`` probabilities
  with the global tokens' rows included, instead of the banded layout plus `global_attentions`;
- the question-answering / multiple-choice rule marks no token global in a row without a separator token (with a
  warning) instead of failing; padded positions carry finite, meaningless values rather than zeros.

Config field <-> paper symbol: `attention_window` = w (a query sees w/2 keys per side), `attention_dilation` = d.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Cache
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions, CausalLMOutputWithPast
from transformers.utils import logging

from ...attention import (
    GlobalTokens,
    WindowPattern,
    attend,
    build_global_query_mask,
    build_sliding_window_mask,
    dropout,
    global_attention,
    sliding_window_attention,
)
from ...attention.alibi import alibi_slopes
from ...attention.flex import BlockMaskCache
from ...attention.rotary import apply_rotary, rotary_cos_sin
from ...attention.sliding_window import cached_window_attention, sliding_window_alibi_bias
from ...layers import BertFeedForward
from ...modeling.cache import GrowingCache
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import (
    GenericForMaskedLM,
    GenericForMultipleChoice,
    GenericForQuestionAnswering,
    GenericForSequenceClassification,
    GenericForTokenClassification,
    LMPredictionHead,
)
from ...modeling.losses import causal_lm_loss
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import accepts_past_key_values
from ...modeling.utils import (
    Dropout,
    find_first_real_token,
    fused_projections,
    key_value_generation_inputs,
)
from ...modeling.validation import ValidatedGenerationMixin, check_cache, check_tensor
from .configuration_longformer import TffLongformerConfig

logger = logging.get_logger(__name__)


def separator_global_attention_mask(
    input_ids: torch.LongTensor, sep_token_id: int, before_separator: bool = True
) -> torch.Tensor:
    """transformers' question-answering rule: the tokens before the first separator (the question) are global;
    with ``before_separator=False`` (its multiple-choice rule) the tokens after the first separator pair are.

    A row without a separator gets no global token (and a warning)."""
    is_separator = input_ids == sep_token_id  # (B, T)
    has_separator = is_separator.any(dim=1)
    if not bool(has_separator.all()):
        logger.warning_once(
            f"Some rows have no separator token (sep_token_id={sep_token_id}); they get no global attention. Pass "
            "global_attention_mask to choose the global tokens yourself."
        )
    first = torch.where(has_separator, is_separator.int().argmax(dim=1), input_ids.shape[1])  # (B,)
    position = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
    mask = position < first[:, None] if before_separator else position > first[:, None] + 1
    return (mask & has_separator[:, None]).long()


class TffLongformerEmbeddings(nn.Module):
    """Word + learned position + token-type embeddings, layer norm, dropout. Positions start at
    ``pad_token_id + 1`` (RoBERTa) and count only real tokens."""

    def __init__(self, config: TffLongformerConfig):
        super().__init__()
        self.padding_idx = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = None  # rotary / ALiBi positions act in the attention
        if config.position_embedding_type == "absolute":
            self.position_embeddings = nn.Embedding(
                config.max_position_embeddings, config.hidden_size, padding_idx=config.pad_token_id
            )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def position_ids(self, input_ids, attention_mask, batch: int, length: int, device) -> torch.Tensor:
        if attention_mask is not None:
            real = attention_mask.to(torch.long)
        elif input_ids is not None:
            real = (input_ids != self.padding_idx).to(torch.long)
        else:
            real = torch.ones(batch, length, dtype=torch.long, device=device)
        return real.cumsum(dim=1) * real + self.padding_idx  # (B, T)

    def forward(self, input_ids, inputs_embeds, attention_mask, token_type_ids, position_ids) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, D)
        batch, length = inputs_embeds.shape[:2]
        if token_type_ids is None:
            token_type_ids = torch.zeros(batch, length, dtype=torch.long, device=inputs_embeds.device)
        if self.position_embeddings is None:  # rotary / ALiBi: no learned positions
            return self.dropout(self.layer_norm(inputs_embeds + self.token_type_embeddings(token_type_ids)))
        if position_ids is None:
            position_ids = self.position_ids(input_ids, attention_mask, batch, length, inputs_embeds.device)
        # a data-dependent check: skipped while torch.compile / torch.export trace the model
        if not torch.compiler.is_compiling() and int(position_ids.max()) >= self.position_embeddings.num_embeddings:
            raise ValueError(
                f"The input needs position {int(position_ids.max())} (positions start at pad_token_id + 1 = "
                f"{self.padding_idx + 1}) but max_position_embeddings={self.position_embeddings.num_embeddings}; "
                f"shorten the input to at most {self.position_embeddings.num_embeddings - self.padding_idx - 1} tokens."
            )
        embeddings = (
            inputs_embeds + self.position_embeddings(position_ids) + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.layer_norm(embeddings))


class TffLongformerAttention(nn.Module):
    """Sliding-window + global self-attention with its output projection and post-layer-norm residual."""

    def __init__(self, config: TffLongformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.pattern = WindowPattern(
            config.layer_windows()[layer_idx] // 2, config.layer_dilations()[layer_idx], config.causal
        )
        self.mode = config.attention_mode
        self.layer_idx = layer_idx
        width = config.hidden_size
        self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        # separate projections for the global tokens (section 3.1, "Linear Projections for Global Attention")
        self.global_query, self.global_key, self.global_value = (nn.Linear(width, width) for _ in range(3))
        self.out_proj = nn.Linear(width, width)
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.attention_dropout = config.attention_probs_dropout_prob

    def _heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(*tensor.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _folded_global_attention(
        self, global_query: torch.Tensor, hidden: torch.Tensor, key_valid: torch.Tensor, global_tokens: GlobalTokens
    ) -> torch.Tensor:
        """The global tokens' attention without projecting every token to global keys and values.

        With few global tokens (``H * G < D``) it is cheaper to fold the key projection into the queries and apply
        the value projection after the weighted sum: ``q . (W_k x + b_k) = (q W_k) . x + const`` (the constant
        does not change the softmax) and ``sum_t p_t (W_v x_t + b_v) = W_v (sum_t p_t x_t) + b_v sum_t p_t``. Same
        result as projecting, in ``O(H G T D)`` instead of ``O(T D^2)``."""
        heads, head_dim, width = self.num_heads, self.head_dim, hidden.shape[-1]
        key_weight = self.global_key.weight.view(heads, head_dim, width)  # (H, Dh, D)
        value_weight = self.global_value.weight.view(heads, head_dim, width)
        folded = torch.einsum("bhgd,hde->bhge", global_query, key_weight) * head_dim**-0.5  # (B, H, G, D)
        key_bias = self.global_key.bias.view(heads, head_dim)
        scores = torch.einsum("bhge,bte->bhgt", folded, hidden)  # (B, H, G, T)
        # the key bias adds one constant per query row (no effect on the softmax); kept so the graph matches
        scores = scores + torch.einsum("bhgd,hd->bhg", global_query, key_bias)[..., None] * head_dim**-0.5
        allowed = build_global_query_mask(global_tokens, key_valid, self.pattern.causal, hidden.shape[1])
        scores = scores.float().masked_fill(~allowed[:, None], float("-inf"))
        probs = dropout(scores.softmax(dim=-1), self.attention_dropout, self.training).to(hidden.dtype)
        mixed = torch.einsum("bhgt,bte->bhge", probs, hidden)  # (B, H, G, D)
        out = torch.einsum("bhge,hde->bhgd", mixed, value_weight)  # (B, H, G, Dh)
        return out + self.global_value.bias.view(heads, head_dim)[None, :, None, :] * probs.sum(-1, keepdim=True)

    def use_dense(self, length: int, output_attentions: bool) -> bool:
        """Decided per call: the dense path when asked for, for attention maps, or when the window covers a
        short input (then it is the same computation, done in one piece). An exported graph (ONNX) takes the dense
        path at every length: the chunked path's shapes branch on the length, which a graph with a dynamic length
        cannot."""
        if self.mode != "auto" or output_attentions:
            return self.mode == "dense" or output_attentions
        return torch.compiler.is_exporting() or self.pattern.window * self.pattern.dilation >= length - 1

    def forward(
        self,
        hidden: torch.Tensor,
        key_valid: torch.Tensor,
        global_tokens: GlobalTokens | None,
        output_attentions: bool = False,
        cache: Cache | None = None,
        past_length: int = 0,
        block_masks: BlockMaskCache | None = None,
        positions: tuple | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``key_valid`` and ``global_tokens`` cover the cached positions too (``past_length`` of them) when a
        cache is given; ``hidden`` holds the new tokens only. ``block_masks``: the model's cache of FlexAttention
        block masks (``None``: built for this call). ``positions``: ``(cos, sin, slopes)`` of rotary / ALiBi."""
        batch, length, _ = hidden.shape
        dropout_p = self.attention_dropout if self.training else 0.0
        # attention maps come from the dense twin, whatever the configured implementation
        implementation = "eager" if output_attentions else self.config._attn_implementation
        query, key, value = (self._heads(x) for x in fused_projections(hidden, self.query, self.key, self.value))
        cos, sin, slopes = positions if positions is not None else (None, None, None)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)  # the window's q, k (not global's)
        if past_length > 0:  # the new tokens over the cache (none of them global)
            keys, values = cache.update(key, value, self.layer_idx)  # (B, H, P + t, Dh)
            attended, probs = cached_window_attention(
                query, keys, values, self.pattern, key_valid, global_tokens, slopes, dropout_p, implementation
            )
            attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, t, D)
            return self.layer_norm(hidden + self.dropout(self.out_proj(attended))), probs
        if cache is not None:
            cache.update(key, value, self.layer_idx)
        probs = None
        if self.use_dense(length, output_attentions):
            allowed = build_sliding_window_mask(self.pattern, key_valid, global_tokens)[:, None]  # (B, 1, T, T)
            bias = None if slopes is None else sliding_window_alibi_bias(slopes, length, global_tokens).to(query.dtype)
            attended, probs = attend(query, key, value, allowed, bias, dropout_p, implementation)
        else:
            attended = sliding_window_attention(
                query,
                key,
                value,
                self.pattern,
                key_padding_mask=key_valid,
                global_tokens=global_tokens,
                dropout_p=dropout_p,
                implementation=implementation,
                block_masks=block_masks,
                slopes=slopes,
            )  # (B, H, T, Dh)

        if global_tokens is not None:
            global_query = self._heads(self.global_query(global_tokens.gather(hidden)))  # (B, H, G, Dh)
            if output_attentions:
                global_key, global_value = self._heads(self.global_key(hidden)), self._heads(self.global_value(hidden))
                allowed = build_global_query_mask(global_tokens, key_valid, self.pattern.causal, length)
                global_attended, global_probs = attend(
                    global_query,
                    global_key,
                    global_value,
                    allowed[:, None],
                    dropout_p=dropout_p,
                    implementation=implementation,
                )
                probs = global_tokens.scatter(probs, global_probs)
            elif not torch.compiler.is_exporting() and self.num_heads * global_tokens.num_slots < hidden.shape[-1]:
                global_attended = self._folded_global_attention(global_query, hidden, key_valid, global_tokens)
            else:
                global_key, global_value = self._heads(self.global_key(hidden)), self._heads(self.global_value(hidden))
                causal = self.pattern.causal
                global_attended = global_attention(
                    global_query,
                    global_key,
                    global_value,
                    global_tokens,
                    key_padding_mask=key_valid,
                    causal=causal,
                    dropout_p=dropout_p,
                    implementation=implementation,
                )  # (B, H, G, Dh)
            attended = global_tokens.scatter(attended, global_attended)
        attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        return self.layer_norm(hidden + self.dropout(self.out_proj(attended))), probs


class TffLongformerLayer(GradientCheckpointingLayer):
    def __init__(self, config: TffLongformerConfig, layer_idx: int):
        super().__init__()
        self.attention = TffLongformerAttention(config, layer_idx)
        self.feed_forward = BertFeedForward(
            config.hidden_size,
            config.intermediate_size,
            config.hidden_act,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
        )

    def forward(
        self,
        hidden,
        key_valid,
        global_tokens=None,
        output_attentions=False,
        cache=None,
        past_length=0,
        block_masks=None,
        positions=None,
    ):
        hidden, probs = self.attention(
            hidden,
            key_valid=key_valid,
            global_tokens=global_tokens,
            output_attentions=output_attentions,
            cache=cache,
            past_length=past_length,
            block_masks=block_masks,
            positions=positions,
        )
        return self.feed_forward(hidden), probs


class TffLongformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffLongformerConfig
    config: TffLongformerConfig
    base_model_prefix = "longformer"
    carried_state = None  # nothing carried between calls
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffLongformerLayer"]
    _supports_sdpa = True  # eager (the dense twin per chunk) and sdpa agree: tests/attention/test_backend.py
    _supports_flex_attn = True  # the sparse pattern as a FlexAttention block mask: tests/attention/test_flex.py
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
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

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate makes no cache: the first forward does (a `GrowingCache`)


class TffLongformerModel(TffLongformerPreTrainedModel):
    """The Longformer encoder (or, with ``causal=True``, decoder stack), with an optional pooler on the first real
    token."""

    def __init__(self, config: TffLongformerConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = TffLongformerEmbeddings(config)
        self.layers = nn.ModuleList(TffLongformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.gradient_checkpointing = False
        # the attention's block masks (and BigBird's random plans), built once per (shape, pattern) and reused
        self.block_masks = BlockMaskCache()
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module):
        self.embeddings.word_embeddings = value

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        global_attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPoolingAndCrossAttentions | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids (or pass ``inputs_embeds`` ``(B, T, D)``); with a filled
                ``cache``, the new tokens only.
            attention_mask: ``(B, P + T)`` 1 for real tokens, 0 for padding (left or right); ``P`` is the number of
                cached positions (0 without a cache).
            global_attention_mask: ``(B, P + T)`` 1 for tokens with global attention (see every token and are seen by
                every token), 0 for windowed attention. Given per call; padding is never global. With a cache, only
                cached positions (the prompt) can be global.
            token_type_ids, position_ids: ``(B, T)``; positions default to RoBERTa's, counted over real tokens.
            output_attentions: return ``(B, H, T, P + T)`` attention probabilities per layer (runs the dense path).
            cache: a `transformers.Cache` (e.g. `DynamicCache`) of the keys and values of earlier calls;
                causal models only. The new tokens attend to the last ``window * dilation`` cached positions and the
                global ones, so a generation step costs the same at any length.
            use_cache: return the cache (a new `GrowingCache`, a `DynamicCache`, when none is given); causal models only.

        transformers' encoder signature (heads and `Trainer` pass these by name), hence more than ~6 parameters.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        batch, length, use_cache = self._check_inputs(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            global_attention_mask=global_attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        if use_cache and cache is None:
            cache = GrowingCache(self.config)  # a DynamicCache whose decoding steps are written in place
        past_length = cache.get_seq_length() if cache is not None else 0
        device = (input_ids if input_ids is not None else inputs_embeds).device
        key_valid = (
            torch.ones(batch, past_length + length, dtype=torch.bool, device=device)
            if attention_mask is None
            else attention_mask.to(torch.bool)
        )
        global_tokens = GlobalTokens.from_mask(global_attention_mask, key_valid)
        if position_ids is None and past_length:
            real = key_valid.long()
            position_ids = (real.cumsum(dim=1) * real + self.config.pad_token_id)[:, past_length:]  # (B, T)

        new_mask = attention_mask[:, past_length:] if attention_mask is not None else None
        hidden = self.embeddings(input_ids, inputs_embeds, new_mask, token_type_ids, position_ids)
        layer_inputs = {
            "key_valid": key_valid,
            "global_tokens": global_tokens,
            "output_attentions": output_attentions,
            "cache": cache,
            "past_length": past_length,
            # a compiled graph builds its block masks once per forward, in a cache of its own
            "block_masks": BlockMaskCache() if torch.compiler.is_compiling() else self.block_masks,
            "positions": self._positions(key_valid, past_length, position_ids, hidden.dtype),
        }
        hidden, all_hidden, all_attentions = self._run_layers(hidden, layer_inputs, output_hidden_states)
        pooled = None
        if self.pooler is not None:
            first = find_first_real_token(new_mask, batch, device)
            pooled = torch.tanh(self.pooler(hidden[torch.arange(batch, device=device), first]))  # (B, D)
        output = BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=hidden,
            pooler_output=pooled,
            cache=cache,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()

    def _positions(self, key_valid, past_length: int, position_ids, dtype) -> tuple | None:
        """Rotary ``(cos, sin, None)`` at the real-token positions (``position_ids`` less RoBERTa's offset, when
        given), ALiBi ``(None, None, slopes)``, or ``None`` (absolute positions: in the embeddings)."""
        kind, device = self.config.position_embedding_type, key_valid.device
        if kind == "alibi":
            return None, None, alibi_slopes(self.config.num_attention_heads).to(device)
        if kind != "rotary":
            return None
        if position_ids is None:
            positions = (key_valid.long().cumsum(dim=1) - 1).clamp(min=0)[:, past_length:]  # (B, T)
        else:
            positions = (position_ids - self.config.pad_token_id - 1).clamp(min=0)
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        return (*rotary_cos_sin(positions, head_dim, self.config.rope_base, dtype), None)

    def _run_layers(self, hidden: torch.Tensor, layer_inputs: dict, output_hidden_states: bool):
        """Every layer, called with ``hidden`` and the keyword arguments ``layer_inputs`` (the same for each): the
        last hidden state, the hidden states (the input of every layer and the last output, when asked for) and the
        attention probabilities of every layer (when asked for)."""
        all_hidden, all_attentions = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = layer(hidden, **layer_inputs)
            if layer_inputs["output_attentions"]:
                all_attentions += (probs,)
        if output_hidden_states:
            all_hidden += (hidden,)
        return hidden, all_hidden, all_attentions

    def _check_inputs(
        self,
        *,
        input_ids,
        inputs_embeds,
        attention_mask,
        global_attention_mask,
        token_type_ids,
        position_ids,
        cache,
        use_cache,
    ) -> tuple[int, int, bool]:
        """`forward`'s inputs checked once, at the edge: ``(B, T)`` and whether to build a cache (turned off, with a
        warning, under gradient checkpointing in training). Every argument is `forward`'s, by name."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        config = self.config
        self._check_index_inputs(
            "token_type_ids", token_type_ids, batch, length, config.type_vocab_size, "type_vocab_size"
        )
        self._check_index_inputs(
            "position_ids", position_ids, batch, length, config.max_position_embeddings, "max_position_embeddings"
        )
        for name, mask in (("attention_mask", attention_mask), ("global_attention_mask", global_attention_mask)):
            if mask is not None:
                check_tensor(name, mask, dim=2)
        heads = config.num_attention_heads
        check_cache(cache, batch, heads, config.hidden_size // heads)
        if (cache is not None or use_cache) and not self.config.causal:
            raise ValueError(
                "cache (past_key_values) / use_cache need a causal model (config.causal=True, e.g. TffLongformerForCausalLM): "
                "a bidirectional window also reads tokens that come later."
            )
        if self.gradient_checkpointing and self.training and (use_cache or cache is not None):
            if cache is not None:  # recomputed layers would append their keys twice
                raise ValueError("cache cannot be used with gradient checkpointing in training mode.")
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing in training; not caching.")
            use_cache = False
        past_length = cache.get_seq_length() if cache is not None else 0
        total = past_length + length
        for name, mask in (("attention_mask", attention_mask), ("global_attention_mask", global_attention_mask)):
            if mask is not None and tuple(mask.shape) != (batch, total):
                expected = f"{(batch, total)} like the input" + (
                    f" plus the {past_length} cached positions of the cache" if past_length else ""
                )
                raise ValueError(f"{name} must have shape {expected}, got {tuple(mask.shape)}.")
        if past_length and global_attention_mask is not None and bool(global_attention_mask[:, past_length:].any()):
            raise ValueError(
                "global_attention_mask marks a new token as global while a key/value cache is in use; global tokens "
                "must be in the prompt (the first call). Run without a cache to make later tokens global."
            )
        return batch, length, use_cache


class _TffLongformerHead:
    """Longformer's input for the shared heads: a ``global_attention_mask`` ``(B, T)`` (``(B, C, T)`` for multiple
    choice), in the signature (so that `Trainer` keeps the column) and chosen by the head's
    `default_global_attention_mask` rule when not given."""

    base_model_class = TffLongformerModel

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        global_attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ):
        """``global_attention_mask``: 1 for tokens with global attention (see every token and are seen by every
        token), or ``None`` for the head's rule. The rest as in the shared head (`tf_family.modeling.heads`);
        ``output_attentions``, ``output_hidden_states`` go to `TffLongformerModel`.

        transformers' head signature plus ``global_attention_mask`` (`Trainer` passes them by name), hence more than ~6
        parameters."""
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            return_dict=return_dict,
            num_items_in_batch=num_items_in_batch,
            global_attention_mask=global_attention_mask,
            **kwargs,
        )

    def _encode(self, **inputs):
        if inputs.get("global_attention_mask") is None:
            # the rule reads the inputs: check them first (the base model checks them again, cheaply)
            input_ids, attention_mask, inputs_embeds = (
                inputs.get(name) for name in ("input_ids", "attention_mask", "inputs_embeds")
            )
            batch, length = self._check_token_inputs(input_ids, inputs_embeds)
            self._check_mask("attention_mask", attention_mask, batch, length)
            rule = self.default_global_attention_mask(input_ids, attention_mask, inputs_embeds)
            inputs = {**inputs, "global_attention_mask": rule}
        return super()._encode(**inputs)

    def default_global_attention_mask(self, input_ids, attention_mask, inputs_embeds) -> torch.Tensor | None:
        """The global tokens when none are given (inputs as the base model sees them): none by default."""
        return None


class TffLongformerForMaskedLM(_TffLongformerHead, GenericForMaskedLM, TffLongformerPreTrainedModel):
    """RoBERTa's masked-LM head (dense, GELU, layer norm, decoder tied to the input embeddings)."""

    lm_head_activation = "gelu"
    _tied_weights_keys = {"lm_head.decoder.weight": "longformer.embeddings.word_embeddings.weight"}


class TffLongformerForCausalLM(FusedLMHeadMixin, TffLongformerPreTrainedModel, ValidatedGenerationMixin):
    """A causal Longformer language model (causal, optionally dilated windows; the paper's character-level LM
    setting, section 4). Builds its stack with ``causal=True`` whatever the given config says."""

    _tied_weights_keys = {"lm_head.decoder.weight": "longformer.embeddings.word_embeddings.weight"}

    def __init__(self, config: TffLongformerConfig):
        if not config.causal:
            config = copy.deepcopy(config)
            config.causal = True
        super().__init__(config)
        self.longformer = TffLongformerModel(config, add_pooling_layer=False)
        self.lm_head = LMPredictionHead(config.hidden_size, config.vocab_size, "gelu", config.layer_norm_eps)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        global_attention_mask=None,
        token_type_ids=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        cache=None,
        use_cache=None,
        position_ids=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        r"""labels: ``(B, T)``, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1`` (the
        shift happens inside), -100 is ignored; with ``num_items_in_batch`` (`Trainer`'s count of ``labels[:, 1:]``
        over the accumulated batch) the loss is the sum over it. ``cache`` / ``use_cache``: a key/value cache, as in
        `TffLongformerModel` (`generate` uses one unless ``use_cache=False``).

        transformers' language-model signature plus ``global_attention_mask`` (`generate` and `Trainer` pass them by
        name), hence more than ~6 parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.longformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            global_attention_mask=global_attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            cache=cache,
            use_cache=use_cache,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
        loss = None
        if labels is not None:
            self._check_lm_labels(labels, *logits.shape[:2])
            loss = causal_lm_loss(logits, labels, num_items_in_batch)
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    @accepts_past_key_values
    def prepare_inputs_for_generation(
        self, input_ids, cache=None, attention_mask=None, inputs_embeds=None, use_cache=True, **kwargs
    ) -> dict:
        """With a cache (the default), only the tokens it has not seen; without, the whole prefix every step.
        ``attention_mask`` and ``global_attention_mask`` always cover the whole sequence."""
        model_inputs = key_value_generation_inputs(
            self, input_ids, cache, attention_mask, inputs_embeds, use_cache, kwargs.get("next_sequence_length")
        )
        total = attention_mask.shape[1] if attention_mask is not None else None
        if total is None:  # the whole sequence: prompt embeddings (if any) and tokens
            total = input_ids.shape[1] + (inputs_embeds.shape[1] if inputs_embeds is not None else 0)
        if kwargs.get("global_attention_mask") is not None:
            global_mask = kwargs["global_attention_mask"]
            grow = total - global_mask.shape[1]
            model_inputs["global_attention_mask"] = F.pad(global_mask, (0, grow)) if grow > 0 else global_mask
        return model_inputs


class TffLongformerForSequenceClassification(
    _TffLongformerHead, GenericForSequenceClassification, TffLongformerPreTrainedModel
):
    """Classifier (dense + tanh + linear) on the first real token, which is global unless a
    `global_attention_mask` says otherwise (as transformers' Longformer does)."""

    def default_global_attention_mask(self, input_ids, attention_mask, inputs_embeds) -> torch.Tensor:
        source = input_ids if input_ids is not None else inputs_embeds
        first = find_first_real_token(attention_mask, source.shape[0], source.device)
        return F.one_hot(first, source.shape[1])  # (B, T): the first real token


class TffLongformerForTokenClassification(
    _TffLongformerHead, GenericForTokenClassification, TffLongformerPreTrainedModel
):
    """A label per token; windowed attention only unless a `global_attention_mask` is given."""


class TffLongformerForQuestionAnswering(_TffLongformerHead, GenericForQuestionAnswering, TffLongformerPreTrainedModel):
    """Extractive QA (start / end logits). Without a `global_attention_mask`, the question -- the tokens before the
    first `sep_token_id` -- is global, as in transformers' Longformer."""

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        global_attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ):
        """As `GenericForQuestionAnswering.forward`, with Longformer's ``global_attention_mask``.

        transformers' QA signature plus ``global_attention_mask`` (`Trainer` and pipelines pass them by name), hence
        more than ~6 parameters."""
        return GenericForQuestionAnswering.forward(
            self,
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            start_positions=start_positions,
            end_positions=end_positions,
            return_dict=return_dict,
            num_items_in_batch=num_items_in_batch,
            global_attention_mask=global_attention_mask,
            **kwargs,
        )

    def default_global_attention_mask(self, input_ids, attention_mask, inputs_embeds) -> torch.Tensor | None:
        if input_ids is None or self.config.sep_token_id is None:
            return None
        return separator_global_attention_mask(input_ids, self.config.sep_token_id)


class TffLongformerForMultipleChoice(_TffLongformerHead, GenericForMultipleChoice, TffLongformerPreTrainedModel):
    """One score per choice from the pooled first token. Without a `global_attention_mask`, the tokens after the
    first separator pair are global, as in transformers' Longformer."""

    def default_global_attention_mask(self, input_ids, attention_mask, inputs_embeds) -> torch.Tensor | None:
        if input_ids is None or self.config.sep_token_id is None:
            return None
        return separator_global_attention_mask(input_ids, self.config.sep_token_id, before_separator=False)


__all__ = [
    "TffLongformerForCausalLM",
    "TffLongformerForMaskedLM",
    "TffLongformerForMultipleChoice",
    "TffLongformerForQuestionAnswering",
    "TffLongformerForSequenceClassification",
    "TffLongformerForTokenClassification",
    "TffLongformerModel",
    "TffLongformerPreTrainedModel",
    "separator_global_attention_mask",
]
