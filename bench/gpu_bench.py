"""The GPU benchmark at real sizes, one script, at most 8 minutes on one H100 / H200; records written as it goes.

    python bench/gpu_bench.py --out DIR             # a CUDA machine: DIR/gpu_bench.jsonl (a record per cell, as
                                                    # measured), DIR/gpu_bench.md (the tables, rewritten each cell)
    python bench/gpu_bench.py --dry-run --out DIR   # CPU, tiny sizes: every cell's code path (the CI test)

Two levels, bf16 autocast, forward + backward, attention dropout 0:

- ``kernels``: B=1, 12 heads of 64, 4k / 16k / 32k tokens: dense SDPA (the flash backend where PyTorch picks it)
  against our sliding window (one-sided 256, one global token) under ``sdpa`` and ``flex_attention``, BigBird's
  pattern (blocks of 64, 3 random) under ``flex_attention`` (key tiles of one block) and ``sdpa``, and Reformer's LSH
  chunks (chunk 64, 2 rounds). The FlexAttention block mask is built in the first call and kept in a
  `BlockMaskCache`, so the timed steps reuse it; the build is timed apart (``mask_ms``).
- ``models``: base size (12 layers, width 768, 12 heads, FFN 3072) at (batch 4, 4k), (1, 16k), (1, 32k): our
  Longformer and BigBird under each backend, transformers' model with the same weights, a dense BERT with SDPA of
  the same size, and a floor cell (our Longformer with its attention replaced by the identity); Reformer (6 local +
  6 LSH layers, causal, LM head) against a causal Llama with the same LM head and loss at 16k.

Each cell: median step time of the timed steps after warm-up (compile time apart: ``warmup_s``), tokens/s, peak GiB
(reset before the warm-up), and the fraction of one profiled step's wall time the GPU was busy (kernel time over
wall time from ``torch.profiler``; a host-bound cell shows a low fraction). A failure (out of memory, a compile
error) is recorded with its error and the rest runs; a global budget (``--budget``, 450 s) stops starting cells
near its end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, run from anywhere

from gpu_check import Deadline, _autocast, _error, _free, _is_oom, _sync  # noqa: E402


def shapes(dry_run: bool) -> dict:
    """The benchmark's sizes; tiny ones for the dry run (every code path, seconds on a CPU)."""
    if dry_run:
        return {
            "heads": 2, "head_dim": 16, "kernel_lengths": [512], "window": 64, "block": 16, "random": 1, "chunk": 32,
            "width": 32, "layers": 2, "ffn": 64, "vocab": 128, "model_cells": [(2, 512)], "reformer_length": 512,
            "warmup": 1, "repeats": 2, "dtype": "bf16",
        }  # fmt: skip
    return {
        "heads": 12, "head_dim": 64, "kernel_lengths": [4096, 16384, 32768], "window": 256, "block": 64, "random": 3,
        "chunk": 64, "width": 768, "layers": 12, "ffn": 3072, "vocab": 32000,
        "model_cells": [(4, 4096), (1, 16384), (1, 32768)], "reformer_length": 16384, "warmup": 2, "repeats": 5,
        "dtype": "bf16",
    }  # fmt: skip


class Recorder:
    """Appends each record to ``gpu_bench.jsonl`` when it is measured and rewrites ``gpu_bench.md`` after it."""

    def __init__(self, out: Path, environment: dict):
        self.out, self.environment, self.records = out, environment, []
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = out / "gpu_bench.jsonl"
        self.jsonl.write_text(json.dumps({"environment": environment}) + "\n")

    def add(self, record: dict) -> None:
        self.records.append(record)
        with self.jsonl.open("a") as sink:
            sink.write(json.dumps(record) + "\n")
        status = f"{record['median_ms']:.2f} ms" if record.get("ok") else f"FAILED {record.get('error', '')[:160]}"
        print(f"[{record['level']}] {record['cell']} {record.get('shape', '')}: {status}", flush=True)
        partial = self.out / ".gpu_bench.md.tmp"
        partial.write_text(markdown(self.records, self.environment))
        partial.replace(self.out / "gpu_bench.md")


