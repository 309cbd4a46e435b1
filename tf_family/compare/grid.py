"""`tf-family compare`: the family side by side on one corpus, against dense baselines, in one command.

    tf-family compare --quick                                  # all seven causal models + baseline, small lengths
    tf-family compare --archs transfo_xl memorizing --tokens 2000000 --output_dir runs/compare
    python -m tf_family.compare --train_file my.txt --validation_file held_out.txt --minutes 5

Reads top to bottom: arguments and settings -> the grid of cells (one model x one measurement each) -> run every
cell not already cached, with a progress bar and ETA over the whole grid -> the report (`tf_family.compare.report`).

Who: the causal architectures (``--archs``, default all seven), each built with one shared shape (width, depth,
heads, feed-forward width; `tf_family.compare.models`) and trained by the causal-LM recipe (``recipes/causal_lm.py``)
on the same data with the same token budget (``--tokens``, or ``--minutes`` per model) and seed, and a dense baseline,
transformers' ``LlamaForCausalLM`` with SDPA, of the same width and depth, its feed-forward width chosen so that its
parameter count is nearest the family's median. The kNN-LM is that baseline's trained weights plus a datastore of
training tokens (``recipes/knn_lm.py``: the paper's setting, a retrieval layer on a trained LM). Encoders
(``--encoders``: Longformer, BigBird, Reformer, and transformers' RoBERTa as their dense baseline) are trained by the
sequence-classification recipe on ListOps (generated offline, `tf_family.compare.listops`) and on the Brown genres.

Every cell's result is cached under ``OUTPUT_DIR/cache/<settings fingerprint>/``: a rerun with the same settings
resumes where the last one stopped; a cell that fails is recorded with its error (and tried again on the next run)
while the others run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import (
    BASELINE,
    CAUSAL_ARCHS,
    ENCODER_ARCHS,
    ENCODER_BASELINE,
    Shape,
    arch_overrides,
    family_parameters,
    median,
    override_arguments,
    save_dense_baseline,
    save_roberta_baseline,
)

# ------------------------------------------------------------------------------------------------------- settings
QUICK = {
    "width": 64, "depth": 2, "heads": 2, "ffn": 128, "segment": 64, "block": 256, "batch": 8, "tokens": 32_768,
    "learning_rate": 2e-3, "eval_docs": 2, "eval_length": 2048, "first_bucket": 128,
    "passkey_distances": [64, 256, 1024], "passkey_steps": 12, "passkey_batch": 4, "passkey_eval_samples": 12,
    "passkey_learning_rate": 1e-3, "train_lengths": [256, 512, 1024, 2048], "decode_prompts": [256, 1024],
    "new_tokens": 8, "step_limit_s": 30.0, "knn_memory": 1024, "datastore_tokens": 30_000, "encoder_steps": 20,
    "encoder_batch": 8, "encoder_learning_rate": 1e-3, "listops_train": 160, "listops_eval": 60,
    "listops_words": [10, 100], "listops_max_length": 256, "brown_max_length": 256, "train_docs": 40,
}  # fmt: skip
DEFAULT = {
    "width": 256, "depth": 4, "heads": 4, "ffn": 1024, "segment": 128, "block": 512, "batch": 8,
    "tokens": 1_000_000, "learning_rate": 1e-3, "eval_docs": 4, "eval_length": 16384, "first_bucket": 512,
    "passkey_distances": [64, 256, 1024, 4096, 8192], "passkey_steps": 200, "passkey_batch": 8,
    "passkey_eval_samples": 32, "passkey_learning_rate": 5e-4,
    "train_lengths": [512, 1024, 2048, 4096, 8192, 16384], "decode_prompts": [512, 2048, 8192], "new_tokens": 32,
    "step_limit_s": 120.0, "knn_memory": 8192, "datastore_tokens": 200_000, "encoder_steps": 300,
    "encoder_batch": 8, "encoder_learning_rate": 5e-4, "listops_train": 2000, "listops_eval": 500,
    "listops_words": [100, 1000], "listops_max_length": 2048, "brown_max_length": 4096, "train_docs": None,
}  # fmt: skip
MEASURES = ("perplexity", "passkey", "cost")
ENCODER_TASKS = ("listops", "brown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tf-family compare",
        description="The family side by side on one corpus against dense baselines: perplexity by position, "
        "passkey retrieval, training and decoding cost, encoders on ListOps and Brown genres.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes and lengths (about 15 min on 2 CPU cores)")
    parser.add_argument(
        "--archs", nargs="*", default=list(CAUSAL_ARCHS), help=f"causal models, of {CAUSAL_ARCHS} (none: skip)"
    )
    parser.add_argument(
        "--encoders", nargs="*", default=list(ENCODER_ARCHS), help=f"encoders, of {ENCODER_ARCHS} (none: skip)"
    )
    parser.add_argument("--no_baseline", action="store_true", help="leave the dense baselines out")
    parser.add_argument("--measures", nargs="+", default=list(MEASURES), choices=MEASURES)
    parser.add_argument("--encoder_tasks", nargs="*", default=list(ENCODER_TASKS), choices=ENCODER_TASKS)
    parser.add_argument("--tokens", type=int, help="training tokens per causal model (the same for each)")
    parser.add_argument("--minutes", type=float, help="training minutes per causal model instead of --tokens")
    parser.add_argument("--train_file", help="training text (.txt/.json/.jsonl/.csv/.parquet; default: bundled SOTU)")
    parser.add_argument("--validation_file", help="held-out text: its longest documents are the perplexity set")
    parser.add_argument("--text_column")
    parser.add_argument("--output_dir", default="runs/compare", help="report, tables, plots and the cell cache")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is present")
    parser.add_argument(
        "--report_only",
        action="store_true",
        help="write the report from the cells cached so far, running none (e.g. while another run fills the grid)",
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help=f"change a setting of the grid (JSON values), e.g. width=128 'train_lengths=[512,1024]'; keys: "
        f"{sorted(QUICK)}",
    )
    parser.add_argument(
        "--config_overrides",
        nargs="*",
        default=[],
        metavar="ARCH:KEY=VALUE",
        help="a config field of one architecture, e.g. longformer:attention_window=64",
    )
    return parser


def parse_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The grid's settings: the preset, ``--set``, ``--tokens``/``--minutes``; refuses what cannot run."""
    settings = dict(QUICK if args.quick else DEFAULT)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in settings:
            raise ValueError(f"--set {item!r}: use KEY=VALUE with KEY one of {sorted(settings)}.")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(f"--set {item!r}: the value must be JSON (a number, a list, a quoted string).") from None
    if args.tokens is not None and args.minutes is not None:
        raise ValueError("--tokens and --minutes both set the training budget; pass one of them.")
    if args.tokens is not None:
        settings["tokens"] = args.tokens
    settings["minutes"] = args.minutes
    for name in ("tokens", "batch", "segment", "block", "width", "depth", "heads", "eval_docs"):
        if not isinstance(settings[name], int) or settings[name] < 1:
            raise ValueError(f"setting {name}={settings[name]!r} must be a positive integer.")
    if args.minutes is not None and args.minutes <= 0:
        raise ValueError(f"--minutes={args.minutes} must be positive.")
    unknown = [a for a in args.archs if a not in CAUSAL_ARCHS]
    if unknown:
        raise ValueError(f"--archs {unknown}: not causal architectures of the family; choose from {CAUSAL_ARCHS}.")
    unknown = [a for a in args.encoders if a not in ENCODER_ARCHS]
    if unknown:
        raise ValueError(f"--encoders {unknown}: choose from {ENCODER_ARCHS}.")
    if "knn_lm" in args.archs and args.no_baseline:
        raise ValueError("--archs knn_lm is the dense baseline plus a datastore: drop --no_baseline or knn_lm.")
    if args.validation_file and not args.train_file:
        raise ValueError("--validation_file needs --train_file too (local files replace the bundled corpus).")
    overrides: dict[str, dict[str, Any]] = {}
    for item in args.config_overrides:
        arch, colon, rest = item.partition(":")
        key, sep, value = rest.partition("=")
        if not colon or not sep or arch not in (*CAUSAL_ARCHS, *ENCODER_ARCHS):
            raise ValueError(f"--config_overrides {item!r}: use ARCH:KEY=VALUE, e.g. longformer:attention_window=64.")
        try:
            overrides.setdefault(arch, {})[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides.setdefault(arch, {})[key] = value
    settings["config_overrides"] = overrides
    settings["device"] = "cpu" if args.cpu else _default_device()
    return settings


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def shape_of(settings: dict[str, Any]) -> Shape:
    longest = max(
        settings["eval_length"] + 1,
        max(settings["train_lengths"], default=0),
        max(settings["decode_prompts"], default=0) + settings["new_tokens"],
        max(settings["passkey_distances"]) + 64,
        settings["listops_max_length"],
        settings["brown_max_length"],
        settings["block"] + 1,
    )
    return Shape(
        width=settings["width"], depth=settings["depth"], heads=settings["heads"], ffn=settings["ffn"],
        max_length=longest, segment=settings["segment"], block=settings["block"], knn_memory=settings["knn_memory"],
    )  # fmt: skip


def versions() -> dict[str, str]:
    import accelerate
    import datasets
    import torch
    import transformers

    import tf_family

    return {
        "tf_family": getattr(tf_family, "__version__", "unknown"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible, torch threads {torch.get_num_threads()}",
    }


# ---------------------------------------------------------------------------------------------------------- cells
@dataclass
class Cell:
    """One model x one measurement. ``run`` returns result rows; ``needs``: cells whose success it requires."""

    key: str
    section: str
    model: str
    measure: str
    run: Callable[[], list[dict]]
    needs: list[str] = field(default_factory=list)


def row(section: str, model: str, metric: str, value, unit: str = "", setting: str = "", **extra) -> dict:
    return {"section": section, "model": model, "metric": metric, "setting": setting, "value": value, "unit": unit,
            **extra}  # fmt: skip


class Grid:
    """The cells of one comparison and what they share (data, folders, settings)."""

    def __init__(self, args: argparse.Namespace, settings: dict[str, Any]):
        self.args = args
        self.settings = settings
        self.shape = shape_of(settings)
        fingerprint_source = {k: v for k, v in settings.items() if k != "device"}
        fingerprint_source.update(train_file=args.train_file, validation_file=args.validation_file, seed=args.seed)
        fingerprint_source["data_files"] = [_file_stamp(f) for f in (args.train_file, args.validation_file) if f]
        self.fingerprint = hashlib.sha256(json.dumps(fingerprint_source, sort_keys=True).encode()).hexdigest()[:12]
        self.cache = Path(args.output_dir) / "cache" / self.fingerprint
        self.models = self.cache / "models"
        self._tokenizer = None
        self._held_out = None

    # ---- shared data -----------------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from ..data import SOTU_TOKENIZER_DIR

            self._tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
        return self._tokenizer

    def held_out(self) -> list[list[int]]:
        """Token ids of the held-out documents: the validation split's (and the test split's, for the bundled
        corpus) longest ones."""
        if self._held_out is None:
            from datasets import concatenate_datasets

            from ..data import load_text_datasets

            raw, column = load_text_datasets(
                "sotu", None, self.args.train_file, self.args.validation_file, self.args.text_column, 5, None
            )
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

    def recipe_data_arguments(self) -> list[str]:
        data = []
        if self.args.train_file:
            data += ["--train_file", self.args.train_file]
        if self.args.validation_file:
            data += ["--validation_file", self.args.validation_file]
        if self.args.text_column:
            data += ["--text_column", self.args.text_column]
        return data

    def device_arguments(self) -> list[str]:
        return ["--cpu"] if self.settings["device"] == "cpu" else []

    # ---- models ----------------------------------------------------------------------------------------------
    def overrides(self, arch: str) -> dict[str, Any]:
        return {**arch_overrides(arch, self.shape), **self.settings["config_overrides"].get(arch, {})}

    def folder(self, model: str) -> Path:
        return self.models / model

    def load(self, model: str, task: str = "causal_lm"):
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        auto = AutoModelForSequenceClassification if task == "sequence_classification" else AutoModelForCausalLM
        torch.manual_seed(self.args.seed)
        return auto.from_pretrained(self.folder(model)).to(self.settings["device"])

    def train_steps(self, model: str, build: Callable[[], Any], block: int) -> int:
        """Optimizer steps giving ``--tokens`` tokens (batch x block each), or fitting ``--minutes`` (timed on two
        steps of a fresh model)."""
        batch = self.settings["batch"]
        if self.settings["minutes"] is None:
            return max(1, self.settings["tokens"] // (batch * block))
        import torch

        probe = build().to(self.settings["device"]).train()
        optimizer = torch.optim.AdamW(probe.parameters(), lr=1e-4)
        ids = torch.randint(1, len(self.tokenizer), (batch, block), device=self.settings["device"])
        times = []
        for _ in range(2):
            started = time.perf_counter()
            probe(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            times.append(time.perf_counter() - started)
        return max(1, int(self.settings["minutes"] * 60 / times[-1]))

    def causal_recipe(self, model: str, source: list[str], memory: bool, build: Callable[[], Any]) -> list[dict]:
        from ..recipes import causal_lm

        block = self.settings["segment"] if memory else self.settings["block"]
        steps = self.train_steps(model, build, block)
        argv = [
            *source, *self.recipe_data_arguments(), *self.device_arguments(), "--block_size", str(block),
            "--per_device_train_batch_size", str(self.settings["batch"]), "--max_train_steps", str(steps),
            "--learning_rate", str(self.settings["learning_rate"]), "--num_warmup_steps", str(max(1, steps // 20)),
            "--seed", str(self.args.seed), "--max_eval_samples", str(self.settings["eval_docs"]),
            "--output_dir", str(self.folder(model)), "--overwrite_output_dir", "--logging_steps", str(max(1, steps)),
        ]  # fmt: skip
        if self.settings["train_docs"]:
            argv += ["--max_train_samples", str(self.settings["train_docs"])]
        started = time.perf_counter()
        with self.logged(f"train-{model}"):
            summary = causal_lm.main(argv)
        seconds = time.perf_counter() - started
        return self.training_rows(model, summary, steps * self.settings["batch"] * block, seconds, block)

    def training_rows(self, model: str, summary: dict, tokens: int, seconds: float, block: int) -> list[dict]:
        from .models import count_parameters

        parameters = count_parameters(self.load(model))
        metrics = summary  # a recipe's main returns its metrics at the top level
        rows = [
            row("causal", model, "parameters", parameters),
            row("causal", model, "training tokens", tokens, setting=f"block {block}"),
            row("causal", model, "training time", seconds, "s"),
            row("causal", model, "recipe tokens/s", tokens / seconds, "tokens/s"),
        ]
        if "perplexity" in metrics:
            rows.append(row("causal", model, "validation perplexity", metrics["perplexity"]))
        if "unigram_perplexity" in metrics:
            rows.append(row("causal", model, "unigram perplexity", metrics["unigram_perplexity"]))
        return rows

    @contextlib.contextmanager
    def logged(self, name: str):
        """A recipe's own output (progress bars, logs) goes to ``cache/logs/<name>.log``, not the terminal."""
        import logging

        logs = self.cache / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        root = logging.getLogger()
        handlers = list(root.handlers)
        try:
            with (
                open(logs / f"{name}.log", "w") as handle,
                contextlib.redirect_stdout(handle),
                contextlib.redirect_stderr(handle),
            ):
                yield
        finally:  # a recipe's logging.basicConfig attached a handler to the log file, now closed: take it off
            for handler in [h for h in root.handlers if h not in handlers]:
                root.removeHandler(handler)
                handler.close()

    # ---- the cells -------------------------------------------------------------------------------------------
    def cells(self) -> list[Cell]:
        cells: list[Cell] = []
        archs = list(self.args.archs)
        measures = self.args.measures
        contestants = ([] if self.args.no_baseline or not archs else [BASELINE]) + archs
        for model in contestants:
            needs = []
            if model == "knn_lm":
                needs = [f"train:{BASELINE}"]
            cells.append(Cell(f"train:{model}", "causal", model, "train", lambda m=model: self.train(m), needs))
            for measure in measures:
                function = {"perplexity": self.perplexity, "passkey": self.passkey, "cost": self.cost}[measure]
                cells.append(
                    Cell(f"{measure}:{model}", "causal", model, measure, lambda m=model, f=function: f(m),
                         [f"train:{model}"])
                )  # fmt: skip
        encoders = ([] if self.args.no_baseline or not self.args.encoders else [ENCODER_BASELINE]) + list(
            self.args.encoders
        )
        for model in encoders:
            for task in self.args.encoder_tasks:
                cells.append(
                    Cell(f"{task}:{model}", "encoder", model, task, lambda m=model, t=task: self.encoder_task(m, t))
                )
        return cells

    def train(self, model: str) -> list[dict]:
        from ..registry import get_arch

        if model == BASELINE:
            folder = self.cache / "baseline-init"
            target = median(family_parameters(
                [a for a in CAUSAL_ARCHS if a in self.args.archs] or list(CAUSAL_ARCHS), self.shape,
                len(self.tokenizer), self.settings["config_overrides"],
            ).values())  # fmt: skip
            with self.logged("baseline-init"):
                save_dense_baseline(folder, self.shape, target, self.args.seed)

            def build():
                from transformers import AutoModelForCausalLM

                return AutoModelForCausalLM.from_pretrained(folder)

            return self.causal_recipe(model, ["--model_name_or_path", str(folder)], False, build)
        if model == "knn_lm":
            return self.knn_lm()
        spec = get_arch(model)
        overrides = self.overrides(model)

        def build():
            config = spec.make_config("tiny", vocab_size=len(self.tokenizer), **overrides)
            return spec.model_classes["causal_lm"](config)

        memory = spec.carried_state is not None
        source = ["--arch", model, "--variant", "tiny", "--config_overrides", *override_arguments(overrides)]
        return self.causal_recipe(model, source, memory, build)

    def knn_lm(self) -> list[dict]:
        """The trained baseline plus a datastore of its keys over the first training tokens (``recipes/knn_lm.py``
        ``build``), then λ and k picked on validation (``eval``), saved as a kNN-LM."""
        from ..recipes import knn_lm

        datastore = self.cache / "datastore"
        block = str(self.settings["block"])
        common = [*self.recipe_data_arguments(), *self.device_arguments(), "--block_size", block]
        tokens_per_doc = 8_000  # SOTU addresses: about 7.5k tokens each; the datastore stops at the budget
        docs = str(max(1, self.settings["datastore_tokens"] // tokens_per_doc))
        started = time.perf_counter()
        with self.logged("train-knn_lm"):
            knn_lm.main(["build", "--model_name_or_path", str(self.folder(BASELINE)), "--output_dir", str(datastore),
                         "--overwrite_output_dir", "--max_samples", docs, *common])  # fmt: skip
            result = knn_lm.main([
                "eval", "--model_name_or_path", str(self.folder(BASELINE)), "--datastore", str(datastore),
                "--output_dir", str(self.folder("knn_lm")), "--overwrite_output_dir", "--lmbdas", "0.1", "0.25",
                "0.5", "--ks", "8", "32", "--max_samples", str(self.settings["eval_docs"]), *common,
            ])  # fmt: skip
        seconds = time.perf_counter() - started
        rows = [
            row("causal", "knn_lm", "parameters", sum(p.numel() for p in self.load("knn_lm").parameters())),
            row("causal", "knn_lm", "datastore build and λ, k search time", seconds, "s"),
        ]
        best = result["best"]
        rows.append(row("causal", "knn_lm", "validation perplexity", result["validation_knn"]["perplexity"],
                        setting=f"λ {best['lmbda']}, k {best['k']}"))  # fmt: skip
        return rows

    def perplexity(self, model: str) -> list[dict]:
        from .measures import bucket_edges, perplexity_by_position

        documents = self.eval_documents()
        length = len(documents[0]) - 1
        edges = bucket_edges(self.settings["first_bucket"], length)
        result = perplexity_by_position(
            self.load(model), documents, edges, self.settings["segment"], self.settings["block"]
        )
        return [
            row("causal", model, "perplexity by position", value, setting=bucket, documents=len(documents))
            for bucket, value in result.items()
        ]

    def passkey(self, model: str) -> list[dict]:
        from .measures import passkey_accuracy

        settings = {
            "steps": self.settings["passkey_steps"], "batch": self.settings["passkey_batch"],
            "learning_rate": self.settings["passkey_learning_rate"],
            "eval_samples": self.settings["passkey_eval_samples"], "seed": self.args.seed,
        }  # fmt: skip
        result = passkey_accuracy(
            self.load(model), self.tokenizer, self.filler(), self.settings["passkey_distances"],
            self.settings["segment"], self.settings["block"], settings,
        )  # fmt: skip
        return [
            row("causal", model, "passkey accuracy", value, setting=f"distance {distance}")
            for distance, value in result.items()
        ]

    def cost(self, model: str, task: str = "causal_lm", lengths=None, section: str = "causal") -> list[dict]:
        """Training and decoding cost, each in its own child process (`tf_family.compare.cost`)."""
        from .cost import OUT_OF_MEMORY

        lengths = self.settings["train_lengths"] if lengths is None else lengths
        spec = {
            "folder": str(self.folder(model)), "task": task, "device": self.settings["device"],
            "vocab_size": len(self.tokenizer), "segment": self.settings["segment"],
            "step_limit_s": self.settings["step_limit_s"], "new_tokens": self.settings["new_tokens"],
            "pad_token_id": self.tokenizer.eos_token_id,
        }  # fmt: skip
        job = {**spec, "lengths": lengths, "prompts": self.settings["decode_prompts"] if task == "causal_lm" else []}
        spec_file = self.cache / "logs" / f"cost-{model}-{task}.json"
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
        records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
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
        names = {"train": ("training", "sequence length"), "decode": ("decoding", "prompt")}
        rows = []
        for record in records:
            name, what = names[record["kind"]]
            setting = f"{what} {record['length']}"
            if "status" in record:
                rows.append(
                    row(section, model, f"{name} tokens/s", None, "tokens/s", setting, status=record["status"])
                )
                continue
            rows.append(row(section, model, f"{name} tokens/s", record["tokens_per_second"], "tokens/s", setting))
            rows.append(row(section, model, f"{name} peak memory", record["peak_mb"], "MiB", setting))
        stopped = {kind for kind, _ in done}
        for kind, length in wanted:
            if (kind, length) not in done:
                name, what = names[kind]
                why = (
                    f"skipped: a shorter length took over {self.settings['step_limit_s']} s"
                    if kind in stopped
                    else "not measured: the measurement before it ended the process"
                )
                rows.append(row(section, model, f"{name} tokens/s", None, "tokens/s", f"{what} {length}", status=why))
        return rows

    # ---- encoders --------------------------------------------------------------------------------------------
    def listops_files(self) -> tuple[Path, Path]:
        from .listops import generate

        folder = self.cache / "data"
        train, validation = folder / "listops-train.jsonl", folder / "listops-validation.jsonl"
        if not train.exists():
            folder.mkdir(parents=True, exist_ok=True)
            low, high = self.settings["listops_words"]
            for path, count, seed in ((train, self.settings["listops_train"], self.args.seed),
                                      (validation, self.settings["listops_eval"], self.args.seed + 1)):  # fmt: skip
                examples = generate(count, seed, min_length=low, max_length=high)
                partial = path.with_suffix(".partial")
                partial.write_text("".join(json.dumps(e) + "\n" for e in examples))
                partial.replace(path)
        return train, validation

    def majority_rate(self, task: str) -> float:
        """The accuracy of always answering the validation split's most frequent class: the floor to beat."""
        from collections import Counter

        if task == "listops":
            labels = [json.loads(line)["label"] for line in self.listops_files()[1].read_text().splitlines()]
        else:
            from ..data import load_brown

            split = load_brown()["validation"]
            labels = split["genre"] if "genre" in split.column_names else split["label"]
        return Counter(labels).most_common(1)[0][1] / len(labels)

    def encoder_task(self, model: str, task: str) -> list[dict]:
        """Train ``model`` on ``task`` with the sequence-classification recipe; accuracy, training tokens/s (the
        recipe's own run, padded tokens included), then the cost of a step at the task's length."""
        from ..recipes import sequence_classification

        length = self.settings["listops_max_length" if task == "listops" else "brown_max_length"]
        name = f"{model}-{task}"
        if task == "listops":
            train, validation = self.listops_files()
            data = ["--train_file", str(train), "--validation_file", str(validation)]
            labels = 10
        else:
            data = ["--dataset_name", "brown"]
            labels = 15
        if model == ENCODER_BASELINE:
            init = self.cache / f"roberta-init-{task}"
            with self.logged(f"roberta-init-{task}"):
                save_roberta_baseline(init, self.shape, labels, length, self.args.seed)
            source = ["--model_name_or_path", str(init)]
        else:
            overrides = self.overrides(model)
            source = ["--arch", model, "--variant", "tiny", "--config_overrides", *override_arguments(overrides)]
        steps = self.settings["encoder_steps"]
        argv = [
            *source, *data, *self.device_arguments(), "--max_length", str(length),
            "--per_device_train_batch_size", str(self.settings["encoder_batch"]), "--max_train_steps", str(steps),
            "--learning_rate", str(self.settings["encoder_learning_rate"]), "--num_warmup_steps", str(max(1, steps // 10)),
            "--seed", str(self.args.seed), "--output_dir", str(self.folder(name)), "--overwrite_output_dir",
            "--max_eval_samples", "0",
        ]  # fmt: skip
        started = time.perf_counter()
        with self.logged(f"train-{name}"):
            summary = sequence_classification.main(argv)
        seconds = time.perf_counter() - started
        metrics = summary
        task_name = "ListOps" if task == "listops" else "Brown genres"
        rows = [
            row("encoder", model, f"{task_name} accuracy", metrics.get("eval_accuracy", metrics.get("accuracy")),
                setting=f"max length {length}"),
            row("encoder", model, f"{task_name} training time", seconds, "s", f"{steps} steps"),
        ]  # fmt: skip
        rows.append(row("encoder", model, f"{task_name} majority-class accuracy", self.majority_rate(task)))
        if "eval_macro_f1" in metrics:
            rows.append(row("encoder", model, f"{task_name} macro-F1", metrics["eval_macro_f1"]))
        rows += self.cost(name, "sequence_classification", [length], section="encoder")
        for r in rows:
            r["model"] = model
            if r["metric"].startswith("training "):
                r["metric"] = f"{task_name} {r['metric']}"
        return rows


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the cost measurements): beside the wall time, how
    much of a cell's time went to it on a machine that other work shares."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _file_stamp(path: str) -> str:
    stat = Path(path).stat()
    return f"{Path(path).resolve()}:{stat.st_size}:{int(stat.st_mtime)}"


# ----------------------------------------------------------------------------------------------------------- run
def run_cells(grid: Grid, cells: list[Cell], report_only: bool = False) -> dict[str, dict]:
    """Run every cell not cached; a cell's result (or error) is written atomically to ``cache/cells/``. With
    ``report_only``, run nothing: the cached cells, and the others as not run yet."""
    from tqdm.auto import tqdm

    folder = grid.cache / "cells"
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    progress = tqdm(total=len(cells), desc="compare", unit="cell", dynamic_ncols=True)
    for cell in cells:
        path = folder / (cell.key.replace(":", "--") + ".json")
        if path.exists():
            cached = json.loads(path.read_text())
            if "error" not in cached or report_only:
                results[cell.key] = cached
                progress.update(1)
                continue
        if report_only:
            results[cell.key] = {"error": "not run yet", "key": cell.key, "model": cell.model}
            progress.update(1)
            continue
        progress.set_postfix_str(cell.key)
        started, cpu_started = time.perf_counter(), _cpu_seconds()
        failed = [need for need in cell.needs if "error" in results.get(need, {"error": "not run"})]
        if failed:
            result = {"error": f"needs {failed[0]}, which failed: {results.get(failed[0], {}).get('error')}"}
        else:
            try:
                result = {"rows": cell.run()}
            except Exception as error:  # the cell's failure is its result; the grid goes on
                result = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        result.update(
            key=cell.key,
            section=cell.section,
            model=cell.model,
            measure=cell.measure,
            seconds=time.perf_counter() - started,
            cpu_seconds=_cpu_seconds() - cpu_started,
        )
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(result, indent=1, default=str))
        partial.replace(path)
        results[cell.key] = result
        progress.update(1)
    progress.close()
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    settings = parse_settings(args)
    started = time.perf_counter()
    grid = Grid(args, settings)
    cells = grid.cells()
    results = run_cells(grid, cells, args.report_only)
    from .report import write_report

    paths = write_report(
        Path(args.output_dir),
        results,
        settings,
        versions(),
        {"argv": argv, **vars(args)},
        time.perf_counter() - started,
    )
    failed = [k for k, r in results.items() if "error" in r and r["error"] != "not run yet"]
    sys.stdout.write(f"report: {paths['html']}\ntable: {paths['markdown']}\n")
    if failed:
        sys.stdout.write(f"{len(failed)} cell(s) failed (recorded in the report): {', '.join(failed)}\n")
    return 0


__all__ = ["DEFAULT", "QUICK", "Cell", "Grid", "build_parser", "main", "parse_settings", "run_cells"]
