"""The output folder's guard and the run's checkpoints: written atomically (beside, then renamed), found again by
step, and resumed with the state a model carries between steps.

A checkpoint ``<output_dir>/checkpoints/step_N`` holds the accelerate state (weights, optimizer, scheduler, RNG),
``trainer_state.json`` (the step reached, the world size and whatever the recipe needs to continue, e.g. the epoch and
the update within it) and, for a model that carries state between steps (a class attribute ``carried_state``:
``"segment_memory"`` for Transformer-XL, ``"compressive_memory"`` for the Compressive Transformer, ``"knn_memory"``
for the Memorizing Transformer), each process's
carried state as ``memory_rank<i>.safetensors``.

Resuming is exact: the weights, optimizer, scheduler, random states and carried state of the checkpoint are all
restored, or the resume stops with a `ValueError` naming the file that cannot be read. accelerate itself only logs
(at INFO level) when it cannot restore the random states, and the run would then go on with other dropout masks and
data order than the interrupted one; here that is refused unless ``--allow_inexact_resume`` is given, which resumes
with a warning that the run is no longer exact.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import RNG_STATE_NAME
from accelerate.utils import load as accelerate_load
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .. import memory as memory_lib
from ..cards import RUN_INFO_FILE
from ..files import atomic_write_text, file_sha256, read_safetensors_header, replace_dir, resolve_inside

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
    accelerator.wait_for_everyone()  # every process's files are written: record their digests
    if accelerator.is_main_process:
        digests = {path.name: file_sha256(path) for path in sorted(partial.iterdir()) if path.is_file()}
        record = {**state, "world_size": accelerator.num_processes, "file_sha256": digests}
        atomic_write_text(partial / TRAINER_STATE_FILE, json.dumps(record))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        replace_dir(partial, final)  # flushed to disk, then swapped in
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
    state = read_trainer_state(checkpoint)
    world = accelerator.num_processes
    if state["world_size"] != world:
        raise ValueError(
            f"{checkpoint} was written by {state['world_size']} processes; resume it with as many "
            f"(this run has {world})."
        )
    check_state_files(checkpoint, accelerator)
    allow_inexact = getattr(args, "allow_inexact_resume", False)
    check_file_digests(checkpoint, state, accelerator.process_index, allow_inexact)
    check_random_states(checkpoint, accelerator.process_index, allow_inexact)
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as error:  # noqa: BLE001 - damaged files raise many kinds; name the file instead
        damaged = find_unreadable_file(checkpoint)
        what = f"{damaged[0]} cannot be read ({damaged[1]})" if damaged else f"{type(error).__name__}: {error}"
        raise ValueError(
            f"--resume_from_checkpoint: {checkpoint} cannot be resumed: {what}. Resume from an earlier checkpoint, "
            "or start the run again."
        ) from error
    logger.info(f"resumed from {checkpoint} at step {state['completed_steps']}", main_process_only=True)
    return checkpoint, state


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint, checked (a `ValueError` names the file and the field)."""
    path = checkpoint / TRAINER_STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"--resume_from_checkpoint: {path} cannot be read ({type(error).__name__}: {error}); resume from an "
            "earlier checkpoint."
        ) from error
    for name in ("completed_steps", "world_size"):
        value = state.get(name) if isinstance(state, dict) else None
        if type(value) is not int or value < (1 if name == "world_size" else 0):
            raise ValueError(
                f"--resume_from_checkpoint: {path} has {name}={value!r}, not a count; resume from an earlier checkpoint."
            )
    return state


def check_state_files(checkpoint: Path, accelerator: Accelerator) -> None:
    """Every file ``accelerator.load_state`` will read is there (a `ValueError` naming the first one missing)."""
    expected = []
    for number in range(len(accelerator._models)):
        ending = f"_{number}" if number else ""
        if not (checkpoint / f"pytorch_model{ending}.bin").is_file():
            expected.append(f"model{ending}.safetensors")
    for kind, count in (("optimizer", len(accelerator._optimizers)), ("scheduler", len(accelerator._schedulers))):
        expected += [f"{kind}{f'_{number}' if number else ''}.bin" for number in range(count)]
    missing = [name for name in expected if not (checkpoint / name).is_file()]
    if missing:
        raise ValueError(
            f"--resume_from_checkpoint: {checkpoint} lacks {missing[0]} (a checkpoint holds {expected}); resume from "
            "an earlier checkpoint."
        )


_PER_PROCESS_FILE = re.compile(r"^(?:random_states_|memory_rank)(\d+)\.(?:pkl|safetensors)$")


