"""The one attention dispatch: every model's attention and every kernel's tiles go through `attend`.

The implementation is a plain string, ``config._attn_implementation`` (nothing here reads a config), and it names what
runs:

- ``"eager"``: `dense.dense_attention`, the slow twin, which also returns the probabilities (``output_attentions``);
- ``"sdpa"``: PyTorch's `scaled_dot_product_attention`, on every device and in every mode;
- ``"flex_attention"``: the sparse kernels (sliding window, BigBird blocks, Reformer's chunks) hand their whole
  pattern to FlexAttention (`flex`); a dense call here (global rows, short inputs, cached steps, Reformer's LSH
  chunks) is PyTorch's SDPA;
- ``"tff_native"`` (`NATIVE`): tf_family's CPU kernels for CPU training. A CPU call that needs a gradient or dropout
  goes to the native fused kernel (`native.fused_attention`; bfloat16/float16 computed in float32) when the tile
  has at least `NATIVE_MIN_ROWS` query rows (or the caller's ``native_min_rows``: the Sparse Transformer's factorised
  tiles pass 64), else to `masked.masked_attention` (float32/64) or PyTorch's SDPA
  (bfloat16/float16); every other call (eval, another device, ``torch.compile``, ``torch.export``, a float bias) is
  PyTorch's SDPA. Where the kernel cannot be built (or ``TF_FAMILY_NATIVE=0``), `masked_attention` takes its calls.

The default (`default_implementation`) is a rule by device and dtype, with no measurement, so every run of the same
machine makes the same choice: ``"tff_native"`` on CPU where the kernel can be built, ``"sdpa"`` everywhere else.
A model applies it when it is built (``attn_implementation=None``); ``model.set_attn_implementation(...)`` or
``from_pretrained(..., attn_implementation=...)`` choose any of `IMPLEMENTATIONS`. Whether the kernel beats PyTorch
on a machine is measured only on request (`native.calibrate`, which writes a file the user reads and may delete).

`preferred_chunk` says how many queries a chunked kernel (the sliding window) should give each call, since the
best tile depends on which function the call will reach.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import native
from .dense import dense_attention
from .dropout import dropout_mask
from .masked import masked_attention

FLEX = "flex_attention"
NATIVE = "tff_native"
IMPLEMENTATIONS = ("eager", "sdpa", FLEX, NATIVE)
# the native kernel's products pay off from 128 query rows per tile (Longformer's chunks); BigBird's 64-row middle
# blocks ran faster through `masked_attention` (measured in bench/results/sparse_floor_4096_idle.md)
NATIVE_MIN_ROWS = 128


def check_implementation(implementation: str | None) -> str:
    """``implementation`` if it is one of `IMPLEMENTATIONS` (``None`` counts as ``"sdpa"``, transformers' default),
    else a `ValueError` naming the choices."""
    if implementation is None:
        return "sdpa"
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation must be one of {IMPLEMENTATIONS} (config._attn_implementation), got "
            f"{implementation!r}; load the model with attn_implementation= one of them, or call "
            "model.set_attn_implementation(...)."
        )
    return implementation


def default_implementation(device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> str:
    """The default attention of a model built on ``device`` (default: ``torch.get_default_device()``) with weights of
    ``dtype``: `NATIVE` on CPU in float32/bfloat16/float16 where the native kernel can be built
    (`native.can_build`), ``"sdpa"`` everywhere else (CUDA and other devices, float64, no compiler target). A rule,
    not a measurement: the same answer on every run of the same machine."""
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type != "cpu" or dtype not in (None, torch.float32, *native.REDUCED_DTYPES):
        return "sdpa"
    return NATIVE if native.can_build() else "sdpa"


def _needs_training_path(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """A CPU call under dropout or a gradient, outside `torch.compile` / `torch.export` (which keep PyTorch's SDPA:
    our CPU functions are a C++ extension and a custom autograd function, opaque to them)."""
    if query.device.type != "cpu" or torch.compiler.is_exporting() or torch.compiler.is_compiling():
        return False
    return dropout_p > 0.0 or (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))


def takes_masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """Whether `NATIVE` computes this call with one of our CPU functions (the kernel or `masked_attention`) rather
    than PyTorch's SDPA: a float32/64 CPU training call (`_needs_training_path`)."""
    return query.dtype in (torch.float32, torch.float64) and _needs_training_path(query, key, value, dropout_p)


def attention_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float,
    implementation: str | None = NATIVE,
    native_min_rows: int | None = None,
) -> str:
    """The function a call reaches: ``"eager"``, ``"sdpa"`` (PyTorch's), ``"native"`` (`native.fused_attention`,
    or its float32 upcast for bfloat16/float16) or ``"masked"`` (`masked_attention`). Only `NATIVE` reaches the last
    two; the rule is in the module's notes (``native_min_rows``: as in `attend`)."""
    implementation = check_implementation(implementation)
    if implementation == "eager":
        return "eager"
    if implementation != NATIVE or not _needs_training_path(query, key, value, dropout_p):
        return "sdpa"
    min_rows = NATIVE_MIN_ROWS if native_min_rows is None else native_min_rows
    kernel = query.dim() == 4 and query.shape[-2] >= min_rows and native.extension() is not None
    if query.dtype in native.REDUCED_DTYPES:
        return "native" if kernel else "sdpa"
    if query.dtype not in (torch.float32, torch.float64):
        return "sdpa"
    return "native" if kernel else "masked"


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    implementation: str | None = "sdpa",
    *,
    cpu_kernels: bool = True,
    native_min_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``softmax(q k^T / sqrt(Dh) + bias)`` under a bool mask, with dropout on the probabilities, times ``v``.

    Args:
        query: ``(..., T, Dh)``; key, value: ``(..., S, Dh)`` (4-D ``(B, H, ., Dh)`` for the native kernel).
        allowed: bool, broadcastable to ``(..., T, S)``, True where a query may attend; ``None``: nothing masked.
            Every row needs one True entry, except for ``"eager"``, where an empty row attends to every key.
        bias: float, broadcastable to ``(..., T, S)``, added to the scaled scores (a large negative entry masks a
            key, as Transformer-XL's relative-position scores with ``finfo.min`` do). A call with a bias stays on
            PyTorch's SDPA: our CPU functions pass no gradient back to it.
        dropout_p: dropout on the probabilities (0 in eval).
        implementation: one of `IMPLEMENTATIONS` (``None`` counts as ``"sdpa"``): ``config._attn_implementation``;
            ``"flex_attention"`` is PyTorch's SDPA here (the dense parts of that route).
        cpu_kernels: False keeps `NATIVE` calls on PyTorch's SDPA (a caller whose seeded dropout masks must stay
            PyTorch's).
        native_min_rows: the fewest query rows per tile that `NATIVE` hands to the native kernel (``None``:
            `NATIVE_MIN_ROWS`; a kernel whose tiles are measured faster there at fewer rows passes its own, as the Sparse
            Transformer's factorised kernels do).

    Returns:
        ``(..., T, Dh)`` and, for ``"eager"``, the ``(..., T, S)`` probabilities (``None`` otherwise).

    Nine parameters: every caller's tensors, mask, bias, dropout and implementation, and two keyword-only choices of
    the CPU route.
    """
    implementation = check_implementation(implementation)
    if implementation == NATIVE and (bias is not None or not cpu_kernels):
        implementation = "sdpa"
    backend = attention_backend(query, key, value, dropout_p, implementation, native_min_rows)
    if backend == "eager":
        return dense_attention(query, key, value, allowed, dropout_p, key_bias=bias)
    if backend == "sdpa":
        mask = allowed
        if bias is not None:
            mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p), None
    if allowed is not None and bool(allowed.all()):
        allowed = None  # nothing masked (a CPU training call): no pass over the scores for it
    if backend == "native":
        if query.dtype in native.REDUCED_DTYPES:  # autocast's bfloat16: computed in float32, returned in bfloat16
            return native.fused_attention_upcast(query, key, value, allowed, dropout_p), None
        return native.fused_attention(query, key, value, allowed, dropout_p), None
    scores_bias = None  # nothing masked (e.g. BigBird's middle blocks without padding): no pass over the scores for it
    if allowed is not None:
        scores_bias = allowed.view(torch.uint8).to(query.dtype).log_()  # 0 where allowed, -inf elsewhere
    kept, scale = None, 1.0
    if dropout_p > 0.0:
        kept, scale = dropout_mask((*query.shape[:-1], key.shape[-2]), dropout_p, query.device)
    return masked_attention(query, key, value, scores_bias, kept, scale), None


def preferred_chunk(
    window: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float,
    implementation: str | None = "sdpa",
) -> int:
    """Queries per `attend` call for a sliding window of one-sided width ``window`` (at least 64).

    One window suits PyTorch's fused attention and the native kernel (its products are more efficient on 128 rows
    than on 64, which outweighs the wasted scores of longer spans, as `bench/bench_sparse_attention.py` measures); the
    functions that hold the whole score tile in memory (`masked_attention`, the eager dense twin) do best with half a
    window."""
    implementation = check_implementation(implementation)
    if implementation == "eager":
        return max(window // 2, 64)
    whole = max(window, 64)
    ours = implementation == NATIVE and takes_masked_attention(query, key, value, dropout_p)
    if ours and (whole < NATIVE_MIN_ROWS or query.dim() != 4 or native.extension() is None):
        return max(window // 2, 64)  # `masked_attention`
    return whole


__all__ = [
    "FLEX",
    "IMPLEMENTATIONS",
    "NATIVE",
    "NATIVE_MIN_ROWS",
    "attend",
    "attention_backend",
    "check_implementation",
    "default_implementation",
    "preferred_chunk",
    "takes_masked_attention",
]
