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
from transformers import AutoConfig
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import logging

from ...layers import (
    PositionwiseFeedForward,
    RelativeAttentionInputs,
    RelativeDecoderLayer,
    RelativeMultiHeadAttention,
)
from ...layers.adaptive import adaptive_embeddings_view, resize_adaptive_token_embeddings
from ...layers.xl_scaffold import (
    adaptive_tied_weights_keys,
    build_adaptive_embedding,
    build_adaptive_softmax,
    build_segment_masks,
    check_memory_batch,
    init_xl_weights,
    output_flags,
    relative_attention_inputs,
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
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import memory_generation_inputs
from ...modeling.losses import NumItems
from ...modeling.outputs import MemorizingCausalLMOutput, MemorizingModelOutput
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import MEMORY_NAME, memory_from_aliases
from ...modeling.validation import (
    ValidatedGenerationMixin,
    check_memory_states,
    refuse_key_value_cache,
)
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
        self.attention = RelativeMultiHeadAttention.from_config(config)
        self.feed_forward = PositionwiseFeedForward.from_config(config)
        self.knn_scale = nn.Parameter(torch.full((config.n_head,), config.knn_scale_init))
        self.knn_gate = nn.Parameter(torch.full((config.n_head,), config.knn_gate_init))

    def forward(
        self,
        hidden: torch.Tensor,
        memory: torch.Tensor | None,
        *,
        inputs: RelativeAttentionInputs,
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
            local, probs = attention.local_attention(query, key, value, inputs)  # (B, H, T, Dh)
            attended_retrieved = fused_knn_attention(query_direction, retrieved, scale, knn.readers)  # (B, H, T, Dh)
            # a query that found nothing keeps its local result: with the gate closed this is Transformer-XL exactly
            gate = torch.sigmoid(self.knn_gate)[:, None, None] * retrieved.any_found  # (B, H, T, 1)
            attended = local * (1 - gate) + attended_retrieved * gate
        else:
            attended, probs = self._joint_attention(query, key, value, inputs, query_direction, retrieved, scale)
            probs = probs if inputs.output_attentions else None
        hidden = attention.finish(hidden, attended)
        return self.feed_forward(hidden), probs, (segment[0].detach(), segment[1].detach())

    def _joint_attention(self, query, key, value, inputs, query_direction, retrieved, scale):
        """One softmax over the local keys (Transformer-XL scores) and the retrieved pairs (scaled cosine scores)."""
        attention = self.attention
        bias, content_bias = attention.position_scores(query, inputs)
        content = torch.einsum("bhtd,bhsd->bhts", query + content_bias[:, None, :].to(query.dtype), key)
        local_logits = content * attention.scale + bias.to(query.dtype)  # (B, H, T, S)
        knn_logits = retrieved.logits(query_direction, scale)  # (B, H, T, K [+ T])
        probs = torch.softmax(torch.cat([local_logits, knn_logits], dim=-1), dim=-1)  # (B, H, T, S + K [+ T])
        probs = attention.attention_dropout(probs)
        key_length = key.shape[2]
        attended = probs[..., :key_length] @ value + retrieved.attend(probs[..., key_length:])  # (B, H, T, Dh)
        return attended, probs[..., :key_length]


class TffMemorizingPreTrainedModel(TffPreTrainedModel):
    """Flags and weights initialisation (`tf_family.layers.xl_scaffold.init_xl_weights`, and the kNN layers' gate
    and scale from the config), and the resizing of the adaptive embeddings."""

    config_class = TffMemorizingConfig
    config: TffMemorizingConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer", "TffMemorizingKNNLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True
    carried_state = "knn_memory"  # a MemorizingMemory (kNN memory + Transformer-XL memory), passed as `mems`

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        init_xl_weights(module, self.config.init_std, self.config.proj_init_std)
        if isinstance(module, TffMemorizingKNNLayer):
            init.constant_(module.knn_scale, self.config.knn_scale_init)
            init.constant_(module.knn_gate, self.config.knn_gate_init)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel._supports_default_dynamic_cache with TransfoXL->Memorizing
    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrence state is a memory object returned as `mems`, not a transformers Cache.
        return False

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel.resize_token_embeddings with TransfoXL->Memorizing
    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Module:
        """Resize the vocabulary's last cluster (`resize_adaptive_token_embeddings`; transformers' ``mean_resizing``
        fits one embedding matrix and does not apply to clustered embeddings)."""
        return resize_adaptive_token_embeddings(self, new_num_tokens, pad_to_multiple_of)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLPreTrainedModel.embeddings with TransfoXL->Memorizing
    @property
    def embeddings(self) -> nn.Module:
        """The adaptive input embedding as ``embeddings.word_embeddings``, where PEFT's prompt learning looks
        (`adaptive_embeddings_view`)."""
        return adaptive_embeddings_view(self)


class TffMemorizingModel(TffMemorizingPreTrainedModel):
    """The Memorizing Transformer decoder stack: last hidden state and the updated memories."""

    def __init__(self, config: TffMemorizingConfig):
        super().__init__(config)
        layers = [  # drawn first, as the weights always were
            TffMemorizingKNNLayer(config) if index in config.knn_layers else RelativeDecoderLayer.from_config(config)
            for index in range(config.n_layer)
        ]
        self.word_embeddings = build_adaptive_embedding(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layers)
        if not config.untie_r:  # u, v shared by all layers
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False
        self.post_init()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLModel.get_input_embeddings
    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLModel.set_input_embeddings
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
        refuse_key_value_cache("mems", mems, "the Memorizing Transformer", "a MemorizingMemory")
        if not isinstance(mems, MemorizingMemory):
            raise TypeError(
                f"mems must be the MemorizingMemory a previous call returned (or None to start), got {type(mems)}."
            )
        check_memory_batch(mems, None, batch_size)
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

    def _knn_layer_inputs(
        self, knn: KNNMemory, slot: int, memory_allowed: MemoryAllowed, segment_allowed: torch.Tensor | None
    ) -> KNNLayerInputs:
        """What the kNN layer ``slot`` (its index among the kNN layers) reads of the kNN memory."""
        config = self.config
        return KNNLayerInputs(
            knn.keys[slot],
            knn.values[slot],
            memory_allowed,
            segment_allowed,
            config.knn_top_k,
            config.knn_search,
            self._faiss_indexes(knn, slot),
            readers=knn.readers[slot],
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
        r"""The keyword parameters follow transformers' ``forward`` convention (hence more than STYLE's six).

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
        flags = output_flags(config, output_attentions, output_hidden_states, use_cache, return_dict)
        batch, length = self._check_token_inputs(input_ids, inputs_embeds, embedding_width=config.d_model)
        # no 4D attention_mask: what a query may retrieve follows the padding mask
        self._check_mask("attention_mask", attention_mask, batch, length, at_least=True, dims=(2,))
        self._check_reset_mems(reset_mems, batch)
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        state = self._as_memory(mems, batch, embeddings.device, embeddings.dtype)
        if reset_mems is not None:
            state = state.reset(reset_mems)
        memory = state.segment
        masks = build_segment_masks(
            embeddings,
            attention_mask,
            None if memory is None else memory.mask,
            max_span=config.mem_len if config.same_length else None,
        )
        memory_allowed, segment_allowed = self._knn_masks(state.knn, masks.segment, length)
        inputs = relative_attention_inputs(
            config,
            embeddings,
            masks.allowed,
            None if config.untie_r else (self.content_bias, self.position_bias),
            flags.output_attentions,
            dropout=self.dropout if self.training else None,
        )
        written = []  # per kNN layer: the segment's (normalised key, value) pairs to write into the memory

        hidden = self.dropout(embeddings)  # (B, T, D)
        layer_inputs, all_hidden, all_attentions = [], (), ()  # the layer inputs are what the memory keeps
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if flags.output_hidden_states:
                all_hidden += (hidden,)
            layer_memory = None if memory is None else memory.states[index]  # (B, M, D)
            if isinstance(layer, TffMemorizingKNNLayer):
                knn = self._knn_layer_inputs(state.knn, len(written), memory_allowed, segment_allowed)
                hidden, probs, pairs = layer(hidden, layer_memory, inputs=inputs, knn=knn)
                written.append(pairs)
            else:
                hidden, probs = layer(hidden, layer_memory, inputs=inputs)
            if flags.output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if flags.output_hidden_states:
            all_hidden += (hidden,)

        new_memory = None
        if flags.use_cache:
            new_memory = self._update_memories(state, layer_inputs, masks.segment, written)
        output = MemorizingModelOutput(
            last_hidden_state=hidden,
            mems=new_memory,
            hidden_states=all_hidden if flags.output_hidden_states else None,
            attentions=all_attentions if flags.output_attentions else None,
        )
        return output if flags.return_dict else output.to_tuple()

    def _update_memories(self, state, layer_inputs, segment_mask, written) -> MemorizingMemory:
        """The kNN memory with the segment's pairs ``written`` by the kNN layers, and the Transformer-XL memory."""
        config = self.config
        # the whole segment retrieved above; only now is it written (meliad's order)
        in_place = config.knn_write == "in_place" and not (self.gradient_checkpointing and self.training)
        knn_memory = state.knn.write([k for k, _ in written], [v for _, v in written], segment_mask, in_place)
        segment = None
        if config.mem_len > 0:
            previous = state.segment if state.segment is not None else SegmentMemory.empty_like(layer_inputs)
            segment = previous.update(layer_inputs, mem_len=config.mem_len, new_mask=segment_mask)
        return MemorizingMemory(segment, knn_memory)


class TffMemorizingForCausalLM(FusedLMHeadMixin, TffMemorizingPreTrainedModel, ValidatedGenerationMixin):
    """The Memorizing Transformer with an adaptive softmax language-model head. `logits` are log-probabilities."""

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.__init__ with TransfoXL->Memorizing
    def __init__(self, config: TffMemorizingConfig):
        super().__init__(config)
        # transformers infers the loss type from the class name ("...ForCausalLM"); `Trainer` reads it to count
        # ``labels[:, 1:]`` (the shifted targets) for ``num_items_in_batch``
        self.loss_type = "ForCausalLM"
        self.transformer = TffMemorizingModel(config)
        self.lm_head = build_adaptive_softmax(config)
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()
        self.post_init()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.get_expanded_tied_weights_keys with TransfoXL->Memorizing
    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        """Output layers tie to the input embeddings (`tie_word_embeddings`); tail projections tie to the input
        projections (`tie_projs`), as in the original code."""
        return adaptive_tied_weights_keys(self.lm_head, self.transformer.word_embeddings, self.config)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.get_output_embeddings with TransfoXL->Memorizing
    def get_output_embeddings(self):
        return None  # the adaptive softmax is not one matrix; tying is handled by get_expanded_tied_weights_keys

    @answers_fused_lm_head
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: MemorizingMemory | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ) -> MemorizingCausalLMOutput | tuple:
        r"""transformers' language-model signature (`generate` and `Trainer` pass these by name), hence more than ~6
        parameters.

        Args:
            labels: ``(B, T)`` token ids, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1``
                (the shift happens inside), ``-100`` is ignored. With ``num_items_in_batch`` (`Trainer`: the counted
                ``labels[:, 1:]`` of the accumulated batch) the loss is the sum over it. With an adaptive softmax
                (non-empty `cutoffs`) the full `logits` are not computed when labels are given, only the losses.
            Other arguments: see `TffMemorizingModel.forward`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        mems = memory_from_aliases(mems, kwargs, type(self).__name__)  # its names before, for one release
        outputs = self.transformer(
            input_ids=input_ids,
            mems=mems,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            reset_mems=reset_mems,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        self._check_lm_labels(labels, *outputs.last_hidden_state.shape[:2])
        logits, losses, loss = self.lm_head.causal_lm_outputs(outputs.last_hidden_state, labels, num_items_in_batch)
        output = MemorizingCausalLMOutput(
            loss=loss,
            logits=logits,
            losses=losses,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel.prepare_inputs_for_generation with TransfoXL->Memorizing
    def prepare_inputs_for_generation(
        self, input_ids, mems=None, attention_mask=None, inputs_embeds=None, use_cache=None, **kwargs
    ) -> dict:
        """Once the memory exists only the newest token is fed (`memory_generation_inputs`)."""
        first = kwargs.get("is_first_iteration", True)
        return memory_generation_inputs(input_ids, mems, attention_mask, inputs_embeds, use_cache, first)

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel._update_model_kwargs_for_generation with TransfoXL->Memorizing
    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs) -> dict:
        """The memory travels between steps as ``mems`` (`MEMORY_NAME`), in the output and in the model kwargs, as
        transformers 5 carries XLNet's."""
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        if getattr(outputs, "mems", None) is not None:
            model_kwargs[MEMORY_NAME] = outputs.mems
        return model_kwargs

    # Copied from tf_family.models.transfo_xl.modeling_transfo_xl.TffTransfoXLLMHeadModel._reorder_cache with TransfoXL->Memorizing
    def _reorder_cache(self, mems, beam_idx: torch.Tensor):
        return mems.index_select(beam_idx)

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
