"""Training the contestants with the existing recipes: the causal models with ``recipes/causal_lm.py`` (the kNN-LM
with ``recipes/knn_lm.py`` on the trained baseline), the encoders with ``recipes/sequence_classification.py``.

Equal work: every causal model takes the same optimizer steps of the same ``batch`` x ``block`` tokens. A model that
carries a memory reads its streams in segments of ``segment`` tokens, ``block // segment`` micro-batches accumulated
per step with its memory carried from one to the next, so it sees as many tokens in as many steps as the others.
Each function takes the `tf_family.compare.grid.Grid` the cell belongs to and returns result rows
(`tf_family.compare.rows.row`) for one model and one seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .models import (
    BASELINE,
    ENCODER_BASELINE,
    count_parameters,
    family_parameters,
    flags,
    median,
    override_arguments,
    save_dense_baseline,
    save_roberta_baseline,
)
from .rows import row


def micro_batches(grid, memory: bool) -> tuple[int, int]:
    """(tokens per micro-batch row, micro-batches per optimizer step) for a model with or without memory."""
    block, segment = grid.settings["block"], grid.settings["segment"]
    if not memory:
        return block, 1
    if block % segment:
        raise ValueError(f"block {block} must be a multiple of segment {segment} (memory models read it in segments).")
    return segment, block // segment


def optimizer_steps(grid, build: Callable[[], Any], memory: bool) -> int:
    """The steps of the run's budget: ``steps`` (or ``--tokens`` worth), or what fits ``--minutes`` (timed on two
    steps of a fresh model)."""
    settings = grid.settings
    if settings["minutes"] is None:
        return settings["steps"]
    import torch

    length, accumulation = micro_batches(grid, memory)
    probe = build().to(settings["device"]).train()
    optimizer = torch.optim.AdamW(probe.parameters(), lr=1e-4)
    ids = torch.randint(1, len(grid.data.tokenizer), (settings["batch"], length), device=settings["device"])
    times = []
    for _ in range(2):
        started = time.perf_counter()
        for _ in range(accumulation):
            probe(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - started)
    return max(1, int(settings["minutes"] * 60 / times[-1]))


def causal_recipe(grid, model: str, seed: int, source: list[str], memory: bool, build) -> list[dict]:
    from ..recipes import causal_lm

    settings = grid.settings
    length, accumulation = micro_batches(grid, memory)
    steps = optimizer_steps(grid, build, memory)
    options = {
        "--block_size": length,
        "--per_device_train_batch_size": settings["batch"],
        "--gradient_accumulation_steps": accumulation,
        "--max_train_steps": steps,
        "--learning_rate": settings["learning_rate"],
        "--num_warmup_steps": max(1, steps // 20),
        "--seed": seed,
        "--max_eval_samples": settings["eval_docs"],
        "--output_dir": grid.folder(model, seed),
        "--logging_steps": max(1, steps),
    }
    argv = [*source, *grid.data.recipe_arguments(), *grid.device_arguments(), *flags(options)]
    argv.append("--overwrite_output_dir")
    if settings["train_docs"]:
        argv += ["--max_train_samples", str(settings["train_docs"])]
    started = time.perf_counter()
    with grid.logged(f"train-{model}-{seed}"):
        summary = causal_lm.main(argv)
    seconds = time.perf_counter() - started
    tokens = steps * settings["batch"] * settings["block"]
    parameters = count_parameters(grid.load(model, seed))
    setting = f"block {settings['block']}" + (f" in {accumulation} segments of {length}" if memory else "")
    rows = [
        row("causal", model, "parameters", parameters),
        row("causal", model, "training tokens", tokens, setting=setting),
        row("causal", model, "optimizer steps", steps),
        row("causal", model, "training time", seconds, "s"),
        row("causal", model, "recipe tokens/s", tokens / seconds, "tokens/s"),
    ]
    if "perplexity" in summary:
        rows.append(row("causal", model, "validation perplexity", summary["perplexity"]))
    if "unigram_perplexity" in summary:
        rows.append(row("causal", model, "unigram perplexity", summary["unigram_perplexity"]))
    return [{**r, "seed": seed} for r in rows]


def train_causal(grid, model: str, seed: int) -> list[dict]:
    """Train ``model`` (the dense baseline, the kNN-LM or a registry architecture) for the run's budget."""
    from ..registry import get_arch

    if model == BASELINE:
        folder = grid.cache / f"baseline-init-{seed}"
        vocab = len(grid.data.tokenizer)
        counts = family_parameters(grid.causal_models(), grid.shape, vocab, grid.settings["config_overrides"])
        with grid.logged(f"baseline-init-{seed}"):
            save_dense_baseline(folder, grid.shape, median(counts.values()), seed)

        def build():
            from transformers import AutoModelForCausalLM

            return AutoModelForCausalLM.from_pretrained(folder)

        return causal_recipe(grid, model, seed, ["--model_name_or_path", str(folder)], False, build)
    spec = get_arch(model)
    if grid.wraps_baseline(model):
        return train_knn_lm(grid, model, seed)
    overrides = grid.overrides(model)

    def build():
        config = spec.make_config("tiny", vocab_size=len(grid.data.tokenizer), **overrides)
        return spec.model_classes["causal_lm"](config)

    source = ["--arch", model, "--variant", "tiny", "--config_overrides", *override_arguments(overrides)]
    return causal_recipe(grid, model, seed, source, spec.carried_state is not None, build)