def busy_fraction(step, device) -> float | None:
    """The fraction of one step's wall time the GPU spent in kernels (``torch.profiler``); ``None`` on CPU."""
    import torch

    if device.type != "cuda":
        return None
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    _sync(device)
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as profile:
        step()
        _sync(device)
    wall_us = (time.perf_counter() - start) * 1e6
    kernels_us = sum(event.device_time for event in profile.events() if event.device_type.name == "CUDA")
    return min(kernels_us / wall_us, 1.0) if wall_us > 0 else None


def time_cell(record: dict, step, tokens: int, shape: dict, device, deadline: Deadline, recorder: Recorder):
    """Warm up, time, profile one step, record (failures included)."""
    import torch

    try:
        _free(device)
        start = time.perf_counter()
        for _ in range(shape["warmup"]):
            step()
        _sync(device)
        record["warmup_s"] = round(time.perf_counter() - start, 3)
        times = []
        for _ in range(shape["repeats"]):
            if times and deadline.left() < 10:
                record["cut_by_budget"] = True
                break
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        record.update(ok=True, median_ms=median * 1e3, min_ms=min(times) * 1e3, tokens_per_s=tokens / median)
        if device.type == "cuda":
            record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        record["gpu_busy"] = busy_fraction(step, device)
    except Exception as exc:
        record.update(ok=False, error=_error(exc), oom=_is_oom(exc))
        if not _is_oom(exc):
            record["trace"] = traceback.format_exc()[-1500:]
    recorder.add(record)
    _free(device)


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_cells(shape: dict, length: int, device):
    """``(name, step, mask_ms)`` for every kernel cell at ``length``: each step is forward + backward."""
    import torch
    import torch.nn.functional as F

    from tf_family.attention import (
        ChunkPattern,
        GlobalTokens,
        WindowPattern,
        block_sparse_attention,
        hash_vectors,
        lsh_attention,
        lsh_rotations,
        normalize_shared_keys,
        random_block_indices,
        sliding_window_attention,
    )
    from tf_family.attention.flex import BlockMaskCache

    heads, head_dim = shape["heads"], shape["head_dim"]
    dtype = torch.bfloat16 if shape["dtype"] == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)

    def leaves():
        return [
            torch.randn(1, heads, length, head_dim, generator=generator).to(device, dtype).requires_grad_()
            for _ in range(3)
        ]

    query, key, value = leaves()
    valid = torch.ones(1, length, dtype=torch.bool, device=device)
    global_mask = torch.zeros(1, length, dtype=torch.bool, device=device)
    global_mask[:, 0] = True
    global_tokens = GlobalTokens.from_mask(global_mask, valid)
    window = WindowPattern(shape["window"])
    num_blocks = length // shape["block"]
    plan = random_block_indices(num_blocks, heads, shape["random"], 1, seed=0, device=device)

    def backward(out):
        out.float().pow(2).mean().backward()
        for tensor in (query, key, value):
            tensor.grad = None

    def with_cache(run):
        """A step that reuses one cache (the mask built in the first call) and the first call's time."""
        cache = BlockMaskCache()

        def step():
            backward(run(cache))

        return step

    cells = {
        "dense_sdpa": lambda: backward(F.scaled_dot_product_attention(query, key, value)),
        "window_sdpa": lambda: backward(
            sliding_window_attention(query, key, value, window, valid, global_tokens, 0.0, "sdpa")
        ),
        "window_flex": with_cache(
            lambda cache: sliding_window_attention(
                query, key, value, window, valid, global_tokens, 0.0, "flex_attention", cache
            )
        ),
        "big_bird_sdpa": lambda: backward(
            block_sparse_attention(query, key, value, shape["block"], plan, 1, valid, 0.0, "sdpa")
        ),
        "big_bird_flex": with_cache(
            lambda cache: block_sparse_attention(
                query, key, value, shape["block"], plan, 1, valid, 0.0, "flex_attention", cache, ("bench",)
            )
        ),
    }
    chunk = ChunkPattern(shape["chunk"], 1, 0)
    rotations = lsh_rotations(0, heads, head_dim, 2, 2 * length // shape["chunk"], device=device)
    buckets = hash_vectors(query.detach(), rotations, 2 * length // shape["chunk"])
    cells["lsh_chunks"] = lambda: backward(
        lsh_attention(query, normalize_shared_keys(query), value, buckets, chunk, valid, implementation="sdpa")
    )
    for name, step in cells.items():
        mask_ms = None
        if name.endswith("_flex"):  # the block mask alone, built in a cache of its own
            _sync(device)
            start = time.perf_counter()
            if name == "window_flex":
                from tf_family.attention.flex import sliding_window_block_mask

                sliding_window_block_mask(-(-length // 128) * 128, 128, window, device)
            else:
                from tf_family.attention.block_sparse import build_block_sparse_counts
                from tf_family.attention.flex import block_sparse_block_mask

                counts = build_block_sparse_counts(num_blocks, plan, 1, heads)
                block_sparse_block_mask(shape["block"], counts, -(-length // 128) * 128)
            _sync(device)
            mask_ms = (time.perf_counter() - start) * 1e3

        def run(step=step):
            with _autocast(device, shape["dtype"]):
                step()

        yield name, run, mask_ms


def section_kernels(shape, device, deadline, recorder):
    for length in shape["kernel_lengths"]:
        for name, step, mask_ms in kernel_cells(shape, length, device):
            if deadline.left() < 20:
                return
            record = {"level": "kernels", "cell": name, "shape": f"B=1 T={length}", "length": length}
            record["mask_ms"] = mask_ms
            time_cell(record, step, length, shape, device, deadline, recorder)


# ----------------------------------------------------------------------------------------------------- models
def _model_shape(shape: dict) -> dict:
    """`gpu_check`'s model builders read these names."""
    return {
        "vocab": shape["vocab"], "width": shape["width"], "layers": shape["layers"], "heads": shape["heads"],
        "ffn": shape["ffn"], "window": 2 * shape["window"], "block": shape["block"], "random": shape["random"],
        "chunk": shape["chunk"], "buckets": 2 * shape["reformer_length"] // shape["chunk"],
    }  # fmt: skip


def training_step(model, batch: int, length: int, vocab: int, device, dtype: str, causal_lm: bool, global_token):
    """One forward + backward of ``model`` on random tokens: an LM loss for a causal LM, else the mean square of a
    fixed projection of the last hidden states."""
    import torch

    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(5, vocab, (batch, length), generator=generator).to(device)
    inputs = {"input_ids": ids}
    if global_token:
        global_mask = torch.zeros_like(ids)
        global_mask[:, 0] = 1
        inputs["global_attention_mask"] = global_mask
    probe = torch.randn(model.config.hidden_size, generator=generator).to(device)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        with _autocast(device, dtype):
            if causal_lm:
                loss = model(**inputs, labels=ids).loss
            else:
                loss = (model(**inputs).last_hidden_state.float() @ probe).pow(2).mean()
        loss.backward()

    return step


@contextlib.contextmanager
def identity_attention():
    """The floor: every sliding-window call returns its values (the rest of the step unchanged)."""
    from tf_family.models.longformer import modeling_longformer

    real = modeling_longformer.sliding_window_attention
    modeling_longformer.sliding_window_attention = lambda query, key, value, *args, **kwargs: value
    try:
        yield
    finally:
        modeling_longformer.sliding_window_attention = real


def section_models(shape, device, deadline, recorder):
    import gpu_check

    model_shape = _model_shape(shape)
    for batch, length in shape["model_cells"]:
        for arch in ("longformer", "big_bird"):
            with tempfile.TemporaryDirectory() as folder:
                try:
                    gpu_check._reference_model(arch, model_shape, length, folder)
                except Exception as exc:
                    recorder.add({"level": "models", "cell": f"{arch} setup", "ok": False, "error": _error(exc)})
                    continue
                builds = {
                    f"{arch} {implementation}": (
                        lambda arch=arch, folder=folder, implementation=implementation: gpu_check._our_model(
                            arch, folder, implementation
                        )
                    )
                    for implementation in ("sdpa", "flex_attention")
                }
                builds[f"{arch} transformers"] = lambda arch=arch, folder=folder: gpu_check._load_reference(
                    arch, folder
                )
                for cell, build in builds.items():
                    _model_cell(cell, build, arch, batch, length, shape, device, deadline, recorder)
                if arch == "longformer":
                    with identity_attention():
                        build = builds["longformer sdpa"]
                        _model_cell("floor (identity attention)", build, arch, batch, length, shape, device,
                                    deadline, recorder)  # fmt: skip
        build = lambda length=length: gpu_check._dense_model("bert", model_shape, length)  # noqa: E731
        _model_cell("dense BERT sdpa", build, "bert", batch, length, shape, device, deadline, recorder)
    length = shape["reformer_length"]
    with tempfile.TemporaryDirectory() as folder:
        gpu_check._reference_model("reformer", model_shape, length, folder)
        for implementation in ("sdpa", "flex_attention"):
            build = lambda implementation=implementation: gpu_check._our_model("reformer", folder, implementation)  # noqa: E731
            _model_cell(f"reformer {implementation}", build, "reformer", 1, length, shape, device, deadline, recorder)
    build = lambda: _causal_llama(model_shape, length)  # noqa: E731
    _model_cell("causal Llama sdpa + LM head", build, "llama", 1, length, shape, device, deadline, recorder)


def _causal_llama(model_shape: dict, length: int):
    import gpu_check
    import transformers

    base = gpu_check._dense_model("llama", model_shape, length)
    model = transformers.LlamaForCausalLM._from_config(base.config, attn_implementation="sdpa")
    model.model = base
    return model


def _model_cell(cell, build, arch, batch, length, shape, device, deadline, recorder):
    if deadline.left() < 20:
        return
    record = {"level": "models", "cell": cell, "shape": f"B={batch} T={length}", "batch": batch, "length": length}
    record["peer"] = cell.endswith("transformers") or arch in ("bert", "llama")
    try:
        model = build().to(device)
        record["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        causal_lm = arch in ("reformer", "llama")
        step = training_step(
            model, batch, length, shape["vocab"], device, shape["dtype"], causal_lm, arch == "longformer"
        )
    except Exception as exc:
        record.update(ok=False, error=_error(exc), oom=_is_oom(exc))
        recorder.add(record)
        return
    time_cell(record, step, batch * length, shape, device, deadline, recorder)


# ----------------------------------------------------------------------------------------------------- report
def _fmt(value, digits=2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(records: list[dict], environment: dict) -> str:
    lines = [
        "# GPU benchmark (bench/gpu_bench.py)",
        "",
        f"{environment['device']}, torch {environment['torch']}, {environment['date']}; command: "
        f"`{environment['command']}`. bf16 autocast, forward + backward, median of the timed steps; GPU busy = "
        "kernel time / wall time of one profiled step.",
        "",
        "| level | cell | shape | step ms | tokens/s | peak GiB | GPU busy | mask ms | warm-up s | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        note = "" if r.get("ok") else ("OOM" if r.get("oom") else (r.get("error", "")[:80]).replace("|", "/"))
        busy = None if r.get("gpu_busy") is None else 100 * r["gpu_busy"]
        lines.append(
            f"| {r['level']} | {r['cell']} | {r.get('shape', '')} | {_fmt(r.get('median_ms'))} | "
            f"{_fmt(r.get('tokens_per_s'), 0)} | {_fmt(r.get('peak_gib'))} | {_fmt(busy, 0)} | "
            f"{_fmt(r.get('mask_ms'))} | {_fmt(r.get('warmup_s'))} | {note} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_bench.jsonl and gpu_bench.md")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU: every code path, seconds")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds after which no new cell starts")
    parser.add_argument("--levels", nargs="+", default=["kernels", "models"], choices=["kernels", "models"])
    args = parser.parse_args(argv)
    import torch
    import torch._dynamo

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here; run with --dry-run for the tiny CPU pass")
    device = torch.device("cpu" if args.dry_run else "cuda")
    torch._dynamo.config.recompile_limit = 64  # lengths and batch sizes vary between cells
    deadline = Deadline(time.time() + args.budget)
    shape = shapes(args.dry_run)
    environment = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({platform.processor()})",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "python bench/gpu_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "dry_run": args.dry_run,
    }
    recorder = Recorder(args.out, environment)
    if "kernels" in args.levels:
        section_kernels(shape, device, deadline, recorder)
    if "models" in args.levels:
        section_models(shape, device, deadline, recorder)
    # the dry run fails on our cells' errors; a peer's (transformers' BigBird under CPU autocast) is only recorded
    failed = [r for r in recorder.records if not r.get("ok") and not r.get("oom") and not r.get("peer")]
    return 1 if args.dry_run and failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
