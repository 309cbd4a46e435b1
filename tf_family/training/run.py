"""One training run, as the recipes' named steps pass it along: start (output folder, `Accelerator`) → build the model
and data (the recipe's own) → `prepare` (optimizer, schedule, ``accelerator.prepare``, hyperparameters, trackers)
→ the training loop (`Run.start_training`, `Run.optimizer_step` on each micro-batch) → evaluate (`Run.log_metrics`)
→ save and end (`Run.finish`).

A recipe keeps its data, model and loop in view; what every recipe did the same way lives here, and the prepared
pieces travel in one `Run` instead of long argument lists.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from tqdm.auto import tqdm

from .accelerator import configure_ddp, ending_run, make_accelerator
from .checkpointing import check_output_dir
from .loop import TrainingLog, make_optimizer
from .saving import run_hyperparameters, save_run

logger = get_logger(__name__)


@dataclass
class Run:
    """A run's accelerator, arguments and output folder, and once `prepare` has run, the prepared model, optimizer
    and schedule, the number of optimizer steps and the hyperparameters recorded; the loop keeps
    ``completed_steps`` here, and `start_training` the number of parameters."""

    accelerator: Accelerator
    args: argparse.Namespace
    output_dir: Path
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    max_train_steps: int = 0
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    completed_steps: int = 0
    num_parameters: int = 0

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    def start_training(self, rate_name: str, described: str) -> tuple[tqdm, TrainingLog]:
        """Log the model's size with ``described`` (the data and steps) and open the progress bar and the log of
        training steps (its speed in ``rate_name``, e.g. ``tokens_per_second``); the model goes into training mode."""
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        logger.info(f"{self.num_parameters:,} parameters, {described}", main_process_only=True)
        progress = tqdm(
            total=self.max_train_steps,
            initial=self.completed_steps,
            disable=not self.accelerator.is_local_main_process,
            desc="training",
        )
        self.model.train()
        return progress, TrainingLog(self.accelerator, rate_name)

    def optimizer_step(self, loss: torch.Tensor) -> None:
        """Inside ``accelerator.accumulate(model)``: backward, clipping (``--max_grad_norm``, on the micro-batch that
        syncs the gradients), then the optimizer and schedule steps (which accelerate skips until the gradients
        sync)."""
        self.accelerator.backward(loss)
        if self.accelerator.sync_gradients and self.args.max_grad_norm > 0:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()

    def log_metrics(self, metrics: dict[str, Any], label: str = "validation") -> None:
        """Send evaluation ``metrics`` to the trackers (as ``eval/<name>``, at the steps done) and the log."""
        self.accelerator.log({f"eval/{k}": v for k, v in metrics.items()}, step=self.completed_steps)
        logger.info(f"{label}: {metrics}", main_process_only=True)

    def finish(self, tokenizer, **record: Any) -> dict[str, Any]:
        """`save_run` (weights, tokenizer, run record, card) with what the run knows (its hyperparameters, the
        number of parameters and of steps done) and ``record`` (recipe, task, dataset, metrics, history…), then
        `end`; returns `save_run`'s summary."""
        summary = save_run(
            self.accelerator, self.args, self.model, self.output_dir, tokenizer, hyperparameters=self.hyperparameters,
            num_parameters=self.num_parameters, train_steps=self.completed_steps, **record,
        )  # fmt: skip
        self.end()
        return summary

    def end(self) -> None:
        """The end of the run on every process: the last barrier held while the prepared model, optimizer and
        schedule are let go of (DDP's wrapper holds the process group; see `ending_run`). The recipe must keep no
        other reference to the prepared model."""
        with ending_run(self.accelerator):
            self.model, self.optimizer, self.scheduler = self.accelerator.free_memory(
                self.model, self.optimizer, self.scheduler
            )


def start_run(args: argparse.Namespace, default_output_dir: Callable[[], str]) -> Run:
    """The output folder (``--output_dir``, else ``default_output_dir()``), checked and claimed, and the run's
    `Accelerator`."""
    args.output_dir = args.output_dir or default_output_dir()
    output_dir = check_output_dir(args)
    return Run(make_accelerator(args, output_dir), args, output_dir)


def prepare(run: Run, model: torch.nn.Module, max_train_steps: int, tracker: str, **hyperparameters: Any) -> None:
    """AdamW and its schedule for ``max_train_steps``, DDP's unused-parameter search where the model can leave some,
    ``accelerator.prepare``; the run's hyperparameters (`run_hyperparameters` with ``hyperparameters``) go to the
    trackers (``--report_to``) under the project name ``tracker``."""
    optimizer, scheduler = make_optimizer(model, run.args, max_train_steps, run.world)
    configure_ddp(run.accelerator, model)  # DDP searches for unused parameters only where a model can leave some
    run.model, run.optimizer, run.scheduler = run.accelerator.prepare(model, optimizer, scheduler)
    run.max_train_steps = max_train_steps
    run.hyperparameters = run_hyperparameters(run.args, run.world, max_train_steps, **hyperparameters)
    if run.args.trackers:
        run.accelerator.init_trackers(tracker, config=run.hyperparameters)


__all__ = ["Run", "prepare", "start_run"]
