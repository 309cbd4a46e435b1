"""tf_family's native CPU kernels, one compiled module: fused masked softmax attention with dropout
(``csrc/fused_attention.cpp``, which also holds the module's bindings) and the Memorizing Transformer's exact kNN
search (``csrc/knn_top_k.cpp``, called by `tf_family.memory.knn_search.native_top_k`) and products with the pairs
it retrieved, read by slot (``csrc/knn_pairs.cpp``, `tf_family.memory.knn_reader.MemoryReader`); ``csrc/blas.h``
is the BLAS they use.

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
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

from .dropout import _dropout_levels

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = tuple(_CSRC / name for name in ("fused_attention.cpp", "knn_top_k.cpp", "knn_pairs.cpp"))  # one module
_HEADERS = (_CSRC / "blas.h",)
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
    if os.environ.get("TF_FAMILY_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    if "module" not in _state:
        module = None
        if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
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


def fused_keep_mask(shape: tuple[int, ...] | torch.Size, dropout_p: float, seed: int) -> tuple[torch.Tensor, float]:
    """The dropout mask `fused_attention` applies for ``seed`` (True = kept) and the scale of the kept values."""
    numel = 1
    for size in shape:
        numel *= int(size)
    dropped, scale = _dropout_levels(dropout_p)
    kept = extension().keep_mask(numel, dropped, seed).view(*shape).to(torch.bool)
    return kept, scale


__all__ = [
    "build_directory",
    "build_key",
    "extension",
    "float32_cpu_extension",
    "fused_attention",
    "fused_keep_mask",
    "is_built",
]
