"""The grid of `tf-family compare`: one cell per model x measurement (x seed), what the cells share, and the loop
that runs every cell not already cached.

Every cell's result is cached under ``OUTPUT_DIR/cache/<settings fingerprint>/``: a rerun with the same settings
resumes where the last one stopped; a cell that fails is recorded with its error (and tried again on the next run)
while the others run. The command line is `tf_family.compare.cli`; training `training`; the measures `measures` and
`cost`; the data `data` and `lra`; the report `report`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .data import BROWN_TASK, TASK_TITLES, GridData
from .family import Shape, causal_archs, encoder_archs, quick_subset, shape_overrides, wraps_base_config
from .models import BASELINE, ENCODER_BASELINE


@dataclass
class Cell:
    """One model x one measurement (x one seed). ``run`` returns result rows; ``needs``: cells whose success it
    requires."""

    key: str
    section: str
    model: str
    measure: str
    run: Callable[[], list[dict]]
    needs: list[str] = field(default_factory=list)


def shape_of(settings: dict[str, Any], lengths: list[int]) -> Shape:
    """The shared shape, its position tables long enough for every input of the grid (``lengths``: the encoder
    tasks' inputs)."""
    longest = max(
        settings["eval_length"] + 1,
        max(settings["train_lengths"], default=0),
        max(settings["decode_prompts"], default=0) + settings["new_tokens"],
        max(settings["passkey_distances"]) + 64,
        settings["block"] + 1,
        *lengths,
    )
    return Shape(
        width=settings["width"],
        depth=settings["depth"],
        heads=settings["heads"],
        ffn=settings["ffn"],
        max_length=longest,
        segment=settings["segment"],
        block=settings["block"],
        knn_memory=settings["knn_memory"],
    )


def _file_stamp(path: str) -> str:
    stat = Path(path).stat()
    return f"{Path(path).resolve()}:{stat.st_size}:{int(stat.st_mtime)}"


class Grid:
    """The cells of one comparison and what they share: settings, shape, data, folders."""

    def __init__(self, args, settings: dict[str, Any]):
        from . import lra

        self.args = args
        self.settings = settings
        self.seeds: list[int] = list(settings["seeds"])
        lengths = [lra.input_length(t, settings) for t in args.encoder_tasks if t in lra.TASKS]
        if BROWN_TASK in args.encoder_tasks:
            lengths.append(settings["brown_max_length"])
        self.shape = shape_of(settings, lengths)
        source = {k: v for k, v in settings.items() if k != "device"}
        source.update(train_file=args.train_file, validation_file=args.validation_file)
        source["data_files"] = [_file_stamp(f) for f in (args.train_file, args.validation_file) if f]
        self.fingerprint = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:12]
        self.cache = Path(args.output_dir) / "cache" / self.fingerprint
        files = {"train_file": args.train_file, "validation_file": args.validation_file}
        files["text_column"] = args.text_column
        self.data = GridData(self.cache, settings, files, self.seeds[0])

    # ---- who ---------------------------------------------------------------------------------------------------
    def causal_models(self) -> list[str]:
        """The causal architectures of this run (``--archs``), the dense baseline not included."""
        return list(self.settings["archs"])

    def passkey_seeds(self) -> list[int]:
        """The seeds whose models the passkey task trains on (``passkey_seeds`` of them: its training is long)."""
        return self.seeds[: self.settings["passkey_seeds"]]

    def encoder_models(self) -> list[str]:
        return list(self.settings["encoders"])

    def wraps_baseline(self, model: str) -> bool:
        """Whether ``model`` is built on the dense baseline's trained weights (the baselines themselves are not)."""
        from ..registry import get_arch

        return model not in (BASELINE, ENCODER_BASELINE) and wraps_base_config(get_arch(model))

    def overrides(self, arch: str) -> dict[str, Any]:
        from ..registry import get_arch

        return {**shape_overrides(get_arch(arch), self.shape), **self.settings["config_overrides"].get(arch, {})}

    # ---- where -------------------------------------------------------------------------------------------------
    def folder(self, model: str, seed: int) -> Path:
        return self.cache / "models" / f"{model}-{seed}"

    def load(self, model: str, seed: int, task: str = "causal_lm"):
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        auto = AutoModelForSequenceClassification if task == "sequence_classification" else AutoModelForCausalLM
        torch.manual_seed(seed)
        return auto.from_pretrained(self.folder(model, seed)).to(self.settings["device"])

    def device_arguments(self) -> list[str]:
        return ["--cpu"] if self.settings["device"] == "cpu" else []

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

    # ---- the cells ---------------------------------------------------------------------------------------------
    def _key(self, measure: str, model: str, seed: int | None) -> str:
        return f"{measure}:{model}" if seed is None or len(self.seeds) == 1 else f"{measure}:{model}@{seed}"

    def cells(self) -> list[Cell]:
        from .training import train_causal

        cells: list[Cell] = []
        archs = self.causal_models()
        contestants = ([] if self.args.no_baseline or not archs else [BASELINE]) + archs
        for model in contestants:
            for seed in self.seeds:
                train = self._key("train", model, seed)
                needs = [self._key("train", BASELINE, seed)] if self.wraps_baseline(model) else []
                cells.append(Cell(train, "causal", model, "train", _bind(train_causal, self, model, seed), needs))
                for measure in self.args.measures:
                    if measure == "cost" or (measure == "passkey" and seed not in self.passkey_seeds()):
                        continue
                    run = _bind(_MEASURES[measure], self, model, seed)
                    cells.append(Cell(self._key(measure, model, seed), "causal", model, measure, run, [train]))
            if "cost" in self.args.measures:
                first = self._key("train", model, self.seeds[0])
                cells.append(
                    Cell(self._key("cost", model, None), "causal", model, "cost", _bind(_cost, self, model), [first])
                )
        if contestants and "perplexity" in self.args.measures:
            cells.append(Cell("perplexity:unigram", "causal", "unigram", "perplexity", _bind(_unigram, self)))
        encoders = self.encoder_models()
        encoders = ([] if self.args.no_baseline or not encoders else [ENCODER_BASELINE]) + encoders
        for model in encoders:
            for task in self.args.encoder_tasks:
                for seed in self.settings["encoder_seeds"]:
                    key = f"{task}:{model}" if len(self.settings["encoder_seeds"]) == 1 else f"{task}:{model}@{seed}"
                    cells.append(Cell(key, "encoder", model, task, _bind(_encoder, self, model, task, seed)))
        return cells


