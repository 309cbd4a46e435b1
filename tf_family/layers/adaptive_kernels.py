"""The adaptive softmax's output product ``hidden @ weight.T + bias`` through oneDNN where it is measured faster.

Evaluating a Transformer-XL of the peer baselines' size (vocabulary 32000, width 256, segments of 128 tokens) spends
most of its time in one product: the output layer's ``(128, 256) x (256, 32000)``. ``F.linear`` runs it through
MKL's sgemm; on an AMD EPYC machine oneDNN's matmul (``torch.ops.mkldnn._linear_pointwise``, the op TorchInductor
calls for CPU linears, bias added inside the product) computes it faster (docs/benchmarks.md). MKL may be the
faster one elsewhere (an Intel machine), so neither is chosen blindly: the first call at a given shape (rows,
widths, bias or not, thread count) times both on the call's own tensors, interleaved, and the faster one serves
that shape for the rest of the process (`faster_path`).

oneDNN is considered only where its result is F.linear's up to rounding (a few ulps; not bit-identical): 2-D
float32 CPU tensors, nothing that needs a gradient (the op has no backward: training keeps F.linear), no autocast,
not under ``torch.compile`` / ``torch.export`` or a ``torch.func`` transform, and products of at least `MIN_MACS`
multiply-adds (below that a calibration costs more than it can save; tiny models stay on F.linear).
``TF_FAMILY_ONEDNN_LINEAR=0`` keeps F.linear everywhere; ``=force`` takes oneDNN wherever it may run, without
calibrating (tests). ``F.linear`` is the dense twin (`tests/layers/test_adaptive_kernels.py` compares them).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..attention.timing import interleaved_times

ENV_VAR = "TF_FAMILY_ONEDNN_LINEAR"
MIN_MACS = 1 << 22  # rows * in_features * out_features; the 32000-word head of a 128-token segment has 1 << 30
CALIBRATION_ROUNDS = 5
_SETTINGS = {"0": "off", "off": "off", "false": "off", "no": "off", "1": "auto", "auto": "auto", "force": "force"}
_decisions: dict[tuple, dict] = {}
_available: list[bool] = []  # filled on first use


def _setting() -> str:
    value = os.environ.get(ENV_VAR, "1").strip().lower()
    if value not in _SETTINGS:
        raise ValueError(
            f"{ENV_VAR}={value!r} is not a setting; use 1 (measure once per shape, the default), 0 (always "
            "F.linear) or force (always oneDNN where it may run)."
        )
    return _SETTINGS[value]


def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear op (x86-64 and aarch64 builds do)."""
    if not _available:
        available = torch.backends.mkldnn.is_available()
        try:
            available = available and torch.ops.mkldnn._linear_pointwise.default is not None
        except (AttributeError, RuntimeError):
            available = False
        _available.append(available)
    return _available[0]


def onednn_linear(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``hidden (N, K) @ weight (M, K).T + bias (M,)`` through oneDNN (no autograd)."""
    return torch.ops.mkldnn._linear_pointwise(hidden.contiguous(), weight.contiguous(), bias, "none", [], "")


def _may_use_onednn(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    tensors = (hidden, weight) if bias is None else (hidden, weight, bias)
    if hidden.dim() != 2 or weight.dim() != 2 or (bias is not None and bias.dim() != 1):
        return False
    if any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in tensors):  # DTensor, fake or other subclasses
        return False
    if any(t.device.type != "cpu" or t.dtype != torch.float32 for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    if torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    if torch._C._are_functorch_transforms_active():
        return False
    return onednn_available()


def _shape_key(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    """What a decision holds for: the rows rounded up to a power of two (a tail cluster of the adaptive softmax gets
    a different number of rows at every call), the widths, bias or not, and the thread count."""
    rows_bucket = 1 << max(hidden.shape[0] - 1, 0).bit_length()
    return rows_bucket, hidden.shape[1], weight.shape[0], bias is not None, torch.get_num_threads()


def faster_path(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[bool, torch.Tensor]:
    """Time F.linear and oneDNN on this call's tensors (one warm-up each, then `CALIBRATION_ROUNDS` interleaved
    rounds; the fastest time of each), record which is faster for the shape, and return that decision with the
    faster path's result."""
    paths = {"aten": lambda: F.linear(hidden, weight, bias), "onednn": lambda: onednn_linear(hidden, weight, bias)}
    times, results = interleaved_times(paths, CALIBRATION_ROUNDS)
    best = {name: min(values) for name, values in times.items()}  # a co-tenant only ever adds time: the min is
    use_onednn = best["onednn"] < best["aten"]  # the steadiest estimate on a shared machine
    decision = {"aten_s": best["aten"], "onednn_s": best["onednn"], "onednn": use_onednn}
    _decisions[_shape_key(hidden, weight, bias)] = decision
    return use_onednn, results["onednn" if use_onednn else "aten"]


def output_linear(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(hidden, weight, bias)``, through oneDNN where it may run and is measured faster for the shape (see
    the module's notes; ``TF_FAMILY_ONEDNN_LINEAR``)."""
    setting = _setting()
    if setting == "off" or not _may_use_onednn(hidden, weight, bias):
        return F.linear(hidden, weight, bias)
    if setting == "force":
        return onednn_linear(hidden, weight, bias)
    if hidden.shape[0] * hidden.shape[1] * weight.shape[0] < MIN_MACS:
        return F.linear(hidden, weight, bias)
    decision = _decisions.get(_shape_key(hidden, weight, bias))
    if decision is None:
        return faster_path(hidden, weight, bias)[1]
    return onednn_linear(hidden, weight, bias) if decision["onednn"] else F.linear(hidden, weight, bias)


def decisions() -> dict[tuple, dict]:
    """The shapes measured in this process: ``(rows rounded up to a power of two, in_features, out_features, bias,
    threads)`` -> the fastest seconds of each path and whether oneDNN was chosen (benchmarks record it)."""
    return {key: dict(value) for key, value in _decisions.items()}


__all__ = ["MIN_MACS", "decisions", "faster_path", "onednn_available", "onednn_linear", "output_linear"]
