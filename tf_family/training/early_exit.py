"""What the CALM calibration recipe and benchmark share: prompts cut from documents, batched generation with early
exits (tokens and exit layers), per-example consistency losses, and the Learn-then-Test run over a threshold grid.

The math is `tf_family.early_exit`'s; this module runs models.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..early_exit import LTTResult, calibrate_threshold, rouge_l_f1, token_disagreement
from ..early_exit.calibration import hoeffding_bentkus_p_value, hoeffding_p_value

CONSISTENCY_KINDS = ("token", "rouge_l", "risk")

# Descending threshold grids per confidence measure, fixed before any data is seen (fixed-sequence testing needs
# that), reaching down to thresholds where every token leaves at the first exit, so that Learn-then-Test stops
# where the inconsistency really exceeds δ. Fine where a measure's values crowd: small top-1 minus top-2 gaps,
# cosines near 1, meta probabilities around 0.5.
_SOFTMAX_GRID = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1, 0.07, 0.05, 0.035, 0.025, 0.015, 0.01, 0.005, 0.0)
_PROBABILITY_GRID = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.3, 0.2, 0.0)
DEFAULT_GRIDS = {
    "softmax_diff": _SOFTMAX_GRID,
    "restricted_softmax": _SOFTMAX_GRID,
    "softmax_max": (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05, 0.0),
    "state": (
        1.0,
        0.9995,
        0.999,
        0.998,
        0.996,
        0.993,
        0.99,
        0.985,
        0.98,
        0.97,
        0.96,
        0.95,
        0.93,
        0.9,
        0.85,
        0.8,
        0.6,
        0.0,
    ),
    "meta": _PROBABILITY_GRID,
    # the Depth-Adaptive halting classifiers: a probability of leaving (geometric-like) or of having left (multinomial)
    "halting": _PROBABILITY_GRID,
    "multinomial": _PROBABILITY_GRID,
}


def cut_prompts(
    documents: Sequence[Sequence[int]], prompt_length: int, continuation_length: int, count: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows of ``prompt_length + continuation_length`` tokens from the documents, in order:
    the prompts ``(N, P)`` and their true continuations ``(N, C)`` (the reference of risk consistency)."""
    if prompt_length < 1 or continuation_length < 1:
        raise ValueError(
            f"prompt_length and continuation_length must be >= 1, got {prompt_length}, {continuation_length}."
        )
    window = prompt_length + continuation_length
    windows = [
        list(document[start : start + window])
        for document in documents
        for start in range(0, len(document) - window + 1, window)
    ]
    if count is not None:
        windows = windows[:count]
    if not windows:
        raise ValueError(
            f"no document holds {window} tokens (prompt + continuation); use shorter prompts or more data."
        )
    tokens = torch.tensor(windows, dtype=torch.long)
    return tokens[:, :prompt_length], tokens[:, prompt_length:]


@dataclass
class Generations:
    """Greedy generations of a set of prompts: ``tokens`` ``(N, C)`` and the exit layer of each ``(N, C)``."""

    tokens: torch.Tensor
    exit_layers: torch.Tensor

    @property
    def mean_exit_layer(self) -> float:
        return float(self.exit_layers.double().mean())


def prompt_loader(prompts: torch.Tensor, batch_size: int) -> torch.utils.data.DataLoader:
    """A `DataLoader` of the rows of ``prompts`` ``(N, P)`` in order, ``batch_size`` at a time (the last batch
    shorter); its own seeded generator leaves the global random state alone (a loader otherwise draws its seed
    from it)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer.")
    return torch.utils.data.DataLoader(prompts, batch_size=batch_size, generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def generate_with_exits(
    model, prompts: torch.Tensor, max_new_tokens: int, batch_size: int, threshold: float | None
) -> Generations:
    """Greedy generation of every prompt (same length, no padding) at ``threshold`` (``None``: full depth), in
    batches (`prompt_loader`). ``model.config.exit_threshold`` is restored afterwards. End-of-sequence tokens do not stop it (every
    row generates ``max_new_tokens``), so losses compare sequences of equal length."""
    saved = model.config.exit_threshold
    model.config.exit_threshold = threshold
    device = next(model.parameters()).device
    tokens, exits = [], []
    try:
        for batch in prompt_loader(prompts, batch_size):
            batch = batch.to(device)
            out = model.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                output_exit_layers=True,
                return_dict_in_generate=True,
                pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0,
            )
            tokens.append(out.sequences[:, batch.shape[1] :].cpu())
            exits.append(out.exit_layers.cpu())  # (the first generated token's is the prompt's last position's)
    finally:
        model.config.exit_threshold = saved
    return Generations(torch.cat(tokens), torch.cat(exits))


def consistency_losses(
    kind: str, early: torch.Tensor, full: torch.Tensor, reference: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-example losses in [0, 1] of early-exit generations ``(N, C)`` against full-depth ones ``(N, C)``:

    - ``"token"``: token disagreement with the full model's output;
    - ``"rouge_l"``: 1 - ROUGE-L F1 against it;
    - ``"risk"``: risk consistency, ``L(early) - L(full)`` with L the token error rate against the true
      continuation ``reference``, a difference in [-1, 1] mapped to [0, 1] as ``(d + 1) / 2`` (a tolerance δ on the
      difference is then ``(δ + 1) / 2``: see `loss_tolerance`).
    """
    if kind not in CONSISTENCY_KINDS:
        raise ValueError(f"consistency must be one of {CONSISTENCY_KINDS}, got {kind!r}.")
    early_rows, full_rows = early.tolist(), full.tolist()
    if kind == "token":
        values = [token_disagreement(a, b) for a, b in zip(early_rows, full_rows, strict=True)]
    elif kind == "rouge_l":
        values = [1.0 - rouge_l_f1(a, b) for a, b in zip(early_rows, full_rows, strict=True)]
    else:
        if reference is None:
            raise ValueError("risk consistency needs the true continuations (reference).")
        gold = reference.tolist()
        values = [
            (token_disagreement(a, g) - token_disagreement(b, g) + 1.0) / 2.0
            for a, b, g in zip(early_rows, full_rows, gold, strict=True)
        ]
    return torch.tensor(values, dtype=torch.float64)


