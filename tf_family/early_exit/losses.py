"""The training losses of a model that exits early (CALM's anytime loss, its meta classifier's loss, the
Depth-Adaptive halting classifier's loss), written over the exits' hidden states. Functions: the model passes its
final norm, LM head and classifiers as callables, so the same loss serves any decoder with exits.

CALM's training loss: the anytime loss — the exits' cross entropies weighted by `anytime_loss_weights` (``aggregation``) — plus
the meta classifier's class-balanced loss (label: the exit's argmax equals the last layer's) on detached states,
weighted by ``meta_loss_weight``, and (opt-in, ``distillation_weight``) the intermediate exits' mean
self-distillation ``KL(p_final || p_exit)`` with the last layer's distribution detached. Under `Trainer`'s gradient
accumulation (``num_items_in_batch``) each exit's cross entropy is a sum over the counted tokens divided by their
count over the accumulated batch (exact: one large batch's anytime loss); the meta loss, class-balanced within a
call, enters weighted by the call's share of the counted tokens (`tf_family.modeling.losses.batch_share`): accumulated, the
token-weighted average of the micro-batches' meta losses. It trains the meta classifier only (its inputs are
detached), so the rest of the model gets exactly the large-batch update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from ..modeling.losses import NumItems, cross_entropy, item_mean
from .confidence import anytime_loss_weights, class_balanced_meta_loss, distillation_kl
from .depth_adaptive import geometric_halting_loss, multinomial_halting_loss, oracle_exits

Module = Callable[[torch.Tensor], torch.Tensor]


class ExitLosses(NamedTuple):
    anytime: torch.Tensor  # the weighted exits' cross entropies (plus the self-distillation term)
    lm_loss: torch.Tensor  # the last layer's cross entropy
    meta_loss: torch.Tensor  # the meta classifier's loss (a mean over the call)
    halting_loss: torch.Tensor | None  # the halting classifier's loss, when the model has one


def exit_losses(
    all_hidden: tuple[torch.Tensor, ...],
    final_logits: torch.Tensor,
    targets: torch.Tensor,
    points: list[int],
    *,
    norm: Module,
    lm_head: Module,
    meta_classifier: Module,
    aggregation: str | int,
    distillation_weight: float,
    halting_classifier: torch.nn.Linear | None = None,
    halting_measure: str = "halting",
    halting_oracle: str = "likelihood",
    halting_depth_penalty: float = 0.0,
    num_items_in_batch: NumItems = None,
) -> ExitLosses:
    """The anytime loss over the exits ``points`` (layer counts; ``all_hidden[point]`` is an exit's state, the
    last point's logits are ``final_logits``), plus ``distillation_weight`` times the intermediate exits' mean
    self-distillation KL when set; the last layer's cross entropy (sums over ``num_items_in_batch`` when given);
    the meta classifier's loss, on detached states; and, with a ``halting_classifier``, its loss against the
    oracle exits (`halting_classifier_loss`). ``targets`` ``(B, T)``: position t's next token, -100 where not
    counted.

    Fourteen parameters: the exits' states, logits, targets and points, then by keyword the model's own modules
    and loss settings (a per-call record would only rename the model's attributes)."""
    weights = anytime_loss_weights(len(points), aggregation).tolist()
    valid = targets != -100
    flat_targets = targets.reshape(-1)
    final_prediction = final_logits.detach().argmax(-1)  # (B, T)
    anytime = final_logits.new_zeros((), dtype=torch.float32)
    meta_losses, distillations = [], []
    distill = distillation_weight > 0
    halting = halting_classifier is not None
    exit_states, target_log_probs, correct = [], [], []  # per exit, for the Depth-Adaptive oracle
    lm_loss = None
    for weight, point in zip(weights, points, strict=True):
        if point == points[-1]:
            logits = final_logits
        else:
            normed = norm(all_hidden[point])  # (B, T, D)
            logits = lm_head(normed)
            exit_states.append(normed.detach())
            agrees = logits.detach().argmax(-1) == final_prediction  # (B, T)
            meta_logits = meta_classifier(normed.detach())
            meta_losses.append(
                class_balanced_meta_loss(meta_logits.reshape(-1, 2), agrees.reshape(-1), valid.reshape(-1))
            )
            if distill:  # a token mean over the counted positions, as the cross entropies
                distillations.append(item_mean(distillation_kl(logits, final_logits), valid, num_items_in_batch))
        if halting:
            safe = targets.clamp(min=0)[..., None]
            target_log_probs.append(torch.log_softmax(logits.detach().float(), -1).gather(-1, safe)[..., 0])
            correct.append(logits.detach().argmax(-1) == targets)
        exit_loss = cross_entropy(logits.reshape(-1, logits.shape[-1]), flat_targets, num_items_in_batch)
        if not bool(valid.any()):
            exit_loss = logits.sum() * 0.0
        anytime = anytime + weight * exit_loss
        lm_loss = exit_loss
    if distillations:
        anytime = anytime + distillation_weight * torch.stack(distillations).mean()
    if meta_losses:
        meta_loss = torch.stack(meta_losses).mean()
    else:  # one exit only: nothing to classify, but the classifier stays in the graph
        meta_loss = meta_classifier(all_hidden[-1].detach()).sum() * 0.0
    halting_loss = None
    if halting:  # the Depth-Adaptive halting classifier, beside the meta classifier
        if len(points) == 1:  # one exit: nothing to decide, but the classifier stays in the graph
            halting_loss = halting_classifier(all_hidden[-1].detach()).sum() * 0.0
        else:
            oracle = oracle_exits(
                torch.stack(target_log_probs), torch.stack(correct), points, halting_oracle, halting_depth_penalty
            )  # (B, T) exit indices
            halting_loss = halting_classifier_loss(halting_classifier, halting_measure, exit_states, oracle, valid)
    return ExitLosses(anytime, lm_loss, meta_loss, halting_loss)


def halting_classifier_loss(
    classifier: Module, measure: str, exit_states: list[torch.Tensor], oracle: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """``-log q(n*)`` of the halting classifier against the oracle exits ``(B, T)``, a mean over the counted
    tokens, on the detached normed states of the exits before the last (the classifier never changes the language
    model): ``"multinomial"`` reads the first exit's state only, ``"halting"`` (geometric-like) each exit's own
    logit."""
    if measure == "multinomial":
        return multinomial_halting_loss(classifier(exit_states[0]), oracle, valid)
    per_exit = [classifier(state)[..., index] for index, state in enumerate(exit_states)]
    return geometric_halting_loss(torch.stack(per_exit, dim=-1), oracle, valid)  # (B, T, P - 1) logits
