"""TRL's fused LM head, answered by the tf_family causal LMs themselves.

TRL's trainers (`SFTTrainer`, `DPOTrainer`, `GRPOTrainer` …, trl >= 1.x) never read a model's logits: they call
``trl.trainer.utils.add_fused_lm_head(model)``, which replaces ``model.forward`` by one that, when called with
``fused_lm_head=True``, runs ``model.base_model`` and multiplies its ``last_hidden_state`` by
``model.get_output_embeddings().weight``. That is only the model's distribution when the head is one linear layer on
the backbone's last hidden state. Among the tf_family causal LMs it is not: the Transformer-XL family's adaptive
softmax is no single matrix (``get_output_embeddings()`` is ``None``), Longformer's head is RoBERTa's
(dense, GELU, LayerNorm, decoder), the kNN-LM interpolates with its datastore.

So every tf_family causal LM answers the same call itself. TRL's patch is installed as TRL installs it; the class
lists `FusedLMHeadMixin`, whose ``post_init`` registers a forward pre-hook (PyTorch's public
``register_forward_pre_hook(with_kwargs=True)``) that turns a ``fused_lm_head=True`` call into a plain one carrying
the patch's temperature and requested fields (``fused_lm_head_settings``); TRL's patch passes a plain call, labels
included, to the model's own ``forward``, which is wrapped by `answers_fused_lm_head`, which computes `FusedLMHeadOutput` (the fields of TRL's ``FusedCausalLMOutput``) from the
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


def _is_own_forward(function) -> bool:
    """Whether ``function`` is a forward wrapped by `answers_fused_lm_head` (told by its code, since
    ``functools.wraps`` copies names and ``__dict__`` onto the patches that wrap it)."""
    code = getattr(function, "__code__", None)
    return (
        code is not None
        and code.co_filename == __file__
        and code.co_qualname == "answers_fused_lm_head.<locals>.wrapper"
    )


def _installed_patch_settings(forward) -> dict | None:
    """The temperature and requested fields of the ``fused_lm_head`` patch (TRL's ``_fused_forward``) installed as
    ``forward``, looked for through ``__wrapped__`` (accelerate's mixed-precision wrappers sit on top of it); ``None``
    when the first function taking ``fused_lm_head`` is the model's own (`answers_fused_lm_head`). TRL keeps what
    ``add_fused_lm_head(model, temperature=, outputs=)`` was called with nowhere but in that function's closure, so
    they are read there."""
    for _ in range(16):
        function = getattr(forward, "__func__", forward)
        if _is_own_forward(function):
            return None
        try:
            takes_fused = "fused_lm_head" in inspect.signature(function, follow_wrapped=False).parameters
        except (TypeError, ValueError):
            takes_fused = False
        if takes_fused:
            break
        forward = getattr(function, "__wrapped__", None)
        if forward is None:
            return None
    else:
        return None
    settings = inspect.getclosurevars(function).nonlocals if hasattr(function, "__code__") else {}
    if "temperature" not in settings:
        raise ValueError(
            "model.forward was replaced by a forward taking fused_lm_head whose temperature cannot be read (TRL's "
            "add_fused_lm_head keeps it in the closure of its `_fused_forward`; this TRL may have renamed it). Call "
            "the model without that patch: the tf_family causal LMs answer fused_lm_head=True themselves."
        )
    requested = tuple(settings.get("outputs") or FUSED_FIELDS)
    unknown = sorted(set(requested) - set(FUSED_FIELDS))
    if unknown:
        raise ValueError(
            f"The fused LM head fields {unknown} cannot be computed; the fields are {list(FUSED_FIELDS)}."
        )
    return {"temperature": float(settings["temperature"]), "outputs": requested}


def _hand_fused_call_to_own_forward(module, args, kwargs):
    """Forward pre-hook (``register_forward_pre_hook(with_kwargs=True)``) of every tf_family causal LM: when TRL's
    patch is installed on the instance (``model.forward`` set by ``add_fused_lm_head``) and the call asks for
    ``fused_lm_head=True``, turn it into a plain call carrying ``fused_lm_head_settings``: TRL's patch then passes it,
    with the labels, to the model's own ``forward`` (its ``original_forward``), which answers it. Other calls are
    left alone (``None``)."""
    patch = module.__dict__.get("forward")
    if patch is None or not kwargs.get("fused_lm_head"):
        return None
    settings = _installed_patch_settings(patch)
    if settings is None:  # no foreign patch: the model's own forward gets the call as it is
        return None
    logger.info_once(
        f"{type(module).__name__} answers `fused_lm_head=True` itself (its head is not one linear layer on the "
        "backbone's last hidden state, or it refuses padding-free batches); the installed patch passes the call on."
    )
    return args, {**kwargs, "fused_lm_head": False, "fused_lm_head_settings": settings}


class FusedLMHeadMixin:
    """Listed by every tf_family causal LM (before its ``PreTrainedModel``): its ``post_init`` (transformers' hook run
    at the end of every model's ``__init__``) registers `_hand_fused_call_to_own_forward` as a forward pre-hook, so a
    ``fused_lm_head=True`` call reaches the model's own ``forward`` (wrapped by `answers_fused_lm_head`) even after
    TRL's ``add_fused_lm_head`` replaced ``model.forward``; the temperature and fields TRL's patch was built with are
    kept."""

    def post_init(self):
        super().post_init()
        self.register_forward_pre_hook(_hand_fused_call_to_own_forward, with_kwargs=True)


def answers_fused_lm_head(forward):
    """Wrap a causal LM's ``forward`` so that ``forward(..., labels=labels, fused_lm_head=True)`` returns
    `FusedLMHeadOutput` computed from ``forward(...).logits`` (without labels), and so that padding-free batches are
    refused in both modes. ``fused_lm_head_settings`` (``{"temperature": float, "outputs": tuple}``, set by the
    pre-hook when TRL's patch is installed) asks for the same with that temperature and those fields. ``shift_labels`` (already shifted, as passed under context parallelism) are scored without
    shifting."""

    @functools.wraps(forward)
    def wrapper(self, *args, fused_lm_head: bool = False, shift_labels=None, fused_lm_head_settings=None, **kwargs):
        padding_free = [key for key in PADDING_FREE_KEYS if kwargs.get(key) is not None]
        if padding_free:
            raise ValueError(
                f"{type(self).__name__} got a padding-free batch ({', '.join(padding_free)}: several documents in one "
                "row, told apart only by position_ids), but its attention cannot keep packed documents apart. With "
                "TRL, pack with SFTConfig(packing=True, packing_strategy='wrapped') or do not pack (packing=False, "
                "padding_free=False)."
            )
        if fused_lm_head_settings is not None:  # handed on by TRL's patch (see `_hand_fused_call_to_own_forward`)
            fused_lm_head = True
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
        settings = fused_lm_head_settings or {"temperature": 1.0, "outputs": FUSED_FIELDS}
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
