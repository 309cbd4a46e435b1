"""CALM: a decoder-only language model that exits early, token by token and row by row, with a calibrated guarantee.

Paper: Schuster, Fisch, Gupta, Dehghani, Bahri, Tran, Tay, Metzler, "Confident Adaptive Language Modeling",
NeurIPS 2022, arXiv:2207.07061. Reference code read: google-research t5x ``contrib/calm`` and flaxformer
``calm_t5`` (an encoder-decoder T5); its formulas are in `tf_family.early_exit`.

The decoder is Llama's (RMSNorm, rotary positions, gated SiLU MLP, grouped key/value heads; Llama's module names,
so a transformers Llama checkpoint loads one to one, `convert_calm.py`) or GPT-2's (``decoder_style="gpt2"``);
`TffCalmForCausalLM.from_decoder` builds one from a Llama, a GPT-2 or a zoo kNN-LM around one. Exits sit after the layer counts
``config.exit_points()`` (``first_exit``, every ``exit_interval``, and the last layer) and all read the hidden
state through the shared final norm and LM head.

Decoding (one new token per row, with a cache): after each exit point from ``min_exit`` on, every row still
running computes its confidence (`confidence_measure`) and leaves when it reaches the position-decayed threshold
λ'(t) = 0.9 λ + 0.1 λ exp(-τ t / N). Rows decide separately: a row that has left keeps its exit state, and
every layer above still writes keys and values for all rows — a left row's are the layer's own pre-attention norm
and key/value projections of its exit state (the paper's state propagation). So every cache layer has the same
length at every step (a layer that wrote nothing would make SDPA attend silently over misaligned caches). While
more than half the rows run, a layer runs on the whole batch and keeps the left rows' states with ``torch.where``;
with at most half running, attention and MLP run on those rows only. Once every row has left, the remaining layers
only propagate, all of them in one product (`TffCalmModel.propagate`). ``exit_layer=k`` forces every token of a
call to exit after k layers (with propagation), for tests and analysis.

The prompt (a call with several new tokens per row) runs at full depth, as in the paper, which exits only on
generated tokens: every prompt position's keys and values at every layer are what later tokens attend to, so they
must come from the real states, and all positions run each layer in the same products — exiting the last position
early would save nothing and only change the first generated token.

Training (`tf_family.early_exit.exit_losses`): the anytime loss over the exits, plus the meta classifier's
class-balanced loss on detached states (``meta_loss_weight``), the optional self-distillation term
(``distillation_weight``) and, for the Depth-Adaptive measures, the halting classifier's loss; exact under
`Trainer`'s gradient accumulation (``num_items_in_batch``).

Deviations from the official code: exits are decided per row (it exits the whole batch when its least confident
row is confident; its PyTorch port runs batch 1 only); the ``state`` measure is a per-row cosine; t in the decay is
the token's position (the decoder-only prompt counts) and N is ``decay_length``; a ``restricted_softmax`` measure
is added (softmax over ``restricted_vocab`` only). Config field <-> paper symbol: ``exit_threshold`` = λ,
``position_temperature`` = τ, ``decay_length`` = N.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Cache
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils import logging

from ...attention import attend
from ...attention.rotary import apply_rotary, rotary_cos_sin
from ...early_exit import (
    HALTING_MEASURES,
    decayed_threshold,
    exit_losses,
    geometric_halting_confidence,
    meta_confidence,
    multinomial_halting_confidence,
    restricted_softmax_confidence,
    softmax_diff_confidence,
    softmax_max_confidence,
    state_confidence,
)
from ...modeling.cache import GrowingCache, GrowingCacheGenerationMixin
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.losses import IGNORE_INDEX, NumItems, batch_share
from ...modeling.outputs import CalmGenerateOutput, EarlyExitCausalLMOutput
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import GENERATION_CACHE_KEY, accepts_past_key_values
from ...modeling.utils import (
    build_activation,
    decoding_past_length,
    decoding_step_inputs,
    fused_projections,
    is_plain_linear,
)
from ...modeling.validation import (
    MAX_SIZE,
    check_cache,
    check_class_labels,
    check_int,
    check_tensor,
)
from .configuration_calm import TffCalmConfig
from .convert_calm import from_decoder

logger = logging.get_logger(__name__)


# ---------------------------------------------------------------------------------------------------- small modules
class TffCalmRMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``, computed in float32 (as Llama's)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.weight * _normalise(self, hidden)


def build_norm(config: TffCalmConfig) -> nn.Module:
    """The decoder style's norm: RMSNorm (``"llama"``) or LayerNorm with bias (``"gpt2"``)."""
    if config.decoder_style == "gpt2":
        return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    return TffCalmRMSNorm(config.hidden_size, config.rms_norm_eps)


