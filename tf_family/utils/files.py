"""Reading and writing the user's files safely: one helper for each rule of the house (DESIGN §4).

* **Every file a manifest names resolves inside its folder** (`resolve_inside`): a sharded checkpoint's
  ``model.safetensors.index.json`` and a kNN datastore's ``datastore.json`` name files by relative names; a name
  that is absolute, climbs out with ``..``, or is a symlink pointing out of the folder is refused with a
  `ValueError` naming the manifest and the entry, before anything is read. (In huggingface_hub's cache a snapshot's
  files are links into the repository's ``blobs/``; those are inside the download and allowed.)
* **A safetensors file is checked before it is mapped** (`read_safetensors_header`): its header must be JSON that
  describes tensors lying inside the file, so a truncated or garbled file gives a `ValueError` naming it, not a crash
  in ``mmap``.
* **Writes of user data are atomic** (`atomic_write_bytes`, `atomic_write_text`, `atomic_write_with`,
  `atomic_replace_dir`, `atomic_update_dir`): everything is written beside its final name, flushed to disk
  (``fsync``), then renamed over it, so an interrupted write (a kill, a full disk) leaves the previous version in
  place, never half a file or half a folder.

Standard library only: model code that reads or writes files (the kNN-LM's datastore) imports it, and a remote-code
export carries it along.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import json
import math
import os
import posixpath
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# --------------------------------------------------------------------------------------------- paths in manifests


def _hub_cache_repository(folder: Path) -> Path | None:
    """The repository folder (``.../models--org--name``) when ``folder`` lies in a huggingface_hub cache snapshot."""
    parts = folder.parts
    for position in range(len(parts) - 2, 0, -1):
        if parts[position] == "snapshots" and parts[position - 1].startswith(("models--", "datasets--", "spaces--")):
            return Path(*parts[:position])
    return None


def resolve_inside(folder: str | os.PathLike, name: Any, manifest: str | os.PathLike, what: str = "file") -> Path:
    """The path of ``name``, an entry of ``manifest``, inside ``folder`` (symlinks resolved).

    Refuses (`ValueError` naming the manifest, the entry and the fix) a name that is not a non-empty string, that is
    absolute, that climbs out of the folder (``../x``), or that resolves outside it through a symlink. In a
    huggingface_hub cache snapshot, links into the same repository's ``blobs/`` are what a download is made of and are
    allowed.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(
            f"{manifest!s} names the {what} {name!r}, which is not a file name; every {what} must be named by a "
            "relative file name inside the folder that holds the manifest."
        )
    normal = posixpath.normpath(name.replace("\\", "/"))
    lexical_escape = (
        os.path.isabs(name) or posixpath.isabs(normal) or normal == ".." or normal.startswith("../")
        or (len(name) > 1 and name[1] == ":")  # a Windows drive
    )  # fmt: skip
    root = Path(folder).resolve()
    resolved = (root / normal).resolve()
    allowed = [root]
    repository = _hub_cache_repository(root)
    if repository is not None:
        allowed.append((repository / "blobs").resolve())
    if lexical_escape or normal == "." or not any(resolved.is_relative_to(base) for base in allowed):
        raise ValueError(
            f"{manifest!s} names the {what} {name!r}, which resolves to {resolved}, outside the folder {root}: every "
            f"{what} a manifest names must lie inside the manifest's folder (a relative name without '..', and no "
            "symlink out of the folder). Move the file into the folder and name it relatively, or re-save the "
            "folder; nothing was read."
        )
    return resolved


# ------------------------------------------------------------------------------------------------ safetensors


# safetensors dtype name -> bytes per element
SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
_MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


