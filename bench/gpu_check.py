"""One GPU check, at most 8 minutes: does every architecture train on CUDA, and how fast are the sparse models there?

Run through ``bench/gpu_check.sh`` (which installs the wheels of ``.whl/`` when present) from the repository root::

    bash bench/gpu_check.sh --out DIR          # a CUDA machine
    bash bench/gpu_check.sh --dry-run --out DIR  # CPU, tiny sizes (CI)

Sections, in this order, each in its own worker process (a CUDA error or a hang stays in its section):

1. ``smoke``: every architecture (its tiny variant, first task) forward and backward on the device, float32 and
   under bf16 autocast; then, for Longformer, BigBird and Reformer, ``attn_implementation="flex_attention"`` against
   the default path on the device (largest output and gradient difference).
2. ``fsdp``: one FSDP2 training step (``torch.distributed.fsdp.fully_shard``, world size 1, nccl on CUDA, else
   gloo) of Longformer, BigBird and Reformer.
3. ``time``: training steps (forward + backward, bf16 autocast first, float32 after) of Longformer, BigBird and
   Reformer at 4096 and 16384 tokens (batch 1): our default path (``sdpa``), our ``flex_attention`` path,
   transformers' ``LongformerModel`` / ``BigBirdModel`` / ``ReformerModelWithLMHead`` of the same shape and weights,
   and dense SDPA of the same width (transformers' ``BertModel``, bidirectional, against Longformer and BigBird;
   ``LlamaModel``, causal, against Reformer). Median of timed steps after warm-up (which includes compiling).

Every measurement is guarded: a failure (out of memory, unsupported) is recorded with its error and the rest runs. A
global budget (``--budget``, 450 s) stops starting new sections and cells near its end; a section's worker is killed
at the budget. Results: ``DIR/gpu_check.json`` (everything), ``DIR/gpu_check.md`` (tables), ``DIR/gpu_check.log``
(the workers' output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPARSE = ("longformer", "big_bird", "reformer")
FLEX_LENGTHS = {"longformer": 40, "big_bird": 40, "reformer": 48}  # the tiny models' sparse paths (tests/attention)


def _shapes(dry_run: bool) -> dict:
    """The timed models' shape: the CPU benchmarks' (width 256, 4 layers, 4 heads of 64); tiny for the dry run."""
    if dry_run:
        return {
            "width": 32, "layers": 2, "heads": 2, "ffn": 64, "vocab": 128, "window": 32, "block": 16, "random": 1,
            "chunk": 32, "buckets": 8, "lengths": [256], "dtypes": ["bf16"], "warmup": 1, "repeats": 1,
        }  # fmt: skip
    return {
        "width": 256, "layers": 4, "heads": 4, "ffn": 1024, "vocab": 32000, "window": 512, "block": 64, "random": 3,
        "chunk": 64, "buckets": 64, "lengths": [4096, 16384], "dtypes": ["bf16", "fp32"], "warmup": 2,
        "repeats": 5,
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------------- helpers
class Deadline:
    def __init__(self, end: float):
        self.end = end

    def left(self) -> float:
        return self.end - time.time()


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) < 600 else text[:600] + " ..."


def _is_oom(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _free(device):
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _autocast(device, dtype: str):
    import contextlib

    import torch

    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _emit(record: dict, sink) -> None:
    sink.write(json.dumps(record) + "\n")
    sink.flush()
    status = "ok" if record.get("ok") else f"FAILED {record.get('error', '')[:200]}"
    label = " ".join(str(record.get(k)) for k in ("section", "arch", "impl", "length", "dtype") if record.get(k))
    extra = f" {record['median_ms']:.1f} ms" if record.get("median_ms") is not None else ""
    print(f"[{record['section']}] {label}: {status}{extra}", flush=True)


# ------------------------------------------------------------------------------------------------------ smoke
def section_smoke(device, deadline: Deadline, sink, dry_run: bool) -> None:
    import torch

    from tests.common.tester import make_inputs, scalar_loss
    from tf_family.registry import ARCHITECTURES

    for name, spec in ARCHITECTURES.items():
        task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
        for dtype in ("fp32", "bf16"):
            if deadline.left() < 5:
                return
            record = {"section": "smoke", "arch": name, "task": task, "dtype": dtype}
            try:
                torch.manual_seed(0)
                model = spec.model_classes[task](spec.tiny_config()).to(device).train()
                inputs = make_inputs(spec, model.config, task)
                inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}
                start = time.perf_counter()
                with _autocast(device, dtype):
                    outputs = model(**inputs)
                    loss = scalar_loss(task, outputs)
                loss.backward()
                _sync(device)
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                record.update(
                    ok=bool(torch.isfinite(loss).item()) and all(bool(torch.isfinite(g).all()) for g in grads),
                    loss=float(loss.detach()),
                    parameters_with_grad=len(grads),
                    seconds=time.perf_counter() - start,
                )
                if not record["ok"]:
                    record["error"] = "non-finite loss or gradient"
            except Exception as exc:  # recorded; the next cell runs
                record.update(ok=False, error=_error(exc), oom=_is_oom(exc))
            _emit(record, sink)
            _free(device)


# -------------------------------------------------------------------------------------------------- flexcheck
def section_flexcheck(device, deadline: Deadline, sink, dry_run: bool) -> None:
    """The flex route against the default path, on this device (float32, tiny; attention dropout off)."""
    import torch

    from tests.common.tester import make_inputs, without_labels
    from tf_family.registry import ARCHITECTURES

    for name in SPARSE:
        if deadline.left() < 10:
            return
        spec = ARCHITECTURES[name]
        task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
        record = {"section": "flexcheck", "arch": name, "task": task, "dtype": "fp32", "impl": "flex_vs_default"}
        try:
            overrides = {}
            if name == "reformer":
                overrides = {"lsh_attention_probs_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0}
            torch.manual_seed(0)
            model = spec.model_classes[task](spec.tiny_config(**overrides)).to(device).train()
            inputs = without_labels(make_inputs(spec, model.config, task, batch=2, length=FLEX_LENGTHS[name]))
            inputs = {k: v.to(device) for k, v in inputs.items()}
            mask = torch.ones_like(inputs["input_ids"])
            mask[1, -5:] = 0
            inputs["attention_mask"] = mask

            default = _outputs_and_grads(model, task, inputs, mask)
            model.set_attn_implementation("flex_attention")
            flexed = _outputs_and_grads(model, task, inputs, mask)
            # largest difference relative to the largest value: of the output, and over all the gradients (some
            # gradients are zero up to rounding, e.g. a key bias's: per-tensor ratios would be noise)
            output_diff = float((flexed[0] - default[0]).abs().max() / default[0].abs().max())
            grad_scale = max(float(g.abs().max()) for g in default[1:])
            grad_diff = (
                max(float((a - b).abs().max()) for a, b in zip(flexed[1:], default[1:], strict=True)) / grad_scale
            )
            record.update(
                ok=len(flexed) == len(default) and max(output_diff, grad_diff) < 1e-3,
                output_rel_diff=output_diff,
                max_grad_rel_diff=grad_diff,
            )
            if not record["ok"]:
                record["error"] = f"flex differs from the default path: {output_diff:.3g} / {grad_diff:.3g}"
        except Exception as exc:
            record.update(ok=False, error=_error(exc), oom=_is_oom(exc), trace=traceback.format_exc()[-1500:])
        _emit(record, sink)
        _free(device)


def _outputs_and_grads(model, task, inputs, mask):
    from tests.common.tester import main_output

    model.zero_grad(set_to_none=True)
    out = main_output(task, model(**inputs)) * mask[..., None]
    out.float().square().mean().backward()
    return [out.detach().float()] + [p.grad.float() for p in model.parameters() if p.grad is not None]


# ------------------------------------------------------------------------------------------------------- fsdp
def section_fsdp(device, deadline: Deadline, sink, dry_run: bool) -> None:
    import socket

    import torch
    import torch.distributed as dist

    from tests.common.tester import make_inputs, scalar_loss
    from tf_family.registry import ARCHITECTURES

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        # per layer for each; root only too for Reformer (its reversible backward re-runs the layers inside one
        # autograd function, outside the per-layer FSDP hooks)
        for name, units in [(name, "layers") for name in SPARSE] + [("reformer", "root")]:
            if deadline.left() < 5:
                return
            spec = ARCHITECTURES[name]
            task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
            record = {"section": "fsdp", "arch": name, "task": task, "dtype": "fp32", "backend": backend}
            record["units"] = units
            try:
                torch.manual_seed(0)
                model = spec.model_classes[task](spec.tiny_config()).to(device).train()
                layers = []
                if units == "layers":  # each of the model's _no_split_modules, then the root
                    layers = [m for m in model.modules() if type(m).__name__ in set(model._no_split_modules or ())]
                for layer in layers:
                    fully_shard(layer)
                fully_shard(model)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
                inputs = make_inputs(spec, model.config, task)
                inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}
                losses = []
                for _ in range(2):
                    optimizer.zero_grad(set_to_none=True)
                    loss = scalar_loss(task, model(**inputs))
                    loss.backward()
                    optimizer.step()
                    losses.append(float(loss))
                _sync(device)
                sharded = sum(type(p).__name__ == "DTensor" for p in model.parameters())
                record.update(
                    ok=all(v == v for v in losses) and sharded > 0,
                    losses=losses,
                    sharded_units=len(layers) + 1,
                    dtensor_parameters=sharded,
                )
            except Exception as exc:
                record.update(ok=False, error=_error(exc), trace=traceback.format_exc()[-1500:])
            _emit(record, sink)
            _free(device)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------------- time
def _reference_model(arch: str, shape: dict, length: int, folder: str):
    """transformers' model of the shape, saved to ``folder`` (ours loads the same weights from there)."""
    import torch
    import transformers

    torch.manual_seed(0)
    common = dict(  # noqa: C408
        vocab_size=shape["vocab"], hidden_size=shape["width"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], intermediate_size=shape["ffn"], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    if arch == "longformer":
        config = transformers.LongformerConfig(
            **common, attention_window=shape["window"], max_position_embeddings=length + 2, type_vocab_size=1
        )
        model = transformers.LongformerModel(config)
    elif arch == "big_bird":
        config = transformers.BigBirdConfig(
            **common, block_size=shape["block"], num_random_blocks=shape["random"], max_position_embeddings=length
        )
        model = transformers.BigBirdModel(config)
    else:
        config = transformers.ReformerConfig(
            vocab_size=shape["vocab"], hidden_size=shape["width"], num_attention_heads=shape["heads"],
            attention_head_size=shape["width"] // shape["heads"], feed_forward_size=shape["ffn"],
            attn_layers=["local", "lsh"] * (shape["layers"] // 2), local_attn_chunk_length=shape["chunk"],
            lsh_attn_chunk_length=shape["chunk"], num_hashes=2, num_buckets=shape["buckets"], hash_seed=0,
            axial_pos_embds=False, is_decoder=True, max_position_embeddings=length, hidden_dropout_prob=0.0,
            local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        model = transformers.ReformerModelWithLMHead(config)
    model.save_pretrained(folder)
    return model


def _dense_model(kind: str, shape: dict, length: int):
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(
            vocab_size=shape["vocab"], hidden_size=shape["width"], num_hidden_layers=shape["layers"],
            num_attention_heads=shape["heads"], intermediate_size=shape["ffn"], hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, max_position_embeddings=length,
        )  # fmt: skip
        return transformers.BertModel._from_config(config, attn_implementation="sdpa")
    config = transformers.LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["width"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["heads"], intermediate_size=shape["ffn"],
        max_position_embeddings=length,
    )  # fmt: skip
    return transformers.LlamaModel._from_config(config, attn_implementation="sdpa")


def _our_model(arch: str, folder: str, implementation: str):
    import tf_family

    if arch == "longformer":
        model = tf_family.TffLongformerModel.from_pretrained(folder)
    elif arch == "big_bird":
        model = tf_family.TffBigBirdModel.from_pretrained(folder)
    else:
        model = tf_family.TffReformerForCausalLM.from_pretrained(folder, chunk_wrap_around=False)
    model.set_attn_implementation(implementation)
    return model


def _step_fn(model, arch: str, length: int, vocab: int, device, dtype: str):
    import torch

    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(5, vocab, (1, length), generator=generator).to(device)
    inputs = {"input_ids": ids}
    if arch == "longformer":
        global_mask = torch.zeros_like(ids)
        global_mask[:, 0] = 1
        inputs["global_attention_mask"] = global_mask
    causal_lm = arch == "reformer"  # ours and transformers' Reformer with an LM head: the loss of the labels
    # the encoders: the mean square of a fixed projection of the last (layer-normed) hidden states
    probe = torch.randn(model.config.hidden_size, generator=generator).to(device)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        with _autocast(device, dtype):
            if causal_lm:
                loss = model(**inputs, labels=ids).loss
            else:
                hidden = model(**inputs).last_hidden_state
        if not causal_lm:  # in float32, outside autocast
            loss = (hidden.float() @ probe).pow(2).mean()
        loss.backward()
        return loss.detach()

    return step


def _time_cell(record: dict, build, arch: str, length: int, shape: dict, device, dtype: str, deadline, sink):
    import torch

    try:
        model = build().to(device)
        step = _step_fn(model, arch, length, shape["vocab"], device, dtype)
        _free(device)
        start = time.perf_counter()
        for index in range(shape["warmup"]):
            loss = step()
            if index == 0:  # the same weights and input in every cell of an architecture: the losses must agree
                record["first_loss"] = float(loss)
        _sync(device)
        record["warmup_s"] = time.perf_counter() - start
        times = []
        for _ in range(shape["repeats"]):
            if times and deadline.left() < 15:
                record["cut_by_budget"] = True
                break
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        record.update(
            ok=True,
            times_ms=[t * 1e3 for t in times],
            median_ms=statistics.median(times) * 1e3,
            min_ms=min(times) * 1e3,
        )
        if device.type == "cuda":
            record["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except Exception as exc:
        record.update(ok=False, error=_error(exc), oom=_is_oom(exc))
        if not _is_oom(exc):
            record["trace"] = traceback.format_exc()[-1500:]
    _emit(record, sink)
    model = step = None  # noqa: F841
    _free(device)


def section_time(device, deadline: Deadline, sink, dry_run: bool, arch: str, length: int, dtype: str) -> None:
    shape = _shapes(dry_run)
    base = {"section": "time", "arch": arch, "length": length, "dtype": dtype}
    if arch == "dense":
        for kind, label in (("bert", "dense_sdpa_bert"), ("llama", "dense_sdpa_llama_causal")):
            if deadline.left() < 15:
                return
            record = {**base, "impl": label}
            _time_cell(
                record, lambda kind=kind: _dense_model(kind, shape, length), kind, length, shape, device, dtype,
                deadline, sink,
            )  # fmt: skip
        return
    with tempfile.TemporaryDirectory() as folder:
        try:
            _reference_model(arch, shape, length, folder)
        except Exception as exc:
            _emit({**base, "impl": "setup", "ok": False, "error": _error(exc)}, sink)
            return
        cells = (
            ("tf_family_sdpa", lambda: _our_model(arch, folder, "sdpa")),
            ("tf_family_flex", lambda: _our_model(arch, folder, "flex_attention")),
            ("transformers", lambda: _load_reference(arch, folder)),
        )
        for label, build in cells:
            if deadline.left() < 15:
                return
            _time_cell({**base, "impl": label}, build, arch, length, shape, device, dtype, deadline, sink)


def _load_reference(arch: str, folder: str):
    import transformers

    cls = {
        "longformer": transformers.LongformerModel,
        "big_bird": transformers.BigBirdModel,
        "reformer": transformers.ReformerModelWithLMHead,
    }[arch]
    return cls.from_pretrained(folder)


# ----------------------------------------------------------------------------------------------------- worker
def worker(args) -> None:
    os.environ.setdefault("TF_FAMILY_NATIVE", "0")  # never build the CPU kernel here (and never on CUDA paths)
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    deadline = Deadline(args.deadline)
    with open(args.records, "a") as sink:
        for section in args.sections:
            if deadline.left() < 5:
                break
            kind, *rest = section.split(":")
            start = time.time()
            try:
                if kind == "smoke":
                    section_smoke(device, deadline, sink, args.dry_run)
                elif kind == "fsdp":
                    section_fsdp(device, deadline, sink, args.dry_run)
                elif kind == "flexcheck":
                    section_flexcheck(device, deadline, sink, args.dry_run)
                else:
                    arch, length, dtype = rest
                    section_time(device, deadline, sink, args.dry_run, arch, int(length), dtype)
            except Exception as exc:  # a section that fails before its cells: recorded, the next one runs
                _emit({"section": kind, "impl": section, "ok": False, "error": _error(exc)}, sink)
            print(f"section {section}: {time.time() - start:.1f} s", flush=True)


# ------------------------------------------------------------------------------------------------ orchestrator
def _sections(dry_run: bool) -> list[str]:
    """smoke and FSDP (fast), the bf16 timings, the flex check on tiny models (compiles), the float32 timings."""
    sections = ["smoke", "fsdp"]
    shape = _shapes(dry_run)
    for index, dtype in enumerate(shape["dtypes"]):
        if index == 1:
            sections.append("flexcheck")
        for length in shape["lengths"]:
            sections += [f"time:{arch}:{length}:{dtype}" for arch in (*SPARSE, "dense")]
    if "flexcheck" not in sections:
        sections.append("flexcheck")
    return sections


def _environment(device_name: str) -> dict:
    import torch
    import transformers

    try:  # a copy of the tree may come without git or .git
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "commit": commit or None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": device_name,
        "platform": platform.platform(),
    }


def _fmt(value, unit="") -> str:
    return "—" if value is None else f"{value:.1f}{unit}"


def markdown(payload: dict) -> str:
    env, records = payload["environment"], payload["records"]
    lines = [
        "# GPU check (`bench/gpu_check.sh`)",
        "",
        f"Device: {env['device']}; torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, "
        f"Python {env['python']}; commit `{env['commit']}`; {env['date_utc']} UTC; dry run: {payload['dry_run']}; "
        f"{payload['elapsed_s']:.0f} s of a {payload['budget_s']:.0f} s budget.",
        "",
        "## Every architecture, forward + backward (tiny variant)",
        "",
        "| architecture | float32 | bf16 autocast |",
        "|---|---|---|",
    ]
    smoke = {(r["arch"], r["dtype"]): r for r in records if r["section"] == "smoke" and "impl" not in r}
    for arch in dict.fromkeys(a for a, _ in smoke):
        cells = []
        for dtype in ("fp32", "bf16"):
            r = smoke.get((arch, dtype))
            cells.append("not run" if r is None else ("ok" if r["ok"] else f"FAILED: {r.get('error', '')[:80]}"))
        lines.append(f"| {arch} | {cells[0]} | {cells[1]} |")
    lines += ["", "## `flex_attention` against the default path on this device (float32, tiny models)", ""]
    lines += ["| architecture | ok | output rel. diff | largest gradient rel. diff |", "|---|---|---|---|"]
    for r in records:
        if r.get("impl") == "flex_vs_default":
            lines.append(
                f"| {r['arch']} | {'yes' if r['ok'] else 'NO: ' + r.get('error', '')[:80]} | "
                f"{r.get('output_rel_diff', float('nan')):.2e} | {r.get('max_grad_rel_diff', float('nan')):.2e} |"
            )
    lines += ["", "## FSDP2 (fully_shard, world size 1), two optimizer steps", ""]
    lines += ["| architecture | sharded | backend | ok | losses |", "|---|---|---|---|---|"]
    for r in records:
        if r["section"] == "fsdp" and "arch" in r:
            losses = ", ".join(f"{v:.4f}" for v in r.get("losses", []))
            status = "yes" if r["ok"] else "NO: " + r.get("error", "")[:80]
            units = "each layer + root" if r.get("units") == "layers" else "root only"
            lines.append(f"| {r['arch']} | {units} | {r.get('backend')} | {status} | {losses} |")
    shape = payload["shape"]
    lines += [
        "",
        "## Training step (forward + backward), median ms",
        "",
        f"Width {shape['width']}, {shape['layers']} layers, {shape['heads']} heads, batch 1; Longformer window "
        f"{shape['window']} (one global token), BigBird blocks of {shape['block']} with {shape['random']} random, "
        f"Reformer local + LSH layers (chunks of {shape['chunk']}, 2 hashes, {shape['buckets']} buckets, causal). "
        f"{shape['warmup']} warm-up steps (compiling included), median of up to {shape['repeats']}. Dense: "
        "transformers' BertModel (bidirectional) / LlamaModel (causal) with SDPA, same width and depth. The last "
        "column: relative difference of the first step's loss, flex against sdpa (same weights and input).",
        "",
        "| dtype | tokens | model | tf_family (sdpa) | tf_family (flex) | transformers | dense SDPA | "
        "transformers / best ours | dense / best ours | flex loss vs sdpa |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    timed = {(r["arch"], r["length"], r["dtype"], r["impl"]): r for r in records if r["section"] == "time"}

    def cell(key):
        r = timed.get(key)
        if r is None:
            return None, "not run"
        if not r["ok"]:
            return None, "OOM" if r.get("oom") else "failed"
        return r["median_ms"], f"{r['median_ms']:.1f}"

    for dtype in shape["dtypes"]:
        for length in shape["lengths"]:
            for arch in SPARSE:
                dense_impl = "dense_sdpa_llama_causal" if arch == "reformer" else "dense_sdpa_bert"
                values = [
                    cell((arch, length, dtype, impl)) for impl in ("tf_family_sdpa", "tf_family_flex", "transformers")
                ]
                dense = cell(("dense", length, dtype, dense_impl))
                ours = [v for v, _ in values[:2] if v is not None]
                best = min(ours) if ours else None
                ratio = f"{values[2][0] / best:.2f}x" if best and values[2][0] else "—"
                dense_ratio = f"{dense[0] / best:.2f}x" if best and dense[0] else "—"
                losses = [timed.get((arch, length, dtype, impl), {}).get("first_loss") for impl in
                          ("tf_family_sdpa", "tf_family_flex")]  # fmt: skip
                agree = f"{abs(losses[1] - losses[0]) / abs(losses[0]):.1e}" if None not in losses else "—"
                lines.append(
                    f"| {dtype} | {length} | {arch} | {values[0][1]} | {values[1][1]} | {values[2][1]} | {dense[1]} | "
                    f"{ratio} | {dense_ratio} | {agree} |"
                )
    failures = [r for r in records if not r.get("ok")]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            label = " ".join(str(r.get(k)) for k in ("section", "arch", "impl", "length", "dtype") if r.get(k))
            lines.append(f"- {label}: {r.get('error', '')[:300]}")
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu"), help="folder for the results")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes (CI)")
    parser.add_argument("--budget", type=float, default=None, help="seconds (default 450; dry run 240)")
    parser.add_argument("--sections", nargs="*", help="only these sections (smoke, fsdp, time:ARCH:LENGTH:DTYPE)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--records", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    started = time.time()
    budget = args.budget if args.budget is not None else (240.0 if args.dry_run else 450.0)
    if budget <= 0:
        parser.error(f"--budget must be > 0 seconds, got {budget}")
    deadline = started + budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records_path = out / "gpu_check.records.jsonl"
    records_path.write_text("")
    log_path = out / "gpu_check.log"
    sections = args.sections or _sections(args.dry_run)
    import torch

    device_name = "cpu (dry run)"
    if torch.cuda.is_available() and not args.dry_run:
        device_name = torch.cuda.get_device_name(0)
    elif not args.dry_run:
        print("no CUDA device: use --dry-run for the CPU check", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))}
    env.setdefault("TF_FAMILY_NATIVE", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the dry run's sections share one worker (imports are slow on a small CPU); on a GPU each has its own
    batches = [sections] if args.dry_run else [[s] for s in sections]
    skipped = []
    with open(log_path, "w") as log:
        for batch in batches:
            left = deadline - time.time()
            if left < 20:
                skipped += batch
                continue
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--records", str(records_path),
                       "--deadline", str(deadline - 5), "--sections", *batch]  # fmt: skip
            if args.dry_run:
                command.append("--dry-run")
            log.write(f"$ sections {' '.join(batch)}\n")
            log.flush()
            try:
                subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=left)
            except subprocess.TimeoutExpired:
                log.write(f"killed at the budget: {' '.join(batch)}\n")
                with open(records_path, "a") as sink:
                    _emit({"section": batch[0].split(":")[0], "impl": " ".join(batch), "ok": False,
                           "error": "killed at the time budget"}, sink)  # fmt: skip
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    payload = {
        "environment": _environment(device_name),
        "dry_run": args.dry_run,
        "budget_s": budget,
        "elapsed_s": time.time() - started,
        "shape": _shapes(args.dry_run),
        "sections": sections,
        "skipped_sections": skipped,
        "records": records,
    }
    _write_atomic(out / "gpu_check.json", json.dumps(payload, indent=1) + "\n")
    _write_atomic(out / "gpu_check.md", markdown(payload))
    records_path.unlink()
    print(f"wrote {out / 'gpu_check.json'}, {out / 'gpu_check.md'}, {log_path} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
