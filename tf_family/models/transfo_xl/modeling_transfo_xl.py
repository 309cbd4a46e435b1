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

Options: `gating="gru"` makes it a GTrXL (Parisotto et al. 2020, `tf_family.layers.gated_residual`);
`adaptive_span=True` gives every head a learned span (Sukhbaatar et al. 2019, `tf_family.layers.adaptive_span`): the
model trims each layer's memory to what its spans reach (`_span_limits`), keeps no more than the widest layer needs,
and the language-model head adds the span penalty to the loss (`span_loss`).

Config field <-> paper symbol: `mem_len` = M, `n_layer` = N, `n_head` = n, `d_head` = d_h, `d_model` = d,
`content_bias` = u, `position_bias` = v, `position_proj` = W_{k,R}.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import logging

from ...attention.adaptive_span import span_key_limit
from ...layers import PositionwiseFeedForward, RelativeDecoderLayer, RelativeMultiHeadAttention
from ...layers.adaptive import adaptive_embeddings_view, resize_adaptive_token_embeddings
from ...layers.adaptive_span import AdaptiveSpan, AdaptiveSpanAttention
from ...layers.gated_residual import GatedRelativeDecoderLayer
from ...layers.xl_scaffold import (
    adaptive_tied_weights_keys,
    as_segment_memory,
    build_adaptive_embedding,
    build_adaptive_softmax,
    build_segment_masks,
    init_xl_weights,
    output_flags,
    relative_attention_inputs,
)
from ...memory import SegmentMemory
from ...modeling.fused_lm_head import FusedLMHeadMixin, answers_fused_lm_head
from ...modeling.heads import memory_generation_inputs, sequence_classification_loss
from ...modeling.losses import IGNORE_INDEX, NumItems, item_mean
from ...modeling.outputs import MemoryCausalLMOutput, MemoryModelOutput, MemorySequenceClassifierOutput
from ...modeling.pretrained import TffPreTrainedModel
from ...modeling.state_names import MEMORY_NAME, memory_from_aliases
from ...modeling.validation import (
    ValidatedGenerationMixin,
)
from .configuration_transfo_xl import TffTransfoXLConfig

logger = logging.get_logger(__name__)


@dataclass
class TransfoXLCausalLMOutput(MemoryCausalLMOutput):
    """`MemoryCausalLMOutput` and, with ``adaptive_span=True``, ``span_loss``: the span penalty
    ``adaptive_span_loss * mean(z)`` (a scalar), which ``loss`` includes when labels are given."""

    span_loss: torch.FloatTensor | None = None


class TffTransfoXLPreTrainedModel(TffPreTrainedModel):
    """Flags and weights initialisation (`tf_family.layers.xl_scaffold.init_xl_weights`), and the resizing of the
    adaptive embeddings (`tf_family.layers.adaptive.resize_adaptive_token_embeddings`)."""

    config_class = TffTransfoXLConfig
    config: TffTransfoXLConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer", "GatedRelativeDecoderLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True
    carried_state = "segment_memory"  # a SegmentMemory, passed as `mems` and returned

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        init_xl_weights(module, self.config.init_std, self.config.proj_init_std)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrence state is a memory object returned as `mems`, not a transformers Cache.
        return False

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Module:
        """Resize the vocabulary's last cluster (`resize_adaptive_token_embeddings`; transformers' ``mean_resizing``
        fits one embedding matrix and does not apply to clustered embeddings)."""
        return resize_adaptive_token_embeddings(self, new_num_tokens, pad_to_multiple_of)

    @property
    def embeddings(self) -> nn.Module:
        """The adaptive input embedding as ``embeddings.word_embeddings``, where PEFT's prompt learning looks
        (`adaptive_embeddings_view`)."""
        return adaptive_embeddings_view(self)


def _as_memory(mems, num_layers: int, batch_size: int, width: int) -> SegmentMemory | None:
    return as_segment_memory(mems, "Transformer-XL", num_layers, batch_size, width)