def read_safetensors_header(path: str | os.PathLike) -> tuple[int, dict[str, dict[str, Any]]]:
    """``(header size, {tensor name: {"dtype", "shape", "data_offsets"}})`` of a safetensors file, after checking that
    the header is well-formed and that every tensor's bytes lie inside the file and match its dtype and shape.

    A `ValueError` names the file and what is wrong (truncated, not safetensors, a tensor whose offsets or shape
    disagree): re-save or re-download it. ``__metadata__`` is left out of the result.
    """
    path = Path(path)
    fix = "The file is damaged or not a safetensors file: re-save or re-download it."
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ValueError(f"{path} is {file_size} bytes, too short for a safetensors header. {fix}")
            (header_size,) = struct.unpack("<Q", prefix)
            if header_size > min(_MAX_HEADER_BYTES, file_size - 8):
                raise ValueError(
                    f"{path}: its header claims {header_size} bytes, but the file holds {file_size - 8} after the "
                    f"length prefix (truncated?). {fix}"
                )
            raw = handle.read(header_size)
    except OSError as error:
        raise ValueError(f"{path} could not be read ({type(error).__name__}: {error}).") from error
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: the safetensors header is not JSON ({error}). {fix}") from error
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is a {type(header).__name__}, not a JSON object. {fix}")
    data_size = file_size - 8 - header_size
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise ValueError(f"{path}: '__metadata__' must map strings to strings. {fix}")
            continue
        problem = _tensor_entry_problem(info, data_size)
        if problem:
            raise ValueError(f"{path}: tensor {name!r} {problem}. {fix}")
        tensors[name] = info
    return header_size, tensors


def _tensor_entry_problem(info: Any, data_size: int) -> str | None:
    if not isinstance(info, dict):
        return f"is described by a {type(info).__name__}, not an object"
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in SAFETENSORS_DTYPE_BYTES:
        return f"has an unknown dtype {dtype!r}"
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        return f"has shape {shape!r}, not a list of non-negative integers"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)):
        return f"has data_offsets {offsets!r}, not [begin, end]"
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        return f"lies at bytes [{begin}, {end}) of a data section of {data_size} bytes (truncated?)"
    expected = math.prod(shape) * SAFETENSORS_DTYPE_BYTES[dtype]
    if end - begin != expected:
        return f"has {end - begin} bytes, but dtype {dtype} and shape {shape} need {expected}"
    return None


def read_json_object(path: str | os.PathLike, fix: str) -> dict[str, Any]:
    """The JSON object in the file ``path``; a `ValueError` naming the file and ending with ``fix`` when it is not
    valid UTF-8 JSON or holds something other than an object."""
    path = Path(path)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}); {fix}.") from error
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds a {type(values).__name__}, not a JSON object; {fix}.")
    return values


def check_checkpoint_folder(folder: str | os.PathLike) -> None:
    """Check a local checkpoint folder's files before transformers reads them: ``config.json`` must be a JSON object,
    ``model.safetensors`` (and every shard a ``model.safetensors.index.json`` names, which must lie inside the folder)
    a well-formed safetensors file. Each problem is a `ValueError` naming the file, where transformers would raise a
    bare parse error (or read outside the folder)."""
    folder = Path(folder)
    for name in ("config.json", "model.safetensors.index.json"):
        path = folder / name
        if not path.is_file():
            continue
        values = read_json_object(path, fix="re-save the checkpoint")
        if name == "model.safetensors.index.json":
            weight_map = values.get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{path} has no 'weight_map' object; re-save the checkpoint.")
            for shard in sorted(set(map(str, weight_map.values()))):
                shard_path = resolve_inside(folder, shard, path, what="shard")
                if shard_path.is_file():
                    read_safetensors_header(shard_path)
    if (folder / "model.safetensors").is_file():
        read_safetensors_header(folder / "model.safetensors")


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------- atomic writes


