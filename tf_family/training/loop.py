"""What every training loop uses: AdamW with its learning-rate schedule, and the window of steps between two log
lines (`TrainingLog`)."""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from transformers import get_scheduler


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace, max_train_steps: int, world: int):
    """AdamW with the usual no-decay groups (biases, incl. Transformer-XL's u/v position biases, and normalisation
    weights) and the ``--lr_scheduler_type`` schedule, laid out in process-steps: a prepared scheduler advances once
    per process at every optimizer step (accelerate's convention)."""
    decay, skip = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (skip if param.ndim < 2 or name.endswith("bias") else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": skip, "weight_decay": 0.0}],
        lr=args.learning_rate,
    )
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.num_warmup_steps * world,
        num_training_steps=max_train_steps * world,
    )
    return optimizer, scheduler


class TrainingLog:
    """Sums, over the micro-batches since the last log line, the loss, what it is averaged over and what the speed is
    counted in (``rate_name``, e.g. ``tokens_per_second``); `write` reduces them over the processes, appends the
    record to ``history``, sends it to the trackers and starts a new window."""

    def __init__(self, accelerator: Accelerator, rate_name: str):
        self.accelerator = accelerator
        self.rate_name = rate_name
        self.history: list[dict[str, float]] = []
        self._reset()

    def _reset(self) -> None:
        self.loss, self.count, self.items, self.start = 0.0, 0, 0, time.perf_counter()

    def add(self, loss: float, count: int, items: int) -> None:
        """One micro-batch: its summed ``loss`` over ``count`` (tokens, or 1 for a mean loss) and its ``items``."""
        self.loss += loss
        self.count += count
        self.items += items

    def write(self, step: int, learning_rate: float) -> dict[str, float]:
        totals = self.accelerator.reduce(
            torch.tensor([self.loss, self.count, self.items], dtype=torch.float64, device=self.accelerator.device),
            reduction="sum",
        ).tolist()
        record = {
            "train_loss": totals[0] / max(totals[1], 1),
            self.rate_name: totals[2] / (time.perf_counter() - self.start),
            "learning_rate": learning_rate,
            "step": step,
        }
        self.history.append(record)
        self.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=step)
        self._reset()
        return record
