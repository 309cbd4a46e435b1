"""The report of `tf-family compare`: a Markdown table per measure (``compare.md``), every row as CSV and JSON (one
row per model x metric x setting, with the settings and versions), PNG plots, and one self-contained HTML page
(``report.html``: tables, plots inlined as base64, the reading). The reading is written from the numbers by
`reading`: each sentence is a comparison computed here, not a claim typed in advance. The page is rendered from the
jinja2 template ``templates/report.html.j2``. Rows of several seeds are shown as their mean ± half their range
(`tf_family.compare.rows.fold_seeds`); the JSON and CSV keep one row per seed."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .data import TASK_TITLES
from .lra import PUBLISHED, PUBLISHED_SCALE
from .lra import TASKS as LRA_TASKS
from .measures import CHANCE, UNIGRAM
from .models import BASELINE, inference_setting
from .presets import passkey_train_distances
from .rows import fold_seeds

TEMPLATES = Path(__file__).parent / "templates"


class Table:
    def __init__(self, title: str, headers: list[str], rows: list[list[str]], note: str = ""):
        self.title, self.headers, self.rows, self.note = title, headers, rows, note

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("| " + " | ".join("---" for _ in self.headers) + " |")
        lines += ["| " + " | ".join(cells) + " |" for cells in self.rows]
        return "\n".join(lines) + "\n"


def _format(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}" if abs(value) < 1 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _cell_text(record: dict) -> str:
    if record.get("status"):
        return record["status"]
    text = _format(record["value"])
    if record.get("seeds") and record["spread"]:
        text += f" ± {_format(record['spread'])}"
    return text


def collect(results: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    rows, errors = [], []
    for key, result in results.items():
        if "error" in result:
            errors.append({"cell": key, "model": result.get("model"), "error": result["error"]})
        else:
            rows.extend(result["rows"])
    return rows, errors


def _models(rows: list[dict], section: str) -> list[str]:
    order: list[str] = []
    for r in rows:
        if r["section"] == section and r["model"] not in order:
            order.append(r["model"])
    return order


def _settings_of(rows: list[dict], metric: str) -> list[str]:
    order: list[str] = []
    for r in rows:
        if r["metric"] == metric and r["setting"] not in order:
            order.append(r["setting"])
    return order


def pivot(rows: list[dict], metric: str, section: str = "causal") -> dict[str, dict[str, dict]]:
    table: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r["metric"] == metric and r["section"] == section:
            table[r["model"]][r["setting"]] = r
    return table


def metric_table(rows: list[dict], metric: str, title: str, note: str = "", section: str = "causal") -> Table | None:
    data = pivot(rows, metric, section)
    if not data:
        return None
    settings = _settings_of([r for r in rows if r["section"] == section], metric)
    models = [m for m in _models(rows, section) if m in data]
    body = [[m, *(_cell_text(data[m][s]) if s in data[m] else "–" for s in settings)] for m in models]
    headers = ["model", *(_short(s) or metric for s in settings)]
    return Table(title, headers, body, note)


def _short(setting: str) -> str:
    for prefix in ("distance ", "sequence length ", "prompt "):
        setting = setting.replace(prefix, "")
    return setting


def models_table(rows: list[dict]) -> Table | None:
    metrics = [
        "parameters",
        "optimizer steps",
        "training tokens",
        "training time",
        "recipe tokens/s",
        "validation perplexity",
        "unigram perplexity",
    ]
    models = [m for m in _models(rows, "causal") if m != UNIGRAM]
    if not models:
        return None
    values = {(r["model"], r["metric"]): r for r in rows if r["section"] == "causal" and r["metric"] in metrics}
    body = []
    for m in models:
        cells = [m]
        for metric in metrics:
            record = values.get((m, metric))
            text = _cell_text(record) if record else "–"
            if record and metric == "validation perplexity" and record.get("setting"):
                text += f" ({record['setting']})"
            cells.append(text)
        cells.append(inference_setting(m))
        body.append(cells)
    note = "The cost of each model in this run: its parameters, optimizer steps, training tokens and seconds."
    return Table("Models", ["model", *metrics, "inference setting"], body, note)


def encoder_table(rows: list[dict]) -> Table | None:
    enc = [r for r in rows if r["section"] == "encoder"]
    if not enc:
        return None
    metrics: list[str] = []
    values = {}
    for r in enc:
        label = _encoder_label(r)
        if label not in metrics and "majority" not in label:
            metrics.append(label)
        values[(r["model"], label)] = r
    models = _models(rows, "encoder")
    body = [[m, *(_cell_text(values[(m, k)]) if (m, k) in values else "–" for k in metrics)] for m in models]
    majority = {r["metric"]: r["value"] for r in enc if "majority" in r["metric"]}
    note = "; ".join(f"{k}: {_format(v)}" for k, v in majority.items())
    return Table("Encoders", ["model", *metrics], body, note)


def _encoder_label(record: dict) -> str:
    """An encoder column: the metric, with its setting for the cost metrics (which length it was measured at)."""
    costs = "tokens/s" in record["metric"] or "peak" in record["metric"]
    return f"{record['metric']} ({record['setting']})" if record["setting"] and costs else record["metric"]


def lra_table(rows: list[dict]) -> Table | None:
    """Our encoders' accuracy (%) on the Long Range Arena's tasks made here, beside the published table."""
    ours = {(r["model"], r["metric"]): r for r in rows if r["section"] == "encoder"}
    models = _models(rows, "encoder")
    titles = [TASK_TITLES[t] for t in LRA_TASKS]
    if not any((m, f"{t} accuracy") in ours for m in models for t in titles):
        return None
    body = []
    for m in models:
        cells = [f"{m} (ours)"]
        for title in titles:
            record = ours.get((m, f"{title} accuracy"))
            if record is None or record["value"] is None:
                cells.append("–")
            else:
                spread = f" ± {100 * record['spread']:.1f}" if record.get("seeds") else ""
                cells.append(f"{100 * record['value']:.1f}{spread}")
        body.append(cells)
    first = models[0]
    floor = []
    for title in titles:
        record = ours.get((first, f"{title} majority-class accuracy"))
        floor.append(f"{100 * record['value']:.1f}" if record else "–")
    body.append(["majority class (ours)", *floor])
    for name, scores in PUBLISHED.items():
        body.append([f"{name} (LRA paper)", *(f"{scores[t]:.2f}" for t in LRA_TASKS)])
    title = "Long Range Arena: ours beside the published table (accuracy, %)"
    return Table(title, ["model", *titles], body, PUBLISHED_SCALE)


def tables(rows: list[dict], settings: dict) -> list[Table]:
    chance = f"chance is {CHANCE:.2f} per digit"
    passkey_note = (
        f"Each trained model then trained on the task for {settings['passkey_steps']} steps of "
        f"{settings['passkey_batch']} samples at {_trained_at(settings)}; models without memory read the last "
        f"{settings['block']} tokens (their training length); a model built on the dense baseline (the kNN-LM) "
        f"trains its LM alone, as its paper does, and is scored with retrieval on; {chance}."
    )
    cost_note = (
        f"One forward and backward pass; memory models read the sequence in segments of {settings['segment']} "
        "tokens with their memory carried, the others in one block."
    )
    decoding = f"3c. Decoding tokens/s after a prompt ({settings['new_tokens']} new tokens, greedy)"
    found = [
        models_table(rows),
        metric_table(
            rows,
            "perplexity by position",
            "1. Perplexity by position in held-out documents (tokens)",
            "Each model at its own inference setting (see Models); lower is better; the unigram row is the add-one "
            "unigram model of the training tokens, the floor to beat.",
        ),
        metric_table(
            rows, "passkey accuracy", "2. Passkey retrieval: digit accuracy by distance (tokens)", passkey_note
        ),
        metric_table(rows, "training tokens/s", "3a. Training tokens/s by sequence length (batch 1)", cost_note),
        metric_table(rows, "training peak memory", "3b. Training peak memory (MiB) by sequence length"),
        metric_table(rows, "decoding tokens/s", decoding),
        metric_table(rows, "decoding peak memory", "3d. Decoding peak memory (MiB) by prompt length"),
        encoder_table(rows),
        lra_table(rows),
    ]
    return [t for t in found if t is not None]


# ----------------------------------------------------------------------------------------------------------- reading
def _values(rows: list[dict], metric: str, section: str = "causal") -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["metric"] == metric and r["section"] == section and isinstance(r["value"], int | float):
            out[r["model"]][r["setting"]] = float(r["value"])
    return out


def _number(setting: str) -> int:
    return int(setting.split()[-1])


def _memory_models(models) -> list[str]:
    from ..registry import ARCHITECTURES

    return [m for m in models if m in ARCHITECTURES and ARCHITECTURES[m].carried_state is not None]


def _reading_training(rows: list[dict], settings: dict) -> list[str]:
    said = []
    steps = {m: v[""] for m, v in _values(rows, "optimizer steps").items() if "" in v}
    tokens = _values(rows, "training tokens")
    if steps:
        same = len(set(steps.values())) == 1
        counts = sorted({t for v in tokens.values() for t in v.values()})
        step_counts = ", ".join(f"{s:,.0f}" for s in sorted(set(steps.values())))
        token_counts = f" and {', '.join(f'{t:,.0f}' for t in counts)} training tokens" if counts else ""
        said.append(
            f"Work: {'every' if same else 'not every'} causal model took {step_counts} optimizer steps{token_counts}"
            + (" (memory models read each block in segments, their memory carried)." if same else ".")
        )
    ppl = _values(rows, "perplexity by position")
    unigram = ppl.pop(UNIGRAM, {}).get("overall")
    overall = {m: v["overall"] for m, v in ppl.items() if "overall" in v}
    if overall and unigram:
        below = [m for m, p in overall.items() if p < unigram]
        above = [m for m, p in overall.items() if p >= unigram]
        little = "their other numbers are those of models that have learned little more than word frequencies"
        if not below:
            verdict = f"no model beats it ({little})"
        elif above:
            verdict = f"{', '.join(below)} beat it; {', '.join(above)} do not ({little})"
        else:
            verdict = "every model beats it"
        said.append(
            f"Training: the unigram model of the training tokens scores {unigram:.0f} on the held-out documents; "
            f"{verdict}."
        )
    return said


def reading(rows: list[dict], settings: dict) -> list[str]:
    """What the numbers show, in sentences computed from them, one measurement after another."""
    return [
        *_reading_training(rows, settings),
        *_reading_sizes(rows),
        *_reading_perplexity(rows),
        *_reading_passkey(rows, settings),
        *_reading_cost(rows),
        *_reading_encoders(rows),
    ]


def _reading_sizes(rows: list[dict]) -> list[str]:
    """Parameter counts against the dense baseline's."""
    said: list[str] = []
    parameters = {m: v[""] for m, v in _values(rows, "parameters").items() if "" in v}
    baseline = parameters.get("dense_llama")
    if baseline:
        off = {m: count / baseline - 1 for m, count in parameters.items() if abs(count / baseline - 1) > 0.10}
        if off:
            listed = ", ".join(f"{m} {share:+.0%}" for m, share in off.items())
            why = (
                " (a Reformer's output layer reads both reversible streams, twice the width)"
                if "reformer" in off
                else ""
            )
            said.append(
                f"Size: every model is within 10 % of the dense baseline's {baseline:,.0f} parameters except {listed}"
                f"{why}."
            )
        else:
            said.append(f"Size: every model is within 10 % of the dense baseline's {baseline:,.0f} parameters.")
    return said


