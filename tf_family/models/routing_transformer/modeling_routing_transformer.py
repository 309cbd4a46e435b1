"""Routing Transformer: a decoder-only language model whose heads are local heads and k-means routing heads (Roy,
Saffar, Vaswani & Grangier 2021, "Efficient Content-Based Sparse Attention with Routing Transformers", TACL,
arXiv:2003.05997).

Every layer from ``sparsity_skip_first`` on has ``num_local_heads`` local heads (causal attention within a block of
``local_window`` positions and the block before: `tf_family.attention.image_local`'s 1-D pattern) and
``H - num_local_heads`` routing heads; the first ``sparsity_skip_first`` layers are local only. A routing head shares
its queries and keys (the keys are the normalised queries, section 4.1), clusters those unit vectors with online
k-means against its centroids ``(H_routing, K, Dh)`` and attends within clusters, causally on the original positions
(`tf_family.attention.routing`). ``routing_membership="nearest"`` (every token joins its nearest centroid) is strictly
causal and decodes with a key/value cache; ``"balanced"`` (every centroid takes its ``cluster_size`` nearest tokens,
the reference implementations' top-k) gives equal cluster sizes but ranks tokens against the whole sequence, so
generation recomputes the prefix at each step (no cache).

Centroids are buffers: saved in the checkpoint, moved by an exponential moving average of one k-means step
(`kmeans_statistics`, `kmeans_centroids`, `ema_update`) at every *training* forward, never in eval. The update is
applied after the layer loop; the layers of a training forward read a copy taken before it, so gradient checkpointing
recomputes the same clusters. Under data parallelism the k-means sums are added over the ranks first (one
``all_reduce`` per training forward), so the centroids move as one process's would on the whole batch.

Attention paths (the same outputs, `tests/models/routing_transformer/test_modeling_routing_transformer.py`):

- the efficient path (``attn_implementation`` ``"sdpa"``, no padding, no filled cache): local heads through
  `image_local_attention` (gathered blocks), routing heads through `routing_attention` (members gathered per cluster,
  ``O(T W)``); no ``T x T`` tensor;
- the dense path: the local pattern as a ``(B, H, T, S)`` mask through `attend`, the routing heads through
  `nearest_routing_attention` (one "same cluster and causal" ``T x S`` mask) or, for balanced clusters,
  `routing_attention_reference` (every cluster as a ``T x S`` mask); with ``"eager"`` / ``output_attentions``,
  padding, a decoding step over the cache (whose cached keys' clusters are re-derived from the keys themselves) and
  under `torch.export`.

Positions are rotary on every head (local heads: Llama's pairing; routing heads: GPT-J's interleaved pairing, on the
values too, as lucidrains' ``routing_transformer`` does); positions count real tokens, so padding changes nothing.

Reference implementation used for parity: lucidrains' ``routing-transformer`` 1.6.1 (``RoutingTransformerLM``, causal,
shared QK; `tests/models/routing_transformer/test_parity_routing_transformer.py`). Deviations: no auxiliary
commitment loss (the reference returns ``1e-4 * MSE(x, its centroid)`` beside the logits for the user to add); the
centroids start as random unit vectors instead of the reference's k-means on its first batch (which draws from the
global RNG); the EMA step is applied in the training forward, not from a backward hook; a token that belongs to no
balanced cluster gets a zero routing output, one in several the exact mean (the reference divides by ``count +
1e-5``); no memory key/values (``num_mem_kv``), reversible layers, product-key memories or mixtures of experts.

Config field <-> paper symbol: ``num_clusters`` = k, ``cluster_size`` = w (balanced membership), ``kmeans_ema_decay``
= lambda, ``sparsity_skip_first`` as in the paper's code.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Cache
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils import logging

from ...attention import attend
from ...attention.image_local import Local1DPattern, build_image_local_mask, image_local_attention
from ...attention.rotary import apply_rotary, rotary_cos_sin
from ...attention.routing import (
    balanced_members,
    centroid_similarity,
    ema_update,
    kmeans_centroids,
    kmeans_statistics,
    nearest_centroid,
    nearest_members,
    nearest_routing_attention,
    routing_attention,
    routing_attention_reference,
)
from ...modeling.cache import GrowingCache
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.losses import causal_lm_loss
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import accepts_past_key_values
from ...modeling.utils import Dropout, build_activation, key_value_generation_inputs
from ...modeling.validation import MAX_SIZE, ValidatedGenerationMixin, check_cache, check_tensor
from .configuration_routing_transformer import TffRoutingTransformerConfig

logger = logging.get_logger(__name__)


class RoutingLayerInputs(NamedTuple):
    """What `TffRoutingTransformerModel.prepare` makes of a call's inputs, read by every layer's attention."""

    cos: torch.Tensor  # (B, 1, T, Dh) rotary tables, Llama's pairing (local heads)
    sin: torch.Tensor
    routing_cos: torch.Tensor  # (B, 1, T, Dh) rotary tables, GPT-J's interleaved pairing (routing heads)
    routing_sin: torch.Tensor
    query_positions: torch.Tensor  # (B, T) real-token positions of the new tokens
    key_positions: torch.Tensor  # (B, S) of every key (cached ones first)
    key_valid: torch.Tensor | None  # (B, S) bool, False at padding (None: no padding)
    sparse: bool  # take the efficient path (no filled cache, no padding)
    centroids: dict | None  # layer index -> (H_routing, K, Dh) copy read in training (None: the buffers)
    centroid_updates: list | None  # training: (attention module, k-means sums, counts), applied after the layers


def _interleaved_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama-layout tables ``(..., Dh)`` (frequencies repeated by halves) in GPT-J's layout (each repeated twice)."""
    half = cos.shape[-1] // 2
    return cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)


