"""Transformer-XL: attentive language models beyond a fixed-length context (Dai et al. 2019, arXiv:1901.02860).

Segment-level recurrence: every layer attends over the hidden states of the previous segment(s) kept as a memory
without gradient (section 3.2), with relative positional attention so that positions stay coherent when states are
reused (section 3.3). Adaptive input embeddings (Baevski & Auli 2019) and an adaptive softmax (Grave et al. 2017)
handle large vocabularies (`tf_family.layers`, shared with the Compressive Transformer).

Parity reference: transformers 4.35.2 `TransfoXLLMHeadModel` (the last release whose TransfoXL runs), checked
against committed fixtures in `tests/fixtures/transfo_xl_4x/`; `convert_transfo_xl.py` loads its checkpoints.

Deviations from that implementation:
- tensors are batch-major ``(B, T, D)``; the memory is a `SegmentMemory` with a per-slot mask, so batch rows can be
  reset at document boundaries and padding is never attended to;
- per-token `losses` come back in token order (4.x returned them grouped by softmax cluster);
- only the paper's attention (4.x ``attn_type=0``); no sampled softmax (4.x did not implement it either).

Config field <-> paper symbol: `mem_len` = M, `n_layer` = N, `n_head` = n, `d_head` = d_h, `d_model` = d,
`content_bias` = u, `position_bias` = v, `position_proj` = W_{k,R}.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import logging

from ...attention import (
    build_causal_memory_mask,
    build_key_padding_mask,
    segment_position_embedding,
)
from ...conversion import ForeignCheckpointMixin
from ...layers import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax, RelativeDecoderLayer, RelativeMultiHeadAttention
from ...losses import NumItems, sequence_classification_loss
from ...memory import SegmentMemory
from ...modeling_heads import SegmentRecurrentForCausalLM
from ...modeling_outputs import MemoryCausalLMOutput, MemoryModelOutput, MemorySequenceClassifierOutput
from ...modeling_utils import AdaptiveTokenEmbeddingsMixin, RemoteCodeMixin
from ...validation import InputValidationMixin, ValidatedGenerationMixin, check_memory_states, refuse_key_value_cache
from .configuration_transfo_xl import TffTransfoXLConfig
from .convert_transfo_xl import LEGACY_TRANSFO_XL

logger = logging.get_logger(__name__)


class TffTransfoXLPreTrainedModel(
    InputValidationMixin, AdaptiveTokenEmbeddingsMixin, RemoteCodeMixin, ForeignCheckpointMixin, PreTrainedModel
):
    config_class = TffTransfoXLConfig
    config: TffTransfoXLConfig
    base_model_prefix = "transformer"
    _foreign_formats = (LEGACY_TRANSFO_XL,)  # folders of other implementations that from_pretrained reads
    carried_state = "segment_memory"  # a SegmentMemory, passed as `mems` and returned
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std, proj_std = self.config.init_std, self.config.proj_init_std
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
            # the only parameter lists are the adaptive input / softmax projections (transformers initialises
            # the module that directly owns the parameters, so this is where they arrive)
            for projection in module:
                init.normal_(projection, mean=0.0, std=proj_std)
        elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
            init.normal_(module.cluster_weight, mean=0.0, std=std)
            init.zeros_(module.cluster_bias)
        elif isinstance(module, RelativeMultiHeadAttention | TffTransfoXLModel):
            for name in ("content_bias", "position_bias"):
                if getattr(module, name, None) is not None:
                    init.normal_(getattr(module, name), mean=0.0, std=std)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrence state is a SegmentMemory returned as `mems`, not a transformers Cache.
        return False


def _as_memory(mems, num_layers: int, batch_size: int, width: int) -> SegmentMemory | None:
    if mems is None:
        return None
    refuse_key_value_cache("mems (cache)", mems, "Transformer-XL", "a memory of the previous segments' hidden states")
    if not isinstance(mems, SegmentMemory):
        if not isinstance(mems, (list, tuple)) or not all(isinstance(m, torch.Tensor) for m in mems):
            raise TypeError(f"mems must be a SegmentMemory or a sequence of (B, M, D) tensors, got {type(mems)}.")
        mems = SegmentMemory.from_states(mems)
    if len(mems) != num_layers:
        raise ValueError(f"mems has {len(mems)} layers but the model has n_layer={num_layers}.")
    if mems.batch_size != batch_size:
        raise ValueError(
            f"mems holds {mems.batch_size} batch rows but the input has {batch_size}; pass the mems returned for "
            "this batch, or mems=None to start a new stream."
        )
    check_memory_states("mems", mems.states, width)
    return mems


class TffTransfoXLModel(TffTransfoXLPreTrainedModel):
    """The Transformer-XL decoder stack, returning the last hidden state and the updated memory."""

    def __init__(self, config: TffTransfoXLConfig):
        super().__init__(config)
        self.word_embeddings = AdaptiveEmbedding(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
        )
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(RelativeDecoderLayer.from_config(config) for _ in range(config.n_layer))
        if not config.untie_r:
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    def set_input_embeddings(self, new_embeddings: nn.Module):
        self.word_embeddings = new_embeddings

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: SegmentMemory | tuple[torch.Tensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        reset_mems: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MemoryModelOutput | tuple:
        r"""
        Args:
            input_ids: ``(B, T)`` token ids of the segment.
            mems: the memory returned for the previous segment of the same streams (`SegmentMemory`, or per layer
                ``(B, M, D)`` tensors), or ``None`` at the start.
            attention_mask: ``(B, T)`` 0/1 padding mask of the segment, or ``(B, >= M + T)`` covering
                ``[memory, segment]`` (what `generate` passes), or a ``(B, 1, T, M + T)`` bool mask of allowed
                query-key pairs, combined with the causal mask.
            reset_mems: ``(B,)`` bool; rows where it is True ignore their memory (a new document starts).
            use_cache: return the updated memory (defaults to ``config.use_cache``).
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        batch, query_length = self._check_token_inputs(input_ids, inputs_embeds, embedding_width=self.config.d_model)
        self._check_mask("attention_mask", attention_mask, batch, query_length, at_least=True, dims=(2, 4))
        self._check_reset_mems(reset_mems, batch)
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        memory = _as_memory(mems, self.config.n_layer, batch, self.config.d_model)
        if reset_mems is not None and memory is not None:
            memory = memory.reset(reset_mems)
        memory_length = 0 if memory is None else memory.length
        key_length = memory_length + query_length
        device = embeddings.device

        max_span = self.config.mem_len if self.config.same_length else None
        allowed = build_causal_memory_mask(query_length, memory_length, max_span, device)[None, None]  # (1,1,T,S)
        segment_mask = torch.ones(batch, query_length, dtype=torch.bool, device=device)  # (B, T)
        if attention_mask is not None and attention_mask.dim() == 4:
            if attention_mask.shape[-2:] != (query_length, key_length):
                raise ValueError(
                    f"A 4D attention_mask must have shape (B, 1, {query_length}, {key_length}), got "
                    f"{tuple(attention_mask.shape)}."
                )
            allowed = allowed & attention_mask.to(torch.bool)
            attention_mask = None
        if attention_mask is not None:
            segment_mask = attention_mask[:, -query_length:].to(torch.bool)
        key_padding = build_key_padding_mask(
            batch, query_length, None if memory is None else memory.mask, attention_mask, device
        )
        if key_padding is not None:
            allowed = allowed & key_padding[:, None, None, :]  # (B, 1, T, S)

        dropout = self.dropout if self.training and self.dropout.p > 0 else None
        position_embedding = segment_position_embedding(
            key_length, self.config.clamp_len, self.config.d_model, device, embeddings.dtype, dropout
        )  # (S, D)
        shared_biases = None if self.config.untie_r else (self.content_bias, self.position_bias)

        hidden = self.dropout(embeddings)
        layer_inputs, all_hidden, all_attentions = [], (), ()
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if output_hidden_states:
                all_hidden += (hidden,)
            layer_memory = None if memory is None else memory.states[index]
            hidden, probs = layer(
                hidden,
                layer_memory,
                position_embedding,
                allowed,
                shared_biases,
                output_attentions,
                self.config._attn_implementation,
            )
            if output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if output_hidden_states:
            all_hidden += (hidden,)

        new_memory = None
        if use_cache:
            previous = memory if memory is not None else SegmentMemory.empty_like(layer_inputs)
            new_memory = previous.update(layer_inputs, mem_len=self.config.mem_len, new_mask=segment_mask)

        output = MemoryModelOutput(
            last_hidden_state=hidden,
            mems=new_memory,
            hidden_states=all_hidden if output_hidden_states else None,
            attentions=all_attentions if output_attentions else None,
        )
        return output if return_dict else output.to_tuple()


