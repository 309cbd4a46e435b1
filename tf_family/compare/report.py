"""The report of `tf-family compare`: a Markdown table per measure (``compare.md``), every row as CSV and JSON (one
row per model x metric x setting, with the settings and versions), PNG plots, and one self-contained HTML page
(``report.html``: tables, plots inlined as base64, the reading). The reading is written from the numbers by
`reading`: each sentence is a comparison computed here, not a claim typed in advance."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from .measures import CHANCE
from .models import BASELINE, INFERENCE_SETTING

MEMORY_MODELS = ("transfo_xl", "compressive", "memorizing")


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

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in self.rows)
        note = f"<p>{html.escape(self.note)}</p>" if self.note else ""
        return f"<h3>{html.escape(self.title)}</h3>{note}<table><tr>{head}</tr>{body}</table>"


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
    return record.get("status") or _format(record["value"])


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
    headers = ["model", *(s.replace("distance ", "").replace("sequence length ", "").replace("prompt ", "") or metric
                          for s in settings)]  # fmt: skip
    return Table(title, headers, body, note)


def models_table(rows: list[dict]) -> Table | None:
    metrics = [
        "parameters",
        "training tokens",
        "training time",
        "recipe tokens/s",
        "validation perplexity",
        "unigram perplexity",
    ]
    models = _models(rows, "causal")
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
        cells.append(INFERENCE_SETTING.get(m, ""))
        body.append(cells)
    return Table("Models", ["model", *metrics, "inference setting"], body)


def encoder_table(rows: list[dict]) -> Table | None:
    enc = [r for r in rows if r["section"] == "encoder"]
    if not enc:
        return None
    metrics: list[str] = []
    for r in enc:
        label = f"{r['metric']} ({r['setting']})" if r["setting"] and "tokens/s" in r["metric"] or (
            r["setting"] and "peak" in r["metric"]) else r["metric"]  # fmt: skip
        if label not in metrics and "majority" not in label:
            metrics.append(label)
    values = {}
    for r in enc:
        label = f"{r['metric']} ({r['setting']})" if r["setting"] and ("tokens/s" in r["metric"] or
                                                                      "peak" in r["metric"]) else r["metric"]  # fmt: skip
        values[(r["model"], label)] = r
    models = _models(rows, "encoder")
    body = [[m, *(_cell_text(values[(m, k)]) if (m, k) in values else "–" for k in metrics)] for m in models]
    majority = {r["metric"]: r["value"] for r in enc if "majority" in r["metric"]}
    note = "; ".join(f"{k}: {_format(v)}" for k, v in majority.items())
    return Table("Encoders", ["model", *metrics], body, note)


def tables(rows: list[dict], settings: dict) -> list[Table]:
    chance = f"chance is {CHANCE:.2f} per digit"
    found = [
        models_table(rows),
        metric_table(rows, "perplexity by position", "1. Perplexity by position in held-out documents (tokens)",
                     "Each model at its own inference setting (see Models); lower is better."),
        metric_table(rows, "passkey accuracy", "2. Passkey retrieval: digit accuracy by distance (tokens)",
                     f"After {settings['passkey_steps']} fine-tuning steps of {settings['passkey_batch']} samples "
                     f"each; {chance}."),
        metric_table(rows, "training tokens/s", "3a. Training tokens/s by sequence length (batch 1)",
                     f"One forward and backward pass; memory models read the sequence in segments of "
                     f"{settings['segment']} tokens with their memory carried, the others in one block."),
        metric_table(rows, "training peak memory", "3b. Training peak memory (MiB) by sequence length"),
        metric_table(rows, "decoding tokens/s", f"3c. Decoding tokens/s after a prompt ({settings['new_tokens']} "
                     "new tokens, greedy)"),
        metric_table(rows, "decoding peak memory", "3d. Decoding peak memory (MiB) by prompt length"),
        encoder_table(rows),
    ]  # fmt: skip
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


def reading(rows: list[dict], settings: dict) -> list[str]:
    """What the numbers show, in sentences computed from them."""
    said = []
    validation = {m: v[""] for m, v in _values(rows, "validation perplexity").items() if "" in v}
    validation.update({m: min(v.values()) for m, v in _values(rows, "validation perplexity").items() if "" not in v})
    unigram = next(iter(v[""] for v in _values(rows, "unigram perplexity").values()), None)
    if validation and unigram:
        below = [m for m, p in validation.items() if p < unigram]
        above = [m for m, p in validation.items() if p >= unigram]
        little = "their other numbers are those of models that have learned little more than word frequencies"
        if not below:
            verdict = f"no model beats it yet ({little})"
        elif above:
            verdict = f"{', '.join(below)} beat it; {', '.join(above)} do not yet ({little})"
        else:
            verdict = "every model beats it"
        said.append(
            f"Training: the unigram model of the training tokens scores {unigram:.0f} on validation; {verdict}."
        )
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
    ppl = _values(rows, "perplexity by position")
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
            for m in MEMORY_MODELS:
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
                beats = [d for d in far if v.get(f"distance {d}", 0) > max(base.get(f"distance {d}", CHANCE), CHANCE)
                         + 0.1]  # fmt: skip
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
                    f"than 10 points at this fine-tuning budget (chance is {CHANCE:.2f})."
                )
        near = sorted({_number(s) for v in key.values() for s in v if _number(s) <= window})
        if near:
            d = near[-1]
            found = {m: v.get(f"distance {d}") for m, v in key.items() if f"distance {d}" in v}
            good = [m for m, a in found.items() if a is not None and a > 2 * CHANCE]
            said.append(
                f"Within the window (distance {d}) "
                + (
                    f"{', '.join(good)} find the key above twice chance."
                    if good
                    else "no model finds the key above "
                    "twice chance: the fine-tuning budget is too small to learn the copy."
                )  # fmt: skip
            )
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
    for task in ("ListOps", "Brown genres"):
        acc = {r["model"]: r["value"] for r in rows if r["metric"] == f"{task} accuracy" and r["value"] is not None}
        floor = next((r["value"] for r in rows if r["metric"] == f"{task} majority-class accuracy"), None)
        if acc:
            best = max(acc, key=acc.get)
            above = [m for m, a in acc.items() if floor is not None and a > floor + 0.02]
            said.append(
                f"{task}: {best} is most accurate ({acc[best]:.3f}"
                + (f"; always answering the most frequent class scores {floor:.3f}" if floor is not None else "")
                + "); "
                + (f"{', '.join(above)} beat that floor." if above else "no encoder beats that floor at this budget.")
            )
    return said


# ------------------------------------------------------------------------------------------------------------ plots
def plots(rows: list[dict], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def line_plot(metric: str, name: str, title: str, xlabel: str, ylabel: str, logx: bool, logy: bool = False):
        data = _values(rows, metric)
        if not data:
            return
        figure, axis = plt.subplots(figsize=(6.4, 4.0))
        for model, values in data.items():
            points = [(s, v) for s, v in values.items() if s != "overall"]
            if metric == "perplexity by position":
                xs = [int(s.split("-")[1].replace("k", "")) * (1024 if "k" in s.split("-")[1] else 1)
                      for s, _ in points]  # fmt: skip
            else:
                xs = [_number(s) for s, _ in points]
            style = "--" if model == BASELINE else "-"
            axis.plot(xs, [v for _, v in points], style, marker="o", label=model)
        if logx:
            axis.set_xscale("log", base=2)
        if logy:
            axis.set_yscale("log")
        if metric == "passkey accuracy":
            axis.axhline(CHANCE, color="grey", linewidth=0.8, linestyle=":", label="chance")
        axis.set_title(title)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = folder / f"{name}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)

    line_plot("perplexity by position", "perplexity_by_position", "Perplexity by position",
              "end of position bucket (tokens)", "perplexity", True)  # fmt: skip
    line_plot("passkey accuracy", "passkey", "Passkey retrieval", "distance (tokens)", "digit accuracy", True)
    line_plot("training tokens/s", "training_speed", "Training speed", "sequence length", "tokens/s", True, True)
    line_plot("training peak memory", "training_memory", "Training peak memory", "sequence length", "MiB", True,
              True)  # fmt: skip
    line_plot("decoding tokens/s", "decoding_speed", "Decoding speed", "prompt length", "tokens/s", True, True)
    accuracy = [r for r in rows if r["section"] == "encoder" and r["metric"].endswith(" accuracy")
                and "majority" not in r["metric"] and r["value"] is not None]  # fmt: skip
    if accuracy:
        tasks = sorted({r["metric"] for r in accuracy})
        models = _models(accuracy, "encoder")
        figure, axis = plt.subplots(figsize=(6.4, 4.0))
        width = 0.8 / max(1, len(models))
        for i, model in enumerate(models):
            values = {r["metric"]: r["value"] for r in accuracy if r["model"] == model}
            axis.bar([t + i * width for t in range(len(tasks))], [values.get(t, 0) for t in tasks], width,
                     label=model)  # fmt: skip
        for t, task in enumerate(tasks):
            floor = next((r["value"] for r in rows if r["metric"] == task.replace("accuracy", "majority-class accuracy")),
                         None)  # fmt: skip
            if floor is not None:
                axis.hlines(floor, t - width / 2, t + 0.8 - width / 2, colors="grey", linestyles=":")
        axis.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
        axis.set_ylabel("accuracy (dotted: majority class)")
        axis.set_title("Encoders")
        axis.legend(fontsize=7)
        figure.tight_layout()
        path = folder / "encoders.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


# ------------------------------------------------------------------------------------------------------------ write
def _atomic_write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def write_report(
    folder: Path, results: dict[str, dict], settings: dict, versions: dict, command: dict, seconds: float
) -> dict[str, Path]:
    """Write ``compare.md``, ``compare.csv``, ``compare.json``, the PNG plots and ``report.html`` to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rows, errors = collect(results)
    cell_seconds = sum(r.get("seconds", 0.0) for r in results.values())
    cpu_seconds = sum(r.get("cpu_seconds", 0.0) for r in results.values())
    found = tables(rows, settings)
    said = reading(rows, settings)
    images = plots(rows, folder)
    header = (
        f"Command: `tf-family compare {command_line(command)}` - this run {seconds / 60:.1f} min, all cells "
        f"{cell_seconds / 60:.1f} min of wall time and {cpu_seconds / 60:.1f} min of CPU time (cached cells count their first run); {versions['machine']}; torch "
        f"{versions['torch']}, transformers {versions['transformers']}, device {settings['device']}."
    )
    shape = (
        f"Shared shape: width {settings['width']}, depth {settings['depth']}, {settings['heads']} heads, "
        f"feed-forward {settings['ffn']}; memory models train on segments of {settings['segment']} tokens, the others "
        f"on blocks of {settings['block']}; "
        + (
            f"{settings['minutes']} min of training per model"
            if settings.get("minutes")
            else f"about {settings['tokens']:,} training tokens per model"
        )  # fmt: skip
        + f", batch {settings['batch']}."
    )
    markdown = ["# tf-family compare", "", header, "", shape, "", "## Reading", ""]
    markdown += [f"- {s}" for s in said] or ["- (no finished measurement to read)"]
    markdown += ["", "## Tables", ""] + [t.markdown() for t in found]
    failed = [e for e in errors if e["error"] != "not run yet"]
    pending = [e["cell"] for e in errors if e["error"] == "not run yet"]
    if failed:
        markdown += ["## Failed cells", ""] + [f"- `{e['cell']}`: {e['error']}" for e in failed] + [""]
    if pending:
        markdown += ["## Not run yet", "", ", ".join(f"`{cell}`" for cell in pending), ""]
    markdown += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    paths = {"markdown": folder / "compare.md", "csv": folder / "compare.csv", "json": folder / "compare.json",
             "html": folder / "report.html"}  # fmt: skip
    _atomic_write(paths["markdown"], "\n".join(markdown) + "\n")

    common = {"tf_family": versions["tf_family"], "torch": versions["torch"],
              "transformers": versions["transformers"], "device": settings["device"]}  # fmt: skip
    buffer = io.StringIO()
    fields = ["section", "model", "metric", "setting", "value", "unit", "status", *common, "settings"]
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    settings_text = json.dumps(settings, sort_keys=True, default=str)
    for r in rows:
        writer.writerow({**r, **common, "status": r.get("status", ""), "settings": settings_text})
    for e in errors:
        writer.writerow({"section": "", "model": e["model"], "metric": e["cell"], "status": f"error: {e['error']}",
                         **common, "settings": settings_text})  # fmt: skip
    _atomic_write(paths["csv"], buffer.getvalue())
    document = {"command": command, "settings": settings, "versions": versions, "seconds": seconds,
                "cell_seconds": cell_seconds, "cpu_seconds": cpu_seconds, "reading": said, "rows": [{**r, **common} for r in rows],
                "errors": errors}  # fmt: skip
    _atomic_write(paths["json"], json.dumps(document, indent=1, default=str))

    parts = [f"<h1>tf-family compare</h1><p>{html.escape(header)}</p><p>{html.escape(shape)}</p><h2>Reading</h2><ul>"]
    parts += [f"<li>{html.escape(s)}</li>" for s in said]
    parts.append("</ul><h2>Tables</h2>")
    parts += [t.html() for t in found]
    if failed:
        parts.append("<h2>Failed cells</h2><ul>")
        parts += [f"<li><code>{html.escape(e['cell'])}</code>: {html.escape(e['error'])}</li>" for e in failed]
        parts.append("</ul>")
    if pending:
        parts.append(f"<h2>Not run yet</h2><p>{html.escape(', '.join(pending))}</p>")
    parts.append("<h2>Plots</h2>")
    for image in images:
        encoded = base64.b64encode(image.read_bytes()).decode("ascii")
        parts.append(f'<p><img alt="{image.stem}" src="data:image/png;base64,{encoded}"></p>')
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;margin:8px 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child{text-align:left}")  # fmt: skip
    page = (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>tf-family compare</title><style>{style}'
            f"</style></head><body>{''.join(parts)}</body></html>\n")  # fmt: skip
    _atomic_write(paths["html"], page)
    return {**paths, "plots": images}


def command_line(command: dict) -> str:
    """The options a run was given, as a command line."""
    return " ".join(command.get("argv", []))


__all__ = ["Table", "collect", "plots", "reading", "tables", "write_report"]
