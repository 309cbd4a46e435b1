"""The adaptive softmax's output product ``hidden @ weight.T + bias`` through oneDNN, by a fixed rule.

Evaluating a Transformer-XL of the peer baselines' size (vocabulary 32000, width 256, segments of 128 tokens) spends
most of its time in one product: the output layer's ``(128, 256) x (256, 32000)``. ``F.linear`` runs it through
MKL's sgemm; oneDNN's matmul (``torch.ops.mkldnn._linear_pointwise``, the op TorchInductor calls for CPU linears,
bias added inside the product) computed it faster on the AMD EPYC machine the project is built on
(docs/benchmarks.md).

The rule (`output_linear`), the same on every run: oneDNN wherever it may run and the product has at least
`MIN_MACS` multiply-adds; ``F.linear`` everywhere else. oneDNN may run where its result is F.linear's up to rounding
(a few ulps; not bit-identical): 2-D float32 CPU tensors, nothing that needs a gradient (the op has no backward:
training keeps F.linear), no autocast, not under ``torch.compile`` / ``torch.export`` or a ``torch.func``
transform. Nothing is timed at run time and nothing is remembered between calls. MKL may be the faster one on
another CPU (an Intel machine): `measure` is the explicit, opt-in step that times both paths on the shapes you
give it and writes the result to a file you can read and delete (nothing in tf_family reads it);
``TF_FAMILY_ONEDNN_LINEAR=0`` then keeps F.linear everywhere (``=force`` takes oneDNN wherever it may run, whatever
the size: tests). ``F.linear`` is the dense twin (`tests/layers/test_adaptive_kernels.py` compares them).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from ..attention.timing import interleaved_times

ENV_VAR = "TF_FAMILY_ONEDNN_LINEAR"
MIN_MACS = 1 << 22  # rows * in_features * out_features; the 32000-word head of a 128-token segment has 1 << 30
CALIBRATION_ROUNDS = 5
_SETTINGS = {"0": "off", "off": "off", "false": "off", "no": "off", "1": "rule", "rule": "rule", "force": "force"}


def _setting() -> str:
    value = os.environ.get(ENV_VAR, "1").strip().lower()
    if value not in _SETTINGS:
        raise ValueError(
            f"{ENV_VAR}={value!r} is not a setting; use 1 (the rule: oneDNN for products of at least {MIN_MACS} "
            "multiply-adds where it may run, the default), 0 (always F.linear) or force (always oneDNN where it may "
            "run)."
        )
    return _SETTINGS[value]


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN's linear op (x86-64 and aarch64 builds do)."""
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


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


def measure(
    products: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], path: str | os.PathLike | None = None
) -> list[dict]:
    """The explicit, opt-in measurement: for each ``(hidden, weight, bias)`` product, the fastest of
    `CALIBRATION_ROUNDS` interleaved timings of F.linear and of oneDNN (after one warm-up each) and which was faster.
    Returned, and written as JSON to ``path`` when one is given (beside, then renamed). Nothing in tf_family reads
    it: set ``TF_FAMILY_ONEDNN_LINEAR=0`` where it says F.linear is faster at your shapes.

    Raises:
        RuntimeError: when this PyTorch build has no oneDNN linear (`onednn_available`).
    """
    if not onednn_available():
        raise RuntimeError(
            "this PyTorch build has no oneDNN linear (torch.ops.mkldnn._linear_pointwise): nothing to measure."
        )
    records = []
    with torch.no_grad():
        for hidden, weight, bias in products:
            paths = {
                "aten": lambda h=hidden, w=weight, b=bias: F.linear(h, w, b),
                "onednn": lambda h=hidden, w=weight, b=bias: onednn_linear(h, w, b),
            }
            times, _ = interleaved_times(paths, CALIBRATION_ROUNDS)
            best = {name: min(values) for name, values in times.items()}  # a co-tenant only ever adds time: the min
            records.append(  # is the steadiest estimate on a shared machine
                {
                    "shape": [hidden.shape[0], hidden.shape[1], weight.shape[0]],
                    "bias": bias is not None,
                    "threads": torch.get_num_threads(),
                    "aten_s": best["aten"],
                    "onednn_s": best["onednn"],
                    "onednn_faster": best["onednn"] < best["aten"],
                }
            )
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(records, indent=1))
        os.replace(partial, target)
    return records


def uses_onednn(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether `output_linear` takes oneDNN for this product (the module's rule and ``TF_FAMILY_ONEDNN_LINEAR``)."""
    setting = _setting()
    if setting == "off" or not _may_use_onednn(hidden, weight, bias):
        return False
    return setting == "force" or hidden.shape[0] * hidden.shape[1] * weight.shape[0] >= MIN_MACS


def output_linear(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(hidden, weight, bias)``, through oneDNN where the module's rule says (`uses_onednn`)."""
    if uses_onednn(hidden, weight, bias):
        return onednn_linear(hidden, weight, bias)
    return F.linear(hidden, weight, bias)


__all__ = ["MIN_MACS", "measure", "onednn_available", "onednn_linear", "output_linear", "uses_onednn"]