def _build_layer(config: TffTransfoXLConfig) -> nn.Module:
    # adaptive span: each head learns its span; GTrXL (gating="gru"): gated residuals in place of the residuals
    attention_class = AdaptiveSpanAttention if config.adaptive_span else RelativeMultiHeadAttention
    attention, feed_forward = attention_class.from_config(config), PositionwiseFeedForward.from_config(config)
    if config.gating == "gru":
        return GatedRelativeDecoderLayer(attention, feed_forward, config.gate_bias)
    return RelativeDecoderLayer(attention, feed_forward)


class TffTransfoXLModel(TffTransfoXLPreTrainedModel):
    """The Transformer-XL decoder stack, returning the last hidden state and the updated memory."""

    def __init__(self, config: TffTransfoXLConfig):
        super().__init__(config)
        layers = [_build_layer(config) for _ in range(config.n_layer)]  # drawn first, as the weights always were
        self.word_embeddings = build_adaptive_embedding(config)
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layers)
        if not config.untie_r:  # u, v shared by all layers
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    def set_input_embeddings(self, new_embeddings: nn.Module):
        self.word_embeddings = new_embeddings

    def adaptive_spans(self) -> list[AdaptiveSpan]:
        """The layers' `AdaptiveSpan` modules (empty without ``adaptive_span``)."""
        return [layer.attention.adaptive_span for layer in self.layers if self.config.adaptive_span]

    def span_loss(self) -> torch.Tensor | None:
        """The span penalty ``adaptive_span_loss * mean(z)`` over every head of every layer (``z`` in tokens), or
        None without ``adaptive_span``."""
        spans = self.adaptive_spans()
        if not spans:
            return None
        return self.config.adaptive_span_loss * torch.cat([span.spans() for span in spans]).mean()

    def _span_limits(self) -> list[int] | None:
        """Per layer, how many of the most recent memory slots its spans reach (rounded up to
        ``adaptive_span_round``); None when nothing is trimmed. One read from the device for all layers."""
        spans = self.adaptive_spans()
        if not spans or not self.config.adaptive_span_trim:
            return None
        if self.training:  # the paper's clamp after each optimiser step, done before the spans are read
            for span in spans:
                span.clamp_()
        widest = torch.stack([span.spans().detach().max() for span in spans]).tolist()  # L floats
        return [span_key_limit(z, self.config.adaptive_span_ramp, self.config.adaptive_span_round) for z in widest]

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
        r"""The keyword parameters follow transformers' ``forward`` convention (hence more than STYLE's six).

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
        config = self.config
        flags = output_flags(config, output_attentions, output_hidden_states, use_cache, return_dict)
        batch, length = self._check_token_inputs(input_ids, inputs_embeds, embedding_width=config.d_model)
        self._check_mask("attention_mask", attention_mask, batch, length, at_least=True, dims=(2, 4))
        self._check_reset_mems(reset_mems, batch)
        embeddings = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        memory = _as_memory(mems, config.n_layer, batch, config.d_model)
        if reset_mems is not None and memory is not None:
            memory = memory.reset(reset_mems)
        masks = build_segment_masks(
            embeddings,
            attention_mask,
            None if memory is None else memory.mask,
            max_span=config.mem_len if config.same_length else None,
        )
        inputs = relative_attention_inputs(
            config,
            embeddings,
            masks.allowed,
            None if config.untie_r else (self.content_bias, self.position_bias),
            flags.output_attentions,
            dropout=self.dropout if self.training else None,
        )
        limits = self._span_limits()  # adaptive span: the memory slots each layer's spans reach

        hidden = self.dropout(embeddings)  # (B, T, D)
        layer_inputs, all_hidden, all_attentions = [], (), ()  # the layer inputs are what the memory keeps
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if flags.output_hidden_states:
                all_hidden += (hidden,)
            states = None if memory is None else memory.states[index]  # (B, M, D)
            if limits is not None and states is not None and states.shape[1] > limits[index]:
                states = states[:, -limits[index] :]  # (B, limit, D): the slots beyond weigh 0
            hidden, probs = layer(hidden, states, inputs=inputs)
            if flags.output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if flags.output_hidden_states:
            all_hidden += (hidden,)

        new_memory = None
        if flags.use_cache:
            previous = memory if memory is not None else SegmentMemory.empty_like(layer_inputs)
            mem_len = config.mem_len if limits is None else min(config.mem_len, max(limits))
            new_memory = previous.update(layer_inputs, mem_len=mem_len, new_mask=masks.segment)
        output = MemoryModelOutput(
            last_hidden_state=hidden,
            mems=new_memory,
            hidden_states=all_hidden if flags.output_hidden_states else None,
            attentions=all_attentions if flags.output_attentions else None,
        )
        return output if flags.return_dict else output.to_tuple()


class TffTransfoXLLMHeadModel(FusedLMHeadMixin, TffTransfoXLPreTrainedModel, ValidatedGenerationMixin):
    """Transformer-XL with an adaptive softmax language-model head. `logits` are log-probabilities."""

    def __init__(self, config: TffTransfoXLConfig):
        super().__init__(config)
        # transformers infers the loss type from the class name ("...ForCausalLM"); `Trainer` reads it to count
        # ``labels[:, 1:]`` (the shifted targets) for ``num_items_in_batch``
        self.loss_type = "ForCausalLM"
        self.transformer = TffTransfoXLModel(config)
        self.lm_head = build_adaptive_softmax(config)
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()
        self.post_init()

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict[str, str]:
        """Output layers tie to the input embeddings (`tie_word_embeddings`); tail projections tie to the input
        projections (`tie_projs`), as in the original code."""
        return adaptive_tied_weights_keys(self.lm_head, self.transformer.word_embeddings, self.config)

    def get_output_embeddings(self):
        return None  # the adaptive softmax is not one matrix; tying is handled by get_expanded_tied_weights_keys

    @answers_fused_lm_head
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
    ) -> TransfoXLCausalLMOutput | tuple:
        r"""transformers' language-model signature (`generate` and `Trainer` pass these by name), hence more than ~6
        parameters.

        Args:
            labels: ``(B, T)`` token ids, usually ``input_ids``; position ``t`` is predicted from positions ``<= t-1``
                (the shift happens inside), ``-100`` is ignored. With ``num_items_in_batch`` (`Trainer`: the counted
                ``labels[:, 1:]`` of the accumulated batch) the loss is the sum over it. With an adaptive softmax
                (non-empty `cutoffs`) the full `logits` are not computed when labels are given, only the losses.
                With ``adaptive_span`` the span penalty is added to every predicted token's loss (so that with
                ``num_items_in_batch`` the accumulated batch counts it once, as it counts the tokens) and reported
                as ``span_loss``.
            Other arguments: see `TffTransfoXLModel.forward`.
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
        span_loss = self.transformer.span_loss()
        if span_loss is not None and loss is not None:
            counted = labels[:, 1:] != IGNORE_INDEX  # (B, T-1)
            loss = loss + item_mean(span_loss.expand(counted.shape), counted, num_items_in_batch)
        output = TransfoXLCausalLMOutput(
            loss=loss,
            logits=logits,
            losses=losses,
            mems=outputs.mems,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            span_loss=span_loss,
        )
        return output if return_dict else output.to_tuple()

    def prepare_inputs_for_generation(
        self, input_ids, mems=None, attention_mask=None, inputs_embeds=None, use_cache=None, **kwargs
    ) -> dict:
        """Once the memory exists only the newest token is fed (`memory_generation_inputs`)."""
        first = kwargs.get("is_first_iteration", True)
        return memory_generation_inputs(input_ids, mems, attention_mask, inputs_embeds, use_cache, first)

    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs) -> dict:
        """The memory travels between steps as ``mems`` (`MEMORY_NAME`), in the output and in the model kwargs, as
        transformers 5 carries XLNet's."""
        model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
        if getattr(outputs, "mems", None) is not None:
            model_kwargs[MEMORY_NAME] = outputs.mems
        return model_kwargs

    def _reorder_cache(self, mems, beam_idx: torch.Tensor):
        return mems.index_select(beam_idx)


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
        right padding). The keyword parameters follow transformers' ``forward`` convention (hence more than six).

        Args:
            labels: ``(B,)`` class ids (or floats for regression, ``(B, num_labels)`` for multi-label).
            num_items_in_batch: `Trainer`'s count of labels over the accumulated batch (the loss is then the sum over
                it, `tf_family.modeling.heads.sequence_classification_loss`).
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
    "TransfoXLCausalLMOutput",
]