def _bind(function: Callable, *arguments) -> Callable[[], list[dict]]:
    return lambda: function(*arguments)


def _perplexity(grid: Grid, model: str, seed: int) -> list[dict]:
    from .measures import perplexity_rows

    return perplexity_rows(grid, model, seed)


def _passkey(grid: Grid, model: str, seed: int) -> list[dict]:
    from .measures import passkey_rows

    return passkey_rows(grid, model, seed)


def _unigram(grid: Grid) -> list[dict]:
    from .measures import unigram_rows

    return unigram_rows(grid)


_MEASURES = {"perplexity": _perplexity, "passkey": _passkey}


def _cost(grid: Grid, model: str) -> list[dict]:
    from .cost import cost_rows

    folder = grid.folder(model, grid.seeds[0])
    return cost_rows(grid, model, folder, "causal_lm", grid.settings["train_lengths"], "causal")


def _encoder(grid: Grid, model: str, task: str, seed: int) -> list[dict]:
    """Train ``model`` on ``task``; with the first seed also the cost of a training step at the task's length."""
    from .cost import cost_rows
    from .training import train_encoder

    rows = train_encoder(grid, model, task, seed)
    if seed != grid.settings["encoder_seeds"][0]:
        return rows
    length = grid.data.task(task).max_length
    title = TASK_TITLES[task]
    folder = grid.folder(f"{model}-{task}", seed)
    for r in cost_rows(grid, model, folder, "sequence_classification", [length], "encoder"):
        rows.append({**r, "metric": f"{title} {r['metric']}"})
    return rows


# ----------------------------------------------------------------------------------------------------------- run
def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the cost measurements): beside the wall time, how
    much of a cell's time went to it on a machine that other work shares."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cell_path(grid: Grid, cell: Cell) -> Path:
    """Where ``cell``'s result (or error) is cached."""
    return grid.cache / "cells" / (cell.key.replace(":", "--").replace("@", "--") + ".json")


