"""Memorizing Transformers (Wu et al. 2022, arXiv:2203.08913).

A Transformer-XL decoder (segment memory, relative positions, adaptive input and softmax: the shared modules of
`tf_family.layers`, so a Transformer-XL checkpoint of the zoo loads into it, section 4.5) in which the layers
`knn_layers` (default: the one at three quarters of the depth) also attend over a kNN memory of the stream's past.
In a kNN-augmented layer the queries and the keys are L2-normalised for retrieval; each query retrieves the ``k``
keys of the memory closest to it (cosine), attends over the retrieved (key, value) pairs with a learned per-head
scale and no positions, and a learned per-head sigmoid gate mixes that result with the layer's local attention
(section 3). The layer's keys and values are then written into the memory (a FIFO ring buffer per row and head,
`tf_family.memory.KNNMemory`), without gradient. The memory is explicit state: `mems` in, `mems` out (a
`MemorizingMemory` holding it and the Transformer-XL memory), and `generate()` reads and writes it.

Reference implementations read (no shared weights exist, so no parity test against them): google-research/meliad
(the authors' JAX code) and lucidrains/memorizing-transformers-pytorch. What the tests prove instead: with the gate
closed (or an empty memory) the model is exactly `TffTransfoXLLMHeadModel` on the same weights; with ``k`` covering
the memory the retrieved attention is dense attention over the memory; a stream cut into segments, or generated one
token at a time, gives the same result as one forward (``knn_retrieval="token"``); nothing is retrieved from
another row or from before a reset.

Deviations from meliad, and choices where the paper is silent:
- the local attention of a kNN layer is Transformer-XL's, unnormalised (meliad normalises the local keys too and
  uses T5 position biases); normalised queries and keys, with their own learned scale, are used for retrieval and
  the retrieved attention only. This is what makes "gate closed == Transformer-XL" exact;
- ``knn_retrieval="token"`` (default): each position retrieves from everything written before it, its own segment
  included, as if the memory were written token by token; ``"segment"`` is meliad's rule (the whole segment
  retrieves from earlier segments, then is written);
- a query that finds nothing (empty memory, first token of a document) uses its local result alone (meliad mixes
  in the zero vector retrieved from its zeroed memory);
- generation writes the memory as tokens are produced (meliad and lucidrains do not generate with memory);
- ``knn_combine="joint"``: one softmax over the local keys and the retrieved pairs (lucidrains) instead of the gate.

Config field <-> paper symbol: `knn_top_k` = k, `knn_memory_size` = memory size, `mem_len` = XL cache, `n_layer`,
`n_head`, `d_head` as in Transformer-XL; `knn_gate` = b_g (g = sigmoid(b_g)), `knn_scale` = the learned scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging

from ...attention import (
    build_causal_memory_mask,
    build_key_padding_mask,
    segment_position_embedding,
)
from ...layers import (
    AdaptiveEmbedding,
    PositionwiseFeedForward,
    ProjectedAdaptiveLogSoftmax,
    RelativeDecoderLayer,
    RelativeMultiHeadAttention,
)
from ...memory import (
    Expired,
    KNNMemory,
    MemorizingMemory,
    MemoryAllowed,
    ReaderRegistry,
    SegmentMemory,
    fused_knn_attention,
    retrieve,
)
from ...modeling_heads import SegmentRecurrentForCausalLM
from ...modeling_outputs import MemorizingCausalLMOutput, MemorizingModelOutput
from ...modeling_utils import AdaptiveTokenEmbeddingsMixin, RemoteCodeMixin
from ...validation import InputValidationMixin, ValidatedGenerationMixin, check_memory_states, refuse_key_value_cache
from .configuration_memorizing import TffMemorizingConfig

logger = logging.get_logger(__name__)


@dataclass
class KNNLayerInputs:
    """What a kNN-augmented layer reads: its memory, which slots / segment positions each query may retrieve, k."""

    keys: torch.Tensor  # (B, H, N, Dh)
    values: torch.Tensor  # (B, H, N, Dh)
    memory_allowed: MemoryAllowed  # (B, 1, 1, N) real entries, expired (slot, query) pairs
    segment_allowed: torch.Tensor | None  # (B, 1, T, T) bool, or None (meliad's rule: no retrieval in the segment)
    top_k: int
    search: str
    indexes: list | None = None  # the memory's persistent faiss indexes (search "faiss")
    readers: ReaderRegistry | None = None  # the live readers of the memory's buffers (`KNNMemory.readers`)


class TffMemorizingKNNLayer(GradientCheckpointingLayer):
    """A Transformer-XL layer whose attention also attends over pairs retrieved from the kNN memory.

    The attention and feed-forward modules (and so their weights' names) are Transformer-XL's; the layer adds the
    per-head scale of the retrieved scores (`knn_scale`) and the per-head gate bias (`knn_gate`).
    """

    def __init__(self, config: TffMemorizingConfig):
        super().__init__()
        self.combine = config.knn_combine
        self.attention = RelativeMultiHeadAttention(
            config.d_model,
            config.n_head,
            config.d_head,
            config.dropout,
            config.dropatt,
            config.pre_lnorm,
            config.layer_norm_epsilon,
            config.untie_r,
        )
        self.feed_forward = PositionwiseFeedForward(
            config.d_model, config.d_inner, config.dropout, config.pre_lnorm, config.layer_norm_epsilon
        )
        self.knn_scale = nn.Parameter(torch.full((config.n_head,), config.knn_scale_init))
        self.knn_gate = nn.Parameter(torch.full((config.n_head,), config.knn_gate_init))

    def forward(
        self,
        hidden: torch.Tensor,
        memory: torch.Tensor | None,
        position_embedding: torch.Tensor,
        allowed: torch.Tensor,
        shared_biases: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool,
        implementation: str | None,
        knn: KNNLayerInputs,
    ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, torch.Tensor]]:
        """Returns the layer output ``(B, T, D)``, the local attention probabilities (with `output_attentions`) and
        the segment's (normalised key, value) pairs ``(B, H, T, Dh)`` to write into the memory."""
        attention, length = self.attention, hidden.shape[1]
        query, key, value = attention.project(hidden, memory)  # (B, H, T, Dh), 2 x (B, H, S, Dh)
        query_direction = F.normalize(query, dim=-1)  # (B, H, T, Dh)
        segment = (F.normalize(key[:, :, -length:], dim=-1), value[:, :, -length:])  # 2 x (B, H, T, Dh)
        retrieved = retrieve(
            query_direction,
            (knn.keys, knn.values),
            knn.memory_allowed,
            k=knn.top_k,
            kind=knn.search,
            segment=None if knn.segment_allowed is None else segment,
            segment_allowed=knn.segment_allowed,
            indexes=knn.indexes,
        )
        scale = self.knn_scale.abs()
        if self.combine == "gate":
            local, probs = attention.local_attention(
                query, key, value, position_embedding, allowed, shared_biases, output_attentions, implementation
            )  # (B, H, T, Dh)
            attended_retrieved = fused_knn_attention(query_direction, retrieved, scale, knn.readers)  # (B, H, T, Dh)
            # a query that found nothing keeps its local result: with the gate closed this is Transformer-XL exactly
            gate = torch.sigmoid(self.knn_gate)[:, None, None] * retrieved.any_found  # (B, H, T, 1)
            attended = local * (1 - gate) + attended_retrieved * gate
        else:
            attended, probs = self._joint_attention(
                query, key, value, position_embedding, allowed, shared_biases, query_direction, retrieved, scale
            )
            probs = probs if output_attentions else None
        hidden = attention.finish(hidden, attended)
        return self.feed_forward(hidden), probs, (segment[0].detach(), segment[1].detach())

    def _joint_attention(
        self, query, key, value, position_embedding, allowed, shared_biases, query_direction, retrieved, scale
    ):
        """One softmax over the local keys (Transformer-XL scores) and the retrieved pairs (scaled cosine scores)."""
        attention = self.attention
        bias, content_bias = attention.position_scores(query, position_embedding, allowed, shared_biases)
        content = torch.einsum("bhtd,bhsd->bhts", query + content_bias[:, None, :].to(query.dtype), key)
        local_logits = content * attention.scale + bias.to(query.dtype)  # (B, H, T, S)
        knn_logits = retrieved.logits(query_direction, scale)  # (B, H, T, K [+ T])
        probs = torch.softmax(torch.cat([local_logits, knn_logits], dim=-1), dim=-1)  # (B, H, T, S + K [+ T])
        probs = attention.attention_dropout(probs)
        key_length = key.shape[2]
        attended = probs[..., :key_length] @ value + retrieved.attend(probs[..., key_length:])  # (B, H, T, Dh)
        return attended, probs[..., :key_length]


class TffMemorizingPreTrainedModel(
    InputValidationMixin, AdaptiveTokenEmbeddingsMixin, RemoteCodeMixin, PreTrainedModel
):
    config_class = TffMemorizingConfig
    config: TffMemorizingConfig
    base_model_prefix = "transformer"
    carried_state = "knn_memory"  # a MemorizingMemory (kNN memory + Transformer-XL memory), passed as `mems`
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer", "TffMemorizingKNNLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        config = self.config
        std, proj_std = config.init_std, config.proj_init_std
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.ParameterList):
            for projection in module:  # the adaptive input / softmax projections
                init.normal_(projection, mean=0.0, std=proj_std)
        elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
            init.normal_(module.cluster_weight, mean=0.0, std=std)
            init.zeros_(module.cluster_bias)
        elif isinstance(module, RelativeMultiHeadAttention | TffMemorizingModel):
            for name in ("content_bias", "position_bias"):
                if getattr(module, name, None) is not None:
                    init.normal_(getattr(module, name), mean=0.0, std=std)
        if isinstance(module, TffMemorizingKNNLayer):
            init.constant_(module.knn_scale, config.knn_scale_init)
            init.constant_(module.knn_gate, config.knn_gate_init)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The state is a MemorizingMemory returned as `mems`, not a transformers Cache.
        return False


