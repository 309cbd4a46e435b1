"""Loss helpers shared by the task heads. They read the config but never write to it (transformers'
``ForSequenceClassificationLoss`` stores the inferred ``problem_type`` on the config during the forward pass)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .validation import check_sequence_labels, check_span_positions


def sequence_classification_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_labels: int, problem_type: str | None
) -> torch.Tensor:
    """Regression (MSE), single-label (cross-entropy) or multi-label (BCE) loss, inferred like transformers does
    when ``problem_type`` is ``None``: one label -> regression, integer labels -> single-label, else multi-label.
    Labels outside the classes are refused (`tf_family.validation.check_sequence_labels`)."""
    check_sequence_labels(labels, logits.shape[0], num_labels, problem_type)
    labels = labels.to(logits.device)
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        return (
            F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype)) if num_labels == 1 else F.mse_loss(logits, labels)
        )
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels).float(), labels.view(-1))
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.to(torch.float32))
    raise ValueError(
        f"problem_type must be 'regression', 'single_label_classification' or 'multi_label_classification', got "
        f"{problem_type!r}."
    )


def span_loss(
    start_logits: torch.Tensor, end_logits: torch.Tensor, start_positions: torch.Tensor, end_positions: torch.Tensor
) -> torch.Tensor:
    """Extractive question answering: mean of the start and end cross-entropies; positions outside the input
    (clamped to its length) are ignored; negative ones are refused."""
    check_span_positions(start_positions, end_positions, start_logits.shape[0])
    length = start_logits.shape[1]
    start = start_positions.reshape(-1).clamp(0, length).to(start_logits.device)
    end = end_positions.reshape(-1).clamp(0, length).to(end_logits.device)
    start_loss = F.cross_entropy(start_logits.float(), start, ignore_index=length)
    end_loss = F.cross_entropy(end_logits.float(), end, ignore_index=length)
    return (start_loss + end_loss) / 2


__all__ = ["sequence_classification_loss", "span_loss"]
