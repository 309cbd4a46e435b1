"""ModelOutput dataclasses shared by the tf_family models."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import ModelOutput

from ..memory.compressive import CompressiveMemory
from ..memory.knn_memory import MemorizingMemory
from ..memory.segment import SegmentMemory


@dataclass
class MemoryModelOutput(ModelOutput):
    """Output of a segment-recurrent base model (Transformer-XL family).

    Args:
        last_hidden_state: ``(B, T, D)``.
        mems: the updated memory to pass to the next segment, or ``None`` when the model has no memory.
        hidden_states: per layer ``(B, T, D)`` when ``output_hidden_states=True`` (embeddings first).
        attentions: per layer ``(B, H, T, S)`` when ``output_attentions=True``.
    """

    last_hidden_state: torch.FloatTensor | None = None
    mems: SegmentMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class MemoryCausalLMOutput(ModelOutput):
    """Output of a segment-recurrent language model.

    Args:
        loss: mean negative log-likelihood of the predicted tokens (labels shifted inside the model).
        logits: ``(B, T, V)`` log-probabilities of the next token (an adaptive softmax normalises over the
            clusters, so these are log-probabilities rather than raw scores; `softmax` of them is the distribution).
        losses: ``(B, T - 1)`` per-token negative log-likelihood, 0 where the label is ignored (``-100``).
        mems, hidden_states, attentions: as in `MemoryModelOutput`.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    mems: SegmentMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class MemorySequenceClassifierOutput(ModelOutput):
    """Output of a segment-recurrent sequence classifier."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: SegmentMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CompressiveModelOutput(ModelOutput):
    """Output of the Compressive Transformer's base model.

    Args:
        last_hidden_state: ``(B, T, D)``.
        mems: both updated memories (`CompressiveMemory`: ``memory`` and ``compressed``) for the next segment, or
            ``None`` when the model has no memory or ``use_cache=False``.
        aux_loss: the weighted sum of the auxiliary losses (what is added to the language-model loss), when computed.
        attention_reconstruction_loss: the attention-reconstruction loss ``L^attn`` (summed over layers), when
            computed (0 when no state was compressed in this segment).
        autoencoding_loss: the auto-encoding loss ``L^ae`` (summed over layers), when its weight is > 0.
        hidden_states, attentions: as in `MemoryModelOutput` (attention keys are ``[compressed, memory, segment]``).
    """

    last_hidden_state: torch.FloatTensor | None = None
    mems: CompressiveMemory | None = None
    aux_loss: torch.FloatTensor | None = None
    attention_reconstruction_loss: torch.FloatTensor | None = None
    autoencoding_loss: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CompressiveCausalLMOutput(ModelOutput):
    """Output of the Compressive Transformer language model.

    Args:
        loss: ``lm_loss + aux_loss`` (the auxiliary losses train only the compression network).
        logits: ``(B, T, V)`` log-probabilities of the next token.
        losses: ``(B, T - 1)`` per-token negative log-likelihood, 0 where the label is ignored (``-100``).
        lm_loss: mean negative log-likelihood of the predicted tokens.
        aux_loss, attention_reconstruction_loss, autoencoding_loss, mems, hidden_states, attentions: as in
            `CompressiveModelOutput`.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    aux_loss: torch.FloatTensor | None = None
    attention_reconstruction_loss: torch.FloatTensor | None = None
    autoencoding_loss: torch.FloatTensor | None = None
    mems: CompressiveMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class EarlyExitCausalLMOutput(ModelOutput):
    """Output of an early-exit (CALM) language model.

    Args:
        loss: with ``labels``: the anytime loss (the exits' weighted cross entropies) plus the weighted meta
            classifier loss.
        logits: ``(B, T, V)``, each token's from the exit it left at.
        cache: the `transformers.Cache`, every layer filled (skipped layers by state propagation).
        hidden_states: embeddings and every layer's output (full-depth calls with ``output_hidden_states``).
        attentions: per layer ``(B, H, T, S)`` (full-depth calls, eager attention, ``output_attentions``).
        exit_layers: ``(B, T)`` how many layers each token ran before it exited.
        aux_loss: with ``exit_targets``: what the caller adds to the last layer's cross entropy to get ``loss``.
        lm_loss: the last layer's cross entropy (when targets are given).
        meta_loss: the meta classifier's class-balanced loss (when targets are given).
        halting_loss: the Depth-Adaptive halting classifier's loss against the oracle exits (the ``"halting"`` and
            ``"multinomial"`` measures, when targets are given); weighted like ``meta_loss`` in ``loss``.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    cache: object | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None
    exit_layers: torch.LongTensor | None = None
    aux_loss: torch.FloatTensor | None = None
    lm_loss: torch.FloatTensor | None = None
    meta_loss: torch.FloatTensor | None = None
    halting_loss: torch.FloatTensor | None = None


@dataclass
class MemorizingModelOutput(ModelOutput):
    """Output of the Memorizing Transformer's base model.

    Args:
        last_hidden_state: ``(B, T, D)``.
        mems: the `MemorizingMemory` (kNN memory and Transformer-XL memory) for the next segment,
            or ``None`` with ``use_cache=False``.
        hidden_states, attentions: as in `MemoryModelOutput` (attentions: the local attention of every layer).
    """

    last_hidden_state: torch.FloatTensor | None = None
    mems: MemorizingMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class MemorizingCausalLMOutput(ModelOutput):
    """Output of the Memorizing Transformer language model: as `MemoryCausalLMOutput`, with a `MemorizingMemory`."""

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    mems: MemorizingMemory | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class CalmGenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' `GenerateDecoderOnlyOutput` plus ``exit_layers`` ``(B, new tokens)``: after how many layers each
    generated token exited (``generate(..., output_exit_layers=True, return_dict_in_generate=True)``)."""

    exit_layers: torch.LongTensor | None = None