def _fsync_path(path: Path) -> None:
    """Flush a file, or a folder's entries, to disk (folders: best effort, not every OS can open one)."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def fsync_tree(folder: str | os.PathLike) -> None:
    """Flush every file and folder under ``folder`` (and ``folder`` itself) to disk."""
    folder = Path(folder)
    for path in sorted(folder.rglob("*"), reverse=True):
        if not path.is_symlink():
            _fsync_path(path)
    _fsync_path(folder)


def atomic_write_with(write: Callable[[str], Any], path: str | os.PathLike) -> Path:
    """Write ``path`` through ``write(temporary_path)`` (e.g. ``lambda p: save_file(tensors, p)``): the temporary
    file beside it is flushed to disk and renamed over ``path``, so ``path`` is always the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(descriptor)
    try:
        write(temporary)
        _fsync_path(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_path(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (beside, fsync, rename)."""
    return atomic_write_with(lambda temporary: Path(temporary).write_bytes(data), path)


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (beside, fsync, rename)."""
    return atomic_write_bytes(path, text.encode(encoding))


_RENAME_EXCHANGE = 2  # renameat2 flag (Linux >= 3.15): swap two paths in one step
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths atomically where the OS can (Linux ``renameat2``); False where it cannot."""
    name = ctypes.util.find_library("c")
    try:
        renameat2 = ctypes.CDLL(name, use_errno=True).renameat2
    except (OSError, AttributeError, TypeError):
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    return result == 0


def _staging_folder(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))


def replace_dir(staging: str | os.PathLike, target: str | os.PathLike) -> None:
    """Make the complete folder ``staging`` (beside ``target``) become ``target``: flushed to disk, then swapped in
    (one atomic exchange on Linux; elsewhere ``target`` is moved aside for the instant of a rename), and the old
    folder removed. Until the swap, ``target`` is untouched."""
    staging, target = Path(staging), Path(target)
    fsync_tree(staging)
    if not target.exists():
        os.rename(staging, target)
    elif _exchange(staging, target):
        _remove(staging)  # it now holds the old folder
    else:
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.rename(target, aside / target.name)
        os.rename(staging, target)
        _remove(aside)
    _fsync_path(target.parent)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink()
    else:
        shutil.rmtree(path)


# ------------------------------------------------------------------------------------------------ a full disk
_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
# what libraries that do not raise an OSError say instead (torch's zip writer, safetensors' Rust IO error)
_DISK_FULL_WORDS = (
    "no space left",
    "file too large",
    "filetoolarge",
    "storagefull",
    "disk quota",
    "file write failed",
)


class DiskFullError(OSError):
    """A write failed because the disk (or the process's file-size limit, ``RLIMIT_FSIZE``, or a quota) is full."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says the disk or a file-size limit is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
            return True
        if any(word in str(error).lower() for word in _DISK_FULL_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False


def disk_full_error(error: BaseException, writing: str, kept: str) -> DiskFullError:
    """The clear error for a write of ``writing`` that filled the disk: what failed, what is ``kept``, what to do."""
    return DiskFullError(
        errno.ENOSPC,
        f"the disk is full (or a file-size limit or quota was reached) while writing {writing}: "
        f"{type(error).__name__}: {str(error).strip()[:300]}. {kept} Free some space (or raise the limit) and run "
        "again.",
    )


@contextlib.contextmanager
def atomic_replace_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Build a folder that replaces ``target`` as a whole: the block writes into the yielded staging folder (beside
    ``target``, same file system); when it ends without an error the staging folder is flushed to disk and swapped
    with ``target`` (one atomic exchange on Linux; elsewhere ``target`` is moved aside for the instant of a rename),
    then the old folder is removed. When the block fails or the process is killed, ``target`` is untouched (a
    killed build leaves a hidden ``.<name>.*.partial`` folder beside it, safe to delete)."""
    target = Path(os.path.realpath(target))  # a link to a folder: the folder it points at is replaced
    staging = _staging_folder(target)
    try:
        yield staging
        replace_dir(staging, target)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, Exception) and not isinstance(error, DiskFullError) and is_disk_full(error):
            kept = f"{target} is unchanged." if target.exists() else f"Nothing was written to {target}."
            raise disk_full_error(error, target, kept) from error
        raise


@contextlib.contextmanager
def atomic_update_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Write files into ``target`` without replacing what else it holds: the block writes into the yielded staging
    folder; when it ends without an error every file is flushed to disk and renamed into ``target`` (each one
    atomically: a reader sees the old or the new file, never half of one), sub-folders included. When the block
    fails, ``target`` is untouched."""
    target = Path(target)
    staging = _staging_folder(target)
    try:
        yield staging
        fsync_tree(staging)
        target.mkdir(parents=True, exist_ok=True)
        written = {target}
        for path in sorted(staging.rglob("*")):
            destination = target / path.relative_to(staging)
            if path.is_dir() and not path.is_symlink():
                destination.mkdir(exist_ok=True)
            else:
                os.replace(path, destination)
                written.add(destination.parent)
        for folder in sorted(written):
            _fsync_path(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


__all__ = [
    "SAFETENSORS_DTYPE_BYTES",
    "DiskFullError",
    "atomic_replace_dir",
    "atomic_update_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "check_checkpoint_folder",
    "disk_full_error",
    "file_sha256",
    "fsync_tree",
    "is_disk_full",
    "read_safetensors_header",
    "replace_dir",
    "resolve_inside",
]
