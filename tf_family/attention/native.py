"""tf_family's native CPU kernels, one compiled module: fused masked softmax attention with dropout
(``csrc/fused_attention.cpp``, which also holds the module's bindings), the Sparse Transformer's summary factor
(``csrc/summary_attention.cpp``) and its local, strided and block factors (``csrc/factor_attention.cpp``), both
called by `tf_family.attention.factorized`, the Memorizing Transformer's exact kNN
search (``csrc/knn_top_k.cpp``, called by `tf_family.memory.knn_search.native_top_k`) and products with the pairs
it retrieved, read by slot (``csrc/knn_pairs.cpp``, `tf_family.memory.knn_reader.MemoryReader`); ``csrc/blas.h``
is the BLAS they use, ``csrc/softmax.h`` the exponential of the softmax kernels.

On CPU, the unfused training path (`masked_attention`) makes one pass over the whole ``(..., T, S)`` score tensor in
memory for each step: scores, mask, softmax, dropout, and as many again in the backward. On this project's 2-core
machine those passes cost about as much as the matrix products. The native kernel instead works one (batch, head)
tile at a time and keeps the tile's scores in cache. It saves no probabilities, only each row's log-sum-exp, and
the backward recomputes the scores. Dropout draws no random numbers ahead of time: each element's keep decision is
a hash of a per-call seed and its position, and the backward regenerates it. The seed comes from PyTorch's default
generator, so `torch.manual_seed` makes a run reproducible and gradient checkpointing replays the same mask.

The kernel is compiled on first use with `torch.utils.cpp_extension` (about 1.5 minutes on 2 loaded cores; needs a
C++ compiler and ninja), saying so on stderr, and cached under ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``) in a folder keyed on everything that changes the build (`build_key`), so that each
virtual environment keeps its own. ``tf-family build-kernels`` builds it ahead of time. It links the BLAS
inside PyTorch's CPU build (Intel MKL on x86-64 Linux). When the build or the load fails, one warning says why and
`backend.attend` keeps using `masked_attention`. ``TF_FAMILY_NATIVE=0`` turns the kernel off.

`fused_attention` is the entry point; its dense twin is `masked_attention_reference` given the same dropout mask
(`fused_keep_mask`).

The kernel is not faster everywhere: BigBird's 64-row tiles ran slower through it than through the PyTorch path
(`masked_attention`) it replaces, on an Intel and on an AMD machine, while Longformer's 256-row chunks ran faster. So
the ``"tff_native"`` implementation (`backend`) takes it by a fixed rule, for tiles of at least
`backend.NATIVE_MIN_ROWS` query rows, and measures nothing while a model runs. `calibrate` is the explicit step that
measures both paths, forward and backward, at the shapes a user names (random tensors of that shape and layout,
interleaved), and writes the times and the faster path to a JSON file the user reads (and may delete; nothing reads
it back): with it a user decides between ``attn_implementation="tff_native"`` and ``"sdpa"`` on their machine.
``TF_FAMILY_NATIVE=0`` is the one setting read from the environment: it turns the kernel off (no build attempt, e.g.
on a machine without a compiler); `masked_attention` then takes its calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from .dropout import _dropout_levels
from .timing import interleaved_times

_CSRC = Path(__file__).with_name("csrc")
# one module
_SOURCES = tuple(
    _CSRC / name
    for name in (
        "fused_attention.cpp",
        "summary_attention.cpp",
        "factor_attention.cpp",
        "knn_top_k.cpp",
        "knn_pairs.cpp",
    )
)
_HEADERS = (_CSRC / "blas.h", _CSRC / "softmax.h")
_state: dict = {}


def _cpu_signature() -> str:
    """What the ``-march=native`` build depends on: the CPU model and its instruction-set flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


_CFLAGS = ("-O3", "-march=native", "-fopenmp")
_LDFLAGS = ("-fopenmp",)
# what the first build costs, measured (2 loaded CPU cores, g++ 12): said before a build starts
BUILD_TIME_NOTE = "about 1.5 minutes on 2 CPU cores"


