"""The output folder's guard and the run's checkpoints: written atomically (beside, then renamed), found again by
step, and resumed with the state a model carries between steps.

A checkpoint ``<output_dir>/checkpoints/step_N`` holds the accelerate state (weights, optimizer, scheduler, RNG),
``trainer_state.json`` (the step reached, the world size and whatever the recipe needs to continue, e.g. the epoch and
the update within it) and, for a model that carries state between steps (a class attribute ``carried_state``:
``"segment_memory"`` for Transformer-XL, ``"compressive_memory"`` for the Compressive Transformer, ``"knn_memory"``
for the Memorizing Transformer), each process's
carried state as ``memory_rank<i>.safetensors``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.logging import get_logger
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .. import memory as memory_lib
from ..cards import RUN_INFO_FILE

logger = get_logger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^step_(\d+)$")
TRAINER_STATE_FILE = "trainer_state.json"


def check_output_dir(args: argparse.Namespace) -> Path:
    """``--output_dir`` as a path; a folder holding an earlier run is refused unless the run resumes or overwrites
    it (nothing the user saved is replaced by accident)."""
    output_dir = Path(args.output_dir)
    earlier_run = (output_dir / "checkpoints").is_dir() or (output_dir / RUN_INFO_FILE).is_file()
    if earlier_run and not (args.resume_from_checkpoint or args.overwrite_output_dir):
        raise ValueError(
            f"--output_dir {output_dir} holds an earlier run; pass --resume_from_checkpoint latest to continue it, "
            "--overwrite_output_dir to replace it, or another --output_dir."
        )
    return output_dir


def find_checkpoint(output_dir: str, which: str) -> Path:
    """The checkpoint folder ``which`` names: a folder, or ``"latest"`` (the highest step in ``output_dir``)."""
    if which != "latest":
        path = Path(which)
        if not path.is_dir():
            raise ValueError(f"--resume_from_checkpoint {which!r} is not a folder; pass a checkpoint or 'latest'.")
        return path
    root = Path(output_dir) / "checkpoints"
    steps = sorted(
        (int(m.group(1)), p) for p in root.glob("step_*") if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_dir()
    )
    if not steps:
        raise ValueError(
            f"--resume_from_checkpoint latest: no checkpoint in {root}; train with --checkpointing_steps."
        )
    return steps[-1][1]


def load_data_state(checkpoint: Path, accelerator: Accelerator) -> dict | None:
    """How far this process had read its data stream when ``checkpoint`` was written (`save_checkpoint`'s
    ``data_state``), or None when the run did not stream."""
    path = checkpoint / f"data_rank{accelerator.process_index}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def save_checkpoint(
    accelerator: Accelerator,
    output_dir: str,
    state: dict,
    carried: Any,
    limit: int | None,
    data_state: dict | None = None,
) -> Path:
    """Write ``checkpoints/step_N`` atomically: everything goes to ``step_N.partial`` first and is renamed once every
    process has written its part, so an interrupted save never replaces the last good checkpoint. ``carried`` is
    this process's carried state (an object with ``state_dict()``, e.g. a `SegmentMemory`), or None / False;
    ``data_state`` how far this process read its data stream (`StreamingBlocks.state_dict`, JSON), or None."""
    root = Path(output_dir) / "checkpoints"
    final = root / f"step_{state['completed_steps']}"
    partial = root / f"step_{state['completed_steps']}.partial"
    if accelerator.is_main_process and partial.exists():
        shutil.rmtree(partial)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    if data_state is not None:
        (partial / f"data_rank{accelerator.process_index}.json").write_text(json.dumps(data_state))
    if carried not in (None, False):
        tensors = {k: v.detach().cpu().contiguous() for k, v in carried.state_dict().items()}
        save_file(
            tensors,
            str(partial / f"memory_rank{accelerator.process_index}.safetensors"),
            metadata={"class": type(carried).__name__},
        )
    if accelerator.is_main_process:
        (partial / TRAINER_STATE_FILE).write_text(json.dumps({**state, "world_size": accelerator.num_processes}))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        if limit is not None:
            kept = sorted(
                (int(CHECKPOINT_PATTERN.match(p.name).group(1)), p)
                for p in root.glob("step_*")
                if CHECKPOINT_PATTERN.match(p.name)
            )
            for _, old in kept[:-limit]:
                shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def resume(accelerator: Accelerator, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Load the checkpoint ``--resume_from_checkpoint`` names into the prepared objects; returns it and its
    ``trainer_state.json``. A checkpoint is resumed by as many processes as wrote it (each owns its data rows and
    carried state)."""
    checkpoint = find_checkpoint(args.output_dir, args.resume_from_checkpoint)
    state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
    world = accelerator.num_processes
    if state["world_size"] != world:
        raise ValueError(
            f"{checkpoint} was written by {state['world_size']} processes; resume it with as many "
            f"(this run has {world})."
        )
    accelerator.load_state(str(checkpoint))
    logger.info(f"resumed from {checkpoint} at step {state['completed_steps']}", main_process_only=True)
    return checkpoint, state


def load_carried_state(checkpoint: Path, accelerator: Accelerator) -> Any:
    """This process's carried state saved in ``checkpoint`` (on the accelerator's device), or None when it holds
    none (the checkpoint was written at the start of a stream)."""
    path = checkpoint / f"memory_rank{accelerator.process_index}.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as handle:
        class_name = handle.metadata()["class"]
    memory_class = getattr(memory_lib, class_name)
    return memory_class.from_state_dict(load_file(str(path), device=str(accelerator.device)))