class TffTransfoXLLMHeadModel(SegmentRecurrentForCausalLM, TffTransfoXLPreTrainedModel, ValidatedGenerationMixin):
    """Transformer-XL with an adaptive softmax language-model head. `logits` are log-probabilities."""

    causal_lm_output_class = MemoryCausalLMOutput

    def __init__(self, config: TffTransfoXLConfig):
        super().__init__(config)
        # transformers infers the loss type from the class name ("...ForCausalLM"); `Trainer` reads it to count
        # ``labels[:, 1:]`` (the shifted targets) for ``num_items_in_batch``
        self.loss_type = "ForCausalLM"
        self.transformer = TffTransfoXLModel(config)
        self.lm_head = ProjectedAdaptiveLogSoftmax(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
        )
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        """Output layers tie to the input embeddings (`tie_word_embeddings`); tail projections tie to the input
        projections (`proj_share_all_but_first`), as in the original code."""
        return self.lm_head.tied_weights_keys(
            self.transformer.word_embeddings,
            self.config.tie_word_embeddings,
            self.config.tie_projs,
            prefix="lm_head",
            embedding_prefix="transformer.word_embeddings",
        )

    def get_output_embeddings(self):
        return None  # the adaptive softmax is not one matrix; tying is handled by get_expanded_tied_weights_keys


