"""Sparse Transformer: a decoder-only language model with factorised sparse attention (Child, Gray, Radford &
Sutskever 2019, "Generating Long Sequences with Sparse Transformers", arXiv:1904.10509).

Every head attends under one factor of a two-factor causal pattern (`tf_family.attention.factorized`): the
``"strided"`` pattern (the previous ``l`` positions; every ``l``-th earlier position) or the ``"fixed"`` pattern (the
own block of ``l`` positions; the summary columns of every block, a different sub-block per head). The two factors are
split across each layer's heads or interleaved across layers (``pattern_layout``); either way every position reaches
every earlier one in two layers (proved by `tests/attention/test_factorized.py`). With ``l`` near ``sqrt(T)``
attention costs ``O(T sqrt(T))``.

The same house holds two more fixed patterns, each on every head and layer: the Image Transformer's local 1-D / 2-D
attention (Parmar et al. 2018, `tf_family.attention.image_local`) and blockwise self-attention (``"blockwise"``, Qiu
et al. 2020, BlockBERT, arXiv:1911.02972, `tf_family.attention.blockwise`): blocks of ``stride`` positions, head ``h``
reading block ``b - k_h`` (``block_shifts``), the causal partial form of the paper's cyclic block shifts (in the
decoder a block reads only itself or earlier blocks).

Encoder heads (BlockBERT, the paper's own model): with ``sparsity_pattern="blockwise"``,
`TffSparseTransformerForMaskedLM` and `TffSparseTransformerForSequenceClassification` run the same stack
bidirectionally (``config.causal=False``, which they set on their copy of the config): head ``h`` lets block ``b``
attend to block ``(b + k_h) mod n``, the paper's cyclic shift, over the ``n = ceil(T / stride)`` blocks of each row's
real tokens, so padding changes no real position's output. The other patterns are causal by construction and the
encoder heads refuse them. The masked-LM head is BERT's (dense, activation, LayerNorm, decoder tied to the token
embeddings); the classifier reads each row's first real token (`tf_family.modeling.heads`).

Attention paths (the same outputs, decoder and encoder,
`tests/models/sparse_transformer/test_modeling_sparse_transformer.py`):

- the efficient path (every ``attn_implementation`` but ``"eager"``; ``"tff_native"``, the CPU default, runs the
  summary factor on the native kernel): a forward without a filled cache regroups the sequence per factor (blocks,
  the transposed grid, the gathered summary columns, each layer's summary heads in one call; `factorized_attention`),
  no ``T x T`` tensor. Left-padded rows are rolled so that their real tokens start at position 0 and rolled back after;
  a mask whose real tokens are not one contiguous run per row takes the dense path;
- the dense path: every head's pattern as a ``(B, H, T, S)`` mask (`build_factorized_mask`) through `attend`: with
  ``"eager"`` (which returns the probabilities, ``output_attentions``), under `torch.export` (ONNX), and for a
  decoding step, whose one query row over the cache costs ``O(S)``.

Positions: ``position_embedding_type`` ``"absolute"`` (learned, added to the token embeddings), ``"rotary"`` (queries
and keys rotated, Llama's pairing, `tf_family.attention.rotary`), ``"alibi"`` (a per-head linear bias,
`tf_family.attention.alibi`) or ``"distance_aware"`` (DA-Transformer, Wu et al. 2021: each layer's
`DistanceAwareScaling` re-scales the ReLU'd scores by a learnable sigmoid of ``w_h |i - j|`` and re-normalises them,
`tf_family.attention.distance_aware`; causal: the same over keys ``j <= i``; both paths). Positions count real tokens
(left padding starts at 0), and the pattern is laid on those positions, so padding on either side changes nothing.

The block is GPT-2's pre-norm layer (LayerNorm, attention, LayerNorm, GELU MLP). Deviations from the paper: no
recomputation of attention in the backward pass (gradient checkpointing is the layer-level equivalent), no
per-layer initialisation scaling, no mixed-precision tricks; the paper's "fixed" pattern has no self position in its
A(2) factor, which is added here (see `tf_family.attention.factorized`). Reference implementation read:
openai/sparse_attention ``attention.py`` (``get_attn_mask``, ``strided_transpose``); its patterns are the oracle of the
dense twin.

Config field <-> paper symbol: ``stride`` = l, ``summary_size`` = c, ``pattern_layout`` = the paper's "multi-head"
(``"heads"``) or interleaved (``"layers"``) integration.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from torch import nn
from transformers import Cache
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from ...attention import attend
from ...attention.alibi import alibi_bias, alibi_slopes
from ...attention.blockwise import BlockwisePattern, blockwise_attention, build_blockwise_mask, num_blocks_of
from ...attention.distance_aware import distance_aware_attention
from ...attention.factorized import FactorizedPattern, build_factorized_mask, factorized_attention
from ...attention.image_local import Local1DPattern, Local2DPattern, build_image_local_mask, image_local_attention
from ...attention.rotary import apply_rotary, rotary_cos_sin
from ...layers.distance_aware import DistanceAwareScaling, initial_distance_weights
from ...modeling.cache import GrowingCache
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import GenericForMaskedLM, GenericForSequenceClassification
from ...modeling.losses import causal_lm_loss
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import accepts_past_key_values
from ...modeling.utils import (
    Dropout,
    build_activation,
    fused_projections,
    key_value_generation_inputs,
)
from ...modeling.validation import MAX_SIZE, ValidatedGenerationMixin, check_cache, check_tensor
from .configuration_sparse_transformer import FACTORS, TffSparseTransformerConfig

logger = logging.get_logger(__name__)


class SparseLayerInputs(NamedTuple):
    """What `TffSparseTransformerModel.prepare` makes of a call's inputs, read by every layer's attention."""

    cos: torch.Tensor | None  # rotary tables (None unless position_embedding_type="rotary")
    sin: torch.Tensor | None
    slopes: torch.Tensor | None  # (H,) ALiBi slopes (None unless "alibi")
    query_positions: torch.Tensor  # (B, T) real-token positions of the new tokens
    key_positions: torch.Tensor  # (B, S) of every key (cached ones first)
    key_valid: torch.Tensor | None  # (B, S) bool, False at padding (None: no padding)
    sparse: bool  # take the efficient path (no filled cache; positions are 0 .. T - 1 after `roll`)
    roll: torch.Tensor | None  # (B, T) gather index that moves left padding to the right (None: nothing to move)
    lengths: torch.Tensor | None  # (B,) real tokens per row: the encoder's block count n (None for the decoder)


# ---------------------------------------------------------------------------------------------------- small modules
class TffSparseTransformerMLP(nn.Module):
    """``fc_out(act(fc_in(x)))``, GPT-2's feed-forward block."""

    def __init__(self, config: TffSparseTransformerConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(hidden)))


