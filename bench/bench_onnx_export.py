"""ONNX export of every architecture and head: the largest difference between onnxruntime and eager, and the export
time, on tiny random models (weights pushed away from the small init, as the tests do).

    python bench/bench_onnx_export.py [--heads all|default] [--output bench/results/onnx_export.md]

Each model is exported once (batch 2, length 16, dynamic axes) and run at (batch 3, length 21, the last row
left-padded) and (batch 1, length 5); the memory models run two segments, the second reading the memory the first
left. Differences are over real positions for the main outputs and over everything for the memories.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import onnxruntime
import torch

from tf_family.registry import ARCHITECTURES
from tf_family.shipping.onnx_export import OnnxForward, example_inputs, export_model, memory_input_names, prepare_model

SHAPES = ((3, 21), (1, 5))
DEFAULT_HEADS = {"longformer": "masked_lm", "big_bird": "masked_lm", "decision_transformer": "action"}


def tiny_model(arch: str, task: str) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = ARCHITECTURES[arch]
    model = spec.model_classes[task](spec.tiny_config()).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return prepare_model(model)


def largest_difference(arch: str, task: str, folder: Path) -> tuple[float, float]:
    model = tiny_model(arch, task)
    started = time.perf_counter()
    signature = export_model(model, folder / "model.onnx")
    seconds = time.perf_counter() - started
    wrapper = OnnxForward(model, task)
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    past_names, worst = memory_input_names(model), 0.0
    for batch, length in SHAPES:
        inputs, present = example_inputs(model, task, batch, length, seed=length), {}
        for segment in range(2 if past_names else 1):
            if segment:
                inputs = {**example_inputs(model, task, batch, length, seed=length + 1), **present}
            with torch.no_grad():
                expected = dict(zip(wrapper.outputs, wrapper(*inputs.values()), strict=True))
            outputs = session.run(None, {k: v.numpy() for k, v in inputs.items()})
            mask = inputs["attention_mask"].bool()
            for name, got in zip(signature.outputs, outputs, strict=True):
                got, want = torch.from_numpy(got), expected[name]
                if want.dtype == torch.bool:
                    worst = max(worst, float((got != want).sum()))
                    continue
                if not name.startswith("present_") and want.dim() >= 2 and want.shape[:2] == mask.shape:
                    got, want = got[mask], want[mask]
                worst = max(worst, float((got - want).abs().max()) if want.numel() else 0.0)
            present = {name: expected[name.replace("past_", "present_", 1)] for name in past_names}
    return worst, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", choices=["all", "default"], default="all")
    parser.add_argument("--output", default="bench/results/onnx_export.md")
    args = parser.parse_args()
    rows = ["| architecture | head | max abs difference | export (s) |", "| --- | --- | --- | --- |"]
    for arch, spec in ARCHITECTURES.items():
        tasks = [t for t in spec.model_classes if t not in ("base", "multiple_choice")]
        if args.heads == "default":
            tasks = [DEFAULT_HEADS.get(arch, "causal_lm")]
        for task in tasks:
            with tempfile.TemporaryDirectory() as folder:
                worst, seconds = largest_difference(arch, task, Path(folder))
            rows.append(f"| {arch} | {task} | {worst:.1e} | {seconds:.0f} |")
            print(rows[-1], flush=True)  # noqa: T201
    header = (
        f"ONNX export, onnxruntime {onnxruntime.__version__} against eager (torch {torch.__version__}), "
        f"{time.strftime('%Y-%m-%d')}; `python bench/bench_onnx_export.py --heads {args.heads}`.\n\n"
    )
    Path(args.output).write_text(header + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
