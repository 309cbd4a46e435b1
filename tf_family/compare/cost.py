"""What a model costs: training tokens/s and peak memory against sequence length, decoding tokens/s and peak memory
after prompts of several lengths. Run in a child process per model (``python -m tf_family.compare.cost SPEC OUT``),
so that the peak memory measured is that model's alone and a model that exhausts the machine ends its own process,
not the grid: the parent records the length it was on as out of memory.

One training step at length ``L`` is a forward and backward pass over ``L`` tokens (batch 1) the way the model
trains: a model that carries a memory reads them in segments, the memory carried; the others read one block of
``L``. Each length runs one warm-up step, then up to three timed ones (while they take under a tenth of the step limit
together); the fastest counts (the least disturbed by other work on the machine). Peak memory: on CUDA, the allocator's peak; on CPU, the
rise of the process's peak resident set (reset before each length, ``/proc/self/clear_refs``) over its size once the
model was loaded. Each result is written as one JSON line as soon as it is known.

`cost_rows` is the grid's side: it writes the job, starts the child and turns its lines into result rows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from .rows import row

OUT_OF_MEMORY = "out of memory"


def _status_mb(field: str) -> float:
    """A ``/proc/self/status`` size (``VmRSS``: resident now, ``VmHWM``: its peak) in MiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise ValueError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset the process's peak resident set to its current size (Linux >= 4.0); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _is_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return (
        isinstance(error, MemoryError | torch.OutOfMemoryError)
        or "out of memory" in text
        or ("allocate" in text and "bytes" in text)
    )


class _Meter:
    """Peak memory of one measurement: on CUDA the allocator's peak; on CPU the peak resident set (reset before
    the measurement) above the resident set once the model was loaded."""

    def __init__(self, device: torch.device):
        self.device = device
        self.base = _status_mb("VmRSS")

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        if not _reset_peak():
            raise RuntimeError("cannot reset the peak resident set (/proc/self/clear_refs): CPU peak memory unknown")

    def peak(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        return max(0.0, _status_mb("VmHWM") - self.base)


def _train_step(model, length: int, spec: dict, device) -> None:
    from ..training.language_modeling import start_memory
    from .models import has_memory

    ids = torch.randint(1, min(spec["vocab_size"], model.config.vocab_size), (1, length), device=device)
    if spec["task"] == "sequence_classification":
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.zeros(1, dtype=torch.long))
        out.loss.backward()
    elif has_memory(model):
        memory = start_memory(model, 1, length)
        for start in range(0, length, spec["segment"]):
            out = model(input_ids=ids[:, start : start + spec["segment"]], mems=memory, labels=None)
            out.logits.float().logsumexp(-1).mean().backward()
            memory = out.mems
    else:
        out = model(input_ids=ids)
        out.logits.float().logsumexp(-1).mean().backward()
    model.zero_grad(set_to_none=True)


def _decode(model, prompt: int, new_tokens: int, spec: dict, device) -> float | None:
    """Tokens/s of greedy decoding after a ``prompt``-token prompt: the time of ``new_tokens`` generated tokens less
    that of one (the prompt's forward pass), each the fastest of two runs; None when the difference is lost in
    timing noise."""
    ids = torch.randint(1, min(spec["vocab_size"], model.config.vocab_size), (1, prompt), device=device)
    kwargs = {"do_sample": False, "pad_token_id": spec["pad_token_id"], "attention_mask": torch.ones_like(ids)}
    times = {}
    with torch.no_grad():
        for count in (1, new_tokens):
            runs = []
            for _ in range(2):
                started = time.perf_counter()
                model.generate(ids, max_new_tokens=count, min_new_tokens=count, **kwargs)
                runs.append(time.perf_counter() - started)
            times[count] = min(runs)
    decoding = times[new_tokens] - times[1]
    return (new_tokens - 1) / decoding if decoding > 0 else None


