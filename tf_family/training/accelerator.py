"""The run's `Accelerator`: made once at the start (`make_accelerator`) and ended, on every process together, by
`ending_run`."""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path
from typing import Any

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, broadcast_object_list, set_seed

from .checkpointing import lock_output_dir, unlock_output_dir


def make_accelerator(args: argparse.Namespace, output_dir: Path) -> Accelerator:
    """The recipes' `Accelerator` (gradient accumulation, ``--cpu``, mixed precision, trackers under ``output_dir``),
    with logging set up per process and the seed set. Rejects ``--merge_lora`` under FSDP / DeepSpeed. Changes no
    process-wide setting: the recipes' command entry (`tf_family.utils.user_errors.run_main`) and the CLI set the
    allocator (`tf_family.allocator`)."""
    accelerator = Accelerator(
        # DDP's search for parameters without gradient is set per model by `configure_ddp`, before `prepare`
        kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)],
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        cpu=args.cpu,
        mixed_precision=args.mixed_precision,
        log_with=args.trackers or None,
        project_dir=str(output_dir),
    )
    if args.merge_lora and accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError(
            "--merge_lora cannot merge sharded (FSDP / DeepSpeed) weights; save the adapter (drop --merge_lora) and "
            "merge it afterwards with PeftModel.merge_and_unload() on one process."
        )
    claim_output_dir(accelerator, output_dir)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    if not accelerator.is_local_main_process:
        datasets.utils.logging.set_verbosity_error()
        transformers.utils.logging.set_verbosity_error()
    set_seed(args.seed)
    return accelerator


def claim_output_dir(accelerator: Accelerator, output_dir: Path) -> None:
    """The main process locks ``output_dir`` for this run (`lock_output_dir`); when another run holds it, every
    process raises the same `ValueError` naming that run, before anything is written."""
    problem = None
    if accelerator.is_main_process:
        try:
            lock_output_dir(output_dir)
        except ValueError as error:
            problem = str(error)
    if accelerator.num_processes > 1:
        problem = broadcast_object_list([problem])[0]
    if problem is not None:
        raise ValueError(problem)
    accelerator.output_dir_claimed = Path(output_dir)


# modules used only by some calls: Longformer's global-attention projections (no global tokens: unused), a pooler a
# task head does not read
_OPTIONAL_MODULES = {"global_query", "global_key", "global_value", "pooler"}


def may_leave_parameters_unused(model: torch.nn.Module) -> bool:
    """Whether a training step can leave a trainable parameter of ``model`` without a gradient. DDP must then search
    for such parameters every step (``find_unused_parameters=True``, else the collectives mismatch), and should not
    otherwise (the search costs a pass over the graph, and every rank warns when it finds nothing).

    A model class may say so itself (class attribute ``may_leave_parameters_unused``); otherwise: adaptive-input
    clusters absent from a batch (``config.cutoffs``), a compression network idle until the memory fills
    (``config.cmem_len``), auxiliary heads with loss weight 0 (``predict_state`` / ``predict_return``), and the
    modules of `_OPTIONAL_MODULES`. ``tests/recipes/test_ddp_unused.py`` checks every registry task against a real
    step."""
    base = getattr(model, "get_base_model", lambda: model)()  # a PEFT wrapper: its model decides
    declared = getattr(type(base), "may_leave_parameters_unused", None)
    if isinstance(declared, bool):
        return declared
    config = getattr(base, "config", None)
    if getattr(config, "cutoffs", None) or getattr(config, "cmem_len", 0):
        return True
    if getattr(config, "predict_state", False) or getattr(config, "predict_return", False):
        return True
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in base.named_modules()
        if next(module.parameters(False), None) is not None
    }
    return bool(names & _OPTIONAL_MODULES)


def configure_ddp(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Before `accelerator.prepare`: let DDP search for unused parameters only for a model that can leave some
    (`may_leave_parameters_unused`)."""
    accelerator.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=may_leave_parameters_unused(model))


def final_barrier(accelerator: Accelerator) -> Any:
    """`accelerator.wait_for_everyone()` that returns the barrier's work handle under gloo (else None): keep it until
    the process group is destroyed, then drop it.

    Why: a gloo barrier holds weak references to the collectives still in flight when it was issued (here the previous
    barrier and, through it, the ``all_gather`` of `gather_object`), so their work objects and tensors are freed only
    with the barrier's work object. If the Python handle goes first, a gloo worker thread frees them, and it needs the
    GIL for the tensors `gather_object` made in Python. ``~ProcessGroupGloo`` joins the worker threads while holding
    the GIL, so a rank that destroys its group right after the barrier (when it frees the DDP wrapper, whose reducer
    holds the last reference) can deadlock: the worker waits for the GIL, the main thread for the worker. With the
    handle held, the workers free nothing, and this thread frees the lot when it drops the handle.
    """
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not distributed or torch.distributed.get_backend() != "gloo":
        accelerator.wait_for_everyone()
        return None
    work = torch.distributed.barrier(async_op=True)
    work.wait()
    return work


@contextlib.contextmanager
def ending_run(accelerator: Accelerator):
    """The end of a run: the last barrier (`final_barrier`), then, after the block (where the caller lets go of the
    prepared model: ``model, optimizer, scheduler = accelerator.free_memory(model, optimizer, scheduler)``),
    `accelerator.end_training`, and only then the barrier's handle is dropped."""
    handle = final_barrier(accelerator)
    try:
        yield
    finally:
        accelerator.end_training()
        del handle
        claimed = getattr(accelerator, "output_dir_claimed", None)
        if claimed is not None and accelerator.is_main_process:
            unlock_output_dir(claimed)  # the run is over: another may use the folder