def build_key() -> str:
    """A hash of everything that changes the build: the source, the CPU (``-march=native``), the compiler and its
    flags, the Python (its environment, ``sys.prefix``, its version and headers) and torch (version and headers).
    Two virtual environments get two cached builds instead of rebuilding over each other; the ways of starting one
    environment's Python (``python``, ``python3``, a console script such as ``tf-family``) share one build, which
    keying on ``sys.executable`` did not."""
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    parts = [
        *(path.read_bytes().hex() for path in (*_SOURCES, *_HEADERS)),
        _cpu_signature(),
        torch.__version__,
        *include_paths(),
        sys.prefix,
        sys.version,
        sysconfig.get_paths()["include"],
        os.environ.get("CXX", "c++"),
        *_CFLAGS,
        *_LDFLAGS,
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _module_name() -> str:
    return f"tf_family_fused_attention_{build_key()}"


def build_directory() -> Path:
    """Where this environment's build of the kernel lives (under ``TORCH_EXTENSIONS_DIR``)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(_module_name(), verbose=False))


def is_built() -> bool:
    """Whether this environment's kernel is already compiled (loading it then takes well under a second)."""
    name = _module_name()
    return (build_directory() / f"{name}.so").is_file()


def say(message: str) -> None:
    """Write ``message`` as a line of its own on stderr: above an open progress bar (the recipes' training bar, whose
    line it would otherwise continue), with the bar redrawn below it."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)
    sys.stderr.flush()


# a build takes minutes (`BUILD_TIME_NOTE`); a lock file older than this was left by a build that was killed
STALE_LOCK_S = 30 * 60


def _clear_stale_lock(directory: Path, stale_after_s: float = STALE_LOCK_S) -> None:
    """PyTorch's extension builder holds a ``lock`` file in the build directory while it compiles and waits, without
    end and without a word, while one exists. A build killed part-way leaves it behind, and every later import of a
    model would hang. A lock older than ``stale_after_s`` is removed, saying so; a younger one is another process's
    build, which this one waits for, saying where the lock is. PyTorch releases 2.14 and later hold an OS advisory
    lock on that file instead (released by the kernel when its holder dies; the file stays): nothing to do there."""
    import torch.utils.cpp_extension

    if not hasattr(torch.utils.cpp_extension, "FileBaton"):  # the advisory lock (torch 2.14+)
        return
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > stale_after_s:
        lock.unlink(missing_ok=True)
        say(
            f"tf_family: removed {lock}, left {age / 60:.0f} minutes ago by a native-kernel build that did not "
            "finish (a killed process); building again."
        )
    else:
        say(
            f"tf_family: waiting for another process's build of the native kernel ({lock}, {age:.0f} s old). If no "
            "other build is running, delete that file, or set TF_FAMILY_NATIVE=0 to use the PyTorch path."
        )


def _build():
    from torch.utils.cpp_extension import load

    try:  # the `ninja` wheel (a dependency) may sit in a virtual environment that is not on PATH
        import ninja

        if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    name = _module_name()
    fresh = not is_built()
    _clear_stale_lock(build_directory())
    if fresh:  # said on stderr, whoever uses the model (a recipe, a plain Trainer, a notebook)
        say(
            f"tf_family: compiling the native CPU attention kernel for this environment, once ({BUILD_TIME_NOTE}; "
            f"`tf-family build-kernels` does it ahead of time) into {build_directory()} ..."
        )
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the build's own chatter (compiler version notes)
        module = load(
            name=name,
            sources=[str(path) for path in _SOURCES],
            extra_cflags=list(_CFLAGS),
            extra_ldflags=list(_LDFLAGS),
            verbose=False,
        )
    if fresh:
        say(f"tf_family: native attention kernel built in {time.perf_counter() - started:.0f} s.")
    return module


def extension():
    """The compiled kernel module, building it on first call; ``None`` when it is off or cannot be built/loaded."""
    if _native_setting() in ("0", "false", "no", "off"):
        return None
    if "module" not in _state:
        module = None
        if can_build():
            try:
                module = _build()
            except Exception as error:  # a missing compiler, ninja or BLAS symbol: fall back, say why once
                warnings.warn(
                    f"tf_family's native CPU attention kernel could not be built ({type(error).__name__}: "
                    f"{str(error).strip().splitlines()[-1] if str(error).strip() else error!r}); CPU training uses the "
                    "slower PyTorch path. Install a C++ compiler and ninja to build it, or set TF_FAMILY_NATIVE=0 to "
                    "skip the attempt.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _state["module"] = module
    return _state["module"]


def _native_setting() -> str:
    return os.environ.get("TF_FAMILY_NATIVE", "1").strip().lower()


CALIBRATION_FILE = "calibration.json"
CALIBRATION_ROUNDS = 5
# `calibrate` calls the kernel faster only when its forward + backward beats the PyTorch path's by more than this
# fraction: smaller gains did not survive into a training step (see the module's notes)
NATIVE_MARGIN = 0.05
REDUCED_DTYPES = (torch.bfloat16, torch.float16)  # taken by the kernel in float32 (`fused_attention_upcast`)


def can_build() -> bool:
    """Whether the kernel can be used here without trying: a Linux x86-64 machine (the targets of its build) and
    ``TF_FAMILY_NATIVE`` not ``0``. Builds nothing (`extension` does, on first use)."""
    if _native_setting() in ("0", "false", "no", "off"):
        return False
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


def calibration_path() -> Path:
    """`calibrate`'s default file: beside this environment's build of the kernel."""
    return build_directory() / CALIBRATION_FILE


def _layout(*tensors: torch.Tensor) -> str:
    """``c`` for each contiguous tensor, ``s`` for each strided one (which the kernel copies first)."""
    return "".join("c" if tensor.is_contiguous() else "s" for tensor in tensors)


def _calibration_key(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, masked: bool, dropout_p: float
) -> str:
    return (
        f"{str(query.dtype).removeprefix('torch.')} q{tuple(query.shape)} k{tuple(key.shape)} "
        f"layout={_layout(query, key, value)} mask={int(masked)} dropout={int(dropout_p > 0)} "
        f"threads={torch.get_num_threads()}"
    )


def prefer_native(native_s: float, pytorch_s: float, margin: float = NATIVE_MARGIN) -> bool:
    """`calibrate`'s verdict on one shape's forward + backward times: the native kernel only when it is faster than
    the PyTorch path by more than ``margin`` (a fraction of the PyTorch path's time); a tie or a smaller gain says
    the PyTorch path."""
    if not (native_s > 0 and pytorch_s > 0):
        raise ValueError(f"prefer_native needs two positive times, got native_s={native_s}, pytorch_s={pytorch_s}.")
    return native_s < (1.0 - margin) * pytorch_s


def _calibration_tensors(tensors, generator: torch.Generator) -> list[torch.Tensor]:
    """Random leaves of the shapes, dtype and strides of ``tensors``: the call's layout matters, as keys and values
    transposed from ``(B, T, H, Dh)`` cost the kernel a copy each way (and the PyTorch path none)."""
    return [
        torch.empty_like(t, memory_format=torch.preserve_format).normal_(generator=generator).requires_grad_()
        for t in tensors
    ]


def _time_paths(query, key, value, allowed, dropout_p: float) -> dict[str, float]:
    """Median seconds of forward + backward through the kernel and through the PyTorch path, on random tensors of
    the call's shapes and its mask, interleaved; PyTorch's random state is left as it was. In bfloat16/float16 the
    kernel computes in float32 (`fused_attention_upcast`) and the PyTorch path is PyTorch's SDPA in that dtype."""
    import torch.nn.functional as F

    from .dropout import dropout_mask
    from .masked import masked_attention

    reduced = query.dtype in REDUCED_DTYPES

    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        generator = torch.Generator().manual_seed(0)
        tensors = _calibration_tensors((query, key, value), generator)
        grad = torch.randn(query.shape, dtype=query.dtype, generator=generator)
        mask = None if allowed is None else allowed.detach()
        scores_bias = None
        if mask is not None and not reduced:
            scores_bias = mask.to(torch.bool).view(torch.uint8).to(query.dtype).log_()

        def native_path():
            (fused_attention_upcast if reduced else fused_attention)(*tensors, mask, dropout_p, seed=1).backward(grad)

        def pytorch_path():
            if reduced:
                F.scaled_dot_product_attention(*tensors, attn_mask=mask, dropout_p=dropout_p).backward(grad)
                return
            kept, scale = None, 1.0
            if dropout_p > 0.0:
                kept, scale = dropout_mask((*query.shape[:-1], key.shape[-2]), dropout_p, query.device)
            masked_attention(*tensors, scores_bias, kept, scale).backward(grad)

        def clear_grads():
            for tensor in tensors:
                tensor.grad = None

        paths = {"native": native_path, "pytorch": pytorch_path}
        times, _ = interleaved_times(paths, CALIBRATION_ROUNDS, after_each=clear_grads)
    return {name: statistics.median(values) for name, values in times.items()}


def calibrate(
    calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, float]],
    path: str | os.PathLike | None = None,
) -> dict[str, dict]:
    """The explicit, opt-in measurement: for each ``(query, key, value, allowed, dropout_p)`` (tensors of the shapes,
    dtype and strides to measure; their values are not used), the median forward + backward seconds of the native
    kernel and of the PyTorch path, and which is faster by `prefer_native`'s rule. Written as JSON to ``path``
    (default `calibration_path`; beside, then renamed) and returned. Nothing in tf_family reads the file: it is for
    the user, who may delete it.

    Raises:
        RuntimeError: when the kernel is not available (`extension`).
    """
    if extension() is None:
        raise RuntimeError("tf_family's native attention kernel is not available here: nothing to calibrate.")
    table: dict[str, dict] = {}
    for query, key, value, allowed, dropout_p in calls:
        measured = _time_paths(query.detach(), key.detach(), value.detach(), allowed, dropout_p)
        native_s, pytorch_s = round(measured["native"], 9), round(measured["pytorch"], 9)
        table[_calibration_key(query, key, value, allowed is not None, dropout_p)] = {
            "native_s": native_s,
            "pytorch_s": pytorch_s,
            "native_faster": prefer_native(native_s, pytorch_s),
        }
    target = Path(path) if path is not None else calibration_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(partial, target)
    return table