def _run_cell(grid: Grid, cell: Cell, results: dict[str, dict], report_only: bool) -> None:
    """``cell``'s result into ``results``: from the cache, or run now (written atomically to ``cache/cells/``; a
    cell whose needs failed fails without running). With ``report_only``, a cell not cached is "not run yet"."""
    path = cell_path(grid, cell)
    if path.exists():
        cached = json.loads(path.read_text())
        if "error" not in cached or report_only:
            results[cell.key] = cached
            return
    if report_only:
        results[cell.key] = {"error": "not run yet", "key": cell.key, "model": cell.model}
        return
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
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=1, default=str))
    partial.replace(path)
    results[cell.key] = result


def run_cells(grid: Grid, cells: list[Cell], report_only: bool = False) -> dict[str, dict]:
    """Run every cell not cached, in order, with a progress bar. With ``report_only``, run nothing: the cached
    cells, and the others as not run yet."""
    from tqdm.auto import tqdm

    results: dict[str, dict] = {}
    with tqdm(total=len(cells), desc="compare", unit="cell", dynamic_ncols=True) as progress:
        for cell in cells:
            if not report_only:
                progress.set_postfix_str(cell.key)
            _run_cell(grid, cell, results, report_only)
            progress.update(1)
    return results


# a cell kind's rough share of a run's time: the heaviest chains are taken first (`chain_queue`)
_WEIGHT = {"train": 3.0, "passkey": 3.0, "cost": 1.0, "perplexity": 0.2}


def cell_chains(cells: list[Cell]) -> list[list[Cell]]:
    """The cells that must run in one process, in order: those joined by ``needs`` (a model's training and its
    measures of one seed, its cost with the first seed; a model built on the dense baseline with the baseline's
    cells of that seed); every other cell alone. Chains keep the grid's order."""
    owner = {cell.key: i for i, cell in enumerate(cells)}
    parent = list(range(len(cells)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, cell in enumerate(cells):
        for need in cell.needs:
            if need in owner:
                parent[root(i)] = root(owner[need])
    chains: dict[int, list[Cell]] = {}
    for i, cell in enumerate(cells):
        chains.setdefault(root(i), []).append(cell)
    return list(chains.values())


def chain_queue(cells: list[Cell]) -> list[list[Cell]]:
    """The chains (`cell_chains`) in the order ``--jobs``'s processes take them: the heaviest first (longest
    processing time first), so that the short ones fill in at the end; ties keep the grid's order."""
    return sorted(cell_chains(cells), key=lambda c: -sum(_WEIGHT.get(cell.measure, 1.0) for cell in c))


def claims_folder(grid: Grid) -> Path:
    """Where ``--jobs``'s processes mark the chains they took (emptied by the parent before it starts them)."""
    return grid.cache / "claims"


def run_claimed(grid: Grid, cells: list[Cell]) -> dict[str, dict]:
    """One of ``--jobs``'s processes: take the next chain of `chain_queue` that no other process has taken (a claim
    file created exclusively, the chain's first cell's name), run it, and so on until none is left: a shared queue,
    so a process that drew short chains takes more of them."""
    folder = claims_folder(grid)
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for chain in chain_queue(cells):
        claim = folder / cell_path(grid, chain[0]).with_suffix(".claim").name
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue  # another process runs it
        for cell in chain:
            _run_cell(grid, cell, results, report_only=False)
    return results


def default_archs(settings: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The causal and encoder models of a run without ``--archs`` / ``--encoders``: the whole family, or with
    ``subset`` (``--quick``) one causal model per group and the first ``quick_encoders`` encoders."""
    causal, encoders = list(causal_archs()), list(encoder_archs())
    if settings.get("subset"):
        return quick_subset(causal), encoders[: settings["quick_encoders"]]
    return causal, encoders


__all__ = [
    "Cell",
    "Grid",
    "cell_chains",
    "cell_path",
    "chain_queue",
    "claims_folder",
    "default_archs",
    "run_cells",
    "run_claimed",
    "shape_of",
]