def _reading_perplexity(rows: list[dict]) -> list[str]:
    """Perplexity overall, in the farthest bucket and from the first bucket to the last."""
    said: list[str] = []
    ppl = _values(rows, "perplexity by position")
    ppl.pop(UNIGRAM, None)
    if ppl:
        overall = {m: v["overall"] for m, v in ppl.items() if "overall" in v}
        best = min(overall, key=overall.get)
        said.append(
            f"Perplexity: {best} has the lowest perplexity over the held-out documents ({overall[best]:.1f}); "
            + ", ".join(f"{m} {v:.1f}" for m, v in sorted(overall.items(), key=lambda kv: kv[1]) if m != best)
            + "."
        )
        buckets = [b for b in next(iter(ppl.values())) if b != "overall"]
        if len(buckets) >= 2 and BASELINE in ppl:
            last = buckets[-1]
            base_last = ppl[BASELINE].get(last)
            notes = []
            for m in _memory_models(ppl):
                if m in ppl and base_last and last in ppl[m]:
                    change = 100 * (ppl[m][last] / base_last - 1)
                    notes.append(f"{m} {change:+.0f} %")
            if notes:
                said.append(
                    f"In the farthest bucket ({last} tokens) the memory models' perplexity against the dense "
                    f"baseline's ({base_last:.1f}): " + ", ".join(notes) + "."
                )
            gains = {}
            for m, v in ppl.items():
                if buckets[0] in v and last in v:
                    gains[m] = 100 * (1 - v[last] / v[buckets[0]])
            if gains:
                helped = [m for m, g in gains.items() if g > 5 and (BASELINE not in gains or g > gains[BASELINE] + 5)]
                said.append(
                    "From the first bucket to the last, perplexity falls by "
                    + ", ".join(f"{m} {g:.0f} %" for m, g in gains.items())
                    + ". "
                    + (
                        f"Perplexity falls with position more for {', '.join(helped)} than for the dense baseline "
                        "(by more than 5 points)."
                        if helped
                        else "No model gains clearly more from far positions than the dense baseline at this scale "
                        "(differences within 5 points): short training teaches little use of far context."
                    )
                )
    return said


