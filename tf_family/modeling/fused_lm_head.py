"""TRL's fused LM head, answered by the tf_family causal LMs themselves.

TRL's trainers (`SFTTrainer`, `DPOTrainer`, `GRPOTrainer` …, trl >= 1.x) never read a model's logits: they call
``trl.trainer.utils.add_fused_lm_head(model)``, which replaces ``model.forward`` by one that, when called with
``fused_lm_head=True``, runs ``model.base_model`` and multiplies its ``last_hidden_state`` by
``model.get_output_embeddings().weight``. That is only the model's distribution when the head is one linear layer on
the backbone's last hidden state. Among the tf_family causal LMs it is not: the Transformer-XL family's adaptive
softmax is no single matrix (``get_output_embeddings()`` is ``None``), Longformer's head is RoBERTa's
(dense, GELU, LayerNorm, decoder), the kNN-LM interpolates with its datastore.

So every tf_family causal LM answers the same call itself: its class lists `FusedLMHeadMixin`, which declines TRL's
patch (keeping the temperature and the fields TRL asked for), and its ``forward`` is wrapped by
`answers_fused_lm_head`, which computes `FusedLMHeadOutput` (the fields of TRL's ``FusedCausalLMOutput``) from the
model's own next-token log-probabilities. The per-token log-probabilities are then exactly those of
``forward(...).logits.log_softmax(-1)``, and the loss (their sum over ``num_items_in_batch``) is exact under gradient
accumulation. Unlike TRL's tiled kernel it materialises the ``(B, T, V)`` logits, as the models' own ``forward``
does anyway.

Padding-free batches (TRL's ``padding_free=True`` or ``packing_strategy="bfd"``: several documents in one row,
told apart only by ``position_ids`` / ``cu_seq_lens_*``) are refused with a ValueError: no tf_family attention keeps
such documents apart, and silently letting them attend to each other would train on the wrong context.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput, logging

from .losses import IGNORE_INDEX

logger = logging.get_logger(__name__)

# what a padding-free collator (TRL's DataCollatorForLanguageModeling(padding_free=True)) adds to a batch
PADDING_FREE_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
FUSED_FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


@dataclass
class FusedLMHeadOutput(ModelOutput):
    """What a model called with ``fused_lm_head=True`` returns: the fields of TRL's ``FusedCausalLMOutput``.

    Args:
        loss: ``-log_probs.sum()`` over ``num_items_in_batch`` (the count of labels that are not -100 when not given).
        log_probs: ``(B, T - 1)`` (``(B, T)`` with ``shift_labels``) log-probability of each next-token label under
            the temperature-scaled distribution, 0 where the label is -100.
        entropy, log_sum_sq_probs, mean_logits, is_top1: per token, like ``log_probs``, when asked for (else
            ``None``); ``log_sum_sq_probs`` and ``mean_logits`` carry no gradient.
        label_mask: ``(B, T - 1)`` bool, the labels that are not -100.
        aux_loss: always ``None`` (no tf_family model has a router).
    """

    loss: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    label_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def _installs_fused_lm_head(value) -> bool:
    """Whether ``value``, being set as ``forward``, is a forward taking ``fused_lm_head`` (TRL's patch)."""
    if not callable(value) or isinstance(value, torch.nn.Module):
        return False
    try:
        parameters = inspect.signature(value, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return False
    return "fused_lm_head" in parameters


class FusedLMHeadMixin:
    """Listed by every tf_family causal LM (before its ``PreTrainedModel``): a ``forward`` that takes
    ``fused_lm_head`` set on the model (``add_fused_lm_head`` in TRL) is not installed, because the model's own
    ``forward`` (wrapped by `answers_fused_lm_head`) answers that call with the model's real distribution. The
    temperature and the fields the patch was built with are kept for it."""

    def __setattr__(self, name, value):
        if name == "forward" and _installs_fused_lm_head(value):
            function = getattr(value, "__func__", value)
            settings = inspect.getclosurevars(function).nonlocals if hasattr(function, "__code__") else {}
            requested = tuple(settings.get("outputs") or FUSED_FIELDS)
            unknown = sorted(set(requested) - set(FUSED_FIELDS))
            if unknown:
                raise ValueError(
                    f"{type(self).__name__} cannot compute the fused LM head fields {unknown}; it computes "
                    f"{list(FUSED_FIELDS)}."
                )
            self.__dict__["_fused_lm_head_settings"] = {
                "temperature": float(settings.get("temperature", 1.0)),
                "outputs": requested,
            }
            logger.info_once(
                f"{type(self).__name__} answers `fused_lm_head=True` itself (its head is not one linear layer on the "
                "backbone's last hidden state, or it refuses padding-free batches); the patched forward is not "
                "installed."
            )
            return
        super().__setattr__(name, value)


def answers_fused_lm_head(forward):
    """Wrap a causal LM's ``forward`` so that ``forward(..., labels=labels, fused_lm_head=True)`` returns
    `FusedLMHeadOutput` computed from ``forward(...).logits`` (without labels), and so that padding-free batches are
    refused in both modes. ``shift_labels`` (already shifted, as passed under context parallelism) are scored without
    shifting."""

    @functools.wraps(forward)
    def wrapper(self, *args, fused_lm_head: bool = False, shift_labels=None, **kwargs):
        padding_free = [key for key in PADDING_FREE_KEYS if kwargs.get(key) is not None]
        if padding_free:
            raise ValueError(
                f"{type(self).__name__} got a padding-free batch ({', '.join(padding_free)}: several documents in one "
                "row, told apart only by position_ids), but its attention cannot keep packed documents apart. With "
                "TRL, pack with SFTConfig(packing=True, packing_strategy='wrapped') or do not pack (packing=False, "
                "padding_free=False)."
            )
        if not fused_lm_head:
            if shift_labels is not None:
                raise ValueError("shift_labels is only read with fused_lm_head=True; pass labels (shifted inside).")
            return forward(self, *args, **kwargs)
        labels = kwargs.pop("labels", None)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is None and shift_labels is None:
            raise ValueError("fused_lm_head=True needs labels (token ids, -100 where ignored) or shift_labels.")
        kwargs["use_cache"] = False
        kwargs["return_dict"] = True
        logits = forward(self, *args, **kwargs).logits  # (B, T, V)
        settings = self.__dict__.get("_fused_lm_head_settings", {"temperature": 1.0, "outputs": FUSED_FIELDS})
        return fused_lm_head_output(
            logits, labels, shift_labels, num_items_in_batch, settings["temperature"], settings["outputs"]
        )

    return wrapper


def fused_lm_head_output(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    shift_labels: torch.Tensor | None,
    num_items_in_batch,
    temperature: float = 1.0,
    outputs: tuple[str, ...] = FUSED_FIELDS,
) -> FusedLMHeadOutput:
    """TRL's per-token fields from next-token ``logits`` ``(B, T, V)`` (log-probabilities or raw scores): position
    ``t`` predicts ``labels[:, t + 1]`` (or ``shift_labels[:, t]``); -100 is ignored (every field 0 there)."""
    if shift_labels is None:
        if labels.shape != logits.shape[:2]:
            raise ValueError(f"labels must have shape {tuple(logits.shape[:2])}, got {tuple(labels.shape)}.")
        logits, targets = logits[:, :-1], labels[:, 1:]
    else:
        if shift_labels.shape != logits.shape[:2]:
            raise ValueError(
                f"shift_labels must have shape {tuple(logits.shape[:2])}, got {tuple(shift_labels.shape)}."
            )
        targets = shift_labels
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    mask = targets != IGNORE_INDEX  # (B, T')
    scaled = logits.float() / temperature  # (B, T', V)
    log_distribution = scaled.log_softmax(-1)  # (B, T', V)
    log_probs = log_distribution.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(~mask, 0.0)
    fields = {"log_probs": log_probs}
    if "entropy" in outputs:
        entropy = -(log_distribution.exp() * log_distribution).sum(-1)  # (B, T')
        fields["entropy"] = entropy.masked_fill(~mask, 0.0)
    if "is_top1" in outputs:
        fields["is_top1"] = (scaled.argmax(-1) == targets) & mask
    with torch.no_grad():
        if "log_sum_sq_probs" in outputs:
            fields["log_sum_sq_probs"] = torch.logsumexp(2 * log_distribution, -1).masked_fill(~mask, 0.0)
        if "mean_logits" in outputs:
            fields["mean_logits"] = scaled.mean(-1).masked_fill(~mask, 0.0)
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(count):
        count = count.to(log_probs.device)
    loss = -log_probs.sum() / count
    return FusedLMHeadOutput(loss=loss, label_mask=mask, **fields)


__all__ = ["FusedLMHeadMixin", "FusedLMHeadOutput", "answers_fused_lm_head", "fused_lm_head_output"]
