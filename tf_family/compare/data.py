"""The data a comparison shares: the bundled tokenizer, the held-out documents the perplexity measure reads (the
longest of the validation split, and of the test split for the bundled corpus), the filler text of the passkey task,
and the encoder tasks' files (the Long Range Arena's five, `tf_family.compare.lra`, and the Brown genres).
Generated files are written once per settings fingerprint under ``cache/data/``."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from . import lra

BROWN_TASK = "brown"
ENCODER_TASKS = (*lra.TASKS, BROWN_TASK)
# the metric names' prefixes: "ListOps accuracy" and "Brown genres accuracy" as before, the new tasks as LRA's
TASK_TITLES = {
    "listops": "ListOps",
    "text": "LRA Text",
    "retrieval": "LRA Retrieval",
    "image": "LRA Image",
    "pathfinder": "LRA Pathfinder",
    BROWN_TASK: "Brown genres",
}


@dataclass(frozen=True)
class TaskData:
    """One encoder task's data as the sequence-classification recipe reads it."""

    arguments: list[str]  # --train_file / --validation_file, or --dataset_name
    tokenizer: str | None  # --tokenizer_name (None: the bundled BPE)
    num_labels: int
    max_length: int  # tokens an example takes, <cls> and <sep> included
    validation_labels: list[int]


class GridData:
    """Tokenizer, held-out documents and task files of one grid (``folder``: the grid's cache)."""

    def __init__(self, folder: Path, settings: dict[str, Any], files: dict[str, str | None], seed: int):
        self.folder = folder
        self.settings = settings
        self.files = files  # train_file, validation_file, text_column (None: the bundled corpus)
        self.seed = seed
        self._held_out: list[list[int]] | None = None

    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        from ..data import SOTU_TOKENIZER_DIR

        return AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)

    @cached_property
    def _raw(self):
        from ..data import load_text_datasets

        files = self.files
        return load_text_datasets(
            "sotu", None, files["train_file"], files["validation_file"], files["text_column"], 5, None
        )

    def unigram_log_probs(self):
        """Log-probabilities of the add-one unigram model of the training documents' tokens (as the causal-LM
        recipe's ``unigram perplexity``): the reference level of the perplexity measure."""
        import torch

        raw, column = self._raw
        texts = list(raw["train"][column])[: self.settings["train_docs"] or None]  # the documents the models read
        counts = torch.ones(len(self.tokenizer), dtype=torch.float64)
        for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]:
            counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=len(counts)).double()
        return (counts / counts.sum()).log()

    def held_out(self) -> list[list[int]]:
        """Token ids of the held-out documents, longest first."""
        if self._held_out is None:
            from datasets import concatenate_datasets

            raw, column = self._raw
            held = [raw[s] for s in ("validation", "test") if s in raw]
            texts = concatenate_datasets(held)[column] if len(held) > 1 else held[0][column]
            ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            self._held_out = sorted(ids, key=len, reverse=True)
        return self._held_out

    def eval_documents(self) -> list[list[int]]:
        docs = self.held_out()[: self.settings["eval_docs"]]
        length = min(self.settings["eval_length"], min(len(d) for d in docs) - 1)
        if length < 2 * self.settings["block"]:
            raise ValueError(
                f"the held-out documents are too short for the perplexity measure ({length + 1} tokens in the "
                f"shortest of the {len(docs)} longest); pass a --validation_file with longer documents."
            )
        return [d[: length + 1] for d in docs]

    def filler(self) -> list[int]:
        return [t for doc in self.held_out() for t in doc]

    def recipe_arguments(self) -> list[str]:
        """The causal-LM recipe's data options for these files (none: the bundled corpus)."""
        data = []
        for name in ("train_file", "validation_file", "text_column"):
            if self.files.get(name):
                data += [f"--{name}", self.files[name]]
        return data

    # ---- encoder tasks -------------------------------------------------------------------------------------------
    def char_tokenizer_folder(self) -> Path:
        folder = self.folder / "data" / "char-tokenizer"
        if not (folder / "tokenizer.json").exists():
            lra.char_tokenizer(folder)
        return folder

    def task(self, task: str) -> TaskData:
        """The files, tokenizer and length of encoder ``task`` (generated on first use)."""
        if task == BROWN_TASK:
            from ..data import load_brown

            labels = list(load_brown()["validation"]["genre"])
            return TaskData(["--dataset_name", "brown"], None, 15, self.settings["brown_max_length"], labels)
        if task not in lra.TASKS:
            raise ValueError(f"unknown encoder task {task!r}; choose from {ENCODER_TASKS}.")
        folder = self.folder / "data"
        train, validation = folder / f"{task}-train.jsonl", folder / f"{task}-validation.jsonl"
        if not validation.exists():
            folder.mkdir(parents=True, exist_ok=True)
            for path, count, split in (
                (train, self.settings["task_train"], "train"),
                (validation, self.settings["task_eval"], "validation"),
            ):
                examples = lra.generate(task, count, self.seed, self.settings, split)
                partial = path.with_suffix(".partial")
                partial.write_text("".join(json.dumps(e) + "\n" for e in examples))
                partial.replace(path)
        labels = [json.loads(line)["label"] for line in validation.read_text().splitlines() if line.strip()]
        return TaskData(
            ["--train_file", str(train), "--validation_file", str(validation)],
            str(self.char_tokenizer_folder()),
            lra.NUM_LABELS[task],
            lra.input_length(task, self.settings),
            labels,
        )


def majority_rate(labels: list[int]) -> float:
    """The accuracy of always answering the most frequent label: the floor a classifier must beat."""
    return Counter(labels).most_common(1)[0][1] / len(labels)


__all__ = ["BROWN_TASK", "ENCODER_TASKS", "TASK_TITLES", "GridData", "TaskData", "majority_rate"]
