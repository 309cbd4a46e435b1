"""The one attention dispatch: every model's attention and every kernel's tiles go through `attend`.

The implementation is a plain string (a model passes ``config._attn_implementation``; nothing here reads a config):

- ``"eager"``: `dense.dense_attention`, the slow twin, which also returns the probabilities (``output_attentions``);
- ``"sdpa"`` (and ``None``, transformers' default): PyTorch's `scaled_dot_product_attention`, except where our own
  CPU path is measured faster (`attention_backend`): for a CPU forward in float32/64 under dropout or a gradient,
  the native fused kernel (`native.fused_attention`, compiled on first use) or, where that cannot be built or
  ``TF_FAMILY_NATIVE=0``, `masked.masked_attention` with a `dropout.dropout_mask`; a CPU training call in
  bfloat16/float16 (``torch.autocast``) takes the native kernel in float32 where it is measured faster than SDPA;
- ``"flex_attention"``: the sparse kernels (sliding window, BigBird blocks, Reformer's chunks) hand their whole
  pattern to one FlexAttention call (`flex`, compiled on CUDA); a dense call here (global rows, short inputs,
  cached steps) is PyTorch's `scaled_dot_product_attention`, never our CPU functions.

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

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
FLEX = "flex_attention"


def takes_masked_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """Whether `attend` computes with our own CPU function (native kernel or `masked_attention`): on CPU in
    float32/64, under dropout (PyTorch then takes its unfused math path) or when a gradient is needed (PyTorch's fused
    CPU backward is slower: measured 1.2-1.35x ours forward+backward at the chunk shapes of Longformer and BigBird,
    2 cores). Never under `torch.export`: PyTorch's SDPA exports, our CPU functions (a C++ extension, a custom
    autograd function) do not."""
    if query.device.type != "cpu" or query.dtype not in (torch.float32, torch.float64):
        return False
    if torch.compiler.is_exporting():
        return False
    return dropout_p > 0.0 or (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))


def _reduced_cpu_training(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """A CPU call in bfloat16/float16 (``torch.autocast``) under dropout or a gradient, outside `torch.export` and
    `torch.compile` (which keep PyTorch's SDPA there, as before this route existed)."""
    if query.device.type != "cpu" or query.dtype not in native.REDUCED_DTYPES:
        return False
    if torch.compiler.is_exporting() or torch.compiler.is_compiling():
        return False
    return dropout_p > 0.0 or (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)))


def native_candidate(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float) -> bool:
    """Whether the native kernel could take this call (our CPU path, or a bfloat16/float16 CPU call under dropout or
    a gradient, which it computes in float32; 4-D inputs, the kernel built), before the calibration
    (`native.faster_than_pytorch`) decides whether it does."""
    ours = takes_masked_attention(query, key, value, dropout_p) or _reduced_cpu_training(query, key, value, dropout_p)
    return ours and query.dim() == 4 and native.extension() is not None


def attention_backend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float,
    allowed: torch.Tensor | None = None,
) -> str:
    """Which function the ``"sdpa"`` implementation computes with: ``"sdpa"`` (PyTorch's), or where our own is faster
    (`takes_masked_attention`) ``"native"`` (the fused kernel, `native.fused_attention`; 4-D inputs, when built and
    measured faster than the PyTorch path at these shapes on this machine: `native.faster_than_pytorch`) or
    ``"masked"`` (`masked_attention`). In bfloat16/float16 (under ``torch.autocast``) a CPU training call takes the
    native kernel in float32 where it is measured faster than PyTorch's SDPA in that dtype, else ``"sdpa"``."""
    if _reduced_cpu_training(query, key, value, dropout_p):
        if native_candidate(query, key, value, dropout_p) and native.faster_than_pytorch(
            query, key, value, allowed, dropout_p
        ):
            return "native"
        return "sdpa"
    if not takes_masked_attention(query, key, value, dropout_p):
        return "sdpa"
    if native_candidate(query, key, value, dropout_p) and native.faster_than_pytorch(
        query, key, value, allowed, dropout_p
    ):
        return "native"
    return "masked"


def _backend(query, key, value, dropout_p: float, implementation: str | None, cpu_kernels: bool, allowed=None) -> str:
    if implementation == "eager":
        return "eager"
    if implementation == FLEX:  # the dense parts of the flex route: PyTorch's SDPA
        return "sdpa"
    if implementation is not None and implementation != "sdpa":
        raise ValueError(
            f"attention implementation must be one of {IMPLEMENTATIONS} (config._attn_implementation), got "
            f"{implementation!r}; load the model with attn_implementation='sdpa', 'eager' or 'flex_attention'."
        )
    return attention_backend(query, key, value, dropout_p, allowed) if cpu_kernels else "sdpa"


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
        implementation: ``"eager"``, ``"sdpa"`` (``None`` counts as ``"sdpa"``) or ``"flex_attention"`` (here
            PyTorch's SDPA): ``config._attn_implementation``.
        cpu_kernels: let ``"sdpa"`` use our CPU functions where `attention_backend` says they are faster; False keeps
            PyTorch's SDPA (a caller whose shapes were not measured, and whose seeded dropout masks stay PyTorch's).

    Returns:
        ``(..., T, Dh)`` and, for ``"eager"``, the ``(..., T, S)`` probabilities (``None`` otherwise).
    """
    own_cpu_path = cpu_kernels and bias is None and implementation != "eager"
    own_cpu_path = own_cpu_path and (
        takes_masked_attention(query, key, value, dropout_p) or _reduced_cpu_training(query, key, value, dropout_p)
    )
    if own_cpu_path and allowed is not None and bool(allowed.all()):
        allowed = None  # nothing masked: no pass over the scores for it (and one calibration for the shape)
    backend = _backend(query, key, value, dropout_p, implementation, cpu_kernels and bias is None, allowed)
    if backend == "eager":
        return dense_attention(query, key, value, allowed, dropout_p, key_bias=bias)
    if backend == "sdpa":
        mask = allowed
        if bias is not None:
            mask = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p), None
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

    One window suits PyTorch's fused attention (eval) and the native kernel (CPU training; its products are more
    efficient on 128 rows than on 64, which outweighs the wasted scores of longer spans, as
    `bench/bench_sparse_attention.py` measures); the functions that hold the whole score tile in memory
    (`masked_attention`, the eager dense twin) do best with half a window."""
    if implementation == "eager":
        return max(window // 2, 64)
    _backend(query, key, value, dropout_p, implementation, False)  # checks the implementation's name
    candidate = not takes_masked_attention(query, key, value, dropout_p) or native_candidate(
        query, key, value, dropout_p
    )  # PyTorch's SDPA, or the native kernel unless its calibration at the chunk's shape says otherwise
    return max(window if candidate else window // 2, 64)


__all__ = [
    "FLEX",
    "IMPLEMENTATIONS",
    "attend",
    "attention_backend",
    "native_candidate",
    "preferred_chunk",
    "takes_masked_attention",
]