def _reading_passkey(rows: list[dict], settings: dict) -> list[str]:
    """Passkey accuracy beyond the dense baseline's window and inside it."""
    said: list[str] = []
    key = _values(rows, "passkey accuracy")
    if key:
        window = settings["block"]
        far = sorted({_number(s) for v in key.values() for s in v if _number(s) > window})
        base = key.get(BASELINE, {})
        if far:
            winners = []
            for m, v in key.items():
                if m == BASELINE:
                    continue
                beats = [d for d in far if v.get(f"distance {d}", 0) > _passkey_floor(base, d) + 0.1]
                if beats:
                    winners.append(f"{m} (at {', '.join(map(str, beats))})")
            if winners:
                said.append(
                    f"Passkey: beyond the baseline's {window}-token window, these beat the dense baseline by more "
                    f"than 10 points: {'; '.join(winners)}."
                )
            else:
                said.append(
                    f"Passkey: beyond the baseline's {window}-token window no model beats the dense baseline by more "
                    f"than 10 points at this task budget (chance is {CHANCE:.2f})."
                )
        near = sorted({_number(s) for v in key.values() for s in v if _number(s) <= window})
        if near:
            d = near[-1]
            found = {m: v.get(f"distance {d}") for m, v in key.items() if f"distance {d}" in v}
            good = [m for m, a in found.items() if a is not None and a > 2 * CHANCE]
            verdict = (
                f"{', '.join(good)} {'finds' if len(good) == 1 else 'find'} the key above twice chance"
                if good
                else "no model finds the key above twice chance: the task budget is too small to learn the copy"
            )
            said.append(f"Within the window (distance {d}) {verdict}.")
    return said


