"""Reformer: the efficient transformer (Kitaev, Kaiser & Levskaya 2020, arXiv:2001.04451).

Two residual streams with reversible layers (section 3: ``Y1 = X1 + Attention(X2)``, ``Y2 = X2 + FeedForward(Y1)``):
the backward recomputes each layer's activations from its outputs, so activation memory does not grow with depth.
Each layer's attention is LSH attention (shared-QK vectors hashed into buckets, sorted, attended chunk by chunk:
`tf_family.attention.lsh_attention`) or local chunked attention (`tf_family.attention.chunked_local_attention`); an
input within one chunk takes the dense path. Feed-forward and output head can run over position chunks (section 4).

Parity: transformers 5.24's Reformer and heads (`tests/models/reformer/test_parity_reformer.py`, cached generation in
`test_generation_parity_reformer.py`; `convert_reformer.py` maps their checkpoints, ``chunk_wrap_around`` on).
Deviations from transformers' Reformer and reduced-precision behaviour: ``docs/architectures/reformer.md``.

Config field <-> paper symbol: `lsh_attn_chunk_length` = m, `num_hashes` = n_rounds, `num_buckets` = n_buckets.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    SequenceClassifierOutput,
)
from transformers.utils import logging

from ...attention import (
    ChunkPattern,
    auto_num_buckets,
    cached_chunked_local_attention,
    cached_shared_qk_attention,
    chunked_local_attention,
    chunked_local_attention_reference,
    hash_vectors,
    lsh_attention,
    lsh_attention_reference,
    lsh_rotations,
    normalize_shared_keys,
    shared_qk_attention,
)
from ...attention.flex import BlockMaskCache
from ...attention.rotary import apply_rotary, rotary_cos_sin
from ...layers.reversible import ReversibleChain, reversible_layer
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import (
    CLASSIFIER_KEY_MAPPING,
    ClassificationHead,
    question_answering_output,
    sequence_classification_loss,
)
from ...modeling.losses import causal_lm_loss, cross_entropy
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import accepts_past_key_values
from ...modeling.utils import (
    Dropout,
    build_activation,
    decoding_step_inputs,
    find_first_real_token,
    real_tensors_while_exporting,
)
from ...modeling.validation import (
    ValidatedGenerationMixin,
)
from .cache_reformer import TffReformerCache
from .configuration_reformer import TffReformerConfig
from .tokens_reformer import align_tokens, check_inputs, pad_to_chunk_multiple, roll_rows

logger = logging.get_logger(__name__)


# -------------------------------------------------------------------------------------------------------- positions
class AxialWeights(nn.ParameterList):
    """The axial factors, a module ``_init_weights`` sees (transformers skips custom-code modules without parameters
    of their own: left at ones, positions drowned the tokens in bfloat16 rounding, logits 11-21 % off float32)."""


class AxialPositionEmbeddings(nn.Module):
    """transformers' axial positions: position ``p`` is ``[e1[p // n2], e2[p % n2]]`` on an ``n1 x n2`` grid."""

    def __init__(self, config: TffReformerConfig):
        super().__init__()
        rows, cols = config.axial_pos_shape
        first, second = config.axial_pos_embds_dim
        self.columns = cols
        self.weights = AxialWeights(
            [nn.Parameter(torch.ones(rows, 1, first)), nn.Parameter(torch.ones(1, cols, second))]
        )

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        rows, cols = position_ids // self.columns, position_ids % self.columns  # (B, T)
        return torch.cat([self.weights[0][rows, 0], self.weights[1][0, cols]], dim=-1)  # (B, T, D)


class AbsolutePositionEmbeddings(nn.Module):
    def __init__(self, config: TffReformerConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.max_position_embeddings, config.hidden_size)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(position_ids)