def _normalise(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``norm(hidden)`` without its weight and bias: the part every layer's norm shares (as the norm computes it)."""
    if isinstance(norm, nn.LayerNorm):
        return F.layer_norm(hidden, norm.normalized_shape, None, None, norm.eps)
    # one fused kernel: x * rsqrt(mean(x^2) + eps) in float32, as Llama computes it
    return F.rms_norm(hidden.float(), hidden.shape[-1:], None, norm.eps).to(hidden.dtype)


class TffCalmMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` (``"llama"``) or ``down(act(up(x)))`` (``"gpt2"``: no gate)."""

    def __init__(self, config: TffCalmConfig):
        super().__init__()
        gated = config.decoder_style == "llama"
        self.gate_proj = (
            nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias) if gated else None
        )
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        self.act_fn = build_activation(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.gate_proj is None:
            return self.down_proj(self.act_fn(self.up_proj(hidden)))
        gate, up = fused_projections(hidden, self.gate_proj, self.up_proj)
        return self.down_proj(self.act_fn(gate) * up)


class TffCalmAttention(nn.Module):
    """Multi-head attention with rotary positions and grouped key/value heads, through `attend`.

    `forward` can compute outputs for a subset of rows (``rows``) while writing every row's keys and values into the
    cache: the rows that have exited get their keys and values from their (unchanged) exit state.
    """

    def __init__(self, config: TffCalmConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def _heads(self, tensor: torch.Tensor, heads: int) -> torch.Tensor:
        batch, length = tensor.shape[:2]
        return tensor.view(batch, length, heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def key_value(self, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """This layer's keys (rotated) and values of ``normed`` ``(B, T, D)``: ``(B, Hkv, T, Dh)`` each."""
        key, value = fused_projections(normed, self.k_proj, self.v_proj)
        return apply_rotary(self._heads(key, self.num_kv_heads), cos, sin), self._heads(value, self.num_kv_heads)

    def forward(self, normed, cos, sin, allowed, cache: Cache | None = None, rows=None):
        """``normed`` ``(B, T, D)`` -> ``(B', T, D)`` for the ``rows`` (all when ``None``), and the probabilities
        ``(B', H, T, S)`` with the eager implementation."""
        if rows is None:
            query, key, value = fused_projections(normed, self.q_proj, self.k_proj, self.v_proj)
            key = apply_rotary(self._heads(key, self.num_kv_heads), cos, sin)
            value = self._heads(value, self.num_kv_heads)
        else:
            key, value = self.key_value(normed, cos, sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (B, Hkv, S, Dh)
        if rows is not None:
            query = self.q_proj(normed[rows])
            key, value = key[rows], value[rows]
            if cos is not None:
                cos, sin = cos[rows], sin[rows]
            allowed = allowed[rows] if allowed is not None and allowed.shape[0] > 1 else allowed
        query = apply_rotary(self._heads(query, self.num_heads), cos, sin)  # (B', H, T, Dh)
        if self.num_kv_heads != self.num_heads:
            repeat = self.num_heads // self.num_kv_heads
            key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
        dropout_p = self.config.attention_dropout if self.training else 0.0
        attended, probs = attend(
            query, key, value, allowed, dropout_p=dropout_p, implementation=self.config._attn_implementation
        )
        batch, _, length, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1)), probs


class TffCalmDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm attention and MLP (Llama's layer), plus `propagate` for tokens that exited below it."""

    def __init__(self, config: TffCalmConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = build_norm(config)
        self.self_attn = TffCalmAttention(config, layer_idx)
        self.post_attention_layernorm = build_norm(config)
        self.mlp = TffCalmMLP(config)

    def forward(self, hidden, cos, sin, allowed, cache=None, rows=None):
        """``hidden`` ``(B, T, D)``; with ``rows`` (exited rows present), only those rows are updated and the others
        pass through unchanged, their keys and values propagated from their state."""
        attended, probs = self.self_attn(
            self.input_layernorm(hidden), cos=cos, sin=sin, allowed=allowed, cache=cache, rows=rows
        )
        running = hidden if rows is None else hidden[rows]
        running = running + attended
        running = running + self.mlp(self.post_attention_layernorm(running))
        if rows is None:
            return running, probs
        return hidden.index_copy(0, rows, running), probs

    def propagate(self, hidden, cos, sin, cache: Cache) -> None:
        """State propagation: write this layer's keys and values of ``hidden`` (the exit states) into the cache;
        the hidden state passes this layer unchanged."""
        key, value = self.self_attn.key_value(self.input_layernorm(hidden), cos, sin)
        cache.update(key, value, self.layer_idx)


# ------------------------------------------------------------------------------------------------- pretrained model
class TffCalmPreTrainedModel(TffPreTrainedModel):
    config_class = TffCalmConfig
    config: TffCalmConfig
    base_model_prefix = "model"
    carried_state = None  # a transformers Cache, passed in and out as usual
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffCalmDecoderLayer"]
    _supports_sdpa = True  # eager and sdpa give the same tokens: tests/models/calm/test_modeling_calm.py
    _can_set_attn_implementation_cached_value = True  # read at every call

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, TffCalmRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


class CalmLayerInputs(NamedTuple):
    """What `TffCalmModel.prepare` makes of a call's inputs, read by every layer."""

    hidden: torch.Tensor  # (B, T, D) embeddings (plus learned positions in the "gpt2" style)
    cos: torch.Tensor | None  # rotary tables (None with learned positions)
    sin: torch.Tensor | None
    allowed: torch.Tensor | None  # (B, 1, T, S) bool mask (None: nothing masked)
    positions: torch.Tensor  # (B, T)


class TffCalmModel(TffCalmPreTrainedModel):
    """The decoder stack: embeddings, layers, final norm (shared by every exit)."""

    def __init__(self, config: TffCalmConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        # learned absolute positions in the "gpt2" style (rotary ones otherwise)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.decoder_style == "gpt2"
            else None
        )
        self.layers = nn.ModuleList(TffCalmDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = build_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module):
        self.embed_tokens = value

    @property
    def depth(self) -> int:
        """The active depth: ``config.num_hidden_layers`` (transformers' ``assistant_early_exit`` lowers it)."""
        depth = self.config.num_hidden_layers
        if not 1 <= depth <= len(self.layers):
            raise ValueError(
                f"config.num_hidden_layers must be in [1, {len(self.layers)}] (the layers built), got {depth}."
            )
        return depth

    def propagate(self, hidden, cos, sin, cache: Cache, start: int) -> None:
        """State propagation into layers ``start`` … ``depth - 1``: each writes its keys and values of ``hidden``
        (the exit states ``(B, T, D)``, which pass those layers unchanged) into the cache.

        Without gradients, all those layers' norms and key/value projections are one product: a layer's norm is
        the shared normalisation ``x̂`` times its weight (plus its bias, LayerNorm), so ``norm_l(x) W_l^T + c_l =
        x̂ (W_l diag(w_l))^T + (W_l b_l + c_l)``, and the folded weights of every layer are stacked (at every call). With gradients, or when a norm or projection is not a plain module (LoRA), each layer projects on
        its own (`TffCalmDecoderLayer.propagate`)."""
        layers = self.layers[start : self.depth]
        if not len(layers):
            return
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        folded = None if grad else self._folded_key_value(hidden.dtype)
        if folded is None:
            for layer in layers:
                layer.propagate(hidden, cos, sin, cache)
            return
        weight, bias = folded
        width = 2 * self.config.num_key_value_heads * self.config.head_dim
        normalised = _normalise(self.layers[0].input_layernorm, hidden)
        rows = slice(start * width, self.depth * width)
        batch, length = hidden.shape[:2]
        heads, head_dim = self.config.num_key_value_heads, self.config.head_dim
        projected = F.linear(normalised, weight[rows], bias[rows])  # (B, T, L' * 2 * Hkv * Dh)
        projected = projected.view(batch, length, len(layers) * 2 * heads, head_dim).transpose(1, 2)
        keys_values = projected.reshape(batch, len(layers), 2, heads, length, head_dim)
        keys = apply_rotary(keys_values[:, :, 0].reshape(batch, -1, length, head_dim), cos, sin)
        keys = keys.view(batch, len(layers), heads, length, head_dim)
        for index, layer in enumerate(layers):
            cache.update(keys[:, index], keys_values[:, index, 1], layer.layer_idx)

    def _folded_key_value(self, dtype: torch.dtype):
        """Every layer's key/value projection with its input norm's weight (and bias) folded in, stacked:
        ``(L * 2 * Hkv * Dh, D)`` and ``(L * 2 * Hkv * Dh,)``, folded at every call (nothing is kept on the module:
        weights changed in place are always read); ``None`` when a norm or projection is not the plain module whose
        weights these are (a LoRA or quantised wrapper, a hook)."""
        for layer in self.layers:
            attention, norm = layer.self_attn, layer.input_layernorm
            plain_norm = type(norm) in (TffCalmRMSNorm, nn.LayerNorm) and not (
                norm._forward_hooks or norm._forward_pre_hooks
            )
            if not (plain_norm and is_plain_linear(attention.k_proj) and is_plain_linear(attention.v_proj)):
                return None
        weights, biases = [], []
        with torch.no_grad():
            for layer in self.layers:
                attention, norm = layer.self_attn, layer.input_layernorm
                projection = torch.cat([attention.k_proj.weight, attention.v_proj.weight]).double()  # (2 Hkv Dh, D)
                bias = torch.zeros(projection.shape[0], dtype=torch.float64, device=projection.device)
                if attention.k_proj.bias is not None:
                    bias = bias + torch.cat([attention.k_proj.bias, attention.v_proj.bias]).double()
                if getattr(norm, "bias", None) is not None:
                    bias = bias + projection @ norm.bias.double()
                weights.append(projection * norm.weight.double()[None, :])
                biases.append(bias)
            folded = (torch.cat(weights).to(dtype), torch.cat(biases).to(dtype))
        return folded

    def prepare(self, input_ids, inputs_embeds, attention_mask, position_ids, cache) -> CalmLayerInputs:
        """Embeddings ``(B, T, D)``, rotary tables, the bool mask ``(B, 1, T, S)`` (``None``: nothing masked) and
        the positions ``(B, T)``. Positions count real tokens (left padding starts at 0)."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        # learned positions (GPT-2 style) end at max_position_embeddings; rotary ones only need to be >= 0
        learned = self.embed_positions is not None
        limit = self.config.max_position_embeddings if learned else MAX_SIZE
        self._check_index_inputs("position_ids", position_ids, batch, length, limit, "max_position_embeddings")
        if attention_mask is not None:
            check_tensor("attention_mask", attention_mask, dim=2)
        check_cache(cache, batch, self.config.num_key_value_heads, self.config.head_dim)
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        past = int(cache.get_seq_length()) if cache is not None else 0
        total, device = past + length, hidden.device
        slots = max(total, int(cache.get_mask_sizes(length, 0)[0])) if cache is not None else total
        if attention_mask is not None and tuple(attention_mask.shape) != (batch, total):
            raise ValueError(
                f"attention_mask must have shape {(batch, total)} (the {past} cached positions plus the {length} new "
                f"ones), got {tuple(attention_mask.shape)}."
            )
        if position_ids is None:
            if attention_mask is None:
                position_ids = torch.arange(past, total, device=device).expand(batch, length)
            else:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]  # (B, T)
        allowed = None
        padded = attention_mask is not None and (torch.compiler.is_exporting() or not bool(attention_mask.all()))
        if length > 1 or padded or slots > total:
            query_at = torch.arange(past, total, device=device)[:, None]  # (T, 1)
            key_at = torch.arange(slots, device=device)[None, :]  # (1, S): a static cache returns empty slots too
            allowed = (key_at <= query_at)[None, None]  # (1, 1, T, S)
            if padded:  # a padded query still sees itself, so no row of the mask is empty (its output is never used)
                real = F.pad(attention_mask.bool(), (0, slots - total))[:, None, None]  # (B, 1, 1, S)
                allowed = (allowed & real) | (key_at == query_at)
        if self.embed_positions is not None:
            if not torch.compiler.is_compiling() and int(position_ids.max()) >= self.config.max_position_embeddings:
                raise ValueError(
                    f"position {int(position_ids.max())} is beyond max_position_embeddings="
                    f"{self.config.max_position_embeddings} (learned positions); shorten the input."
                )
            return CalmLayerInputs(hidden + self.embed_positions(position_ids), None, None, allowed, position_ids)
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_base, hidden.dtype)
        return CalmLayerInputs(hidden, cos, sin, allowed, position_ids)

    def run_layers(self, inputs: CalmLayerInputs, cache: Cache | None, depth: int | None = None):
        """The first ``depth`` layers (default: the active depth) on the prepared ``inputs``: the last hidden state
        ``(B, T, D)`` (un-normed), the embeddings and every layer's output, and every layer's attention
        probabilities (``None`` entries unless eager)."""
        hidden, cos, sin, allowed, _ = inputs
        all_hidden, all_attentions = (hidden,), ()
        for layer in self.layers[: self.depth if depth is None else depth]:
            hidden, probs = layer(hidden, cos, sin, allowed, cache)
            all_hidden += (hidden,)
            all_attentions += (probs,)
        return hidden, all_hidden, all_attentions

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """Full depth (``config.num_hidden_layers`` layers). ``last_hidden_state`` is after the final norm;
        ``hidden_states`` (with ``output_hidden_states``) are the embeddings and every layer's output, un-normed.

        transformers' decoder signature (heads, PEFT and `generate` pass these by name), hence more than ~6 parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if use_cache and cache is None:
            cache = GrowingCache(self.config)
        inputs = self.prepare(input_ids, inputs_embeds, attention_mask, position_ids, cache)
        hidden, all_hidden, all_attentions = self.run_layers(inputs, cache if use_cache else None)
        output = BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden),
            cache=cache if use_cache else None,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


# ------------------------------------------------------------------------------------------------------------ heads
class TffCalmForCausalLM(FusedLMHeadMixin, TffCalmPreTrainedModel, GrowingCacheGenerationMixin):
    """CALM's language model: the decoder, the shared LM head, the meta classifier, and early exit while decoding.

    ``exit_training = True`` tells the causal-LM recipe to pass its aligned targets as ``exit_targets`` (the anytime
    loss then comes back as ``aux_loss``)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    exit_training = True

    def __init__(self, config: TffCalmConfig):
        super().__init__(config)
        self.model = TffCalmModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.meta_classifier = nn.Linear(config.hidden_size, 2)  # does the exit agree with the last layer?
        # Depth-Adaptive exits: one logit per exit point (geometric-like: the point's own; multinomial: all of them
        # from the first exit's state)
        exits = len(config.exit_points())
        halting = config.confidence_measure in HALTING_MEASURES
        self.halting_classifier = nn.Linear(config.hidden_size, exits) if halting else None
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    @classmethod
    def from_decoder(cls, decoder, **calm_fields) -> TffCalmForCausalLM:
        """A CALM model with the weights of an existing decoder language model, ready to fine-tune with the anytime
        loss (``recipes/causal_lm.py --model_name_or_path <saved>``) and to calibrate.

        ``decoder``: a model object or a folder. Accepted: a transformers Llama (``LlamaForCausalLM``/``LlamaModel``)
        or GPT-2 (``GPT2LMHeadModel``/``GPT2Model``), converted as by `from_pretrained` of their folders
        (`convert_calm.py`); a zoo kNN-LM (``tff_knn_lm``), whose base LM is converted (its datastore is retrieval,
        not layers: attach one to the new model's kNN-LM wrapper if wanted); a CALM model (a copy with new
        fields). ``calm_fields`` set CALM's fields (``first_exit``, ``exit_interval``, ``confidence_measure`` …).
        The zoo's other architectures cannot be CALM decoders; the ValueError names why
        (`convert_calm.UNSUPPORTED_DECODERS`)."""
        return from_decoder(cls, decoder, **calm_fields)

    # --------------------------------------------------------------------------------------------------- forward
    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        exit_layer: int | None = None,
        exit_targets: torch.LongTensor | None = None,
        num_items_in_batch: NumItems = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> EarlyExitCausalLMOutput | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` (or ``inputs_embeds`` ``(B, T, D)``); with a filled cache, the new tokens only.
            attention_mask: ``(B, P + T)``, 1 for real tokens (left or right padding), ``P`` cached positions.
            labels: ``(B, T)`` usually ``input_ids`` (shifted inside; -100 ignored): ``loss`` is the anytime loss
                plus ``meta_loss_weight`` times the meta classifier's loss.
            exit_targets: ``(B, T)`` targets aligned with the positions (packed blocks; `Trainer` wants every ``*labels``
                argument before it reports ``eval_loss``): ``aux_loss`` turns the last layer's CE into that same total.
            cache / use_cache: a `transformers.Cache` (a new `GrowingCache`, a `DynamicCache` that writes in place, when
                ``use_cache`` and none; one given is read even without); also ``past_key_values`` (before 5.24).
            exit_layer: force every token of this call to exit after this many layers (keys and values of the
                layers above propagated from the exit state).
            num_items_in_batch: `Trainer`'s count of ``labels[:, 1:]`` over the accumulated batch (see the module
                docstring for how each loss uses it).
            logits_to_keep: only the last that many positions' logits (0: all); `generate` passes 1, so a prompt's
                forward does not project every position onto the vocabulary. Not with ``labels`` / ``exit_targets``
                (the losses need every position).

        With ``config.exit_threshold`` set and one new token per row (decoding), rows exit early (module docstring).

        transformers' language-model signature plus CALM's exit options (`generate` and `Trainer` pass them by
        name), hence more than ~6 parameters.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if use_cache and cache is None:
            cache = GrowingCache(self.config)
        returned_cache = cache if use_cache else None  # one passed in is read anyway (PEFT prefix tuning's prefix)
        self._check_exit_options(exit_layer, logits_to_keep, labels, exit_targets)
        inputs = self.model.prepare(input_ids, inputs_embeds, attention_mask, position_ids, cache)
        batch, length = inputs.hidden.shape[:2]
        self._check_lm_labels(labels, batch, length)
        if exit_targets is not None:
            check_class_labels("exit_targets", exit_targets, self.config.vocab_size, (batch, length), "vocab_size")
        training = labels is not None or exit_targets is not None
        losses = {}
        all_hidden = all_attentions = None
        if exit_layer is None and not training and self._exits_while_decoding(length):
            logits, exit_layers = self._decode_with_exits(inputs, cache)
        else:  # full depth, or every token forced out after exit_layer layers
            hidden, all_hidden, all_attentions = self.model.run_layers(inputs, cache, depth=exit_layer)
            if exit_layer is not None and cache is not None:
                self.model.propagate(hidden, inputs.cos, inputs.sin, cache, exit_layer)
            logits = self.lm_head(self.model.norm(hidden[:, -logits_to_keep:] if logits_to_keep else hidden))
            depth = self.model.depth if exit_layer is None else exit_layer
            exit_layers = torch.full((batch, length), depth, dtype=torch.long, device=hidden.device)
            if exit_layer is None and training:
                losses = self._training_losses(all_hidden, logits, labels, exit_targets, num_items_in_batch)
            if exit_layer is not None:  # forced exits report no per-layer states
                all_hidden = all_attentions = None
        output = EarlyExitCausalLMOutput(
            loss=losses.get("loss"),
            logits=logits,
            cache=returned_cache,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
            exit_layers=exit_layers,
            aux_loss=losses.get("aux_loss"),
            lm_loss=losses.get("lm_loss"),
            meta_loss=losses.get("meta_loss"),
            halting_loss=losses.get("halting_loss"),
        )
        return output if return_dict else output.to_tuple()

    def generate(self, inputs: torch.Tensor | None = None, *args, output_exit_layers: bool = False, **kwargs):
        """transformers' `generate`; with ``output_exit_layers=True`` (and ``return_dict_in_generate=True``) the
        output also has ``exit_layers`` ``(B, new tokens)``: after how many layers each generated token exited (the
        first generated token comes from the prompt's last position). Read from each forward's
        `EarlyExitCausalLMOutput.exit_layers` through a forward hook held for this call only. Greedy and sampling
        (one sequence per row: beam search reorders rows, so its per-step exits belong to no final sequence)."""
        if not output_exit_layers:
            return super().generate(inputs, *args, **kwargs)
        generation_config = kwargs.get("generation_config") or self.generation_config
        beams = kwargs.get("num_beams", generation_config.num_beams) or 1
        returns = kwargs.get("num_return_sequences", generation_config.num_return_sequences) or 1
        if not kwargs.get("return_dict_in_generate", generation_config.return_dict_in_generate):
            raise ValueError(
                "output_exit_layers=True adds exit_layers to generate's output object: pass "
                "return_dict_in_generate=True as well."
            )
        if beams > 1 or returns > 1:
            raise ValueError(
                f"output_exit_layers=True records one exit per row and step; num_beams={beams} / "
                f"num_return_sequences={returns} reorder or repeat rows. Use num_beams=1 and num_return_sequences=1."
            )
        steps: list[torch.Tensor] = []
        hook = self.register_forward_hook(lambda module, args, output: steps.append(output.exit_layers))
        try:
            out = super().generate(inputs, *args, **kwargs)
        finally:
            hook.remove()
        return CalmGenerateOutput(**out, exit_layers=torch.cat([steps[0][:, -1:], *steps[1:]], dim=1))

    def _check_exit_options(self, exit_layer, logits_to_keep, labels, exit_targets) -> None:
        """`forward`'s own options checked at the edge (the token inputs are checked by `TffCalmModel.prepare`)."""
        depth = self.model.depth
        if exit_layer is not None:
            fix = f"force an exit after 1 to {depth} layers (config.num_hidden_layers), or pass None"
            check_int("exit_layer", exit_layer, minimum=1, maximum=depth, fix=fix)
        check_int("logits_to_keep", logits_to_keep, minimum=0, fix="pass 0 (every position) or how many to keep")
        if logits_to_keep and (labels is not None or exit_targets is not None):
            raise ValueError(
                f"logits_to_keep={logits_to_keep} with labels or exit_targets: the losses need every position's "
                "logits; pass logits_to_keep=0 when training."
            )

    def _exits_while_decoding(self, length: int) -> bool:
        """Whether rows may exit early in this call: a threshold is set and one new token per row (decoding)."""
        threshold = self.config.exit_threshold
        return threshold is not None and not math.isinf(threshold) and length == 1

    def _training_losses(self, all_hidden, logits, labels, exit_targets, num_items_in_batch: NumItems) -> dict:
        """The losses of a full-depth call with ``labels`` (``loss``) or aligned ``exit_targets`` (``aux_loss``,
        the same total less the last layer's cross entropy), plus ``lm_loss`` and ``meta_loss``."""
        # (B, T): position t predicts t + 1
        targets = F.pad(labels[:, 1:], (0, 1), value=-100) if labels is not None else exit_targets
        targets = targets.to(logits.device)
        anytime, lm_loss, meta_loss, halting_loss = exit_losses(
            all_hidden,
            logits,
            targets,
            self.config.exit_points(self.model.depth),
            norm=self.model.norm,
            lm_head=self.lm_head,
            meta_classifier=self.meta_classifier,
            aggregation=self.config.aggregation,
            distillation_weight=self.config.distillation_weight,
            halting_classifier=self.halting_classifier,
            halting_measure=self.config.confidence_measure,
            halting_oracle=self.config.halting_oracle,
            halting_depth_penalty=self.config.halting_depth_penalty,
            num_items_in_batch=num_items_in_batch,
        )
        counted = (targets != IGNORE_INDEX).sum()
        classifiers = meta_loss if halting_loss is None else meta_loss + halting_loss
        total = anytime + self.config.meta_loss_weight * batch_share(classifiers, counted, num_items_in_batch)
        losses = {"lm_loss": lm_loss, "meta_loss": meta_loss, "halting_loss": halting_loss}
        if labels is not None:
            losses["loss"] = total
        else:
            losses["aux_loss"] = total - lm_loss
        return losses

    # -------------------------------------------------------------------------------------------------- exiting
    def _restricted_weight(self) -> torch.Tensor:
        """The LM head's rows of ``config.restricted_vocab`` ``(K, D)``."""
        return self.lm_head.weight[list(self.config.restricted_vocab)]

    def _confidence(self, measure: str, hidden, previous, first, index: int):
        """Every row's confidence ``(B,)`` at exit ``index`` (of the exit points), the exit logits ``(B, 1, V)``
        when the measure computed them, and the normed exit states when it computed those (``previous``: the hidden
        states at the previous exit, for ``state``; ``first``: at the first exit, for ``multinomial``)."""
        if measure == "state":
            return state_confidence(previous, hidden)[:, 0], None, None
        if measure == "multinomial":
            exit_logits = self.halting_classifier(self.model.norm(first))  # (B, 1, P)
            return multinomial_halting_confidence(exit_logits, index)[:, 0], None, None
        normed = self.model.norm(hidden)
        if measure == "halting":
            logit = F.linear(normed, self.halting_classifier.weight[index], self.halting_classifier.bias[index])
            return geometric_halting_confidence(logit)[:, 0], None, normed
        if measure == "meta":
            return meta_confidence(self.meta_classifier(normed))[:, 0], None, normed
        if measure == "restricted_softmax":
            return restricted_softmax_confidence(normed, self._restricted_weight())[:, 0], None, normed
        logits = self.lm_head(normed)
        score = softmax_diff_confidence if measure == "softmax_diff" else softmax_max_confidence
        return score(logits)[:, 0], logits, normed

    def _decode_with_exits(self, inputs: CalmLayerInputs, cache: Cache | None):
        """One new token per row (``inputs.hidden`` ``(B, 1, D)``): per-row exits, state propagation for exited rows.
        Returns the logits ``(B, 1, V)`` (each from its row's exit) and the exit layers ``(B, 1)``.

        A row that leaves keeps its exit state, and every layer above still writes its keys and values: the layer's
        own norm and key/value projections of that state (state propagation). While more than half the rows run,
        a layer runs on the whole batch and ``torch.where`` keeps the left rows' states (on a CPU a layer's cost
        hardly depends on a few rows, and gathering them costs more); once at most half run, attention and MLP run
        on those rows only (`index_select`/`index_copy`), the keys and values still on all. Once every row has
        left, the remaining layers only propagate, all in one product (`TffCalmModel.propagate`). One host read
        per exit check (how many rows leave); no per-row Python work. Until a row leaves, a check adds nothing to the
        layers above (no ``torch.where``, no bookkeeping): a token that runs the full depth pays only its checks."""
        config, base = self.config, self.model
        hidden, cos, sin, allowed, positions = inputs
        depth = base.depth
        points = config.exit_points(depth)
        measure = config.confidence_measure
        if measure in HALTING_MEASURES and self.halting_classifier is None:
            raise ValueError(
                f"confidence_measure={measure!r} reads the Depth-Adaptive halting classifier, which this model was "
                "built without (it is built when the config's measure is 'halting' or 'multinomial'); build the model "
                f"with confidence_measure={measure!r} and train its classifier, or choose one of CALM's measures."
            )
        decay_length = config.decay_length or config.max_position_embeddings
        threshold = decayed_threshold(
            config.exit_threshold, positions[:, 0], decay_length, config.position_temperature
        )
        batch = hidden.shape[0]
        checked = {point for point in points[:-1] if point >= config.min_exit}
        exit_layers = None  # (B,) once a row has left (None: every row runs the full depth so far)
        running = None  # (B,) bool once a row has left (None: every row runs)
        remaining = batch
        rows = None  # the running rows' indices once at most half the batch runs
        previous = first = None  # the hidden states at the previous exit (state) and at the first (multinomial)
        for count, layer in enumerate(base.layers[:depth], start=1):
            updated, _ = layer(hidden, cos, sin, allowed, cache, rows)
            hidden = (
                updated
                if running is None or rows is not None
                else torch.where(running[:, None, None], updated, hidden)
            )
            if count == points[0]:
                first = hidden
            if count not in checked:
                if count in points:
                    previous = hidden
                continue
            if measure == "state" and previous is None:
                previous = hidden
                continue
            confidence, logits, normed = self._confidence(measure, hidden, previous, first, points.index(count))
            previous = hidden
            leaving = confidence >= threshold
            if running is not None:
                leaving = leaving & running
            left = int(leaving.sum())
            if left == 0:  # nobody leaves here: nothing to record
                continue
            remaining -= left
            if exit_layers is None:
                exit_layers = torch.full((batch,), depth, dtype=torch.long, device=hidden.device)
            exit_layers = torch.where(leaving, count, exit_layers)
            running = ~leaving if running is None else running & ~leaving
            if remaining == 0:  # every row has left: the layers above only propagate
                if cache is not None and count < depth:
                    base.propagate(hidden, cos, sin, cache, count)
                # a left row's state is frozen, so these logits are every row's exit logits
                if logits is None:
                    logits = self.lm_head(base.norm(hidden) if normed is None else normed)
                return logits, exit_layers[:, None]
            if 2 * remaining <= batch:
                rows = running.nonzero()[:, 0]
        if exit_layers is None:
            exit_layers = torch.full((batch,), depth, dtype=torch.long, device=hidden.device)
        return self.lm_head(base.norm(hidden)), exit_layers[:, None]

    # ---------------------------------------------------------------------------------------------- generation
    @accepts_past_key_values
    def prepare_inputs_for_generation(
        self, input_ids, cache=None, attention_mask=None, inputs_embeds=None, use_cache=True, **kwargs
    ) -> dict:
        """With a cache, only the tokens it has not seen; the mask always covers the whole sequence."""
        past = decoding_past_length(
            cache if use_cache else None, input_ids, attention_mask, inputs_embeds, kwargs.get("next_sequence_length")
        )
        model_inputs = {"attention_mask": attention_mask, "use_cache": use_cache}
        if use_cache:
            model_inputs[GENERATION_CACHE_KEY] = cache
        step = decoding_step_inputs(input_ids, past, attention_mask, inputs_embeds, self.get_input_embeddings())
        model_inputs.update(step)
        if kwargs.get("exit_layer") is not None:
            model_inputs["exit_layer"] = kwargs["exit_layer"]
        return model_inputs


__all__ = ["CalmLayerInputs", "TffCalmForCausalLM", "TffCalmModel", "TffCalmPreTrainedModel"]
