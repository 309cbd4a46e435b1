"""What the fuzzing suite feeds each task class of the zoo, and how it judges an accepted call.

`valid_inputs` builds sound keyword arguments for a model's ``forward`` (any architecture, any task, any config the
model accepted); the fuzz tests then break one of them. `check_outputs` is the soundness check of an accepted call:
every floating-point tensor of the output finite, and the task's main output shaped for the batch (and length).
"""

from __future__ import annotations

import math

import torch
from transformers.utils import ModelOutput

from tf_family.registry import ARCHITECTURES

# every (architecture, task) of the zoo, "base" included: the fuzz tests are parametrised over this list
TASK_CLASSES = [(arch, task) for arch, spec in ARCHITECTURES.items() for task in spec.model_classes]
GENERATING = [
    (arch, task) for arch, task in TASK_CLASSES if hasattr(ARCHITECTURES[arch].model_classes[task], "generate")
]
NUM_CHOICES = 2


def _vocab(config) -> int:
    return config.vocab_size


def valid_inputs(arch: str, task: str, config, batch: int = 2, length: int = 12, labels: bool = True) -> dict:
    """Sound keyword arguments for ``forward`` of the (``arch``, ``task``) model built from ``config``."""
    generator = torch.Generator().manual_seed(batch * 1000 + length)
    if task == "action":  # trajectories: (return-to-go, state, action) steps
        steps = min(length, config.context_length)
        inputs = {
            "states": torch.randn(batch, steps, config.state_dim, generator=generator),
            "returns_to_go": torch.randn(batch, steps, 1, generator=generator),
            "timesteps": torch.arange(steps).expand(batch, steps) % config.max_ep_len,
            "attention_mask": torch.ones(batch, steps, dtype=torch.long),
        }
        if config.discrete:
            inputs["actions"] = torch.randint(0, config.act_dim, (batch, steps), generator=generator)
        else:
            inputs["actions"] = torch.rand(batch, steps, config.act_dim, generator=generator) * 2 - 1
        if labels:
            inputs["labels"] = inputs["actions"].clone()
        return inputs
    # ids above the special tokens, so Longformer's RoBERTa positions (which skip pad) stay short
    ids = torch.randint(min(4, _vocab(config) - 1), _vocab(config), (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    if task == "multiple_choice":
        ids = ids[:, None].expand(batch, NUM_CHOICES, length).contiguous()
        mask = mask[:, None].expand(batch, NUM_CHOICES, length).contiguous()
    inputs = {"input_ids": ids, "attention_mask": mask}
    if not labels:
        return inputs
    if task in ("causal_lm", "masked_lm"):
        inputs["labels"] = ids.clone()
    elif task == "sequence_classification":
        inputs["labels"] = torch.randint(0, config.num_labels, (batch,), generator=generator)
    elif task == "token_classification":
        inputs["labels"] = torch.randint(0, config.num_labels, (batch, length), generator=generator)
    elif task == "multiple_choice":
        inputs["labels"] = torch.randint(0, NUM_CHOICES, (batch,), generator=generator)
    elif task == "question_answering":
        inputs["start_positions"] = torch.randint(0, length, (batch,), generator=generator)
        inputs["end_positions"] = torch.randint(0, length, (batch,), generator=generator)
    return inputs


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _main_output(task: str, output):
    for name in ("action_preds", "logits", "start_logits", "last_hidden_state"):
        value = output.get(name) if isinstance(output, ModelOutput) else None
        if value is not None:
            return name, value
    return None, None


def check_outputs(task: str, output, batch: int, length: int | None, loss_may_be_nan: bool = False) -> bool:
    """An accepted forward is sound: its floating-point tensors are finite (the loss may be NaN only when the caller
    ignored every label, ``loss_may_be_nan``: PyTorch's mean over nothing) and the task's main output has ``batch``
    rows (and ``length`` positions)."""
    if not isinstance(output, ModelOutput):
        return False
    for name, value in output.items():
        if name == "loss":
            continue
        for tensor in _tensors(value):
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                # log-probabilities of an adaptive softmax may be -inf for impossible tokens, never NaN / +inf
                if name == "logits" and not bool(torch.isnan(tensor).any() or torch.isposinf(tensor).any()):
                    continue
                return False
    loss = output.get("loss")
    if loss is not None and not math.isfinite(float(loss)) and not (loss_may_be_nan and math.isnan(float(loss))):
        return False
    name, main = _main_output(task, output)
    if main is None:
        return output.get("loss") is not None  # adaptive softmax with labels: only the losses
    if main.shape[0] != batch:
        return False
    if length is not None and task not in ("sequence_classification", "multiple_choice") and main.dim() >= 2:
        return main.shape[1] == length
    return True


__all__ = ["GENERATING", "NUM_CHOICES", "TASK_CLASSES", "check_outputs", "valid_inputs"]