def run(spec: dict, out: Path) -> None:
    """Measure the model of ``spec["folder"]`` at each of ``spec["lengths"]`` (and ``spec["prompts"]``); append
    one JSON line per result to ``out``."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import tf_family  # noqa: F401  (registers the architectures with the Auto classes)

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    device = torch.device(spec["device"])
    auto = AutoModelForSequenceClassification if spec["task"] == "sequence_classification" else AutoModelForCausalLM
    model = auto.from_pretrained(spec["folder"]).to(device)
    meter = _Meter(device)

    def write(record: dict) -> None:
        with open(out, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    model.train()
    for length in spec["lengths"]:
        try:
            meter.start()
            _train_step(model, length, spec, device)  # warm-up
            times: list[float] = []
            while len(times) < 3 and sum(times) < spec["step_limit_s"] / 10:  # the fastest of up to 3 steps
                started = time.perf_counter()
                _train_step(model, length, spec, device)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            seconds = min(times)
        except Exception as error:  # out of memory is a result; anything else is the cell's error
            if not _is_out_of_memory(error):
                raise
            write({"kind": "train", "length": length, "status": OUT_OF_MEMORY})
            break
        write({"kind": "train", "length": length, "tokens_per_second": length / seconds, "peak_mb": meter.peak()})
        if seconds > spec["step_limit_s"]:
            break  # longer lengths would take longer still: the parent records them as skipped
    model.eval()
    for prompt in spec.get("prompts", []):
        try:
            meter.start()
            speed = _decode(model, prompt, spec["new_tokens"], spec, device)
        except Exception as error:
            if not _is_out_of_memory(error):
                raise
            write({"kind": "decode", "length": prompt, "status": OUT_OF_MEMORY})
            break
        if speed is None:
            write({"kind": "decode", "length": prompt, "status": "unmeasured: lost in timing noise"})
            continue
        write({"kind": "decode", "length": prompt, "tokens_per_second": speed, "peak_mb": meter.peak()})


NAMES = {"train": ("training", "sequence length"), "decode": ("decoding", "prompt")}


def _run_child(job: dict, spec_file: Path) -> tuple[list[dict], subprocess.CompletedProcess]:
    out = spec_file.with_suffix(".jsonl")
    spec_file.parent.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(json.dumps(job))
    out.unlink(missing_ok=True)
    out.touch()
    process = subprocess.run(
        [sys.executable, "-m", "tf_family.compare.cost", str(spec_file), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()], process


def cost_rows(grid, model: str, folder: Path, task: str, lengths: list[int], section: str) -> list[dict]:
    """Training (and, for a causal model, decoding) cost of the model saved in ``folder``, measured in a child
    process; a length the process died on is recorded as out of memory, the lengths after it as not measured."""
    settings = grid.settings
    job = {
        "folder": str(folder),
        "task": task,
        "device": settings["device"],
        "vocab_size": len(grid.data.tokenizer),
        "segment": settings["segment"],
        "step_limit_s": settings["step_limit_s"],
        "new_tokens": settings["new_tokens"],
        "pad_token_id": grid.data.tokenizer.eos_token_id,
        "lengths": lengths,
        "prompts": settings["decode_prompts"] if task == "causal_lm" else [],
    }
    records, process = _run_child(job, grid.cache / "logs" / f"cost-{folder.name}-{task}.json")
    wanted = [("train", n) for n in job["lengths"]] + [("decode", n) for n in job["prompts"]]
    done = {(r["kind"], r["length"]) for r in records}
    if process.returncode != 0:
        killed = process.returncode < 0 or process.returncode == 137
        pending = [w for w in wanted if w not in done]
        if killed and pending:  # the kernel ended it (out of memory) at the first measurement not written
            records.append({"kind": pending[0][0], "length": pending[0][1], "status": OUT_OF_MEMORY})
            done.add(pending[0])
        else:
            tail = process.stderr.strip().splitlines()[-1:] or [f"exit status {process.returncode}"]
            raise RuntimeError(f"the cost measurement failed: {tail[0]}")
    rows = []
    for record in records:
        name, what = NAMES[record["kind"]]
        setting = f"{what} {record['length']}"
        if "status" in record:
            rows.append(row(section, model, f"{name} tokens/s", None, "tokens/s", setting, status=record["status"]))
            continue
        rows.append(row(section, model, f"{name} tokens/s", record["tokens_per_second"], "tokens/s", setting))
        rows.append(row(section, model, f"{name} peak memory", record["peak_mb"], "MiB", setting))
    stopped = {kind for kind, _ in done}
    for kind, length in wanted:
        if (kind, length) not in done:
            name, what = NAMES[kind]
            why = (
                f"skipped: a shorter length took over {settings['step_limit_s']} s"
                if kind in stopped
                else "not measured: the measurement before it ended the process"
            )
            rows.append(row(section, model, f"{name} tokens/s", None, "tokens/s", f"{what} {length}", status=why))
    return rows


if __name__ == "__main__":
    run(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
