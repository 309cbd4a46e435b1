"""Keep freed memory in the process: glibc's malloc told (``mallopt``) not to hand freed blocks back to the kernel.

A training step frees its activations and allocates them again at the next step. With glibc's defaults a block of
128 KiB or more is its own ``mmap`` (returned to the kernel by ``munmap`` when freed) and the top of the heap is
trimmed once 128 KiB are free, so every step faults the same pages in again (the main job spent a sixth of its CPU
time in the kernel: docs/benchmarks.md, "Measurements behind choices in the code"). `keep_freed_memory` raises the mmap
threshold and the trim threshold to 2 GiB and pads each heap extension by 1 GiB of address space (not of memory:
untouched pages cost nothing), so freed activations stay in the heap and are reused. Peak memory rises a little
(the heap keeps its high-water mark).

Only programs of our own call it, at start-up: the CLI (``tf-family``) and the recipes run as commands
(`tf_family.utils.user_errors.run_main`); importing tf_family or calling its functions from a user's script never does. A
process that has it set keeps it. Opt out with ``TF_FAMILY_KEEP_FREED_MEMORY=0``; ``MALLOC_*_`` variables set by the user,
or jemalloc / tcmalloc preloaded (``LD_PRELOAD``), are left alone. `describe` says which allocator runs (the
benchmarks record it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ENV_VAR = "TF_FAMILY_KEEP_FREED_MEMORY"

# glibc's mallopt parameters (malloc.h) and the values we set; mallopt takes an int, so 2**31 - 1 is the largest
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = {
    "M_MMAP_THRESHOLD": (M_MMAP_THRESHOLD, 2**31 - 1),
    "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2**31 - 1),
    "M_TOP_PAD": (M_TOP_PAD, 2**30),
}
_USER_MALLOC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")

_state: dict[str, object] = {"kept": False, "reason": "not configured"}


def _opted_out() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off")


def _preloaded() -> str | None:
    preload = os.environ.get("LD_PRELOAD", "")
    return next((name for name in _PRELOADED if name in preload), None)


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory (`SETTINGS`), once per process; ``True`` when it is (now or
    already). Does nothing, and says why in `describe`, when ``TF_FAMILY_KEEP_FREED_MEMORY=0``, when another
    allocator is preloaded, when the user set glibc's ``MALLOC_*_`` variables, or off glibc."""
    if _state["kept"]:
        return True
    if _opted_out():
        _state["reason"] = f"{ENV_VAR}=0"
        return False
    preloaded = _preloaded()
    if preloaded is not None:
        _state["reason"] = f"{preloaded} preloaded"
        return False
    user_vars = [name for name in _USER_MALLOC_VARS if name in os.environ]
    if user_vars:
        _state["reason"] = f"set by the environment ({', '.join(user_vars)})"
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _state["reason"] = f"not glibc ({platform.system()} {platform.libc_ver()[0] or 'unknown libc'})"
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as error:
        _state["reason"] = f"mallopt unavailable ({error})"
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    refused = [name for name, (parameter, value) in SETTINGS.items() if mallopt(parameter, value) != 1]
    if refused:
        _state["reason"] = f"mallopt refused {', '.join(refused)}"
        return False
    _state["kept"] = True
    _state["reason"] = "mallopt"
    return True


def describe() -> str:
    """Which allocator this process runs, in a few words (for benchmark records)."""
    preloaded = _preloaded()
    if preloaded is not None:
        return f"{preloaded} (LD_PRELOAD)"
    if _state["kept"]:
        settings = ", ".join(f"{name}={value}" for name, (_, value) in SETTINGS.items())
        return f"glibc malloc, freed memory kept ({settings})"
    user = {name: os.environ[name] for name in _USER_MALLOC_VARS if name in os.environ}
    if user:
        return "glibc malloc, " + ", ".join(f"{name}={value}" for name, value in user.items())
    return f"system malloc, defaults ({_state['reason']})"


__all__ = ["ENV_VAR", "SETTINGS", "describe", "keep_freed_memory"]