class TffTransfoXLForSequenceClassification(TffTransfoXLPreTrainedModel):
    """Transformer-XL with a linear classifier on the last real token of the segment."""

    def __init__(self, config: TffTransfoXLConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = TffTransfoXLModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.score = nn.Linear(config.d_model, config.num_labels, bias=False)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        mems: SegmentMemory | tuple[torch.Tensor, ...] | None = None,
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
    ) -> MemorySequenceClassifierOutput | tuple:
        r"""The representation of a row is the hidden state of its last real token (from `attention_mask`; left or
        right padding).

        Args:
            labels: ``(B,)`` class ids (or floats for regression, ``(B, num_labels)`` for multi-label).
            num_items_in_batch: `Trainer`'s count of labels over the accumulated batch (the loss is then the sum over
                it, `tf_family.losses.sequence_classification_loss`).
            **kwargs: the other arguments, as in `TffTransfoXLModel.forward`.
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.transformer(
            input_ids,
            mems=mems,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            reset_mems=reset_mems,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden = outputs.last_hidden_state  # (B, T, D)
        batch, length = hidden.shape[:2]
        if attention_mask is not None and attention_mask.dim() == 2:
            segment_mask = attention_mask[:, -length:].to(torch.long)
            last = (segment_mask * torch.arange(length, device=hidden.device)).argmax(dim=-1)  # (B,)
        else:
            last = torch.full((batch,), length - 1, device=hidden.device)
        pooled = hidden[torch.arange(batch, device=hidden.device), last]  # (B, D)
        logits = self.score(self.dropout(pooled))  # (B, num_labels)
        loss = None
        if labels is not None:
            # the shared loss checks the labels and never writes problem_type into the config (transformers' does)
            loss = sequence_classification_loss(
                logits, labels, self.num_labels, self.config.problem_type, num_items_in_batch
            )
        output = MemorySequenceClassifierOutput(
            loss=loss,
            logits=logits,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "TffTransfoXLForSequenceClassification",
    "TffTransfoXLLMHeadModel",
    "TffTransfoXLModel",
    "TffTransfoXLPreTrainedModel",
]