def train_knn_lm(grid, model: str, seed: int) -> list[dict]:
    """The trained baseline plus a datastore of its keys over the first training tokens (``recipes/knn_lm.py``
    ``build``), then λ and k picked on validation (``eval``), saved as a kNN-LM."""
    from ..recipes import knn_lm

    settings = grid.settings
    datastore = grid.cache / f"datastore-{seed}"
    baseline = str(grid.folder(BASELINE, seed))
    common = [*grid.data.recipe_arguments(), *grid.device_arguments(), "--block_size", str(settings["block"])]
    tokens_per_doc = 8_000  # SOTU addresses: about 7.5k tokens each; the datastore stops at the budget
    docs = str(max(1, settings["datastore_tokens"] // tokens_per_doc))
    started = time.perf_counter()
    with grid.logged(f"train-{model}-{seed}"):
        build = ["build", "--model_name_or_path", baseline, "--output_dir", str(datastore), "--overwrite_output_dir"]
        knn_lm.main([*build, "--max_samples", docs, *common])
        options = {
            "--model_name_or_path": baseline,
            "--datastore": datastore,
            "--output_dir": grid.folder(model, seed),
            "--max_samples": settings["eval_docs"],
        }
        searched = ["--lmbdas", "0.1", "0.25", "0.5", "--ks", "8", "32"]
        result = knn_lm.main(["eval", *flags(options), "--overwrite_output_dir", *searched, *common])
    seconds = time.perf_counter() - started
    best = result["best"]
    rows = [
        row("causal", model, "parameters", count_parameters(grid.load(model, seed))),
        row("causal", model, "datastore build and λ, k search time", seconds, "s"),
    ]
    perplexity = result["validation_knn"]["perplexity"]
    rows.append(row("causal", model, "validation perplexity", perplexity, setting=f"λ {best['lmbda']}, k {best['k']}"))
    return [{**r, "seed": seed} for r in rows]


def train_encoder(grid, model: str, task: str, seed: int) -> list[dict]:
    """Train ``model`` on encoder ``task`` with the sequence-classification recipe: accuracy against the majority
    class, training time, steps and tokens."""
    from ..recipes import sequence_classification
    from ..registry import get_arch
    from .data import TASK_TITLES, majority_rate

    settings = grid.settings
    data = grid.data.task(task)
    length = data.max_length
    name = f"{model}-{task}"
    tokenizer = ["--tokenizer_name", data.tokenizer] if data.tokenizer else []
    if model == ENCODER_BASELINE:
        init = grid.cache / f"roberta-init-{task}-{seed}"
        with grid.logged(f"roberta-init-{task}-{seed}"):
            save_roberta_baseline(init, grid.shape, data.num_labels, length, seed, data.tokenizer)
        source = ["--model_name_or_path", str(init)]
    else:
        overrides = grid.overrides(model)
        variant = get_arch(model).task_variants.get("sequence_classification", "tiny")  # a head that needs its own
        source = ["--arch", model, "--variant", variant, "--config_overrides", *override_arguments(overrides)]
        source += tokenizer
    steps, batch = settings["encoder_steps"], settings["encoder_batch"]
    options = {
        "--max_length": length,
        "--per_device_train_batch_size": batch,
        "--max_train_steps": steps,
        "--learning_rate": settings["encoder_learning_rate"],
        "--num_warmup_steps": max(1, steps // 10),
        "--seed": seed,
        "--output_dir": grid.folder(name, seed),
        "--max_eval_samples": 0,
    }
    argv = [*source, *data.arguments, *grid.device_arguments(), *flags(options), "--overwrite_output_dir"]
    started = time.perf_counter()
    with grid.logged(f"train-{name}-{seed}"):
        metrics = sequence_classification.main(argv)
    seconds = time.perf_counter() - started
    title = TASK_TITLES[task]
    accuracy = metrics.get("eval_accuracy", metrics.get("accuracy"))
    rows = [
        row("encoder", model, f"{title} accuracy", accuracy, setting=f"max length {length}"),
        row("encoder", model, f"{title} training time", seconds, "s", f"{steps} steps"),
        row("encoder", model, f"{title} training tokens", steps * batch * length, setting="padded to max length"),
        row("encoder", model, f"{title} majority-class accuracy", majority_rate(data.validation_labels)),
    ]
    if "eval_macro_f1" in metrics:
        rows.append(row("encoder", model, f"{title} macro-F1", metrics["eval_macro_f1"]))
    return [{**r, "seed": seed} for r in rows]


__all__ = ["causal_recipe", "micro_batches", "optimizer_steps", "train_causal", "train_encoder", "train_knn_lm"]