def float32_cpu_extension(*tensors: torch.Tensor):
    """The compiled module for a kernel over ``tensors``, or None where it does not run: a tensor not float32 on
    CPU, under `torch.compile` / `torch.export` (the kernels are opaque to them), or no kernel (`extension`)."""
    if (
        any(tensor.dtype != torch.float32 or tensor.device.type != "cpu" for tensor in tensors)
        or torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
    ):
        return None
    return extension()


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, mask, dropped: int, seed: int):
        out, lse = extension().forward(query, key, value, mask, dropped, seed)
        ctx.save_for_backward(query, key, value, mask, lse)
        ctx.dropout = (dropped, seed)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, mask, lse = ctx.saved_tensors
        grads = extension().backward(grad_out.contiguous(), query, key, value, mask, lse, *ctx.dropout)
        return (*grads, None, None, None)


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
) -> torch.Tensor:
    """Softmax attention under a bool mask with dropout on the probabilities, computed by the native kernel.

    Args:
        query: ``(A, H, T, Dh)``; key, value: ``(A, H, S, Dh)``; float32 or float64 on CPU.
        allowed: bool, broadcastable to ``(A, H, T, S)``, True where a query may attend; every row needs one True
            entry. ``None``: nothing masked.
        dropout_p: drop probability, rounded to a multiple of ``1 / 65536`` (the kept values are scaled to keep the
            expectation, as in `torch.nn.functional.dropout`).
        seed: the dropout seed (default: drawn from PyTorch's default generator).

    Returns:
        ``(A, H, T, Dh)``. Raises `RuntimeError` when the kernel is not available (see `extension`).
    """
    if extension() is None:
        raise RuntimeError("tf_family's native attention kernel is not available (see the earlier warning).")
    if query.dim() != 4 or key.shape != value.shape or query.shape[:2] != key.shape[:2] or key.dim() != 4:
        raise ValueError(
            "fused_attention takes query (A, H, T, Dh) and key, value (A, H, S, Dh), got "
            f"{tuple(query.shape)}, {tuple(key.shape)} and {tuple(value.shape)}."
        )
    if query.device.type != "cpu" or query.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"fused_attention runs on CPU in float32/float64, got {query.dtype} on {query.device}.")
    mask = None
    if allowed is not None:
        mask = allowed.to(torch.bool).expand(*query.shape[:-1], key.shape[-2])
        if mask.stride(-1) != 1:  # the kernel reads each row's keys contiguously
            mask = mask.contiguous()
        mask = mask.view(torch.uint8)
    dropped = _dropout_levels(dropout_p)[0] if dropout_p > 0.0 else -1  # -1: no dropout
    if seed is None:
        seed = int(torch.randint(0, 2**62, ())) if dropped >= 0 else 0
    query, key, value = (t.contiguous() for t in (query, key, value))
    return _FusedAttention.apply(query, key, value, mask, dropped, seed)


