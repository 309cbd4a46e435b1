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
import fcntl
import json
import os
import random
import re
import shutil
import socket
import sys
import time
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
from ..shipping.cards import RUN_INFO_FILE
from ..utils.files import (
    atomic_write_text,
    disk_full_error,
    file_sha256,
    is_disk_full,
    read_safetensors_header,
    replace_dir,
    resolve_inside,
)

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


LOCK_FILE = ".tf_family_run.lock"
_held_locks: dict[Path, int] = {}  # output folder -> the open, locked lock file of this process


def lock_output_dir(output_dir: Path) -> None:
    """Claim ``output_dir`` for this run: an exclusive ``flock`` on ``<output_dir>/.tf_family_run.lock``, which
    records the process holding it. A second run started on the same folder is refused at once (a `ValueError`
    naming the process that holds it), before it writes anything. The lock goes with the process (released by
    `unlock_output_dir` at the end of the run, or by the OS when the process dies, even by SIGKILL), so a stale
    lock file never blocks a later run. Call it on the main process only; a process may claim a folder again."""
    output_dir = Path(output_dir).resolve()
    if output_dir in _held_locks:
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / LOCK_FILE
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)
            try:
                holder = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                holder = {}
            who = (
                f"process {holder.get('pid')} on {holder.get('host')} (started {holder.get('started')}: "
                f"{holder.get('command')})"
                if holder
                else "another process"
            )
            raise ValueError(
                f"--output_dir {output_dir} is in use by another run: {who} holds {path}. Wait for that run to end "
                "(or stop it), or pass another --output_dir."
            ) from None
        try:  # the file may have been removed by the run that held it just before: lock the one on disk
            same = os.path.samestat(os.fstat(descriptor), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(descriptor)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv)[:300],
    }
    os.ftruncate(descriptor, 0)
    os.write(descriptor, json.dumps(record).encode())
    _held_locks[output_dir] = descriptor


def unlock_output_dir(output_dir: Path) -> None:
    """Release the claim `lock_output_dir` took (the lock file is removed); nothing when this process holds none."""
    output_dir = Path(output_dir).resolve()
    descriptor = _held_locks.pop(output_dir, None)
    if descriptor is None:
        return
    try:
        (output_dir / LOCK_FILE).unlink(missing_ok=True)
    finally:
        os.close(descriptor)  # closing releases the flock


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
    try:
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
    except Exception as error:
        if not is_disk_full(error):
            raise
        shutil.rmtree(partial, ignore_errors=True)  # a half-written checkpoint is never resumed: drop it
        earlier = _latest_complete(root)
        kept = (
            f"Nothing of it was kept; the last complete checkpoint, {earlier}, is intact: resume from it with "
            "--resume_from_checkpoint latest."
            if earlier
            else "Nothing of it was kept (the run had no earlier checkpoint)."
        )
        raise disk_full_error(error, f"the checkpoint {final}", kept) from error
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


def _latest_complete(root: Path) -> Path | None:
    steps = sorted(
        (int(m.group(1)), p) for p in root.glob("step_*") if (m := CHECKPOINT_PATTERN.match(p.name)) and p.is_dir()
    )
    return steps[-1][1] if steps else None


