"""`tf-family compare` end to end on a miniature grid: two causal models (Transformer-XL and the dense Llama
baseline), a third whose config is refused (its cells recorded as failed while the rest run), one encoder task; then
the outputs, and a rerun that resumes from the cache. Plus the ListOps generator against the LRA rules."""

from __future__ import annotations

import base64
import csv
import json
import time

import pytest

from tf_family.cli import main as cli_main
from tf_family.compare import listops
from tf_family.compare.grid import build_parser, parse_settings

MINI = [
    "--quick", "--archs", "transfo_xl", "calm", "--encoders", "big_bird", "--encoder_tasks", "listops",
    "--config_overrides", "calm:num_key_value_heads=3",  # 2 heads cannot share 3 key/value heads: calm fails
    "--set", "width=32", "ffn=64", "segment=32", "block=64", "batch=2", "tokens=256", "train_docs=2",
    "eval_docs=1", "eval_length=256", "first_bucket=64", "passkey_distances=[16,80]", "passkey_steps=1",
    "passkey_batch=2", "passkey_eval_samples=2", "train_lengths=[64,128]", "decode_prompts=[32]", "new_tokens=3",
    "knn_memory=64", "encoder_steps=1", "encoder_batch=2", "listops_train=4", "listops_eval=4",
    "listops_words=[5,30]", "listops_max_length=96", "brown_max_length=96",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.recipe
def test_compare_miniature_grid_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "compare"
    assert cli_main(["compare", *MINI, "--cpu", "--output_dir", str(out)]) == 0

    table = (out / "compare.md").read_text()
    for heading in ("## Reading", "1. Perplexity by position", "2. Passkey", "3a. Training tokens/s",
                    "3c. Decoding tokens/s", "Encoders", "## Failed cells"):  # fmt: skip
        assert heading in table
    assert "| dense_llama |" in table and "| transfo_xl |" in table and "| dense_roberta |" in table

    document = json.loads((out / "compare.json").read_text())
    assert document["versions"]["torch"] and document["settings"]["width"] == 32
    rows = document["rows"]
    measured = {(r["model"], r["metric"]) for r in rows}
    for model in ("dense_llama", "transfo_xl"):
        for metric in ("parameters", "perplexity by position", "passkey accuracy", "training tokens/s",
                       "training peak memory", "decoding tokens/s"):  # fmt: skip
            assert (model, metric) in measured, (model, metric)
    assert ("big_bird", "ListOps accuracy") in measured and ("dense_roberta", "ListOps accuracy") in measured
    perplexities = [r["value"] for r in rows if r["metric"] == "perplexity by position"]
    assert all(1 < p < 1e6 for p in perplexities)
    accuracy = [r["value"] for r in rows if r["metric"] == "passkey accuracy"]
    assert all(0 <= a <= 1 for a in accuracy)
    # the dense baseline's parameter count is within 10 % of the family's median (here: Transformer-XL's alone)
    params = {r["model"]: r["value"] for r in rows if r["metric"] == "parameters"}
    assert abs(params["dense_llama"] / params["transfo_xl"] - 1) < 0.1

    # calm's config is refused: its cells are recorded with the error, the others ran
    errors = {e["cell"]: e["error"] for e in document["errors"]}
    assert "num_key_value_heads" in errors["train:calm"]
    assert errors["perplexity:calm"].startswith("needs train:calm")
    assert "calm" not in {r["model"] for r in rows}

    with open(out / "compare.csv", newline="") as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == len(rows) + len(errors)
    assert {"model", "metric", "setting", "value", "torch", "settings"} <= set(records[0])

    page = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"perplexity_by_position.png", "passkey.png", "training_speed.png", "encoders.png"} <= set(pngs)
    assert page.count("data:image/png;base64,") == len(pngs) and 'src="perplexity' not in page
    first = page.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(first)[:8] == b"\x89PNG\r\n\x1a\n"

    # a rerun resumes: every finished cell comes from the cache (nothing retrained); the failed cells run again
    cells = {p.name: p.stat().st_mtime_ns for p in out.glob("cache/*/cells/*.json")}
    started = time.perf_counter()
    assert cli_main(["compare", *MINI, "--cpu", "--output_dir", str(out)]) == 0
    rerun_seconds = time.perf_counter() - started
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("cache/*/cells/*.json")}
    failed = {name for name in cells if "calm" in name}
    assert {n: t for n, t in after.items() if n not in failed} == {n: t for n, t in cells.items() if n not in failed}
    assert all(after[name] > cells[name] for name in failed)
    assert json.loads((out / "compare.json").read_text())["rows"] == rows
    assert rerun_seconds < document["cell_seconds"]
    assert "cell(s) failed" in capsys.readouterr().out


def test_compare_refuses_bad_options():
    parser = build_parser()
    with pytest.raises(ValueError, match="--archs"):
        parse_settings(parser.parse_args(["--archs", "big_bird"]))
    with pytest.raises(ValueError, match="--set"):
        parse_settings(parser.parse_args(["--set", "widht=3"]))
    with pytest.raises(ValueError, match="--tokens and --minutes"):
        parse_settings(parser.parse_args(["--tokens", "5", "--minutes", "1"]))
    with pytest.raises(ValueError, match="knn_lm"):
        parse_settings(parser.parse_args(["--archs", "knn_lm", "--no_baseline"]))


def _depth(tree) -> int:
    return 0 if isinstance(tree, int) else 1 + max(_depth(a) for a in tree[1])


def _parse(words: list[str]):
    """Words back into a tree (an independent reader of the generator's text)."""
    stack: list = [[]]
    for word in words:
        if word.startswith("["):
            stack.append([word])
        elif word == "]":
            operator, *arguments = stack.pop()
            stack[-1].append((operator, arguments))
        else:
            stack[-1].append(int(word))
    (tree,) = stack[0]
    return tree


def test_listops_follows_the_lra_rules():
    examples = listops.generate(60, seed=0, min_length=10, max_length=300, max_depth=4, max_args=5)
    assert examples == listops.generate(60, seed=0, min_length=10, max_length=300, max_depth=4, max_args=5)
    reference = {"[MIN": min, "[MAX": max, "[MED": lambda v: int(sorted(v)[(len(v) - 1) // 2] / 2
                 + sorted(v)[len(v) // 2] / 2), "[SM": lambda v: sum(v) % 10}  # fmt: skip

    def value(tree):
        return tree if isinstance(tree, int) else reference[tree[0]]([value(a) for a in tree[1]])

    operators = set()
    for example in examples:
        words = example["text"].split()
        assert 10 <= len(words) <= 300
        tree = _parse(words)
        assert _depth(tree) <= 4 and example["label"] == value(tree)
        stack = [tree]
        while stack:
            node = stack.pop()
            if not isinstance(node, int):
                operators.add(node[0])
                assert 2 <= len(node[1]) <= 5
                stack.extend(node[1])
    assert operators == set(listops.OPERATORS)
    assert listops.evaluate(("[MED", [2, 5])) == 3 and listops.evaluate(("[SM", [9, 8, 7])) == 4
    with pytest.raises(ValueError, match="widen the length bounds"):
        listops.generate(1, seed=0, min_length=200, max_length=210, max_depth=2, max_args=2)