# -------------------------------------------------------------------------------------------------------- attention
def layer_head_patterns(config: TffSparseTransformerConfig, layer_idx: int) -> list:
    """The pattern of every head of layer ``layer_idx`` (built here, beside the kernels that read them)."""
    heads = config.num_attention_heads
    if config.sparsity_pattern == "blockwise":  # head h: shift k_h (block_shifts, default 0 .. H - 1)
        shifts = config.block_shifts if config.block_shifts is not None else range(heads)
        return [BlockwisePattern(config.stride, shift, causal=config.causal) for shift in shifts]
    if config.sparsity_pattern == "local_1d":
        return [Local1DPattern(config.stride, config.memory_length)] * heads
    if config.sparsity_pattern == "local_2d":
        fields = (
            config.image_width,
            config.block_height,
            config.block_width,
            config.memory_height,
            config.memory_width,
        )
        return [Local2DPattern(*fields)] * heads
    first, second = FACTORS[config.sparsity_pattern]
    if config.pattern_layout == "heads":
        kinds = [first] * (heads // 2) + [second] * (heads - heads // 2)
    else:
        kinds = [first if layer_idx % 2 == 0 else second] * heads
    patterns, summary_heads = [], 0
    for kind in kinds:
        if kind == "summary":
            sub_blocks = config.stride // config.summary_size
            start = config.stride - config.summary_size * (1 + summary_heads % sub_blocks)
            patterns.append(FactorizedPattern(kind, config.stride, start, config.summary_size))
            summary_heads += 1
        else:
            patterns.append(FactorizedPattern(kind, config.stride))
    return patterns


def _pattern_mask(pattern, query_positions: torch.Tensor, key_positions: torch.Tensor, lengths=None) -> torch.Tensor:
    """A head's bool mask ``(..., T, S)`` (its pattern's mask function; ``lengths`` ``(B,)``: the real tokens of each
    row, whose blocks a bidirectional pattern cycles over)."""
    if isinstance(pattern, FactorizedPattern):
        return build_factorized_mask(pattern, query_positions, key_positions)
    if isinstance(pattern, BlockwisePattern):
        num_blocks = None if pattern.causal else num_blocks_of(lengths, pattern.block_length)  # (B,)
        return build_blockwise_mask(pattern, query_positions, key_positions, num_blocks)
    return build_image_local_mask(pattern, query_positions, key_positions)


def _head_groups(patterns: list) -> list[tuple[int, int, object]]:
    """Runs of consecutive heads that one kernel call takes: ``(first, end, pattern)``, heads with the same pattern,
    or the fixed pattern's summary heads, each with its own summary columns (``pattern`` is then the tuple of the
    heads' patterns, `factorized.head_patterns`)."""

    def call_key(pattern):
        if isinstance(pattern, FactorizedPattern) and pattern.kind == "summary":
            return ("summary", pattern.stride, pattern.summary_size)
        return pattern

    groups = []
    for head, pattern in enumerate(patterns):
        if groups and call_key(patterns[groups[-1][0]]) == call_key(pattern):
            groups[-1] = (groups[-1][0], head + 1)
        else:
            groups.append((head, head + 1))
    return [
        (first, end, patterns[first] if len(set(patterns[first:end])) == 1 else tuple(patterns[first:end]))
        for first, end in groups
    ]


class TffSparseTransformerAttention(nn.Module):
    """Multi-head self-attention (causal, or bidirectional in the blockwise encoder), each head under its pattern
    (`layer_head_patterns`)."""

    def __init__(self, config: TffSparseTransformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.patterns = layer_head_patterns(config, layer_idx)
        self.groups = _head_groups(self.patterns)
        width = config.hidden_size
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(width, width) for _ in range(4))
        distance_aware = config.position_embedding_type == "distance_aware"
        # DA-Transformer's w_h, v_h of this layer (None unless position_embedding_type="distance_aware")
        self.distance_aware = DistanceAwareScaling(self.num_heads) if distance_aware else None

    def _heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(*tensor.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _sparse(self, query, key, value, inputs: SparseLayerInputs, dropout_p: float) -> torch.Tensor:
        """The efficient path over the new tokens (no cached keys): ``(B, H, T, Dh)``."""
        if inputs.roll is not None:  # left padding moved to the right: real tokens at 0 .. n - 1
            index = inputs.roll[:, None, :, None].expand_as(query)
            query, key, value = (t.gather(2, index) for t in (query, key, value))
        parts, implementation = [], self.config._attn_implementation
        # one split per tensor: its backward is one concatenation, not a zero-filled full-size gradient per group
        sizes = [end - first for first, end, _ in self.groups]
        per_group = zip(*(t.split(sizes, dim=1) for t in (query, key, value)), strict=True)
        for (first, end, pattern), heads in zip(self.groups, per_group, strict=True):
            slopes = None if inputs.slopes is None else inputs.slopes[first:end]
            if self.distance_aware is not None:  # the kernels take DA's (w_h, v_h) where they take ALiBi slopes
                slopes = self.distance_aware.heads(first, end)
            if isinstance(pattern, (FactorizedPattern, tuple)):  # a tuple: summary heads, one call
                attended = factorized_attention(*heads, pattern, slopes, dropout_p, implementation)
            elif isinstance(pattern, BlockwisePattern):
                # the encoder's padded rows: each row cycles over its own blocks (real tokens at 0 .. n - 1 here)
                lengths = None if pattern.causal or inputs.key_valid is None else inputs.lengths
                attended = blockwise_attention(*heads, pattern, slopes, dropout_p, implementation, lengths)
            else:  # the Image Transformer's local 1-D / 2-D attention (no ALiBi, no DA: the config refuses them)
                attended = image_local_attention(*heads, pattern, dropout_p, implementation)
            parts.append(attended)
        attended = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        if inputs.roll is not None:
            attended = torch.empty_like(attended).scatter_(2, index, attended)
        return attended

    def _dense(self, query, key, value, inputs: SparseLayerInputs, dropout_p: float, implementation: str | None):
        """The dense path (every head's mask ``(B, H, T, S)``): the new queries over every key."""
        allowed = torch.stack(
            [_pattern_mask(p, inputs.query_positions, inputs.key_positions, inputs.lengths) for p in self.patterns],
            dim=1,
        )  # (B, H, T, S)
        if inputs.key_valid is not None:
            past = key.shape[2] - query.shape[2]
            allowed = allowed & inputs.key_valid[:, None, None, :]
            # a padded query sees itself only, so no row is empty (its output is never used)
            index_q = torch.arange(past, key.shape[2], device=query.device)[:, None]
            index_k = torch.arange(key.shape[2], device=query.device)[None, :]
            padded_query = ~inputs.key_valid[:, None, past:, None]  # (B, 1, T, 1)
            allowed = allowed | (padded_query & (index_q == index_k))
        if self.distance_aware is not None:
            distance = inputs.query_positions[:, :, None] - inputs.key_positions[:, None, :]  # (B, T, S): i - j
            work = torch.promote_types(query.dtype, torch.float32)
            coefficients = self.distance_aware.heads().coefficients(distance, work)  # (B, H, T, S)
            return distance_aware_attention(query, key, value, allowed, coefficients, dropout_p)
        bias = None
        if inputs.slopes is not None:
            bias = alibi_bias(inputs.slopes, inputs.query_positions, inputs.key_positions).to(query.dtype)
        return attend(query, key, value, allowed, bias, dropout_p=dropout_p, implementation=implementation)

    def forward(
        self, hidden: torch.Tensor, inputs: SparseLayerInputs, cache: Cache | None = None, output_attentions=False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden`` ``(B, T, D)`` (the new tokens) -> ``(B, T, D)`` and, on the dense eager path, the probabilities
        ``(B, H, T, S)``."""
        batch, length, _ = hidden.shape
        query, key, value = (self._heads(x) for x in fused_projections(hidden, self.q_proj, self.k_proj, self.v_proj))
        query, key = apply_rotary(query, inputs.cos, inputs.sin), apply_rotary(key, inputs.cos, inputs.sin)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (B, H, S, Dh)
        dropout_p = self.config.attention_dropout if self.training else 0.0
        probs = None
        if inputs.sparse and not output_attentions:
            attended = self._sparse(query, key, value, inputs, dropout_p)
        else:
            implementation = "eager" if output_attentions else self.config._attn_implementation
            attended, probs = self._dense(query, key, value, inputs, dropout_p, implementation)
        attended = attended.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        return self.o_proj(attended), probs


# ------------------------------------------------------------------------------------------------------------ layer
class TffSparseTransformerLayer(GradientCheckpointingLayer):
    """GPT-2's pre-norm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: TffSparseTransformerConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = TffSparseTransformerAttention(config, layer_idx)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = TffSparseTransformerMLP(config)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, inputs: SparseLayerInputs, cache=None, output_attentions=False):
        attended, probs = self.self_attn(
            self.input_layernorm(hidden), inputs=inputs, cache=cache, output_attentions=output_attentions
        )
        hidden = hidden + self.dropout(attended)
        hidden = hidden + self.dropout(self.mlp(self.post_attention_layernorm(hidden)))
        return hidden, probs


# ------------------------------------------------------------------------------------------------- pretrained model
class TffSparseTransformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffSparseTransformerConfig
    config: TffSparseTransformerConfig
    base_model_prefix = "model"
    carried_state = None  # a transformers Cache, passed in and out as usual
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffSparseTransformerLayer"]
    _supports_sdpa = True  # the efficient path and the eager dense twin agree: the model's tests
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
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, DistanceAwareScaling):
            init.copy_(module.weight, initial_distance_weights(module.weight.shape[0]))
            init.zeros_(module.offset)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate makes no cache: the first forward does (a `GrowingCache`)


# ------------------------------------------------------------------------------------------------------- base model
class TffSparseTransformerModel(TffSparseTransformerPreTrainedModel):
    """The stack: token (and absolute position) embeddings, the layers, the final LayerNorm. A decoder, or (with
    ``config.causal=False`` and the blockwise pattern) a bidirectional encoder."""

    def __init__(self, config: TffSparseTransformerConfig, add_pooling_layer: bool = False):
        if add_pooling_layer:
            raise ValueError(
                "add_pooling_layer=True: the Sparse Transformer has no pooler (its classifier reads the first real "
                "token's state); build the model with add_pooling_layer=False."
            )
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.position_embedding_type == "absolute"
            else None
        )
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(TffSparseTransformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module):
        self.embed_tokens = value

    def _pattern_layout(self, key_valid: torch.Tensor | None, past: int, length: int, output_attentions: bool):
        """Whether this call takes the efficient path, and the roll index that moves left padding to the right."""
        eager = self.config._attn_implementation == "eager" or output_attentions
        if past or length == 1 or eager or torch.compiler.is_exporting():
            return False, None
        if key_valid is None or bool(key_valid.all()):
            return True, None
        leading = (key_valid.long().cumsum(-1) == 0).sum(-1)  # (B,) padded positions before the first real one
        roll = (torch.arange(length, device=key_valid.device)[None, :] + leading[:, None]) % length  # (B, T)
        rolled = key_valid.gather(1, roll)
        if not bool((rolled[:, 1:] <= rolled[:, :-1]).all()):  # real tokens not one run: the dense path
            return False, None
        return True, roll if bool(leading.any()) else None

    def prepare(self, input_ids, inputs_embeds, attention_mask, position_ids, cache, output_attentions):
        """The embeddings ``(B, T, D)`` and the `SparseLayerInputs` of this call."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        absolute = self.embed_positions is not None
        limit = self.config.max_position_embeddings if absolute else MAX_SIZE
        self._check_index_inputs("position_ids", position_ids, batch, length, limit, "max_position_embeddings")
        if attention_mask is not None:
            check_tensor("attention_mask", attention_mask, dim=2)
        check_cache(cache, batch, self.config.num_attention_heads, self.config.head_dim)
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        past = int(cache.get_seq_length()) if cache is not None else 0
        total, device = past + length, hidden.device
        if attention_mask is not None and tuple(attention_mask.shape) != (batch, total):
            raise ValueError(
                f"attention_mask must have shape {(batch, total)} (the {past} cached positions plus the {length} new "
                f"ones), got {tuple(attention_mask.shape)}."
            )
        key_valid = None if attention_mask is None else attention_mask.bool()
        if key_valid is None:
            key_positions = torch.arange(total, device=device).expand(batch, total)
        else:
            key_positions = (key_valid.long().cumsum(-1) - 1).clamp(min=0)  # (B, S): real tokens counted from 0
        query_positions = key_positions[:, past:]
        if position_ids is None:
            position_ids = query_positions
        if absolute:
            if not torch.compiler.is_compiling() and int(position_ids.max()) >= self.config.max_position_embeddings:
                raise ValueError(
                    f"position {int(position_ids.max())} is beyond max_position_embeddings="
                    f"{self.config.max_position_embeddings} (learned positions); shorten the input or use "
                    "position_embedding_type='rotary' or 'alibi'."
                )
            hidden = hidden + self.embed_positions(position_ids)
        cos = sin = slopes = None
        if self.config.position_embedding_type == "rotary":
            cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_base, hidden.dtype)
        elif self.config.position_embedding_type == "alibi":
            slopes = alibi_slopes(self.config.num_attention_heads).to(device)
        sparse, roll = self._pattern_layout(key_valid, past, length, output_attentions)
        lengths = None
        if not self.config.causal:  # (B,) real tokens per row: the encoder's blocks follow each row's length
            lengths = torch.full((batch,), length, device=device) if key_valid is None else key_valid.sum(-1)
            if not torch.compiler.is_compiling() and not torch.compiler.is_exporting() and bool((lengths == 0).any()):
                raise ValueError("attention_mask has a row with no real token; every row needs at least one 1.")
        inputs = SparseLayerInputs(cos, sin, slopes, query_positions, key_positions, key_valid, sparse, roll, lengths)
        return self.dropout(hidden), inputs

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
        token_type_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` (or ``inputs_embeds`` ``(B, T, D)``); with a filled cache, the new tokens only.
            attention_mask: ``(B, P + T)``, 1 for real tokens (left or right padding), ``P`` cached positions.
            position_ids: ``(B, T)`` for the position embeddings (default: real tokens counted from 0); the sparse
                pattern always follows the real-token positions of ``attention_mask``.
            cache / use_cache: a `transformers.Cache` (a new `GrowingCache` when ``use_cache`` and none); the decoder
                only (``config.causal=True``).
            output_attentions: every layer's ``(B, H, T, S)`` probabilities (runs the dense eager path).
            token_type_ids: not used (no token-type embeddings); must be ``None`` (the shared encoder heads pass it).

        ``last_hidden_state`` is after the final LayerNorm. transformers' decoder signature (heads, PEFT and
        `generate` pass these by name), hence more than ~6 parameters."""
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if token_type_ids is not None:
            raise ValueError(
                "token_type_ids: the Sparse Transformer has no token-type embeddings; pass token_type_ids=None."
            )
        causal = self.config.causal
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and causal and not self.training)
        if (cache is not None or use_cache) and not causal:
            raise ValueError(
                "cache (past_key_values) / use_cache need the decoder (config.causal=True, e.g. "
                "TffSparseTransformerForCausalLM); the bidirectional encoder reads the whole input at once: pass "
                "use_cache=False and no cache."
            )
        if self.gradient_checkpointing and self.training and (use_cache or cache is not None):
            if cache is not None:  # recomputed layers would append their keys twice
                raise ValueError("cache cannot be used with gradient checkpointing in training mode.")
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing in training; not caching.")
            use_cache = False
        if use_cache and cache is None:
            cache = GrowingCache(self.config)
        hidden, inputs = self.prepare(input_ids, inputs_embeds, attention_mask, position_ids, cache, output_attentions)
        all_hidden, all_attentions = (), ()
        for layer in self.layers:
            if output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = layer(hidden, inputs=inputs, cache=cache, output_attentions=output_attentions)
            all_attentions += (probs,)
        hidden = self.norm(hidden)
        if output_hidden_states:
            all_hidden += (hidden,)
        output = BaseModelOutputWithPast(
            last_hidden_state=hidden,
            cache=cache if use_cache else None,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


# ------------------------------------------------------------------------------------------------------------ heads
class TffSparseTransformerForCausalLM(FusedLMHeadMixin, TffSparseTransformerPreTrainedModel, ValidatedGenerationMixin):
    """The Sparse Transformer language model: the decoder and a linear head tied to the token embeddings. Builds its
    stack with ``causal=True`` whatever the given config says."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TffSparseTransformerConfig):
        if not config.causal:
            config = copy.deepcopy(config)
            config.causal = True
        super().__init__(config)
        self.model = TffSparseTransformerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        r"""labels: ``(B, T)``, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1`` (the
        shift happens inside), -100 is ignored; with ``num_items_in_batch`` (`Trainer`'s count of ``labels[:, 1:]``
        over the accumulated batch) the loss is the sum over it. The other arguments as in
        `TffSparseTransformerModel`.

        transformers' language-model signature (`generate` and `Trainer` pass these by name), hence more than ~6
        parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
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
        ``attention_mask`` always covers the whole sequence."""
        return key_value_generation_inputs(
            self, input_ids, cache, attention_mask, inputs_embeds, use_cache, kwargs.get("next_sequence_length")
        )


def encoder_config(config: TffSparseTransformerConfig, head: str) -> TffSparseTransformerConfig:
    """``config`` as the encoder heads read it: bidirectional (``causal=False``, on a copy), which only the blockwise
    pattern defines."""
    if config.sparsity_pattern != "blockwise":
        raise ValueError(
            f"{head} is a bidirectional encoder, which only sparsity_pattern='blockwise' defines (BlockBERT's cyclic "
            f"block shifts, Qiu et al. 2020); got sparsity_pattern={config.sparsity_pattern!r}, which is causal by "
            "construction. Set sparsity_pattern='blockwise' (e.g. the variant 'tiny-blockwise'), or use "
            "TffSparseTransformerForCausalLM."
        )
    if config.causal:
        config = copy.deepcopy(config)
        config.causal = False
        config.validate_architecture()  # the encoder's own rules (its positions)
    return config


class TffSparseTransformerForMaskedLM(GenericForMaskedLM, TffSparseTransformerPreTrainedModel):
    """Masked language modelling on the blockwise encoder (BlockBERT): BERT's LM head (dense, activation, LayerNorm,
    decoder tied to the token embeddings) on every position. Builds its stack with ``causal=False`` whatever the
    given config says; needs ``sparsity_pattern="blockwise"``."""

    base_model_class = TffSparseTransformerModel
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TffSparseTransformerConfig):
        super().__init__(encoder_config(config, type(self).__name__))


class TffSparseTransformerForSequenceClassification(
    GenericForSequenceClassification, TffSparseTransformerPreTrainedModel
):
    """A classifier (dropout, dense, tanh, dropout, linear ``out_proj``) on the blockwise encoder's first real token
    (BlockBERT). Builds its stack with ``causal=False`` whatever the given config says; needs
    ``sparsity_pattern="blockwise"``."""

    base_model_class = TffSparseTransformerModel

    def __init__(self, config: TffSparseTransformerConfig):
        super().__init__(encoder_config(config, type(self).__name__))


__all__ = [
    "TffSparseTransformerForCausalLM",
    "TffSparseTransformerForMaskedLM",
    "TffSparseTransformerForSequenceClassification",
    "TffSparseTransformerModel",
    "TffSparseTransformerPreTrainedModel",
]