def check_file_digests(
    checkpoint: Path, state: dict[str, Any], process_index: int, allow_inexact: bool = False
) -> None:
    """Compare the files this process will read with the digests ``trainer_state.json`` recorded when the checkpoint
    was written (a file changed or damaged since: a `ValueError` naming it; for the random states, what
    `check_random_states` does with an unreadable file). Checkpoints written before digests were recorded are not
    checked."""
    digests = state.get("file_sha256")
    if digests is None:
        return
    manifest = checkpoint / TRAINER_STATE_FILE
    if not isinstance(digests, dict) or not all(isinstance(v, str) for v in digests.values()):
        raise ValueError(
            f"--resume_from_checkpoint: {manifest} has a damaged 'file_sha256'; resume from an earlier one."
        )
    for name, recorded in sorted(digests.items()):
        per_process = _PER_PROCESS_FILE.match(name)
        if per_process is not None and int(per_process.group(1)) != process_index:
            continue  # another process's random states or carried state: that process checks them
        path = resolve_inside(checkpoint, name, manifest)
        if not path.is_file() or file_sha256(path) != recorded:
            state_of = "missing" if not path.is_file() else "changed or damaged since the checkpoint was written"
            if name.startswith(RNG_STATE_NAME):
                _inexact(f"{path} cannot be restored (it is {state_of})", allow_inexact)
                continue
            raise ValueError(
                f"--resume_from_checkpoint: {path} is {state_of} (its digest is recorded in {manifest}); resume from "
                "an earlier checkpoint."
            )


def _restore_random_states(states: Any) -> None:
    """What accelerate's ``load_state`` does with ``random_states_<i>.pkl`` (it runs again right after)."""
    random.setstate(states["random_state"])
    np.random.set_state(states["numpy_random_seed"])
    torch.set_rng_state(states["torch_manual_seed"])
    if torch.cuda.is_available() and "torch_cuda_manual_seed" in states:
        torch.cuda.set_rng_state_all(states["torch_cuda_manual_seed"])


def check_random_states(checkpoint: Path, process_index: int, allow_inexact: bool) -> None:
    """Check that this process's random states in ``checkpoint`` can be restored. accelerate would skip a missing
    or unreadable file with an INFO line, and the resumed run would differ from the uninterrupted one: refuse
    (a `ValueError` naming the file), or with ``allow_inexact`` warn that the resume is not exact."""
    path = checkpoint / f"{RNG_STATE_NAME}_{process_index}.pkl"
    try:
        _restore_random_states(accelerate_load(path))
    except Exception as error:  # noqa: BLE001 - a missing, truncated or foreign file: all mean "not exact"
        _inexact(f"{path} cannot be restored ({type(error).__name__}: {error})", allow_inexact)


def _inexact(problem: str, allow_inexact: bool) -> None:
    """Refuse a resume that would not be exact, or with ``--allow_inexact_resume`` warn that it is not."""
    if not allow_inexact:
        raise ValueError(
            f"--resume_from_checkpoint: {problem}, so the resumed run would not continue exactly as the interrupted "
            "one (other dropout masks and data order). Resume from an earlier checkpoint, or pass "
            "--allow_inexact_resume to continue anyway with fresh random states."
        )
    logger.warning(
        f"RESUME IS NOT EXACT: {problem}; continuing with the current random states (--allow_inexact_resume). "
        "The weights will differ from those of an uninterrupted run.",
        main_process_only=False,
    )


def find_unreadable_file(checkpoint: Path) -> tuple[Path, str] | None:
    """The first file of ``checkpoint`` that cannot be read, with why (used to name it when a resume fails)."""
    for path in sorted(checkpoint.iterdir()):
        try:
            if path.suffix == ".safetensors":
                read_safetensors_header(path)
                load_file(str(path))
            elif path.suffix in (".bin", ".pkl", ".pt"):
                accelerate_load(path, map_location="cpu")
        except Exception as error:  # noqa: BLE001
            return path, f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return None


def load_carried_state(checkpoint: Path, accelerator: Accelerator) -> Any:
    """This process's carried state saved in ``checkpoint`` (on the accelerator's device), or None when it holds
    none (the checkpoint was written at the start of a stream)."""
    path = checkpoint / f"memory_rank{accelerator.process_index}.safetensors"
    if not path.is_file():
        return None
    read_safetensors_header(path)  # a damaged file: a ValueError naming it
    with safe_open(str(path), framework="pt") as handle:
        class_name = (handle.metadata() or {}).get("class")
    memory_class = getattr(memory_lib, class_name, None) if isinstance(class_name, str) else None
    if class_name not in getattr(memory_lib, "__all__", ()) or not hasattr(memory_class, "from_state_dict"):
        raise ValueError(
            f"--resume_from_checkpoint: {path} names the carried-state class {class_name!r}, which is not one of "
            "tf_family.memory's; resume from an earlier checkpoint."
        )
    try:
        return memory_class.from_state_dict(load_file(str(path), device=str(accelerator.device)))
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"--resume_from_checkpoint: {path} does not hold a {class_name} ({type(error).__name__}: {error}); resume "
            "from an earlier checkpoint."
        ) from error
