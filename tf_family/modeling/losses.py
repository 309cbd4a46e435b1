"""Loss helpers shared by the models and task heads. They read the config but never write to it (transformers'
``ForSequenceClassificationLoss`` stores the inferred ``problem_type`` on the config during the forward pass).

Gradient accumulation (``num_items_in_batch``). transformers' `Trainer` calls ``forward(**inputs,
num_items_in_batch=N)`` on a model whose ``forward`` takes ``**kwargs`` (unless the class sets
``accepts_loss_kwargs = False``), where ``N`` counts the labels that are not ``-100`` in every micro-batch of the
optimizer step (``labels[..., 1:]`` for a causal LM, i.e. a model whose ``loss_type`` is ``"ForCausalLM"``), summed
over the processes when ``average_tokens_across_devices``; it then does not divide the loss by the number of
accumulation steps, and with several processes multiplies it by their number (DDP averages the gradients). So a
loss that is a sum over counted items divided by ``N`` gives, summed over the micro-batches and averaged over the
processes, exactly the mean over the whole optimizer batch: what one big batch gives. Without ``N`` every helper
returns the usual mean over its own batch (bit for bit what it returned before).

- Token and item losses (causal / masked LM, token classification, sequence classification, multiple choice, span
  starts and ends): `item_mean` — the sum over counted items, over ``N``. (The task heads' losses, which check their
  targets first, are in `tf_family.modeling.heads`: this module imports nothing of tf_family, so that
  `tf_family.modeling.validation` can read `IGNORE_INDEX` from it.)
- A loss that is not a sum over the items `Trainer` counts (an auxiliary loss on memories, a class-balanced loss):
  `batch_share` weighs the micro-batch's own mean by its share ``n / N`` of the counted items; accumulated, that is
  the item-weighted average of the micro-batches' means (the one-batch value when the micro-batches are alike).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The label no loss counts (transformers' convention): defined here, once; everything else imports it from here.
IGNORE_INDEX = -100

NumItems = int | float | torch.Tensor | None


def check_num_items(num_items_in_batch: NumItems) -> None:
    """A `TypeError` / `ValueError` naming ``num_items_in_batch`` when it is not a positive count (a tensor is only
    checked for its kind: reading its value would wait for the device)."""
    if num_items_in_batch is None or isinstance(num_items_in_batch, torch.Tensor):
        if isinstance(num_items_in_batch, torch.Tensor) and num_items_in_batch.is_complex():
            raise TypeError("num_items_in_batch must be a real count, got a complex tensor.")
        return
    if isinstance(num_items_in_batch, bool) or not isinstance(num_items_in_batch, int | float):
        raise TypeError(
            f"num_items_in_batch must be a number or a tensor (the count of labelled items over the accumulated "
            f"batch), got {type(num_items_in_batch).__name__}."
        )
    if num_items_in_batch <= 0:
        raise ValueError(
            f"num_items_in_batch must be positive (the count of labelled items over the accumulated batch), got "
            f"{num_items_in_batch}."
        )


def divide_by_num_items(total: torch.Tensor, num_items_in_batch: int | float | torch.Tensor) -> torch.Tensor:
    """``total`` (a sum over counted items) over ``num_items_in_batch``, checked (`check_num_items`)."""
    check_num_items(num_items_in_batch)
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def item_mean(losses: torch.Tensor, counted: torch.Tensor, num_items_in_batch: NumItems = None) -> torch.Tensor:
    """``losses`` (any shape) summed where ``counted`` (same shape, bool) over ``num_items_in_batch``, or over the
    number of counted entries (at least 1) without it."""
    total = (losses * counted).sum()
    if num_items_in_batch is None:
        return total / counted.sum().clamp(min=1)
    return divide_by_num_items(total, num_items_in_batch)


def _token_mean(loss_fn, scores, targets, num_items_in_batch: NumItems, ignore_index: int) -> torch.Tensor:
    targets = targets.to(scores.device)
    if num_items_in_batch is None:
        return loss_fn(scores, targets, ignore_index=ignore_index)
    return divide_by_num_items(
        loss_fn(scores, targets, ignore_index=ignore_index, reduction="sum"), num_items_in_batch
    )


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    num_items_in_batch: NumItems = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Cross entropy of ``logits`` ``(N, C)`` (computed in float32) against ``targets`` ``(N,)``, ``ignore_index``
    skipped: the mean over the other targets, or their sum over ``num_items_in_batch`` when given."""
    return _token_mean(F.cross_entropy, logits.float(), targets, num_items_in_batch, ignore_index)


def nll(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    num_items_in_batch: NumItems = None,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """`cross_entropy` for log-probabilities ``(N, C)`` that are already normalised (kNN-LM's interpolation)."""
    return _token_mean(F.nll_loss, log_probs, targets, num_items_in_batch, ignore_index)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems = None) -> torch.Tensor:
    """Next-token cross entropy: ``logits[:, t]`` (``(B, T, V)``) predicts ``labels[:, t + 1]`` (``(B, T)``, -100
    ignored); `Trainer` counts ``labels[:, 1:]`` for ``num_items_in_batch`` (a model whose ``loss_type`` is
    ``"ForCausalLM"``)."""
    return cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), num_items_in_batch)


def batch_share(loss: torch.Tensor, count: torch.Tensor | int, num_items_in_batch: NumItems = None) -> torch.Tensor:
    """``loss`` (a mean over this micro-batch that is not a sum over counted items) weighted by the micro-batch's
    share ``count / num_items_in_batch`` of the counted items; ``loss`` itself without ``num_items_in_batch``."""
    if num_items_in_batch is None:
        return loss
    if isinstance(count, torch.Tensor):
        count = count.to(loss.device, loss.dtype)
    return divide_by_num_items(loss * count, num_items_in_batch)


__all__ = [
    "IGNORE_INDEX",
    "batch_share",
    "causal_lm_loss",
    "check_num_items",
    "cross_entropy",
    "divide_by_num_items",
    "item_mean",
    "nll",
]