def _reading_cost(rows: list[dict]) -> list[str]:
    """Training speed at the longest length, and where a model ran out of memory or time."""
    said: list[str] = []
    speed = _values(rows, "training tokens/s")
    if speed:
        statuses = defaultdict(dict)
        for r in rows:
            if r["metric"] == "training tokens/s" and r["section"] == "causal" and r.get("status"):
                statuses[r["model"]][_number(r["setting"])] = r["status"]
        longest = max(_number(s) for v in speed.values() for s in v)
        at = {m: v[f"sequence length {longest}"] for m, v in speed.items() if f"sequence length {longest}" in v}
        if at:
            fastest = max(at, key=at.get)
            said.append(
                f"Training cost: at {longest} tokens {fastest} trains fastest ({at[fastest]:,.0f} tokens/s)"
                + (
                    f"; the dense baseline runs {at[BASELINE]:,.0f} tokens/s"
                    if BASELINE in at and fastest != BASELINE
                    else ""
                )
                + (f"; the slowest, {min(at, key=at.get)}, {min(at.values()):,.0f} tokens/s" if len(at) > 1 else "")
                + "."
            )
        for m, failed in statuses.items():
            first = min(failed)
            said.append(f"{m} stopped at {first} tokens ({failed[first]}).")
        if BASELINE in statuses:
            limit = min(statuses[BASELINE])
            reach = [m for m, v in speed.items() if m != BASELINE and f"sequence length {limit}" in v]
            if reach:
                said.append(f"Where the baseline stopped ({limit} tokens), these still train: {', '.join(reach)}.")
        elif len(at) > 1:
            said.append("No model ran out of memory or time in the measured lengths, the dense baseline included.")
    return said


