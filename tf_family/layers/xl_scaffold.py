"""The scaffold of the Transformer-XL family (Dai et al. 2019, arXiv:1901.02860): what Transformer-XL, the
Compressive Transformer and the Memorizing Transformer share, written once.

* `XLPreTrainedMixin`, listed before a family model's ``PreTrainedModel``: the capability flags and the weights
  initialisation (``_init_weights``).
* `XLStackMixin`, listed by a family base model: the stack itself (adaptive input embedding, dropout, layers, the
  shared position biases) and the steps of its forward pass: `_embed_segment` (checks and embedding),
  `_segment_masks` (causal mask over ``[compressed memory, memory, segment]``, padding, a caller's 4D mask),
  `_attention_inputs` (relative position embedding, biases, implementation) and `_run_layers` (the layer loop,
  with the hidden states and attention maps it collects). A model's own forward reads as these steps plus what is
  its own: how its memory is checked, read by each layer and updated.
* `XLLMHeadMixin`: the adaptive-softmax language-model head and its weight tying.

The modules are taken from this package (`RelativeDecoderLayer`, `AdaptiveEmbedding`, `ProjectedAdaptiveLogSoftmax`)
and the mask and position math from `tf_family.attention`; the memories from `tf_family.memory` stay each model's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from ..attention import build_causal_memory_mask, build_key_padding_mask, segment_position_embedding
from .adaptive import AdaptiveEmbedding, AdaptiveTokenEmbeddingsMixin, ProjectedAdaptiveLogSoftmax
from .adaptive_span import AdaptiveSpan
from .gated_residual import GRUGate
from .relative_attention import RelativeAttentionInputs, RelativeMultiHeadAttention


class XLPreTrainedMixin(AdaptiveTokenEmbeddingsMixin):
    """Flags and weights initialisation of a Transformer-XL-family ``PreTrainedModel`` (listed before it), and the
    resizing of its adaptive embeddings (`AdaptiveTokenEmbeddingsMixin`).

    ``_init_weights`` draws linear layers (and the modules of ``_normal_init_modules``), embeddings, cluster weights
    and the position biases ``u, v`` from ``N(0, config.init_std)``, the adaptive projections from
    ``N(0, config.proj_init_std)``; biases are zero, layer norms one."""

    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["RelativeDecoderLayer"]
    _supports_sdpa = True
    # the attention reads config._attn_implementation at every call, so switching it later is safe
    _can_set_attn_implementation_cached_value = True
    # modules initialised as linear layers (weight normal, bias zero); a model with convolutions adds them
    _normal_init_modules: tuple[type[nn.Module], ...] = (nn.Linear,)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        std, proj_std = self.config.init_std, self.config.proj_init_std
        if isinstance(module, self._normal_init_modules):
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
        elif isinstance(module, GRUGate):  # GTrXL: Xavier matrices, b_g at its configured value (near identity)
            module.reset_parameters()
        elif isinstance(module, AdaptiveSpan):  # adaptive span: z / S starts at its configured value
            init.constant_(module.span, module.init)
        elif isinstance(module, RelativeMultiHeadAttention | XLStackMixin):
            for name in ("content_bias", "position_bias"):
                if getattr(module, name, None) is not None:
                    init.normal_(getattr(module, name), mean=0.0, std=std)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The recurrence state is a memory object returned as `mems`, not a transformers Cache.
        return False


def check_memory_batch(mems: Any, num_layers: int | None, batch_size: int) -> None:
    """A memory passed back in has the model's layers (``num_layers``; None: not checked here) and the input's
    batch rows."""
    if num_layers is not None and len(mems) != num_layers:
        raise ValueError(f"mems has {len(mems)} layers but the model has n_layer={num_layers}.")
    if mems.batch_size != batch_size:
        raise ValueError(
            f"mems holds {mems.batch_size} batch rows but the input has {batch_size}; pass the mems returned for "
            "this batch, or mems=None to start a new stream."
        )


def as_segment_memory(mems: Any, model_name: str, num_layers: int, batch_size: int, width: int):
    """``mems`` of a Transformer-XL stack as a `SegmentMemory` (``None`` stays ``None``; a sequence of ``(B, M, D)``
    tensors, transformers' layout, is wrapped), checked against the stack's layers, batch rows and width; a
    transformers key/value cache is refused, naming ``model_name``."""
    from ..memory.segment import SegmentMemory
    from ..modeling.validation import check_memory_states, refuse_key_value_cache

    if mems is None:
        return None
    refuse_key_value_cache("mems (cache)", mems, model_name, "a memory of the previous segments' hidden states")
    if not isinstance(mems, SegmentMemory):
        if not isinstance(mems, (list, tuple)) or not all(isinstance(m, torch.Tensor) for m in mems):
            raise TypeError(f"mems must be a SegmentMemory or a sequence of (B, M, D) tensors, got {type(mems)}.")
        mems = SegmentMemory.from_states(mems)
    check_memory_batch(mems, num_layers, batch_size)
    check_memory_states("mems", mems.states, width)
    return mems


@dataclass(frozen=True)
class OutputFlags:
    """A forward pass's output switches, the call's values or else the config's."""

    output_attentions: bool
    output_hidden_states: bool
    use_cache: bool
    return_dict: bool


@dataclass(frozen=True, eq=False)
class SegmentMasks:
    """Which query-key pairs of one segment may attend, and which of its positions are real."""

    allowed: torch.Tensor  # (B or 1, 1, T, S) bool over [compressed memory, memory, segment]
    segment: torch.Tensor  # (B, T) bool: real (not padded) positions of the segment, what the memory keeps


@dataclass(frozen=True, eq=False)
class StackOutput:
    """What `XLStackMixin._run_layers` returns."""

    hidden: torch.Tensor  # (B, T, D) the last layer's output, after dropout
    layer_inputs: list[torch.Tensor]  # L x (B, T, D): each layer's input, what the memory keeps
    hidden_states: tuple[torch.Tensor, ...] | None  # with output_hidden_states: the L inputs and the output
    attentions: tuple[torch.Tensor, ...] | None  # with output_attentions: L x (B, H, T, S)


# call_layer(index, layer, hidden) -> (hidden, probs): how a model calls its layer ``index`` on ``hidden``
LayerCall = Callable[[int, nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def init_xl_weights(
    module: nn.Module,
    init_std: float,
    proj_init_std: float,
    normal_modules: tuple[type[nn.Module], ...] = (nn.Linear,),
) -> None:
    """A Transformer-XL-family model's ``_init_weights``: linear layers (and the other ``normal_modules``),
    embeddings, cluster weights and the position biases ``u, v`` (``content_bias``, ``position_bias``, of an attention
    or of the stack that shares them) from ``N(0, init_std)``, the adaptive projections from ``N(0, proj_init_std)``;
    biases zero, layer norms one; a GTrXL gate and an adaptive span reset to their configured values."""
    if isinstance(module, normal_modules):
        init.normal_(module.weight, mean=0.0, std=init_std)
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight, mean=0.0, std=init_std)
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)
    elif isinstance(module, nn.ParameterList):
        # the only parameter lists are the adaptive input / softmax projections (transformers initialises
        # the module that directly owns the parameters, so this is where they arrive)
        for projection in module:
            init.normal_(projection, mean=0.0, std=proj_init_std)
    elif isinstance(module, ProjectedAdaptiveLogSoftmax) and module.num_tail_clusters:
        init.normal_(module.cluster_weight, mean=0.0, std=init_std)
        init.zeros_(module.cluster_bias)
    elif isinstance(module, GRUGate):  # GTrXL: Xavier matrices, b_g at its configured value (near identity)
        module.reset_parameters()
    elif isinstance(module, AdaptiveSpan):  # adaptive span: z / S starts at its configured value
        init.constant_(module.span, module.init)
    else:  # an attention with its own u, v (untie_r=True), or the stack that shares them with every layer
        for name in ("content_bias", "position_bias"):
            parameter = module._parameters.get(name)
            if parameter is not None:
                init.normal_(parameter, mean=0.0, std=init_std)


def build_adaptive_embedding(config) -> AdaptiveEmbedding:
    """The family's adaptive input embedding (Baevski & Auli 2019) from the config's vocabulary and clusters."""
    return AdaptiveEmbedding(config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val)


def build_adaptive_softmax(config) -> ProjectedAdaptiveLogSoftmax:
    """The family's adaptive-softmax language-model head (Grave et al. 2017); its ``logits`` are log-probabilities."""
    return ProjectedAdaptiveLogSoftmax(
        config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
    )


def adaptive_tied_weights_keys(lm_head: ProjectedAdaptiveLogSoftmax, word_embeddings: AdaptiveEmbedding, config):
    """A family language model's tied weights (``get_expanded_tied_weights_keys``): output layers tie to the input
    embeddings (`tie_word_embeddings`), tail projections to the input projections (`tie_projs`), as in the original
    code. Keys are relative to the language model (``lm_head``, ``transformer.word_embeddings``)."""
    return lm_head.tied_weights_keys(
        word_embeddings,
        config.tie_word_embeddings,
        config.tie_projs,
        prefix="lm_head",
        embedding_prefix="transformer.word_embeddings",
    )


def output_flags(
    config,
    output_attentions: bool | None,
    output_hidden_states: bool | None,
    use_cache: bool | None,
    return_dict: bool | None,
) -> OutputFlags:
    """A forward pass's output switches: the call's values, or else the config's."""

    def pick(value: bool | None, default: bool) -> bool:
        return value if value is not None else default

    return OutputFlags(
        pick(output_attentions, config.output_attentions),
        pick(output_hidden_states, config.output_hidden_states),
        pick(use_cache, config.use_cache),
        pick(return_dict, config.return_dict),
    )


def build_segment_masks(
    embeddings: torch.Tensor,
    attention_mask: torch.Tensor | None,
    memory_mask: torch.Tensor | None,
    compressed_mask: torch.Tensor | None = None,
    *,
    max_span: int | None,
) -> SegmentMasks:
    """The segment's masks over ``[compressed memory, memory, segment]``.

    Args:
        embeddings: ``(B, T, D)`` the segment (its batch, length and device).
        attention_mask: ``(B, T)`` or ``(B, >= M + T)`` 0/1 padding mask, or a ``(B, 1, T, S)`` bool mask of
            allowed pairs combined with the causal one.
        memory_mask: ``(B, M)`` real slots of the memory, or None (no memory).
        compressed_mask: ``(B, C)`` real slots of the compressed memory (every one older than the memory, so
            visible to every query, subject to its mask), or None.
        max_span: how far back a query may look (``mem_len`` with ``same_length``), or None.
    """
    batch, query_length, _ = embeddings.shape
    device = embeddings.device
    memory_length = 0 if memory_mask is None else memory_mask.shape[1]
    compressed_length = 0 if compressed_mask is None else compressed_mask.shape[1]
    key_length = compressed_length + memory_length + query_length
    causal = build_causal_memory_mask(query_length, memory_length, max_span, device)  # (T, M + T)
    if compressed_mask is not None:
        causal = torch.cat([causal.new_ones(query_length, compressed_length), causal], 1)  # (T, S)
    allowed = causal[None, None]  # (1, 1, T, S)
    segment_mask = torch.ones(batch, query_length, dtype=torch.bool, device=device)  # (B, T)
    if attention_mask is not None and attention_mask.dim() == 4:
        if attention_mask.shape[-2:] != (query_length, key_length):
            layout = f"memory {memory_length} + segment {query_length}"
            if compressed_mask is not None:
                layout = f"compressed memory {compressed_length} + {layout}"
            raise ValueError(
                f"A 4D attention_mask must have shape (B, 1, {query_length}, {key_length}) ({layout}), got "
                f"{tuple(attention_mask.shape)}."
            )
        allowed = allowed & attention_mask.to(torch.bool)
        attention_mask = None
    if attention_mask is not None:
        segment_mask = attention_mask[:, -query_length:].to(torch.bool)
    key_padding = build_key_padding_mask(batch, query_length, memory_mask, attention_mask, device)  # (B, M + T)
    if key_padding is not None:
        if compressed_mask is not None:
            key_padding = torch.cat([compressed_mask, key_padding], dim=1)  # (B, S)
        allowed = allowed & key_padding[:, None, None, :]  # (B, 1, T, S)
    return SegmentMasks(allowed, segment_mask)


def relative_attention_inputs(
    config,
    embeddings: torch.Tensor,
    allowed: torch.Tensor,
    shared_biases: tuple[nn.Parameter, nn.Parameter] | None,
    output_attentions: bool,
    dropout: nn.Dropout | None = None,
) -> RelativeAttentionInputs:
    """What every layer reads: the relative position embedding of the ``S`` keys of ``allowed`` (``dropout``
    applied, when given and active), the shared biases ``u, v`` (None with ``untie_r``), the mask and the attention
    implementation."""
    dropout = dropout if dropout is not None and dropout.p > 0 else None
    position_embedding = segment_position_embedding(
        allowed.shape[-1], config.clamp_len, config.d_model, embeddings.device, embeddings.dtype, dropout
    )  # (S, D)
    return RelativeAttentionInputs(
        position_embedding=position_embedding,
        allowed=allowed,
        shared_biases=shared_biases,
        output_attentions=output_attentions,
        implementation=config._attn_implementation,
    )


class XLStackMixin:
    """The decoder stack of a Transformer-XL-family base model and the shared steps of its forward pass."""

    _mask_dims: tuple[int, ...] = (2, 4)  # the attention_mask ranks forward accepts (2D padding, 4D pairs)

    def _build_stack(self, config, layers: Sequence[nn.Module]) -> None:
        """Adaptive input embedding, dropout, ``layers`` and (``untie_r=False``) the position biases ``u, v``
        shared by all layers, in this order (the state-dict keys and the order the weights are drawn in)."""
        self.word_embeddings = AdaptiveEmbedding(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
        )
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(layers)
        if not config.untie_r:
            self.content_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
            self.position_bias = nn.Parameter(torch.zeros(config.n_head, config.d_head))
        self.gradient_checkpointing = False

    def get_input_embeddings(self) -> nn.Module:
        return self.word_embeddings

    def set_input_embeddings(self, new_embeddings: nn.Module):
        self.word_embeddings = new_embeddings

    def _output_flags(
        self,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
        use_cache: bool | None,
        return_dict: bool | None,
    ) -> OutputFlags:
        config = self.config

        def pick(value: bool | None, default: bool) -> bool:
            return value if value is not None else default

        return OutputFlags(
            pick(output_attentions, config.output_attentions),
            pick(output_hidden_states, config.output_hidden_states),
            pick(use_cache, config.use_cache),
            pick(return_dict, config.return_dict),
        )

    def _embed_segment(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        reset_mems: torch.Tensor | None,
    ) -> torch.Tensor:
        """Check the inputs (a 4D ``attention_mask`` only where the model accepts one, `_mask_dims`) and return
        the segment's embeddings ``(B, T, D)``."""
        batch, length = self._check_token_inputs(input_ids, inputs_embeds, embedding_width=self.config.d_model)
        self._check_mask("attention_mask", attention_mask, batch, length, at_least=True, dims=self._mask_dims)
        self._check_reset_mems(reset_mems, batch)
        return self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)

    def _segment_masks(
        self,
        embeddings: torch.Tensor,
        attention_mask: torch.Tensor | None,
        memory_mask: torch.Tensor | None,
        compressed_mask: torch.Tensor | None = None,
    ) -> SegmentMasks:
        """The segment's masks over ``[compressed memory, memory, segment]``.

        Args:
            embeddings: ``(B, T, D)`` the segment (its batch, length and device).
            attention_mask: ``(B, T)`` or ``(B, >= M + T)`` 0/1 padding mask, or a ``(B, 1, T, S)`` bool mask of
                allowed pairs combined with the causal one.
            memory_mask: ``(B, M)`` real slots of the memory, or None (no memory).
            compressed_mask: ``(B, C)`` real slots of the compressed memory (every one older than the memory, so
                visible to every query, subject to its mask), or None.
        """
        batch, query_length, _ = embeddings.shape
        device = embeddings.device
        memory_length = 0 if memory_mask is None else memory_mask.shape[1]
        compressed_length = 0 if compressed_mask is None else compressed_mask.shape[1]
        key_length = compressed_length + memory_length + query_length
        max_span = self.config.mem_len if self.config.same_length else None
        causal = build_causal_memory_mask(query_length, memory_length, max_span, device)  # (T, M + T)
        if compressed_mask is not None:
            causal = torch.cat([causal.new_ones(query_length, compressed_length), causal], 1)  # (T, S)
        allowed = causal[None, None]  # (1, 1, T, S)
        segment_mask = torch.ones(batch, query_length, dtype=torch.bool, device=device)  # (B, T)
        if attention_mask is not None and attention_mask.dim() == 4:
            if attention_mask.shape[-2:] != (query_length, key_length):
                layout = f"memory {memory_length} + segment {query_length}"
                if compressed_mask is not None:
                    layout = f"compressed memory {compressed_length} + {layout}"
                raise ValueError(
                    f"A 4D attention_mask must have shape (B, 1, {query_length}, {key_length}) ({layout}), got "
                    f"{tuple(attention_mask.shape)}."
                )
            allowed = allowed & attention_mask.to(torch.bool)
            attention_mask = None
        if attention_mask is not None:
            segment_mask = attention_mask[:, -query_length:].to(torch.bool)
        key_padding = build_key_padding_mask(batch, query_length, memory_mask, attention_mask, device)  # (B, M + T)
        if key_padding is not None:
            if compressed_mask is not None:
                key_padding = torch.cat([compressed_mask, key_padding], dim=1)  # (B, S)
            allowed = allowed & key_padding[:, None, None, :]  # (B, 1, T, S)
        return SegmentMasks(allowed, segment_mask)

    def _attention_inputs(
        self, embeddings: torch.Tensor, allowed: torch.Tensor, output_attentions: bool
    ) -> RelativeAttentionInputs:
        """What every layer reads: the relative position embedding of the ``S`` keys of ``allowed`` (dropout
        applied in training), the shared biases, the mask and the attention implementation."""
        config = self.config
        dropout = self.dropout if self.training and self.dropout.p > 0 else None
        position_embedding = segment_position_embedding(
            allowed.shape[-1], config.clamp_len, config.d_model, embeddings.device, embeddings.dtype, dropout
        )  # (S, D)
        return RelativeAttentionInputs(
            position_embedding=position_embedding,
            allowed=allowed,
            shared_biases=None if config.untie_r else (self.content_bias, self.position_bias),
            output_attentions=output_attentions,
            implementation=config._attn_implementation,
        )

    def _run_layers(self, embeddings: torch.Tensor, flags: OutputFlags, call_layer: LayerCall) -> StackOutput:
        """Dropout, every layer through ``call_layer(index, layer, hidden) -> (hidden, probs)``, dropout."""
        hidden = self.dropout(embeddings)
        layer_inputs, all_hidden, all_attentions = [], (), ()
        for index, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            if flags.output_hidden_states:
                all_hidden += (hidden,)
            hidden, probs = call_layer(index, layer, hidden)
            if flags.output_attentions:
                all_attentions += (probs,)
        hidden = self.dropout(hidden)
        if flags.output_hidden_states:
            all_hidden += (hidden,)
        return StackOutput(
            hidden=hidden,
            layer_inputs=layer_inputs,
            hidden_states=all_hidden if flags.output_hidden_states else None,
            attentions=all_attentions if flags.output_attentions else None,
        )


class XLLMHeadMixin:
    """The adaptive-softmax language-model head of the family (``lm_head``, `ProjectedAdaptiveLogSoftmax`) over the
    base model ``transformer``; ``logits`` are log-probabilities."""

    def _add_lm_head(self, config, transformer: nn.Module) -> None:
        # transformers infers the loss type from the class name ("...ForCausalLM"); `Trainer` reads it to count
        # ``labels[:, 1:]`` (the shifted targets) for ``num_items_in_batch``
        self.loss_type = "ForCausalLM"
        self.transformer = transformer
        self.lm_head = ProjectedAdaptiveLogSoftmax(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, config.div_val
        )
        # per instance: which tensors are tied depends on the config (save_pretrained reads this attribute)
        self._tied_weights_keys = self.get_expanded_tied_weights_keys()

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


__all__ = [
    "LayerCall",
    "OutputFlags",
    "SegmentMasks",
    "StackOutput",
    "XLLMHeadMixin",
    "XLPreTrainedMixin",
    "XLStackMixin",
    "check_memory_batch",
]
