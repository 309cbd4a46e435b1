"""The grid's named settings: ``--quick`` (CPU, a quarter of an hour: a stated subset of the family), the default
grid (CPU, about an hour: the whole family at ``--quick``'s shape) and ``--device cuda`` (one GPU, minutes: base
width, long sequences). Every key can be changed with ``--set KEY=VALUE``; `tf_family.compare.cli.parse_settings` checks them.

Passkey: every model is trained on the task at the scored distances (``passkey_distances``) that lie inside the dense
baseline's window (``passkey_train="window"``: up to ``block`` tokens) or at all of them (``"all"``), and scored at
every one. ``--quick`` trains inside the window: a sample whose key lies beyond a model's sight teaches it nothing but
the digits' frequencies (the probes behind this choice: ``docs/guides/comparing.md``, Budgets). Memory models still
learn to read their memory there (a key 96 tokens back lies in an earlier segment of 64).

Equal work per model: every causal model takes ``steps`` optimizer steps of ``batch`` x ``block`` tokens. A model
that carries a memory reads each block in segments of ``segment`` tokens with its memory carried (``block //
segment`` accumulated micro-batches per step), so it sees the same tokens in the same number of steps.
"""

from __future__ import annotations

from typing import Any

_CAUSAL_QUICK: dict[str, Any] = {
    "width": 64,
    "depth": 2,
    "heads": 2,
    "ffn": 128,
    "segment": 64,
    "block": 128,
    "batch": 8,
    "steps": 150,
    "learning_rate": 3e-3,
    "eval_docs": 2,
    "eval_length": 1024,
    "first_bucket": 128,
    "train_docs": None,
    "seeds": [42, 43],
    "passkey_distances": [16, 96, 320],
    "passkey_train": "window",
    "passkey_steps": 700,
    "passkey_batch": 8,
    "passkey_eval_samples": 32,
    "passkey_learning_rate": 2e-3,
    "passkey_seeds": 1,
    "train_lengths": [256, 1024],
    "decode_prompts": [256],
    "new_tokens": 8,
    "step_limit_s": 20.0,
    "knn_memory": 1024,
    "datastore_tokens": 100_000,
}

_ENCODER_QUICK: dict[str, Any] = {
    "encoder_steps": 100,
    "encoder_batch": 16,
    "encoder_learning_rate": 2e-3,
    "encoder_seeds": [42],
    "task_train": 1200,
    "task_eval": 200,
    "listops_words": [8, 40],
    "listops_max_depth": 3,
    "task_length": 256,
    "image_side": 16,
    "pathfinder_side": 16,
    "brown_max_length": 256,
    "encoder_tasks": ["listops", "text"],
    "quick_encoders": 3,
}

QUICK: dict[str, Any] = {**_CAUSAL_QUICK, **_ENCODER_QUICK, "subset": True}

# the base of the one-GPU grid: LRA's lengths, lengths up to 16k, the whole family (about 90 hours on 2 CPU cores)
_LONG: dict[str, Any] = {
    **QUICK,
    "width": 256,
    "depth": 4,
    "heads": 4,
    "ffn": 1024,
    "segment": 128,
    "block": 512,
    "steps": 2000,
    "learning_rate": 1e-3,
    "eval_docs": 4,
    "eval_length": 16384,
    "first_bucket": 512,
    "seeds": [42, 43],
    "passkey_distances": [64, 256, 1024, 4096],
    "passkey_train": "all",
    "passkey_steps": 600,
    "passkey_eval_samples": 64,
    "passkey_learning_rate": 5e-4,
    "passkey_seeds": 2,
    "train_lengths": [512, 1024, 2048, 4096, 8192, 16384],
    "decode_prompts": [512, 2048, 8192],
    "new_tokens": 32,
    "step_limit_s": 120.0,
    "knn_memory": 8192,
    "datastore_tokens": 500_000,
    "encoder_steps": 1000,
    "encoder_learning_rate": 5e-4,
    "encoder_seeds": [42, 43],
    "task_train": 5000,
    "task_eval": 500,
    "listops_words": [50, 400],
    "listops_max_depth": 6,
    "task_length": 1024,
    "image_side": 32,
    "pathfinder_side": 32,
    "brown_max_length": 1024,
    "encoder_tasks": ["listops", "text", "retrieval", "image", "pathfinder", "brown"],
    "subset": False,
}

# the default grid on CPU: the whole family and all six encoder tasks at --quick's shape, two seeds everywhere but
# passkey; sized for about an hour with two processes on 2 CPU cores (docs/guides/comparing.md, Budgets)
DEFAULT: dict[str, Any] = {
    **QUICK,
    "encoder_seeds": [42, 43],
    "encoder_tasks": ["listops", "text", "retrieval", "image", "pathfinder", "brown"],
    "subset": False,
}

# one GPU (an H100 or H200): base width, LRA's lengths (1k-4k characters) for the encoders, 4k-16k tokens for cost.
# Sized by arithmetic for about 8 minutes (a few seconds of matrix work per model and seed; the memory models' segment
# loops and the recipes' start-up dominate), not yet timed on a GPU.
GPU: dict[str, Any] = {
    **_LONG,
    "width": 512,
    "depth": 4,
    "heads": 8,
    "ffn": 2048,
    "segment": 256,
    "block": 1024,
    "batch": 8,
    "steps": 300,
    "learning_rate": 1e-3,
    "eval_length": 16384,
    "passkey_distances": [256, 768, 4096],
    "passkey_steps": 200,
    "passkey_batch": 8,
    "train_lengths": [4096, 8192, 16384],
    "decode_prompts": [4096, 16384],
    "step_limit_s": 30.0,
    "knn_memory": 16384,
    "encoder_steps": 400,
    "encoder_batch": 32,
    "task_train": 12800,
    "task_eval": 1000,
    "listops_words": [100, 400],
    "listops_max_depth": 10,
    "task_length": 2048,
    "image_side": 32,
    "pathfinder_side": 32,
    "brown_max_length": 4096,
}


def passkey_train_distances(settings: dict) -> list[int]:
    """The distances the passkey task trains at (``passkey_train``: inside the dense baseline's window, or all)."""
    distances = settings["passkey_distances"]
    if settings["passkey_train"] == "window":
        return [d for d in distances if d <= settings["block"]]
    return list(distances)


PRESETS = {"quick": QUICK, "default": DEFAULT, "gpu": GPU}

__all__ = ["DEFAULT", "GPU", "PRESETS", "QUICK", "passkey_train_distances"]