def fused_attention_upcast(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    seed: int | None = None,
) -> torch.Tensor:
    """`fused_attention` for bfloat16/float16 inputs (what ``torch.autocast`` hands the attention): computed in
    float32 and returned in the inputs' dtype; the gradients come back in that dtype too. On CPU, PyTorch's SDPA in
    bfloat16 under dropout and a mask (Longformer's chunks) runs its unfused math path and took twice the time of
    these casts plus the float32 kernel (2 cores, 4096 tokens); `calibrate` measures it per shape on request."""
    if query.dtype not in REDUCED_DTYPES:
        raise ValueError(
            f"fused_attention_upcast takes bfloat16/float16 tensors, got {query.dtype}; call fused_attention."
        )
    out = fused_attention(query.float(), key.float(), value.float(), allowed, dropout_p, seed)
    return out.to(query.dtype)


def fused_keep_mask(shape: tuple[int, ...] | torch.Size, dropout_p: float, seed: int) -> tuple[torch.Tensor, float]:
    """The dropout mask `fused_attention` applies for ``seed`` (True = kept) and the scale of the kept values."""
    numel = 1
    for size in shape:
        numel *= int(size)
    dropped, scale = _dropout_levels(dropout_p)
    kept = extension().keep_mask(numel, dropped, seed).view(*shape).to(torch.bool)
    return kept, scale


__all__ = [
    "CALIBRATION_FILE",
    "NATIVE_MARGIN",
    "build_directory",
    "calibrate",
    "calibration_path",
    "can_build",
    "build_key",
    "extension",
    "float32_cpu_extension",
    "fused_attention",
    "fused_attention_upcast",
    "fused_keep_mask",
    "is_built",
    "prefer_native",
]
