"""What the CALM calibration recipe and benchmark share: prompts cut from documents, batched generation with early
exits (tokens and exit layers), per-example consistency losses, and the Learn-then-Test run over a threshold grid.

The math is `tf_family.early_exit`'s; this module runs models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..early_exit import LTTResult, calibrate_threshold, rouge_l_f1, token_disagreement

CONSISTENCY_KINDS = ("token", "rouge_l", "risk")


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


@torch.no_grad()
def generate_with_exits(
    model, prompts: torch.Tensor, max_new_tokens: int, batch_size: int, threshold: float | None
) -> Generations:
    """Greedy generation of every prompt (same length, no padding) at ``threshold`` (``None``: full depth), in
    batches. ``model.config.exit_threshold`` is restored afterwards. End-of-sequence tokens do not stop it (every
    row generates ``max_new_tokens``), so losses compare sequences of equal length."""
    saved = model.config.exit_threshold
    model.config.exit_threshold = threshold
    device = next(model.parameters()).device
    tokens, exits = [], []
    try:
        for start in range(0, prompts.shape[0], batch_size):
            batch = prompts[start : start + batch_size].to(device)
            log: list[torch.Tensor] = []
            out = model.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                exit_log=log,
                pad_token_id=model.config.pad_token_id if model.config.pad_token_id is not None else 0,
            )
            tokens.append(out[:, batch.shape[1] :].cpu())
            # the first generated token comes from the prompt's last position
            exits.append(torch.cat([log[0][:, -1:], *log[1:]], dim=1).cpu())
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
    """A Learn-then-Test run: the LTT result and, per threshold of the grid, the mean exit layer."""

    result: LTTResult
    consistency: str
    mean_exit_layers: tuple[float, ...]

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
            "grid": list(result.thresholds),
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
) -> GridScores:
    """Generate at full depth (unless ``full`` is given) and at every threshold, and score each example's
    consistency with the full model at each threshold."""
    max_new_tokens = continuations.shape[1]
    if full is None:
        full = generate_with_exits(model, prompts, max_new_tokens, batch_size, None)
    columns, mean_exits = [], []
    for threshold in thresholds:
        early = generate_with_exits(model, prompts, max_new_tokens, batch_size, float(threshold))
        columns.append(consistency_losses(consistency, early.tokens, full.tokens, continuations))
        mean_exits.append(early.mean_exit_layer)
    return GridScores(tuple(float(t) for t in thresholds), torch.stack(columns, dim=1), tuple(mean_exits))


def run_calibration(
    model,
    prompts: torch.Tensor,
    continuations: torch.Tensor,
    thresholds: Sequence[float],
    delta: float,
    epsilon: float,
    consistency: str = "token",
    method: str = "hoeffding_bentkus",
    batch_size: int = 8,
    full: Generations | None = None,
) -> Calibration:
    """`score_grid` over the descending grid, then Learn-then-Test for ``delta`` and ``epsilon``."""
    scores = score_grid(model, prompts, continuations, thresholds, consistency, batch_size, full)
    result = calibrate_threshold(thresholds, scores.losses, loss_tolerance(consistency, delta), epsilon, method)
    return Calibration(result, consistency, scores.mean_exit_layers)


__all__ = [
    "CONSISTENCY_KINDS",
    "Calibration",
    "Generations",
    "GridScores",
    "consistency_losses",
    "cut_prompts",
    "generate_with_exits",
    "loss_tolerance",
    "run_calibration",
    "score_grid",
]