class TffReformerEmbeddings(nn.Module):
    """Token embeddings (dropout) plus axial or absolute positions (dropout); rotary positions add nothing here."""

    def __init__(self, config: TffReformerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.kind = config.position_embedding_type
        self.max_positions = config.max_positions
        self.position_embeddings = {
            "axial": AxialPositionEmbeddings,
            "absolute": AbsolutePositionEmbeddings,
            "rotary": lambda config: None,
        }[self.kind](config)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, inputs_embeds, position_ids: torch.Tensor) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, D)
        # a data-dependent check: skipped while torch.compile / torch.export trace the model
        if (
            not torch.compiler.is_compiling()
            and position_ids.numel()
            and int(position_ids.max()) >= self.max_positions
        ):
            raise ValueError(
                f"The input needs position {int(position_ids.max())} but the model has {self.max_positions} "
                f"positions ({'prod(axial_pos_shape)' if self.kind == 'axial' else 'max_position_embeddings'}); "
                "shorten the input."
            )
        hidden = self.dropout(inputs_embeds)
        if self.position_embeddings is not None:
            hidden = hidden + self.dropout(self.position_embeddings(position_ids))
        return hidden


# -------------------------------------------------------------------------------------------------------- attention
@dataclasses.dataclass(frozen=True)
class ReformerLayerInputs:
    """What every layer of one call reads besides its residual streams (one object per `TffReformerModel` call)."""

    key_valid: torch.Tensor  # (B, P + T) bool: real tokens, over the cached positions and the new ones
    position_ids: torch.Tensor  # (B, P + T)
    num_hashes: int  # hashing rounds of this call
    seed: int  # seed of this call's rotations
    output_attentions: bool = False
    cache: TffReformerCache | None = None
    block_masks: BlockMaskCache | None = None  # the model's FlexAttention block masks (local layers)