def resume(accelerator: Accelerator, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Load the checkpoint ``--resume_from_checkpoint`` names into the prepared objects; returns it and its
    ``trainer_state.json``. A checkpoint is resumed by as many processes as wrote it (each owns its data rows and
    carried state)."""
    checkpoint = find_checkpoint(args.output_dir, args.resume_from_checkpoint)
    state = read_trainer_state(checkpoint)
    world, written_by = accelerator.num_processes, state["world_size"]
    if written_by != world:
        check_world_change(checkpoint, state, args, world)
    check_state_files(checkpoint, accelerator)
    allow_inexact = getattr(args, "allow_inexact_resume", False)
    check_file_digests(checkpoint, state, accelerator.process_index, allow_inexact)
    if written_by == world:
        check_random_states(checkpoint, accelerator.process_index, allow_inexact)
    else:
        logger.warning(
            f"{checkpoint} was written by {written_by} process(es), this run has {world}: the weights, optimizer, "
            "schedule, data order and carried memory continue exactly; the random states cannot (each process "
            "keeps its own), so with dropout the masks differ from those of an uninterrupted run.",
            main_process_only=True,
        )
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as error:  # noqa: BLE001 - damaged files raise many kinds; name the file instead
        damaged = find_unreadable_file(checkpoint)
        what = f"{damaged[0]} cannot be read ({damaged[1]})" if damaged else f"{type(error).__name__}: {error}"
        raise ValueError(
            f"--resume_from_checkpoint: {checkpoint} cannot be resumed: {what}. Resume from an earlier checkpoint, "
            "or start the run again."
        ) from error
    if written_by != world:
        _rescale_schedulers(accelerator, state["completed_steps"], written_by, world)
    logger.info(f"resumed from {checkpoint} at step {state['completed_steps']}", main_process_only=True)
    return checkpoint, state


# what a checkpoint records so that another number of processes can resume it (`save_checkpoint`'s ``state``)
RESUMABLE_BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps")


def check_world_change(checkpoint: Path, state: dict[str, Any], args: argparse.Namespace, world: int) -> None:
    """Refuse (a `ValueError` saying what to pass) a resume by another number of processes unless it continues the
    same run: the checkpoint records its batch layout, the rows of a micro-batch over all processes stay the same
    (``--per_device_train_batch_size`` scaled by the change), so do the accumulation steps, and nothing is read from
    a per-process stream. The carried memory is then re-split by rows (`load_carried_state`)."""
    written_by = state["world_size"]
    prefix = f"--resume_from_checkpoint: {checkpoint} was written by {written_by} process(es), this run has {world}"
    recorded = [state.get(name) for name in RESUMABLE_BATCH_FIELDS]
    if not all(type(value) is int and value > 0 for value in recorded):
        raise ValueError(
            f"{prefix}, and it does not record its batch layout ({', '.join(RESUMABLE_BATCH_FIELDS)}); resume it "
            f"with {written_by} process(es)."
        )
    if any(checkpoint.glob("data_rank*.json")):
        raise ValueError(
            f"{prefix}; its processes read their own parts of a stream (--streaming), which cannot be re-split: "
            f"resume it with {written_by} process(es)."
        )
    per_device, accumulation = recorded
    rows = written_by * per_device
    needed = rows // world if rows % world == 0 else None
    if needed != args.per_device_train_batch_size or accumulation != args.gradient_accumulation_steps:
        fix = (
            f"pass --per_device_train_batch_size {needed} --gradient_accumulation_steps {accumulation}"
            if needed
            else f"its {rows} rows per micro-batch do not divide among {world} processes: use a number that divides them"
        )
        raise ValueError(
            f"{prefix}; to continue the same run every micro-batch must keep its {rows} rows over all processes and "
            f"the accumulation its {accumulation} steps: {fix}."
        )


def _rescale_schedulers(accelerator: Accelerator, steps: int, written_by: int, world: int) -> None:
    """A prepared scheduler advances once per process at every optimizer step (`make_optimizer` lays the schedule
    out in process-steps): move the restored schedules from ``steps * written_by`` to ``steps * world``."""
    for scheduler in accelerator._schedulers:
        inner = getattr(scheduler, "scheduler", scheduler)
        inner.last_epoch = steps * world - 1
        inner.step()  # the learning rates of step ``steps * world``, set on the optimizer's groups


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
    written_by = read_trainer_state(checkpoint)["world_size"]
    if written_by != accelerator.num_processes:
        return _resplit_carried_state(checkpoint, accelerator, written_by)
    path = checkpoint / f"memory_rank{accelerator.process_index}.safetensors"
    if not path.is_file():
        return None
    return _read_carried_state(path, accelerator)


def _read_carried_state(path: Path, accelerator: Accelerator) -> Any:
    """The carried state in ``path``, on the accelerator's device."""
    read_safetensors_header(path)  # a damaged file: a ValueError naming it
    return _carried_from(path, load_file(str(path), device=str(accelerator.device)))


def _carried_from(path: Path, tensors: dict[str, torch.Tensor]) -> Any:
    """The `tf_family.memory` object that ``path``'s metadata names, rebuilt from ``tensors`` (read from it)."""
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
        return memory_class.from_state_dict(tensors)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"--resume_from_checkpoint: {path} does not hold a {class_name} ({type(error).__name__}: {error}); resume "
            "from an earlier checkpoint."
        ) from error


def _resplit_carried_state(checkpoint: Path, accelerator: Accelerator, written_by: int) -> Any:
    """This process's rows of the carried state that ``written_by`` processes saved: their files joined by rows in
    process order (process ``i`` owned the global batch rows ``i * per_device ...``), then cut into equal parts, one
    per process of this run. Per-row state only: a scalar that differs between the files (a kNN memory's write
    pointer) cannot be re-split (`ValueError`)."""
    paths = [checkpoint / f"memory_rank{rank}.safetensors" for rank in range(written_by)]
    present = [path.is_file() for path in paths]
    if not any(present):
        return None
    if not all(present):
        missing = paths[present.index(False)]
        raise ValueError(f"--resume_from_checkpoint: {missing} is missing; resume from an earlier checkpoint.")
    digests = read_trainer_state(checkpoint).get("file_sha256") or {}
    for path in paths:
        read_safetensors_header(path)  # a damaged file: a ValueError naming it
        if path.name in digests and file_sha256(path) != digests[path.name]:
            raise ValueError(
                f"--resume_from_checkpoint: {path} is changed or damaged since the checkpoint was written (its digest "
                f"is recorded in {checkpoint / TRAINER_STATE_FILE}); resume from an earlier checkpoint."
            )
    parts = [load_file(str(path), device=str(accelerator.device)) for path in paths]
    joined = {}
    for key in parts[0]:
        values = [part.get(key) for part in parts]
        if any(value is None for value in values):
            raise ValueError(f"--resume_from_checkpoint: the memory files of {checkpoint} hold different fields.")
        if values[0].dim() == 0:
            if any(not torch.equal(value, values[0]) for value in values):
                raise ValueError(
                    f"--resume_from_checkpoint: {checkpoint}'s processes carried memories with different {key!r} "
                    f"({[v.item() for v in values]}), which cannot be re-split by rows; resume it with "
                    f"{written_by} process(es)."
                )
            joined[key] = values[0]
        else:
            joined[key] = torch.cat(values, dim=0)
    total = next(v.shape[0] for v in joined.values() if v.dim())
    share = total // accelerator.num_processes
    rows = slice(accelerator.process_index * share, (accelerator.process_index + 1) * share)
    return _carried_from(paths[0], {k: v[rows] if v.dim() else v for k, v in joined.items()})