def _rotate_interleaved(tensor: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``tensor`` ``(B, H, T, Dh)`` rotated in GPT-J's pairing (dimensions ``2i``, ``2i + 1``)."""
    first, second = tensor.unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack((-second, first), dim=-1).flatten(-2)
    return tensor * cos.to(tensor.dtype) + rotated * sin.to(tensor.dtype)


# ---------------------------------------------------------------------------------------------------- small modules
# Copied from tf_family.models.sparse_transformer.modeling_sparse_transformer.TffSparseTransformerMLP with SparseTransformer->RoutingTransformer
class TffRoutingTransformerMLP(nn.Module):
    """``fc_out(act(fc_in(x)))``, GPT-2's feed-forward block."""

    def __init__(self, config: TffRoutingTransformerConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc_out(self.act(self.fc_in(hidden)))


# -------------------------------------------------------------------------------------------------------- attention
class TffRoutingTransformerAttention(nn.Module):
    """Local heads (first) and routing heads of one layer, one output projection over all of them."""

    def __init__(self, config: TffRoutingTransformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.local_heads = config.local_heads(layer_idx)
        self.routing_heads = config.num_attention_heads - self.local_heads
        self.local_pattern = Local1DPattern(config.local_window, config.local_window)
        width = self.head_dim * config.num_attention_heads
        if self.local_heads:
            self.local_qkv = nn.Linear(config.hidden_size, 3 * self.local_heads * self.head_dim)
        if self.routing_heads:
            # shared QK: the keys are the normalised queries, so there is no key projection
            self.q_proj = nn.Linear(config.hidden_size, self.routing_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(config.hidden_size, self.routing_heads * self.head_dim, bias=False)
            centroids = F.normalize(torch.randn(self.routing_heads, config.num_clusters, self.head_dim), dim=-1)
            self.register_buffer("centroids", centroids)  # (H_routing, K, Dh), saved in the checkpoint
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def _local(self, query, key, value, inputs: RoutingLayerInputs, dropout_p, eager):
        """Local heads: ``(B, H_local, T, Dh)`` and, with ``eager``, the probabilities."""
        implementation = "eager" if eager else self.config._attn_implementation
        if inputs.sparse and not eager:
            return image_local_attention(query, key, value, self.local_pattern, dropout_p, implementation), None
        allowed = build_image_local_mask(self.local_pattern, inputs.query_positions, inputs.key_positions)  # (B,T,S)
        if inputs.key_valid is not None:
            allowed = allowed & inputs.key_valid[:, None, :]
        allowed = (allowed | ~allowed.any(-1, keepdim=True))[:, None]  # (B, 1, T, S); padding rows: anything
        return attend(query, key, value, allowed, dropout_p=dropout_p, implementation=implementation)

    @torch.no_grad()
    def route(self, keys: torch.Tensor, centroids: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """The clusters of unit vectors ``keys`` ``(B, H_routing, T, Dh)``: each one's nearest centroid ``(B,
        H_routing, T)`` (``"nearest"``) or each centroid's members ``(B, H_routing, K, W)`` (``"balanced"``; padding
        ``valid`` False chosen last). The model's only discrete decision (the common tester replays it in bf16)."""
        similarity = centroid_similarity(keys, centroids)  # (B, H_routing, T, K)
        if self.config.routing_membership == "balanced":
            return balanced_members(similarity, self.config.cluster_size, valid)
        return nearest_centroid(similarity)

    def _routing(self, query, key, value, inputs: RoutingLayerInputs, dropout_p, eager):
        """Routing heads: ``query`` ``(B, H_routing, T, Dh)`` of the new tokens, ``key``/``value`` over every
        position ``(B, H_routing, S, Dh)`` (the keys are the normalised queries)."""
        length, total = query.shape[2], key.shape[2]
        past = total - length
        centroids = self.centroids if inputs.centroids is None else inputs.centroids[self.layer_idx]
        num_clusters = centroids.shape[1]
        new_keys = key[:, :, past:]  # the new tokens' unit vectors (B, H_routing, T, Dh)
        query_valid = None if inputs.key_valid is None else inputs.key_valid[:, past:]
        balanced = self.config.routing_membership == "balanced"
        if self.training and inputs.centroid_updates is not None:
            with torch.no_grad():
                nearest = nearest_centroid(centroid_similarity(new_keys, centroids))
            inputs.centroid_updates.append((self, *kmeans_statistics(new_keys, nearest, num_clusters, query_valid)))
        routes = self.route(new_keys, centroids, query_valid)
        if inputs.sparse and not eager:
            members, exists = (routes, None) if balanced else nearest_members(routes, num_clusters)
            return routing_attention(query, key, value, members, exists, inputs.key_valid, dropout_p), None
        positions = (inputs.query_positions, inputs.key_positions)
        if not balanced:  # one (T, S) mask; a decoding step re-derives the cached keys' clusters from the keys
            key_routes = routes if not past else self.route(key, centroids, inputs.key_valid)
            clusters = (routes, key_routes)
            return nearest_routing_attention(query, key, value, clusters, positions, inputs.key_valid, dropout_p)
        with torch.no_grad():  # no cache here (refused by the model): the keys are the new tokens
            shape = (*routes.shape[:3], length)
            membership = torch.zeros(shape, dtype=torch.bool, device=key.device).scatter_(3, routes, True)
        return routing_attention_reference(
            query, key, value, membership, membership, positions, inputs.key_valid, dropout_p
        )

    def forward(self, hidden: torch.Tensor, inputs: RoutingLayerInputs, cache=None, output_attentions=False):
        batch, length, _ = hidden.shape
        queries, keys, values = [], [], []
        if self.local_heads:
            qkv = self.local_qkv(hidden).view(batch, length, 3, self.local_heads, self.head_dim)
            query, key, value = qkv.permute(2, 0, 3, 1, 4)  # each (B, H_local, T, Dh)
            queries.append(apply_rotary(query, inputs.cos, inputs.sin))
            keys.append(apply_rotary(key, inputs.cos, inputs.sin))
            values.append(value)
        if self.routing_heads:
            query = self.q_proj(hidden).view(batch, length, self.routing_heads, self.head_dim).transpose(1, 2)
            value = self.v_proj(hidden).view(batch, length, self.routing_heads, self.head_dim).transpose(1, 2)
            query = _rotate_interleaved(query, inputs.routing_cos, inputs.routing_sin)
            queries.append(query)
            keys.append(F.normalize(query, dim=-1))  # shared QK: unit-length queries are the keys
            values.append(_rotate_interleaved(value, inputs.routing_cos, inputs.routing_sin))
        query, key, value = (torch.cat(parts, dim=1) for parts in (queries, keys, values))  # (B, H, ., Dh)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)  # (B, H, S, Dh)
        dropout_p = self.config.attention_dropout if self.training else 0.0
        eager = output_attentions or self.config._attn_implementation == "eager"
        split = self.local_heads
        outputs, probs = [], []
        if self.local_heads:
            out, prob = self._local(query[:, :split], key[:, :split], value[:, :split], inputs, dropout_p, eager)
            outputs.append(out), probs.append(prob)
        if self.routing_heads:
            out, prob = self._routing(query[:, split:], key[:, split:], value[:, split:], inputs, dropout_p, eager)
            outputs.append(out), probs.append(prob)
        attended = torch.cat(outputs, dim=1).transpose(1, 2).reshape(batch, length, -1)  # (B, T, H * Dh)
        probs = torch.cat(probs, dim=1) if output_attentions else None  # (B, H, T, S)
        return self.o_proj(attended), probs


# ------------------------------------------------------------------------------------------------------------ layer
class TffRoutingTransformerLayer(GradientCheckpointingLayer):
    """Pre-norm block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, config: TffRoutingTransformerConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = TffRoutingTransformerAttention(config, layer_idx)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = TffRoutingTransformerMLP(config)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden, inputs: RoutingLayerInputs, cache=None, output_attentions=False):
        attended, probs = self.self_attn(
            self.input_layernorm(hidden), inputs=inputs, cache=cache, output_attentions=output_attentions
        )
        hidden = hidden + self.dropout(attended)
        hidden = hidden + self.dropout(self.mlp(self.post_attention_layernorm(hidden)))
        return hidden, probs


# ------------------------------------------------------------------------------------------------- pretrained model
class TffRoutingTransformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffRoutingTransformerConfig
    config: TffRoutingTransformerConfig
    base_model_prefix = "model"
    carried_state = None  # a transformers Cache, passed in and out as usual
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffRoutingTransformerLayer"]
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
        elif isinstance(module, TffRoutingTransformerAttention) and module.routing_heads:
            init.copy_(module.centroids, F.normalize(torch.randn_like(module.centroids), dim=-1))

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate makes no cache: the first forward does (a `GrowingCache`)


# ------------------------------------------------------------------------------------------------------- base model
class TffRoutingTransformerModel(TffRoutingTransformerPreTrainedModel):
    """The decoder stack: token embeddings, the layers, the final LayerNorm."""

    def __init__(self, config: TffRoutingTransformerConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(TffRoutingTransformerLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Module):
        self.embed_tokens = value

    def prepare(self, input_ids, inputs_embeds, attention_mask, position_ids, cache, output_attentions):
        """The embeddings ``(B, T, D)`` and the `RoutingLayerInputs` of this call."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds)
        self._check_index_inputs("position_ids", position_ids, batch, length, MAX_SIZE, "max_position_embeddings")
        if attention_mask is not None:
            check_tensor("attention_mask", attention_mask, dim=2)
        check_cache(cache, batch, self.config.num_attention_heads, self.config.head_dim)
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        past = int(cache.get_seq_length()) if cache is not None else 0
        if past and self.config.routing_membership == "balanced":
            raise ValueError(
                f"routing_membership='balanced' ranks every token against the whole sequence, so a cache of {past} "
                "positions cannot be extended; call without a cache (use_cache=False), or use "
                "routing_membership='nearest'."
            )
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
        cos, sin = rotary_cos_sin(position_ids, self.config.head_dim, self.config.rope_base, hidden.dtype)
        routing_cos, routing_sin = _interleaved_tables(cos, sin)
        eager = self.config._attn_implementation == "eager" or output_attentions
        # (no data-dependent branch while exporting: the dense path is the exported one)
        sparse = not (past or eager or torch.compiler.is_exporting())
        sparse = sparse and (key_valid is None or bool(key_valid.all()))
        centroids = updates = None
        if self.training:  # the layers read a copy; the buffers move after the layer loop
            attentions = (layer.self_attn for layer in self.layers)
            centroids = {a.layer_idx: a.centroids.clone() for a in attentions if a.routing_heads}
            updates = []
        inputs = RoutingLayerInputs(
            cos,
            sin,
            routing_cos,
            routing_sin,
            query_positions,
            key_positions,
            key_valid,
            sparse,
            centroids,
            updates,
        )
        return self.dropout(hidden), inputs

    @torch.no_grad()
    def _move_centroids(self, updates: list) -> None:
        """One EMA k-means step of every routing head from its ``(module, sums, counts)``. Under data parallelism
        (an initialised process group of several ranks) the sums and counts are added over the ranks first, so every
        rank takes the step the whole batch gives and the centroids stay equal across ranks (every rank runs its
        training forwards, as DDP and FSDP do)."""
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and torch.distributed.get_world_size() > 1:
            flat = torch.cat([torch.cat([sums.flatten(), counts.flatten()]) for _, sums, counts in updates])
            torch.distributed.all_reduce(flat)
            reduced, offset = [], 0
            for attention, sums, counts in updates:
                total = sums.numel() + counts.numel()
                chunk = flat[offset : offset + total]
                reduced.append((attention, chunk[: sums.numel()].view_as(sums), chunk[sums.numel() :].view_as(counts)))
                offset += total
            updates = reduced
        for attention, sums, counts in updates:
            moved = kmeans_centroids(sums, counts, attention.centroids)
            ema_update(attention.centroids, moved, self.config.kmeans_ema_decay)

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
        r"""
        Args:
            input_ids: ``(B, T)`` (or ``inputs_embeds`` ``(B, T, D)``); with a filled cache, the new tokens only.
            attention_mask: ``(B, P + T)``, 1 for real tokens (left or right padding), ``P`` cached positions.
            position_ids: ``(B, T)`` for the rotary positions (default: real tokens counted from 0); the local
                blocks and the causal masks always follow the real-token positions of ``attention_mask``.
            cache / use_cache: a `transformers.Cache` (a new `GrowingCache` when ``use_cache`` and none);
                ``routing_membership="balanced"`` makes none (its clusters depend on the whole sequence).
            output_attentions: every layer's ``(B, H, T, S)`` probabilities (runs the dense eager path; a routing
                head's are the average over the clusters of each query).

        In training, every routing head's centroids move by one EMA step after the layers ran. transformers' decoder
        signature (heads, PEFT and `generate` pass these by name), hence more than ~6 parameters."""
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if self.config.routing_membership == "balanced":
            use_cache = False
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
        if inputs.centroid_updates:
            self._move_centroids(inputs.centroid_updates)
        output = BaseModelOutputWithPast(
            last_hidden_state=hidden,
            cache=cache if use_cache else None,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


# ------------------------------------------------------------------------------------------------------------ heads
class TffRoutingTransformerForCausalLM(
    FusedLMHeadMixin, TffRoutingTransformerPreTrainedModel, ValidatedGenerationMixin
):
    """The Routing Transformer language model: the decoder and a linear head (tied to the token embeddings by
    default)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TffRoutingTransformerConfig):
        super().__init__(config)
        self.model = TffRoutingTransformerModel(config)
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
        `TffRoutingTransformerModel`.

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
        """With a cache (``routing_membership="nearest"``, the default), only the tokens it has not seen; without,
        the whole prefix every step. ``attention_mask`` always covers the whole sequence."""
        use_cache = use_cache and self.config.routing_membership == "nearest"
        return key_value_generation_inputs(
            self, input_ids, cache, attention_mask, inputs_embeds, use_cache, kwargs.get("next_sequence_length")
        )


__all__ = [
    "TffRoutingTransformerForCausalLM",
    "TffRoutingTransformerModel",
    "TffRoutingTransformerPreTrainedModel",
]