def loss_tolerance(kind: str, delta: float) -> float:
    """The tolerance on the [0, 1] losses of `consistency_losses` that a user's δ means."""
    return (delta + 1.0) / 2.0 if kind == "risk" else delta


@dataclass
class Calibration:
    """A Learn-then-Test run: the LTT result (over the thresholds evaluated: the grid up to the first failed test)
    and, per evaluated threshold, the mean exit layer; ``grid`` is the whole grid asked for."""

    result: LTTResult
    consistency: str
    mean_exit_layers: tuple[float, ...]
    grid: tuple[float, ...] = ()

    def record(self) -> dict:
        """What goes into ``config.calibration`` (JSON-ready)."""
        result = self.result
        return {
            "threshold": result.threshold,
            "delta": result.delta if self.consistency != "risk" else 2 * result.delta - 1,
            "epsilon": result.epsilon,
            "consistency": self.consistency,
            "n": result.n,
            "p_value_method": result.method,
            "empirical_risk": None if result.index is None else result.risks[result.index],
            "p_value": None if result.index is None else result.p_values[result.index],
            "guarantee": result.guarantee(),
            "grid": list(self.grid or result.thresholds),
            "evaluated_thresholds": len(result.thresholds),
        }


@dataclass
class GridScores:
    """Per-example losses ``(n, k)`` at each threshold of a grid, and the mean exit layer at each ``(k,)``."""

    thresholds: tuple[float, ...]
    losses: torch.Tensor
    mean_exit_layers: tuple[float, ...]


def score_grid(
    model,
    prompts: torch.Tensor,
    continuations: torch.Tensor,
    thresholds: Sequence[float],
    consistency: str = "token",
    batch_size: int = 8,
    full: Generations | None = None,
    stop: Callable[[torch.Tensor], bool] | None = None,
) -> GridScores:
    """Generate at full depth (unless ``full`` is given) and at every threshold, and score each example's
    consistency with the full model at each threshold. ``stop(losses)`` (the latest threshold's ``(n,)`` losses)
    ends the sweep early: the scores then cover the thresholds evaluated so far."""
    max_new_tokens = continuations.shape[1]
    if full is None:
        full = generate_with_exits(model, prompts, max_new_tokens, batch_size, None)
    columns, mean_exits = [], []
    for threshold in thresholds:
        early = generate_with_exits(model, prompts, max_new_tokens, batch_size, float(threshold))
        columns.append(consistency_losses(consistency, early.tokens, full.tokens, continuations))
        mean_exits.append(early.mean_exit_layer)
        if stop is not None and stop(columns[-1]):
            break
    evaluated = tuple(float(t) for t in thresholds[: len(columns)])
    return GridScores(evaluated, torch.stack(columns, dim=1), tuple(mean_exits))


def run_calibration(
    model,
    prompts: torch.Tensor,
    continuations: torch.Tensor,
    thresholds: Sequence[float],
    *,
    delta: float,
    epsilon: float,
    consistency: str = "token",
    method: str = "hoeffding_bentkus",
    batch_size: int = 8,
    full: Generations | None = None,
) -> Calibration:
    """`score_grid` over the descending grid, then Learn-then-Test for ``delta`` and ``epsilon``. The sweep stops
    at the first threshold whose p-value exceeds ε: fixed-sequence testing stops there too, so the thresholds below
    cannot change the result and are not generated.

    Ten parameters: the model, the calibration set and the grid, then by keyword the guarantee asked for (``delta``,
    ``epsilon``, ``consistency``, ``method``) and how to run it (``batch_size``, ``full``: the full-depth
    generations when already computed)."""
    tolerance = loss_tolerance(consistency, delta)
    p_value = hoeffding_p_value if method == "hoeffding" else hoeffding_bentkus_p_value

    def fails(losses: torch.Tensor) -> bool:
        return p_value(min(max(float(losses.mean()), 0.0), 1.0), losses.shape[0], tolerance) > epsilon

    scores = score_grid(model, prompts, continuations, thresholds, consistency, batch_size, full, fails)
    result = calibrate_threshold(scores.thresholds, scores.losses, tolerance, epsilon, method)
    return Calibration(result, consistency, scores.mean_exit_layers, tuple(float(t) for t in thresholds))


__all__ = [
    "CONSISTENCY_KINDS",
    "DEFAULT_GRIDS",
    "Calibration",
    "Generations",
    "GridScores",
    "consistency_losses",
    "cut_prompts",
    "generate_with_exits",
    "loss_tolerance",
    "prompt_loader",
    "run_calibration",
    "score_grid",
]