class TffMemorizingModel(TffMemorizingPreTrainedModel):
    """The Memorizing Transformer decoder stack: last hidden state and the updated memories."""

    def __init__(self, config: TffMemorizingConfig):
        super().__init__(config)
        self.word_embeddings = AdaptiveEmbedding(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
        )
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            TffMemorizingKNNLayer(config) if index in config.knn_layers else RelativeDecoderLayer.from_config(config)
            for index in range(config.n_layer)
        )
        if not config.untie_r:
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    def set_input_embeddings(self, new_embeddings: nn.Module):
        self.word_embeddings = new_embeddings

    def empty_memory(
        self,
        batch_size: int,
        knn_memory_size: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MemorizingMemory:
        """A fresh memory for ``batch_size`` streams with ``knn_memory_size`` kNN entries per row and head (default:
        `config.knn_memory_size`): how to evaluate with another memory size than the one trained with."""
        config = self.config
        size = config.knn_memory_size if knn_memory_size is None else knn_memory_size
        parameter = self.word_embeddings.layers[0].weight
        knn = KNNMemory.empty(
            batch_size,
            len(config.knn_layers),
            config.n_head,
            config.d_head,
            size,
            device or parameter.device,
            dtype or parameter.dtype,
        )
        return MemorizingMemory(None, knn)

    def _as_memory(self, mems, batch_size: int, device, dtype) -> MemorizingMemory:
        if mems is None:
            return self.empty_memory(batch_size, device=device, dtype=dtype)
        refuse_key_value_cache("mems (cache)", mems, "the Memorizing Transformer", "a MemorizingMemory")
        if not isinstance(mems, MemorizingMemory):
            raise TypeError(
                f"mems must be the MemorizingMemory a previous call returned (or None to start), got {type(mems)}."
            )
        if mems.batch_size != batch_size:
            raise ValueError(
                f"mems holds {mems.batch_size} batch rows but the input has {batch_size}; pass the mems returned for "
                "this batch, or mems=None to start a new stream."
            )
        mems.knn.check_current()
        if len(mems.knn) != len(self.config.knn_layers):
            raise ValueError(f"mems has {len(mems.knn)} kNN layers, the model {len(self.config.knn_layers)}.")
        if mems.segment is not None and len(mems.segment) != self.config.n_layer:
            raise ValueError(f"mems has {len(mems.segment)} layers but the model has n_layer={self.config.n_layer}.")
        if mems.segment is not None:
            check_memory_states("mems", mems.segment.states, self.config.d_model)
        check_memory_states("mems (kNN keys)", mems.knn.keys, self.config.d_head, heads=self.config.n_head)
        return mems

    def _faiss_indexes(self, knn: KNNMemory, layer: int) -> list | None:
        config = self.config
        if config.knn_search != "faiss" or knn.capacity == 0:
            return None
        return knn.faiss_indexes(
            layer, config.knn_faiss_index, nlist=config.knn_faiss_nlist, nprobe=config.knn_faiss_nprobe
        )

    def _knn_masks(
        self, knn: KNNMemory, segment_mask: torch.Tensor, length: int
    ) -> tuple[MemoryAllowed, torch.Tensor | None]:
        """Which memory slots (``(B, 1, 1, N)`` real entries, and the (slot, query) pairs already evicted) and which
        earlier positions of the segment ``(B, 1, T, T)`` each query may retrieve. ``"token"``: exactly the entries
        a memory written token by token would hold before the query (the ``N`` most recent); ``"segment"``: every
        real slot of the memory, nothing of the segment."""
        capacity, device = knn.capacity, segment_mask.device
        valid = knn.mask[:, None, None, :]  # (B, 1, 1, N)
        if self.config.knn_retrieval == "segment":
            return MemoryAllowed(valid), None
        offset = torch.arange(length, device=device)  # position i of the query in the segment
        # A slot of age a is still held before position i when a + i < N (the segment's i entries came after it):
        # only the C = min(T, N) oldest slots, next_slot + j of age N - 1 - j, are gone for some queries (j < i).
        oldest = torch.arange(length if length <= capacity else capacity, device=device)  # min(T, N)
        expired = Expired(slots=(knn.next_slot + oldest) % max(capacity, 1), gone=oldest[None, :] < offset[:, None])
        distance = offset[:, None] - offset[None, :]  # (T, T): i - j
        segment_allowed = (distance > 0) & (distance <= capacity)  # written before i and not yet evicted
        segment_allowed = segment_allowed[None, None] & segment_mask[:, None, None, :]  # (B, 1, T, T)
        return MemoryAllowed(valid, expired), segment_allowed

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: MemorizingMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MemorizingModelOutput | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids of the segment.
            mems: the `MemorizingMemory` returned for the previous segment of the same streams, a fresh one
                (`empty_memory`, e.g. to choose the kNN memory size), or ``None`` at the start. The updated memory
                comes back in the output; with ``config.knn_write="in_place"`` (the default) the one passed in is
                consumed by the write (`MemorizingMemory.clone` first to reuse it), with ``"copy"`` it is left as it
                is.
            attention_mask: ``(B, T)`` 0/1 padding mask of the segment, or ``(B, >= M + T)`` covering
                ``[memory, segment]`` (what `generate` passes). Padded positions are neither attended to nor
                retrieved.
            reset_mems: ``(B,)`` bool; rows where it is True forget both memories (a new document starts).
            use_cache: write the kNN memory and return the memories (defaults to ``config.use_cache``).
        """
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else config.use_cache
        return_dict = return_dict if return_dict is not None else config.return_dict
        batch, query_length = self._check_token_inputs(input_ids, inputs_embeds, embedding_width=config.d_model)
        self._check_mask("attention_mask", attention_mask, batch, query_length, at_least=True)
        self._check_reset_mems(reset_mems, batch)
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        device = embeddings.device
        state = self._as_memory(mems, batch, device, embeddings.dtype)
        if reset_mems is not None:
            state = state.reset(reset_mems)
        memory = state.segment
        memory_length = 0 if memory is None else memory.length
        key_length = memory_length + query_length

        max_span = config.mem_len if config.same_length else None
        allowed = build_causal_memory_mask(query_length, memory_length, max_span, device)[None, None]  # (1,1,T,S)
        segment_mask = torch.ones(batch, query_length, dtype=torch.bool, device=device)  # (B, T)
        if attention_mask is not None:
            segment_mask = attention_mask[:, -query_length:].to(torch.bool)
        key_padding = build_key_padding_mask(
            batch, query_length, None if memory is None else memory.mask, attention_mask, device
        )
        if key_padding is not None:
            allowed = allowed & key_padding[:, None, None, :]  # (B, 1, T, S)
        memory_allowed, segment_allowed = self._knn_masks(state.knn, segment_mask, query_length)

        dropout = self.dropout if self.training and self.dropout.p > 0 else None
        position_embedding = segment_position_embedding(
            key_length, config.clamp_len, config.d_model, device, embeddings.dtype, dropout
        )  # (S, D)
        shared_biases = None if config.untie_r else (self.content_bias, self.position_bias)

        hidden = self.dropout(embeddings)
        layer_inputs, written, all_hidden, all_attentions = [], [], (), ()
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if output_hidden_states:
                all_hidden += (hidden,)
            layer_memory = None if memory is None else memory.states[index]
            arguments = (hidden, layer_memory, position_embedding, allowed, shared_biases, output_attentions)
            if isinstance(layer, TffMemorizingKNNLayer):
                slot = len(written)
                knn = KNNLayerInputs(
                    state.knn.keys[slot],
                    state.knn.values[slot],
                    memory_allowed,
                    segment_allowed,
                    config.knn_top_k,
                    config.knn_search,
                    self._faiss_indexes(state.knn, slot),
                    readers=state.knn.readers[slot],
                )
                hidden, probs, pairs = layer(*arguments, config._attn_implementation, knn)
                written.append(pairs)
            else:
                hidden, probs = layer(*arguments, config._attn_implementation)
            if output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if output_hidden_states:
            all_hidden += (hidden,)

        new_memory = None
        if use_cache:
            # the whole segment retrieved above; only now is it written (meliad's order)
            in_place = config.knn_write == "in_place" and not (self.gradient_checkpointing and self.training)
            knn_memory = state.knn.write([k for k, _ in written], [v for _, v in written], segment_mask, in_place)
            segment = None
            if config.mem_len > 0:
                previous = memory if memory is not None else SegmentMemory.empty_like(layer_inputs)
                segment = previous.update(layer_inputs, mem_len=config.mem_len, new_mask=segment_mask)
            new_memory = MemorizingMemory(segment, knn_memory)

        output = MemorizingModelOutput(
            last_hidden_state=hidden,
            mems=new_memory,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class TffMemorizingForCausalLM(SegmentRecurrentForCausalLM, TffMemorizingPreTrainedModel, ValidatedGenerationMixin):
    """The Memorizing Transformer with an adaptive softmax language-model head. `logits` are log-probabilities."""

    causal_lm_output_class = MemorizingCausalLMOutput

    def __init__(self, config: TffMemorizingConfig):
        super().__init__(config)
        self.transformer = TffMemorizingModel(config)
        self.lm_head = ProjectedAdaptiveLogSoftmax(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
        )
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        """Output layers tie to the input embeddings (`tie_word_embeddings`); tail projections tie to the input
        projections (`proj_share_all_but_first`), as in Transformer-XL."""
        return self.lm_head.tied_weights_keys(
            self.transformer.word_embeddings,
            self.config.tie_word_embeddings,
            self.config.tie_projs,
            prefix="lm_head",
            embedding_prefix="transformer.word_embeddings",
        )

    def get_output_embeddings(self):
        return None  # the adaptive softmax is not one matrix; tying is handled by get_expanded_tied_weights_keys

    @classmethod
    def from_transfo_xl(cls, pretrained_model_name_or_path: str, **config_overrides) -> TffMemorizingForCausalLM:
        """Fine-tune an existing model to use memory (paper section 4.5): a saved `TffTransfoXLLMHeadModel` (folder or
        Hub id) loaded with kNN layers added (``config_overrides``: `knn_layers`, `knn_memory_size`, ...). Every
        Transformer-XL weight is reused as it is; only the kNN layers' gate and scale are new."""
        source = AutoConfig.from_pretrained(pretrained_model_name_or_path)
        config = TffMemorizingConfig.from_transfo_xl_config(source, **config_overrides)
        model, info = cls.from_pretrained(pretrained_model_name_or_path, config=config, output_loading_info=True)
        new = {key for key in info["missing_keys"] if key.rsplit(".", 1)[-1] not in ("knn_gate", "knn_scale")}
        if new or info["unexpected_keys"] or info["mismatched_keys"]:
            raise ValueError(
                f"{pretrained_model_name_or_path} is not a Transformer-XL language model of this shape: missing "
                f"{sorted(new)}, unexpected {sorted(info['unexpected_keys'])}, mismatched {info['mismatched_keys']}."
            )
        return model

    def empty_memory(self, batch_size: int, knn_memory_size: int | None = None, **kwargs) -> MemorizingMemory:
        """See `TffMemorizingModel.empty_memory`."""
        return self.transformer.empty_memory(batch_size, knn_memory_size, **kwargs)


__all__ = ["TffMemorizingForCausalLM", "TffMemorizingModel", "TffMemorizingPreTrainedModel"]
