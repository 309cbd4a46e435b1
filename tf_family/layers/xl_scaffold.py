"""What the models of the Transformer-XL family (Dai et al. 2019, arXiv:1901.02860) share, as functions their own
``__init__`` and ``forward`` call: Transformer-XL, the Compressive Transformer, the Memorizing Transformer and SPALM.

Each model builds its stack in its own ``__init__`` (adaptive input embedding, dropout, layers, the shared position
biases ``u, v``, in this order: the state-dict keys and the order the weights are drawn in) and writes its layer loop
in its own ``forward``; what is the same in all four lives here:

* builders that return modules: `build_adaptive_embedding`, `build_adaptive_softmax`;
* `init_xl_weights`, the body of every family model's ``_init_weights``;
* `adaptive_tied_weights_keys`, which weights of the adaptive softmax tie to the adaptive embedding;
* the steps of a forward pass before the layers: `output_flags` (the call's switches or the config's),
  `build_segment_masks` (causal mask over ``[compressed memory, memory, segment]``, padding, a caller's 4D mask),
  `relative_attention_inputs` (relative position embedding, biases, implementation);
* the memory checks `as_segment_memory` and `check_memory_batch`.

The modules come from this package (`RelativeDecoderLayer`, `AdaptiveEmbedding`, `ProjectedAdaptiveLogSoftmax`) and
the mask and position math from `tf_family.attention`; the memories from `tf_family.memory` stay each model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import initialization as init

from ..attention import build_causal_memory_mask, build_key_padding_mask, segment_position_embedding
from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from .adaptive_span import AdaptiveSpan
from .gated_residual import GRUGate
from .relative_attention import RelativeAttentionInputs


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
    refuse_key_value_cache("mems", mems, model_name, "a memory of the previous segments' hidden states")
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


__all__ = [
    "OutputFlags",
    "SegmentMasks",
    "adaptive_tied_weights_keys",
    "as_segment_memory",
    "build_adaptive_embedding",
    "build_adaptive_softmax",
    "build_segment_masks",
    "check_memory_batch",
    "init_xl_weights",
    "output_flags",
    "relative_attention_inputs",
]