class TffReformerAttention(nn.Module):
    """Layer norm, then LSH or local self-attention, output projection and dropout (the ``f`` of a reversible
    layer)."""

    def __init__(self, config: TffReformerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.kind = config.attn_layers[layer_idx]
        self.num_heads, self.head_dim = config.num_attention_heads, config.attention_head_size
        inner = self.num_heads * self.head_dim
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if self.kind == "lsh":
            self.query_key = nn.Linear(config.hidden_size, inner, bias=False)
            self.pattern = ChunkPattern(
                chunk_length=config.lsh_attn_chunk_length,
                before=config.lsh_num_chunks_before,
                after=config.lsh_num_chunks_after,
                causal=config.causal,
                wrap_around=config.chunk_wrap_around,
                # nothing a token sees depends on later tokens
                causal_buckets=config.causal and not config.chunk_wrap_around,
            )
            self.attention_dropout = config.lsh_attention_probs_dropout_prob
            if config.num_buckets is not None:  # memoise the default rotations now (a constant to torch.export)
                lsh_rotations(config.hash_seed, self.num_heads, self.head_dim, config.num_hashes, config.num_buckets)
        else:
            self.query = nn.Linear(config.hidden_size, inner, bias=False)
            self.key = nn.Linear(config.hidden_size, inner, bias=False)
            self.pattern = ChunkPattern(
                chunk_length=config.local_attn_chunk_length,
                before=config.local_num_chunks_before,
                after=config.local_num_chunks_after,
                causal=config.causal,
                wrap_around=config.chunk_wrap_around,
            )
            self.attention_dropout = config.local_attention_probs_dropout_prob
        self.value = nn.Linear(config.hidden_size, inner, bias=False)
        self.output = nn.Linear(inner, config.hidden_size, bias=False)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def _heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(*tensor.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def _rotary(self, vectors: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Rotary positions (`tf_family.attention.rotary`: pairs of halves, angles ``position * base^(-2i/Dh)``)."""
        if self.config.position_embedding_type != "rotary":
            return vectors
        cos_sin = rotary_cos_sin(position_ids, vectors.shape[-1], self.config.rotary_base, vectors.dtype)
        return apply_rotary(vectors, *cos_sin)

    def _num_buckets(self, length: int):
        if self.config.num_buckets is not None:
            return self.config.num_buckets
        return auto_num_buckets(length, self.pattern.chunk_length, self.config.max_position_embeddings)

    def hash(self, shared: torch.Tensor, num_hashes: int, seed: int) -> torch.Tensor:
        """``(B, H, R, T)`` buckets of the shared query-key vectors ``(B, H, T, Dh)``, hashed in float32 always."""
        num_buckets = self._num_buckets(shared.shape[2])
        with real_tensors_while_exporting():  # an exported graph holds the rotations as a constant
            rotations = lsh_rotations(seed, self.num_heads, self.head_dim, num_hashes, num_buckets, device="cpu")
        return hash_vectors(shared.float(), rotations.to(shared.device), num_buckets)

    def forward(
        self, hidden: torch.Tensor, inputs: ReformerLayerInputs, buckets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Args: ``hidden`` ``(B, T, D)`` (the new tokens); ``inputs``: the call's ``key_valid`` / ``position_ids``
        ``(B, P + T)`` over the ``P`` positions of its ``cache`` (normalised inputs of earlier calls; generation)
        and the new tokens, hashing rounds and seed; ``buckets`` ``(B, H, R, T)`` to reuse (the reversible
        backward). Returns the output ``(B, T, D)``, the buckets (LSH chunked path) and, with
        ``inputs.output_attentions``, ``(B, H, T, P + T)`` probabilities."""
        key_valid, position_ids, cache = inputs.key_valid, inputs.position_ids, inputs.cache
        output_attentions = inputs.output_attentions
        normed = self.layer_norm(hidden)
        past_states = None
        if cache is not None:
            past_states = cache.layer_states(self.layer_idx)
            cache.append_states(self.layer_idx, normed)
        states = normed if past_states is None else torch.cat([past_states, normed], dim=1)  # (B, P + T, D)
        new = hidden.shape[1]
        dropout_p = self.attention_dropout if self.training else 0.0
        value = self._heads(self.value(states))
        probs = None
        if self.kind == "lsh":
            shared = self._rotary(self._heads(self.query_key(states)), position_ids)
            key = normalize_shared_keys(shared)
            # one chunk: dense shared-QK attention (not with causal_buckets, whose buckets matter at any length; an
            # exported graph takes the dense twin below at every length: in one chunk it is shared-QK too)
            exporting = torch.compiler.is_exporting() and past_states is None
            if not exporting and states.shape[1] <= self.pattern.chunk_length and not self.pattern.causal_buckets:
                implementation = "eager" if output_attentions else self.config._attn_implementation
                if past_states is None:
                    out, probs = shared_qk_attention(
                        shared[:, :, -new:],
                        key,
                        value,
                        key_valid=key_valid,
                        causal=self.pattern.causal,
                        dropout_p=dropout_p,
                        implementation=implementation,
                    )
                else:
                    implementation = self.config._attn_implementation
                    out, probs = cached_shared_qk_attention(shared, key, value, key_valid, new, implementation)
                buckets = None
            else:
                if buckets is None:
                    buckets = self.hash(shared, inputs.num_hashes, inputs.seed)
                lsh_inputs = (shared, key, value, buckets, self.pattern)
                options = {"key_valid": key_valid, "correct_duplicates": self.config.correct_duplicates}
                if output_attentions or exporting:  # the dense twin (attention maps; an exported graph)
                    out, probs = lsh_attention_reference(*lsh_inputs, **options)
                else:
                    implementation = self.config._attn_implementation
                    out = lsh_attention(*lsh_inputs, **options, dropout_p=dropout_p, implementation=implementation)
                out = out[:, :, -new:]
        else:
            query = self._rotary(self._heads(self.query(states)), position_ids)[:, :, -new:]
            key = self._rotary(self._heads(self.key(states)), position_ids)
            out, probs = self._local(
                query,
                key,
                value,
                key_valid=key_valid,
                position_ids=position_ids,
                dropout_p=dropout_p,
                output_attentions=output_attentions,
                block_masks=inputs.block_masks,
            )
        out = out.transpose(1, 2).reshape(*hidden.shape[:2], -1)  # (B, T, H*Dh)
        return self.dropout(self.output(out)), buckets, probs

    def _local(self, query, key, value, key_valid, position_ids, dropout_p, output_attentions, block_masks=None):
        total, new = key.shape[2], query.shape[2]
        pattern = self.pattern
        # an exported graph takes the dense twin (no wrap-around: one chunk's mask is the same with neighbours)
        exporting = torch.compiler.is_exporting()
        if not exporting and total <= pattern.chunk_length:  # one chunk: no neighbours (nothing to wrap around to)
            pattern = ChunkPattern(pattern.chunk_length, 0, 0, pattern.causal, False)
        if new == total and not output_attentions and not exporting:
            return chunked_local_attention(
                query,
                key,
                value,
                pattern,
                key_valid=key_valid,
                dropout_p=dropout_p,
                implementation=self.config._attn_implementation,
                block_masks=block_masks,
            ), None
        if new == total:
            return chunked_local_attention_reference(query, key, value, pattern, key_valid=key_valid)
        # cached step: the window by position (real tokens counted), so left padding does not move the chunks
        implementation = "eager" if output_attentions else self.config._attn_implementation
        return cached_chunked_local_attention(query, key, value, pattern, key_valid, position_ids, implementation)


class TffReformerFeedForward(nn.Module):
    """Layer norm, dense, dropout, activation, dense, dropout (the ``g`` of a reversible layer), over chunks of
    ``chunk_size_feed_forward`` positions."""

    def __init__(self, config: TffReformerConfig):
        super().__init__()
        self.chunk_size = config.chunk_size_feed_forward
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.fc_in = nn.Linear(config.hidden_size, config.feed_forward_size)
        self.activation = build_activation(config.hidden_act)
        self.fc_out = nn.Linear(config.feed_forward_size, config.hidden_size)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def _forward_chunk(self, hidden: torch.Tensor) -> torch.Tensor:
        inner = self.activation(self.dropout(self.fc_in(self.layer_norm(hidden))))
        return self.dropout(self.fc_out(inner))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.chunk_size or hidden.shape[1] <= self.chunk_size:
            return self._forward_chunk(hidden)
        return torch.cat([self._forward_chunk(part) for part in hidden.split(self.chunk_size, dim=1)], dim=1)


class TffReformerLayer(nn.Module):
    """One reversible layer: ``Y1 = X1 + f(X2)``, ``Y2 = X2 + g(Y1)`` (``f`` attention, ``g`` feed-forward)."""

    def __init__(self, config: TffReformerConfig, layer_idx: int):
        super().__init__()
        self.attention = TffReformerAttention(config, layer_idx)
        self.feed_forward = TffReformerFeedForward(config)

    def forward(self, first, second, inputs: ReformerLayerInputs, buckets=None, reversible=None):
        """``(X1, X2)`` -> ``(Y1, Y2)``, the hash buckets and the attention probabilities (``inputs``: the call's
        `ReformerLayerInputs`). With a `ReversibleChain` as ``reversible``, the layer keeps no activations and its
        backward recomputes it (`reversible_layer`), inside this call's gradient, so that FSDP has gathered this
        layer's weights for the recomputation."""
        if reversible is not None:
            memo = {}

            def attention(x):
                out, found, probs = self.attention(x, inputs, memo.get("buckets", buckets))
                memo.setdefault("buckets", found)  # the backward reuses the forward's buckets
                memo.setdefault("probs", probs)
                return out

            parameters = [p for p in self.parameters() if p.requires_grad]
            first, second = reversible_layer(first, second, attention, self.feed_forward, reversible, parameters)
            return first, second, memo["buckets"], memo["probs"]
        attended, buckets, probs = self.attention(second, inputs, buckets)
        first = first + attended
        return first, second + self.feed_forward(first), buckets, probs


# ------------------------------------------------------------------------------------------------------------ model
class TffReformerPreTrainedModel(TffPreTrainedModel):
    config_class = TffReformerConfig
    base_model_prefix = "reformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TffReformerLayer"]
    _supports_sdpa = True  # eager (the dense twin per chunk) and sdpa agree: tests/attention/test_backend.py
    _supports_flex_attn = True  # the sparse pattern as a FlexAttention block mask: tests/attention/test_flex.py
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, AxialWeights):
            for weight in module:
                init.normal_(weight, std=self.config.axial_norm_std)


class TffReformerModel(TffReformerPreTrainedModel):
    """The Reformer body: embeddings, reversible layers, layer norm over both streams ``(B, T, 2 * D)``."""

    def __init__(self, config: TffReformerConfig, add_pooling_layer: bool = False):
        super().__init__(config)
        self.embeddings = TffReformerEmbeddings(config)
        self.layers = nn.ModuleList(TffReformerLayer(config, index) for index in range(config.num_hidden_layers))
        self.layer_norm = nn.LayerNorm(2 * config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.gradient_checkpointing = False
        self.block_masks = BlockMaskCache()  # the local layers' FlexAttention block masks, built once per shape
        self.post_init()

    @property
    def last_hidden_size(self) -> int:
        """Width of ``last_hidden_state``: both residual streams, ``2 * hidden_size``."""
        return 2 * self.config.hidden_size

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @accepts_past_key_values
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        num_hashes: int | None = None,
        hash_seed: int | None = None,
        cache: TffReformerCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids (or ``inputs_embeds`` ``(B, T, D)``); any length up to the positions'.
            attention_mask: ``(B, P + T)`` (or ``(B, T)``) 1 for real tokens, 0 for padding (left or right).
            position_ids: ``(B, T)``; default: real tokens counted from 0.
            num_hashes: hashing rounds of this call (default ``config.num_hashes``).
            hash_seed: seed of this call's rotations (default ``config.hash_seed``).
            cache: a `TffReformerCache` of earlier calls (generation); causal models only.
            use_cache: return the cache (a new one when none is given).

        transformers' encoder signature plus the hashing options (heads and `generate` pass them by name), hence
        more than ~6 parameters.
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else config.return_dict
        _, length = check_inputs(
            self,
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            num_hashes=num_hashes,
            hash_seed=hash_seed,
            cache=cache,
            use_cache=use_cache,
        )
        if use_cache and cache is None:
            cache = TffReformerCache()
        # left padding moved to the right (the chunks start at the first real token), positions over real tokens
        tokens, shift = align_tokens(input_ids, inputs_embeds, attention_mask, position_ids, cache)
        if config.chunk_wrap_around and not use_cache:  # transformers pads to a multiple of the chunk lengths' LCM
            tokens = pad_to_chunk_multiple(tokens, config, self.embeddings.word_embeddings)
        hidden = self.embeddings(tokens.input_ids, tokens.inputs_embeds, tokens.position_ids)  # (B, T, D)
        key_valid, key_positions = tokens.valid, tokens.position_ids
        if cache is not None:
            key_valid, key_positions = cache.extend(tokens.valid, tokens.position_ids)
        layer_inputs = ReformerLayerInputs(
            key_valid=key_valid,
            position_ids=key_positions,
            num_hashes=num_hashes if num_hashes is not None else config.num_hashes,
            seed=hash_seed if hash_seed is not None else config.hash_seed,
            output_attentions=output_attentions,
            cache=cache,
            # a compiled graph builds its block masks once per forward, in a cache of its own
            block_masks=BlockMaskCache() if torch.compiler.is_compiling() else self.block_masks,
        )
        first, second, all_hidden, all_attentions = self._layers(hidden, layer_inputs, output_hidden_states)
        sequence = self.dropout(self.layer_norm(torch.cat([first, second], dim=-1)))  # (B, T, 2D)

        def restore(tensor):  # drop transformers' padding, undo the roll
            tensor = tensor[:, :length]
            return roll_rows(tensor, -shift) if shift is not None else tensor

        output = BaseModelOutputWithPast(
            last_hidden_state=restore(sequence),
            cache=cache,
            hidden_states=tuple(restore(h) for h in all_hidden) if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()

    def _layers(self, hidden, inputs: ReformerLayerInputs, output_hidden_states: bool):
        """Run the layers on ``(X1, X2) = (hidden, hidden)``: reversibly when training with gradients (and the input
        is at least ``reversible_threshold`` long), else as a plain loop (optionally checkpointed)."""
        all_hidden, all_attentions = [], []
        first = second = hidden
        reversible = (
            self.config.reversible
            and self.training
            and torch.is_grad_enabled()
            and inputs.cache is None
            and hidden.shape[1] >= self.config.reversible_threshold
        )
        if reversible:
            # the last layer keeps its graph (plain backprop): recomputing it would rebuild the activations that the
            # backward holds first anyway, so the peak memory stays and one layer's recomputation is saved
            *recomputed, last = self.layers
            chain = ReversibleChain()
            for layer in recomputed:  # each through its own call (FSDP gathers its weights there)
                first, second, _, probs = layer(first, second, inputs, reversible=chain)
                all_attentions.append(probs)
            first, second, _, probs = last(first, second, inputs)
            all_attentions.append(probs)
            if output_hidden_states:
                logger.warning_once("Reversible training returns only the last hidden states.")
            return first, second, [second], all_attentions
        # a checkpointed layer is recomputed: it writes no cache and keeps no attention maps
        checkpointed = dataclasses.replace(inputs, output_attentions=False, cache=None)
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(second)
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                first, second, _, probs = self._gradient_checkpointing_func(
                    layer.__call__, first, second, checkpointed
                )
            else:
                first, second, _, probs = layer(first, second, inputs)
            all_attentions.append(probs)
        if output_hidden_states:
            all_hidden.append(second)
        return first, second, all_hidden, all_attentions


# ------------------------------------------------------------------------------------------------------------ heads
class TffReformerLMHead(nn.Module):
    """Linear ``2 * D -> V`` with its bias, over chunks of ``chunk_size``."""

    def __init__(self, config: TffReformerConfig):
        super().__init__()
        self.chunk_size = config.chunk_size_lm_head
        self.decoder = nn.Linear(2 * config.hidden_size, config.vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if not self.chunk_size or hidden.shape[1] <= self.chunk_size:
            return self.decoder(hidden)  # (B, T, V)
        return torch.cat([self.decoder(part) for part in hidden.split(self.chunk_size, dim=1)], dim=1)


class _TffReformerWithLMHead(TffReformerPreTrainedModel):
    causal = False

    def __init__(self, config: TffReformerConfig):
        if config.causal != self.causal:
            config = copy.deepcopy(config)
            config.causal = self.causal
            if self.causal:
                config.lsh_num_chunks_after = config.local_num_chunks_after = 0
        super().__init__(config)
        self.reformer = TffReformerModel(config)
        self.lm_head = TffReformerLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings


class TffReformerForCausalLM(FusedLMHeadMixin, _TffReformerWithLMHead, ValidatedGenerationMixin):
    """A causal Reformer language model (the paper's enwik8 / imagenet64 setting). Builds its stack with
    ``causal=True`` whatever the given config says. Generates with a `TffReformerCache`."""

    causal = True

    @answers_fused_lm_head
    @accepts_past_key_values
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        num_hashes=None,
        hash_seed=None,
        cache=None,
        use_cache=None,
        output_hidden_states=None,
        output_attentions=None,
        return_dict=None,
        logits_to_keep: int = 0,
        num_items_in_batch=None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        r"""labels: ``(B, T)``, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1`` (the
        shift happens inside), -100 is ignored; with ``num_items_in_batch`` (`Trainer`'s count of ``labels[:, 1:]``
        over the accumulated batch) the loss is the sum over it. ``logits_to_keep``: only the last that many
        positions' logits.

        transformers' language-model signature plus the hashing options (`generate` and `Trainer` pass them by name),
        hence more than ~6 parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.reformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            num_hashes=num_hashes,
            hash_seed=hash_seed,
            cache=cache,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        hidden = outputs.last_hidden_state
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)  # (B, T, V)
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
        """With a cache, only the tokens it has not seen; ``attention_mask`` always covers the whole sequence (left
        padding is honoured). ``num_hashes`` / ``hash_seed`` pass through."""
        past = cache.get_seq_length() if cache is not None and use_cache else 0
        model_inputs = {"attention_mask": attention_mask, "use_cache": use_cache}
        if use_cache:
            model_inputs["cache"] = cache
        model_inputs.update(
            decoding_step_inputs(input_ids, past, attention_mask, inputs_embeds, self.get_input_embeddings())
        )
        for name in ("num_hashes", "hash_seed", "logits_to_keep"):
            if kwargs.get(name) is not None:
                model_inputs[name] = kwargs[name]
        return model_inputs


class TffReformerForMaskedLM(_TffReformerWithLMHead):
    """Masked language modelling with the same output head (bidirectional attention)."""

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        num_hashes=None,
        hash_seed=None,
        output_hidden_states=None,
        output_attentions=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        r"""labels: ``(B, T)`` token ids to predict at masked positions, -100 elsewhere (with
        ``num_items_in_batch``, `Trainer`'s count over the accumulated batch, the loss is the sum over it).

        transformers' masked-LM signature plus the hashing options (`Trainer` passes them by name), hence more than ~6
        parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.reformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            num_hashes=num_hashes,
            hash_seed=hash_seed,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            self._check_lm_labels(labels, *logits.shape[:2])
            loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), num_items_in_batch)
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class TffReformerForSequenceClassification(TffReformerPreTrainedModel):
    """transformers' Reformer ``classifier``: dropout, dense ``2 * D -> D``, tanh, dropout, ``out_proj`` on each
    row's first real token."""

    _checkpoint_key_mapping = CLASSIFIER_KEY_MAPPING

    def __init__(self, config: TffReformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.reformer = TffReformerModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.classifier = ClassificationHead(
            2 * config.hidden_size, config.hidden_size, config.num_labels, "tanh", dropout
        )
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        r"""labels: ``(B,)`` class ids (floats for regression); ``num_items_in_batch``: `Trainer`'s count of labels
        over the accumulated batch; other keyword arguments go to the base model."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.reformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        first = find_first_real_token(attention_mask, hidden.shape[0], hidden.device)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), first]  # (B, 2D)
        logits = self.classifier(pooled)  # (B, num_labels)
        loss = None
        if labels is not None:
            loss = sequence_classification_loss(
                logits, labels, self.num_labels, self.config.problem_type, num_items_in_batch
            )
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class TffReformerForQuestionAnswering(TffReformerPreTrainedModel):
    """Extractive question answering: ``qa_outputs`` (``2 * D -> 2``) start / end logits per token."""

    def __init__(self, config: TffReformerConfig):
        super().__init__(config)
        self.reformer = TffReformerModel(config)
        self.qa_outputs = nn.Linear(2 * config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        return_dict=None,
        num_items_in_batch=None,
        **kwargs,
    ):
        r"""start_positions, end_positions: ``(B,)`` token indices of the answer span.

        transformers' QA signature (`Trainer` and pipelines pass these by name), hence more than ~6 parameters."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.reformer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # (B, T, 2)
        output = question_answering_output(
            logits, start_positions, end_positions, outputs=outputs, num_items_in_batch=num_items_in_batch
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "TffReformerForCausalLM",
    "TffReformerForMaskedLM",
    "TffReformerForQuestionAnswering",
    "TffReformerForSequenceClassification",
    "TffReformerModel",
    "TffReformerPreTrainedModel",
]