def _reading_encoders(rows: list[dict]) -> list[str]:
    """Each encoder task's best model against the majority class."""
    said: list[str] = []
    for title in dict.fromkeys(TASK_TITLES.values()):
        acc = {r["model"]: r["value"] for r in rows if r["metric"] == f"{title} accuracy" and r["value"] is not None}
        floor = next((r["value"] for r in rows if r["metric"] == f"{title} majority-class accuracy"), None)
        if acc:
            best = max(acc, key=acc.get)
            above = [m for m, a in acc.items() if floor is not None and a > floor + 0.02]
            said.append(
                f"{title}: {best} is most accurate ({acc[best]:.3f}"
                + (f"; always answering the most frequent class scores {floor:.3f}" if floor is not None else "")
                + "); "
                + (f"{', '.join(above)} beat that floor." if above else "no encoder beats that floor at this budget.")
            )
    return said


def _trained_at(settings: dict) -> str:
    train = passkey_train_distances(settings)
    if train == list(settings["passkey_distances"]):
        return "these distances"
    return f"distance{'s' if len(train) > 1 else ''} {', '.join(map(str, train))} (inside the dense baseline's window)"


def _passkey_floor(base: dict[str, float], distance: int) -> float:
    return max(base.get(f"distance {distance}", CHANCE), CHANCE)


# ------------------------------------------------------------------------------------------------------------ plots
def _bucket_end(label: str) -> int:
    end = label.split("-")[1]
    return int(end.replace("k", "")) * 1024 if end.endswith("k") else int(end)


def _spreads(rows: list[dict], metric: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["metric"] == metric and r["section"] == "causal" and r.get("seeds"):
            out[r["model"]][r["setting"]] = float(r["spread"])
    return out


def _line_plot(plt, rows: list[dict], metric: str, labels: tuple[str, str, str], logy: bool = False):
    """One line per model against the setting's number (log-2 axis), error bars where seeds spread; the
    reference rows (unigram) dotted; returns the figure, or None without data."""
    data = _values(rows, metric)
    if not data:
        return None
    spreads = _spreads(rows, metric)
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    for model, values in data.items():
        points = [(s, v) for s, v in values.items() if s != "overall"]
        xs = [_bucket_end(s) if metric == "perplexity by position" else _number(s) for s, _ in points]
        errors = [spreads.get(model, {}).get(s, 0.0) for s, _ in points]
        if model == UNIGRAM:
            axis.plot(xs, [v for _, v in points], ":", color="grey", label="unigram (floor)")
            continue
        style = "--" if model == BASELINE else "-"
        axis.errorbar(xs, [v for _, v in points], yerr=errors, fmt=style, marker="o", capsize=2, label=model)
    axis.set_xscale("log", base=2)
    if logy:
        axis.set_yscale("log")
    title, xlabel, ylabel = labels
    axis.set_title(title)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    return figure, axis


def _encoder_plot(plt, rows: list[dict]):
    accuracy = [
        r
        for r in rows
        if r["section"] == "encoder"
        and r["metric"].endswith(" accuracy")
        and "majority" not in r["metric"]
        and r["value"] is not None
    ]
    if not accuracy:
        return None
    tasks = list(dict.fromkeys(r["metric"] for r in accuracy))
    models = _models(accuracy, "encoder")
    figure, axis = plt.subplots(figsize=(max(6.4, 1.3 * len(tasks) + 2), 4.0))
    width = 0.8 / max(1, len(models))
    for i, model in enumerate(models):
        found = {r["metric"]: r for r in accuracy if r["model"] == model}
        heights = [found[t]["value"] if t in found else 0 for t in tasks]
        errors = [found[t].get("spread", 0.0) if t in found else 0 for t in tasks]
        positions = [t + i * width for t in range(len(tasks))]
        axis.bar(positions, heights, width, yerr=errors, capsize=2, label=model)
    for t, task in enumerate(tasks):
        majority = task.replace("accuracy", "majority-class accuracy")
        floor = next((r["value"] for r in rows if r["metric"] == majority), None)
        if floor is not None:
            axis.hlines(floor, t - width / 2, t + 0.8 - width / 2, colors="grey", linestyles=":")
    axis.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], [t.replace(" accuracy", "") for t in tasks])
    axis.set_ylabel("accuracy (dotted: majority class)")
    axis.set_title("Encoders")
    return figure, axis


# metric -> file name, (title, x label, y label), logarithmic y axis
PLOTS = [
    (
        "perplexity by position",
        "perplexity_by_position",
        ("Perplexity by position", "end of position bucket (tokens)", "perplexity"),
        True,
    ),
    ("passkey accuracy", "passkey", ("Passkey retrieval", "distance (tokens)", "digit accuracy"), False),
    ("training tokens/s", "training_speed", ("Training speed", "sequence length", "tokens/s"), True),
    ("training peak memory", "training_memory", ("Training peak memory", "sequence length", "MiB"), True),
    ("decoding tokens/s", "decoding_speed", ("Decoding speed", "prompt length", "tokens/s"), True),
]


def plots(rows: list[dict], folder: Path) -> list[Path]:
    """The PNG plots of the (seed-folded) rows, reference levels drawn: the unigram perplexity, passkey chance,
    each task's majority class."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = []
    for metric, name, labels, logy in PLOTS:
        made = _line_plot(plt, rows, metric, labels, logy)
        if made is None:
            continue
        figure, axis = made
        if metric == "passkey accuracy":
            axis.axhline(CHANCE, color="grey", linewidth=0.8, linestyle=":", label="chance")
        drawn.append((name, figure, axis))
    made = _encoder_plot(plt, rows)
    if made is not None:
        drawn.append(("encoders", *made))
    written = []
    for name, figure, axis in drawn:
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = folder / f"{name}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------------------ write
def _atomic_write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def _summary(settings: dict, versions: dict, command: dict, seconds: float, results: dict) -> tuple[str, str]:
    """The report's two opening sentences: the run (command, time, machine) and the work (shape, budget)."""
    cell_seconds = sum(r.get("seconds", 0.0) for r in results.values())
    cpu_seconds = sum(r.get("cpu_seconds", 0.0) for r in results.values())
    header = (
        f"Command: `tf-family compare {command_line(command)}` - this run {seconds / 60:.1f} min, all cells "
        f"{cell_seconds / 60:.1f} min of wall time and {cpu_seconds / 60:.1f} min of CPU time (cached cells count "
        f"their first run); {versions['machine']}; torch {versions['torch']}, transformers {versions['transformers']}, "
        f"device {settings['device']}."
    )
    budget = (
        f"{settings['minutes']} min of training per model"
        if settings.get("minutes")
        else f"{settings['steps']:,} optimizer steps of {settings['batch']} x {settings['block']} tokens per model "
        f"({settings['steps'] * settings['batch'] * settings['block']:,} tokens)"
    )
    shape = (
        f"Shared shape: width {settings['width']}, depth {settings['depth']}, {settings['heads']} heads, "
        f"feed-forward {settings['ffn']}; {budget}; memory models read each block in segments of "
        f"{settings['segment']} tokens, their memory carried; seeds {settings['seeds']}. Models: "
        f"{settings.get('chosen', 'the whole family')}."
    )
    return header, shape


def _markdown(header: str, shape: str, said: list[str], found: list[Table], errors: list[dict], images) -> str:
    failed = [e for e in errors if e["error"] != "not run yet"]
    pending = [e["cell"] for e in errors if e["error"] == "not run yet"]
    lines = ["# tf-family compare", "", header, "", shape, "", "## Reading", ""]
    lines += [f"- {s}" for s in said] or ["- (no finished measurement to read)"]
    lines += ["", "## Tables", ""] + [t.markdown() for t in found]
    if failed:
        lines += ["## Failed cells", ""] + [f"- `{e['cell']}`: {e['error']}" for e in failed] + [""]
    if pending:
        lines += ["## Not run yet", "", ", ".join(f"`{cell}`" for cell in pending), ""]
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def _html(header: str, shape: str, said: list[str], found: list[Table], errors: list[dict], images) -> str:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    environment = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    pictures = [(p.stem, base64.b64encode(p.read_bytes()).decode("ascii")) for p in images]
    return environment.get_template("report.html.j2").render(
        header=header,
        shape=shape,
        reading=said,
        tables=found,
        failed=[e for e in errors if e["error"] != "not run yet"],
        pending=[e["cell"] for e in errors if e["error"] == "not run yet"],
        images=pictures,
    )


def _csv(rows: list[dict], errors: list[dict], common: dict, settings_text: str) -> str:
    buffer = io.StringIO()
    fields = ["section", "model", "metric", "setting", "value", "unit", "status", "seed", *common, "settings"]
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, **common, "status": r.get("status", ""), "settings": settings_text})
    for e in errors:
        record = {"section": "", "model": e["model"], "metric": e["cell"], "status": f"error: {e['error']}"}
        writer.writerow({**record, **common, "settings": settings_text})
    return buffer.getvalue()


def write_report(
    folder: Path, results: dict[str, dict], settings: dict, versions: dict, command: dict, seconds: float
) -> dict[str, Path]:
    """Write ``compare.md``, ``compare.csv``, ``compare.json``, the PNG plots and ``report.html`` to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, errors = collect(results)
    folded = fold_seeds(rows)
    found = tables(folded, settings)
    said = reading(folded, settings)
    images = plots(folded, folder)
    header, shape = _summary(settings, versions, command, seconds, results)
    paths = {
        "markdown": folder / "compare.md",
        "csv": folder / "compare.csv",
        "json": folder / "compare.json",
        "html": folder / "report.html",
    }
    _atomic_write(paths["markdown"], _markdown(header, shape, said, found, errors, images))
    common = {
        "tf_family": versions["tf_family"],
        "torch": versions["torch"],
        "transformers": versions["transformers"],
        "device": settings["device"],
    }
    settings_text = json.dumps(settings, sort_keys=True, default=str)
    _atomic_write(paths["csv"], _csv(rows, errors, common, settings_text))
    document = {
        "command": command,
        "settings": settings,
        "versions": versions,
        "seconds": seconds,
        "cell_seconds": sum(r.get("seconds", 0.0) for r in results.values()),
        "cpu_seconds": sum(r.get("cpu_seconds", 0.0) for r in results.values()),
        "reading": said,
        "rows": [{**r, **common} for r in rows],
        "errors": errors,
    }
    _atomic_write(paths["json"], json.dumps(document, indent=1, default=str))
    _atomic_write(paths["html"], _html(header, shape, said, found, errors, images))
    return {**paths, "plots": images}


def command_line(command: dict) -> str:
    """The options a run was given, as a command line."""
    return " ".join(command.get("argv", []))


__all__ = ["Table", "collect", "lra_table", "plots", "reading", "tables", "write_report"]
