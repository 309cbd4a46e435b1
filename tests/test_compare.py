"""`tf-family compare`: a miniature grid end to end (two causal models, one whose config is refused, one encoder on two
tasks, two seeds), then the outputs and a rerun that resumes from the cache; a scratch architecture registered for the
test joins the grid with no change to `tf_family.compare`; the settings, the quick subset, the one-GPU grid's dry run;
the report from rows (seeds folded, reference levels, the LRA table beside the published one); the Long Range Arena's
tasks as generated here."""

from __future__ import annotations

import base64
import csv
import json
import os
import time
from types import MappingProxyType

import pytest

from tf_family.cli import main as cli_main
from tf_family.compare import family, listops, lra
from tf_family.compare.cli import MAX_DEFAULT_JOBS, build_parser, default_jobs, parse_settings
from tf_family.compare.grid import Grid, cell_chains, chain_queue
from tf_family.compare.presets import passkey_train_distances
from tf_family.compare.report import write_report
from tf_family.compare.rows import fold_seeds, row

TINY = [
    "--set",
    "width=32",
    "heads=2",
    "ffn=64",
    "segment=32",
    "block=64",
    "batch=2",
    "steps=2",
    "train_docs=2",
    "eval_docs=1",
    "eval_length=256",
    "first_bucket=64",
    "passkey_distances=[16,80]",
    "passkey_steps=1",
    "passkey_batch=2",
    "passkey_eval_samples=2",
    "train_lengths=[64,128]",
    "decode_prompts=[32]",
    "new_tokens=3",
    "knn_memory=64",
    "encoder_steps=1",
    "encoder_batch=2",
    "task_train=4",
    "task_eval=4",
    "listops_words=[5,20]",
    "pathfinder_side=8",
    "brown_max_length=96",
]
MINI = [
    "--quick",
    "--archs",
    "transfo_xl",
    "calm",
    "--encoders",
    "big_bird",
    "--encoder_tasks",
    "listops",
    "pathfinder",
    "--config_overrides",
    "calm:num_key_value_heads=3",  # 2 heads cannot share 3 key/value heads: calm fails
    *TINY,
    "seeds=[1,2]",
]


@pytest.mark.slow
@pytest.mark.recipe
def test_compare_miniature_grid_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "compare"
    # two processes fill the cache side by side (--jobs); the rerun below, in one, finds every cell there
    assert cli_main(["compare", *MINI, "--cpu", "--jobs", "2", "--output_dir", str(out)]) == 0

    table = (out / "compare.md").read_text()
    for heading in (
        "## Reading",
        "1. Perplexity by position",
        "2. Passkey",
        "3a. Training tokens/s",
        "3c. Decoding tokens/s",
        "Encoders",
        "Long Range Arena",
        "## Failed cells",
    ):
        assert heading in table
    assert "| dense_llama |" in table and "| transfo_xl |" in table and "| dense_roberta |" in table
    assert "| unigram |" in table and "(LRA paper)" in table and " ± " in table  # two seeds: mean ± spread

    document = json.loads((out / "compare.json").read_text())
    assert document["versions"]["torch"] and document["settings"]["width"] == 32
    rows = document["rows"]
    # the row shape and the first pass's metric names, which scripts read, are kept; new metrics are new rows
    assert all({"section", "model", "metric", "setting", "value", "unit"} <= set(r) for r in rows)
    first_pass = {
        "parameters",
        "training tokens",
        "training time",
        "recipe tokens/s",
        "validation perplexity",
        "unigram perplexity",
        "perplexity by position",
        "passkey accuracy",
        "training tokens/s",
        "training peak memory",
        "decoding tokens/s",
        "decoding peak memory",
        "ListOps accuracy",
        "ListOps training time",
        "ListOps majority-class accuracy",
        "ListOps training tokens/s",
    }
    assert first_pass <= {r["metric"] for r in rows}
    measured = {(r["model"], r["metric"]) for r in rows}
    for model in ("dense_llama", "transfo_xl"):
        for metric in (
            "parameters",
            "optimizer steps",
            "training tokens",
            "perplexity by position",
            "passkey accuracy",
            "training tokens/s",
            "training peak memory",
            "decoding tokens/s",
        ):
            assert (model, metric) in measured, (model, metric)
    assert {r["seed"] for r in rows if r["metric"] == "perplexity by position" and r["model"] != "unigram"} == {1, 2}
    # equal work: the memory model read the same tokens in the same optimizer steps, in segments
    steps = {r["model"]: r["value"] for r in rows if r["metric"] == "optimizer steps"}
    tokens = {r["model"]: (r["value"], r["setting"]) for r in rows if r["metric"] == "training tokens"}
    assert steps["transfo_xl"] == steps["dense_llama"] == 2
    assert tokens["transfo_xl"][0] == tokens["dense_llama"][0] == 2 * 2 * 64 and "segments" in tokens["transfo_xl"][1]
    for task in ("ListOps", "LRA Pathfinder"):
        assert ("big_bird", f"{task} accuracy") in measured and ("dense_roberta", f"{task} accuracy") in measured
    perplexities = [r["value"] for r in rows if r["metric"] == "perplexity by position"]
    assert all(1 < p < 1e6 for p in perplexities)
    assert all(0 <= r["value"] <= 1 for r in rows if r["metric"] == "passkey accuracy")
    params = {r["model"]: r["value"] for r in rows if r["metric"] == "parameters"}
    assert abs(params["dense_llama"] / params["transfo_xl"] - 1) < 0.1

    errors = {e["cell"]: e["error"] for e in document["errors"]}
    assert "num_key_value_heads" in errors["train:calm@1"]
    assert errors["perplexity:calm@1"].startswith("needs train:calm@1")
    assert "calm" not in {r["model"] for r in rows}

    with open(out / "compare.csv", newline="") as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == len(rows) + len(errors)
    assert {"model", "metric", "setting", "value", "seed", "torch", "settings"} <= set(records[0])

    page = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"perplexity_by_position.png", "passkey.png", "training_speed.png", "encoders.png"} <= set(pngs)
    assert page.count("data:image/png;base64,") == len(pngs) and 'src="perplexity' not in page
    first = page.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(first)[:8] == b"\x89PNG\r\n\x1a\n"

    cells = {p.name: p.stat().st_mtime_ns for p in out.glob("cache/*/cells/*.json")}
    started = time.perf_counter()
    assert cli_main(["compare", *MINI, "--cpu", "--jobs", "1", "--output_dir", str(out)]) == 0
    rerun_seconds = time.perf_counter() - started
    after = {p.name: p.stat().st_mtime_ns for p in out.glob("cache/*/cells/*.json")}
    failed = {name for name in cells if "calm" in name}
    assert {n: t for n, t in after.items() if n not in failed} == {n: t for n, t in cells.items() if n not in failed}
    assert all(after[name] > cells[name] for name in failed)
    assert json.loads((out / "compare.json").read_text())["rows"] == rows
    assert rerun_seconds < document["cell_seconds"]
    assert "cell(s) failed" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------- a scratch architecture
@pytest.fixture
def scratch_architecture(monkeypatch):
    """A Llama-shaped causal LM registered as ``scratch`` for the test: in the registry table every reader sees,
    and with the Auto classes (a model type no other test uses)."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    import tf_family.registry
    import tf_family.training.arguments
    from tf_family.spec import ArchSpec

    class ScratchConfig(LlamaConfig):
        model_type = "tff_compare_scratch"

    class ScratchForCausalLM(LlamaForCausalLM):
        config_class = ScratchConfig

    AutoConfig.register(ScratchConfig.model_type, ScratchConfig, exist_ok=True)
    AutoModelForCausalLM.register(ScratchConfig, ScratchForCausalLM, exist_ok=True)
    tiny = {
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 64,
        "vocab_size": 128,
    }
    spec = ArchSpec(
        name="scratch",
        title="Scratch (a test)",
        model_type=ScratchConfig.model_type,
        config=ScratchConfig,
        models={"causal_lm": ScratchForCausalLM},
        variants={"tiny": tiny},
        lora_target_modules=("q_proj",),
        reference="-",
        parity="-",
        card="default.md",
    )
    table = MappingProxyType({**tf_family.registry.ARCHITECTURES, "scratch": spec})
    for module in (tf_family.registry, tf_family.training.arguments):
        monkeypatch.setattr(module, "ARCHITECTURES", table)
    return spec


def test_a_registered_architecture_joins_the_grid_with_its_shape(scratch_architecture):
    assert "scratch" in family.causal_archs() and "scratch" not in family.encoder_archs()
    shape = family.Shape(width=48, depth=3, heads=4, ffn=96, max_length=300, segment=32, block=64, knn_memory=64)
    overrides = family.shape_overrides(scratch_architecture, shape)
    assert overrides["hidden_size"] == 48 and overrides["num_hidden_layers"] == 3
    assert overrides["num_attention_heads"] == overrides["num_key_value_heads"] == 4
    assert overrides["intermediate_size"] == 96 and overrides["max_position_embeddings"] >= 300
    assert overrides["attention_dropout"] == 0.0 and overrides["head_dim"] == 12
    assert family.group_of("scratch") == "attention"
    settings = parse_settings(build_parser().parse_args(["--cpu"]))
    assert "scratch" in settings["archs"]  # the default grid: the whole family, the new architecture included


@pytest.mark.recipe
def test_a_registered_architecture_gets_its_rows(scratch_architecture, tmp_path):
    out = tmp_path / "compare"
    argv = [
        "compare",
        "--quick",
        "--cpu",
        "--jobs",
        "1",  # the scratch architecture is registered in this process only
        "--archs",
        "scratch",
        "--no_baseline",
        "--encoders",
        "--measures",
        "perplexity",
        "--output_dir",
        str(out),
        *TINY,
        "seeds=[3]",
    ]
    assert cli_main(argv) == 0
    document = json.loads((out / "compare.json").read_text())
    assert document["errors"] == []
    measured = {(r["model"], r["metric"]) for r in document["rows"]}
    assert {
        ("scratch", "parameters"),
        ("scratch", "optimizer steps"),
        ("scratch", "perplexity by position"),
    } <= measured


@pytest.mark.recipe
def test_an_encoder_head_with_its_own_variant_gets_its_rows(tmp_path):
    """The Sparse Transformer's encoder heads take only the blockwise pattern (its "tiny" is the strided decoder): the
    encoder grid trains them from the variant the registry names for the task (`ArchSpec.task_variants`)."""
    assert "sparse_transformer" in family.encoder_archs()
    out = tmp_path / "compare"
    argv = ["compare", "--quick", "--cpu", "--jobs", "1", "--archs", "--no_baseline", "--encoders", "sparse_transformer",
            "--encoder_tasks", "listops", "--output_dir", str(out), *TINY, "seeds=[3]"]  # fmt: skip
    assert cli_main(argv) == 0
    document = json.loads((out / "compare.json").read_text())
    assert document["errors"] == []
    assert ("sparse_transformer", "ListOps accuracy") in {(r["model"], r["metric"]) for r in document["rows"]}


# --------------------------------------------------------------------------------------------------------- settings
def test_compare_refuses_bad_options():
    parser = build_parser()
    with pytest.raises(ValueError, match="--archs"):
        parse_settings(parser.parse_args(["--cpu", "--archs", "big_bird"]))
    with pytest.raises(ValueError, match="--set"):
        parse_settings(parser.parse_args(["--cpu", "--set", "widht=3"]))
    with pytest.raises(ValueError, match="--tokens and --minutes"):
        parse_settings(parser.parse_args(["--cpu", "--tokens", "5", "--minutes", "1"]))
    with pytest.raises(ValueError, match="kNN-LM"):
        parse_settings(parser.parse_args(["--cpu", "--archs", "knn_lm", "--no_baseline"]))
    with pytest.raises(ValueError, match="multiple of segment"):
        parse_settings(parser.parse_args(["--cpu", "--set", "block=100", "segment=64"]))
    with pytest.raises(ValueError, match="--cpu and --device cuda"):
        parse_settings(parser.parse_args(["--cpu", "--device", "cuda"]))


def test_jobs_keep_each_chain_of_needs_in_one_process_and_queue_the_heaviest_first():
    settings = parse_settings(build_parser().parse_args(["--quick", "--cpu"]))
    args = build_parser().parse_args(["--quick", "--cpu"])
    args.encoder_tasks = list(settings["encoder_tasks"])
    cells = Grid.__new__(Grid)
    cells.args, cells.settings, cells.seeds = args, settings, list(settings["seeds"])
    cells = cells.cells()
    chains = cell_chains(cells)
    chain_of = {cell.key: i for i, chain in enumerate(chains) for cell in chain}
    for cell in cells:  # whatever a cell needs runs before it, in its process
        assert all(chain_of[need] == chain_of[cell.key] for need in cell.needs)
    assert chain_of["train:knn_lm@42"] == chain_of["train:dense_llama@42"] != chain_of["train:dense_llama@43"]
    assert chain_of["cost:transfo_xl"] == chain_of["passkey:transfo_xl@42"]
    queue = chain_queue(cells)  # every cell once, the heaviest chains first, each chain in the grid's order
    assert sorted(c.key for chain in queue for c in chain) == sorted(c.key for c in cells)
    order = [c.key for c in cells]
    for chain in queue:
        assert [c.key for c in chain] == [k for k in order if k in {c.key for c in chain}]
    weights = [sum(3.0 if c.measure in ("train", "passkey") else 1.0 for c in chain) for chain in queue]
    assert weights[0] == max(weights) and weights[-1] < weights[0]
    assert any(c.key == "train:dense_llama@42" for c in queue[0])  # the baseline's chain carries the kNN-LM's
    with pytest.raises(ValueError, match="--jobs=0"):
        parse_settings(build_parser().parse_args(["--quick", "--cpu", "--jobs", "0"]))


def test_jobs_default_to_one_process_per_usable_core_on_cpu_and_one_on_a_gpu(monkeypatch):
    parser = build_parser()
    args = parser.parse_args(["--quick", "--cpu"])
    parse_settings(args)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert args.jobs == min(cores, MAX_DEFAULT_JOBS) >= 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert default_jobs("cpu") == MAX_DEFAULT_JOBS
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_jobs("cpu") == 1
    assert default_jobs("cuda") == 1
    args = parser.parse_args(["--quick", "--cpu", "--jobs", "3"])
    parse_settings(args)
    assert args.jobs == 3  # given, kept


def test_passkey_trains_inside_the_window_or_at_every_distance():
    parser = build_parser()
    quick = parse_settings(parser.parse_args(["--quick", "--cpu"]))
    assert quick["passkey_train"] == "window"
    assert passkey_train_distances(quick) == [d for d in quick["passkey_distances"] if d <= quick["block"]]
    assert max(quick["passkey_distances"]) > quick["block"]  # it still scores beyond the window
    gpu = parse_settings(parser.parse_args(["--device", "cuda"]))
    assert passkey_train_distances(gpu) == gpu["passkey_distances"]
    with pytest.raises(ValueError, match="passkey_train='often'"):
        parse_settings(parser.parse_args(["--quick", "--cpu", "--set", 'passkey_train="often"']))
    with pytest.raises(ValueError, match="within block=128 tokens"):
        parse_settings(parser.parse_args(["--quick", "--cpu", "--set", "passkey_distances=[200,400]"]))


def test_quick_takes_one_causal_model_per_group_and_says_so():
    settings = parse_settings(build_parser().parse_args(["--quick", "--cpu"]))
    groups = [family.group_of(m) for m in settings["archs"]]
    assert len(groups) == len(set(groups)) and set(groups) == {family.group_of(m) for m in family.causal_archs()}
    assert "one causal model per group" in settings["chosen"]
    assert settings["encoders"] == list(family.encoder_archs())[: settings["quick_encoders"]]
    whole = parse_settings(build_parser().parse_args(["--cpu"]))
    assert whole["archs"] == list(family.causal_archs()) and whole["chosen"] == "the whole family"


def test_the_gpu_grid_dry_run_lists_its_cells_without_a_gpu(tmp_path, capsys):
    assert cli_main(["compare", "--device", "cuda", "--dry-run", "--output_dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "device cuda, preset gpu" in out and "width=512" in out
    for model in ("dense_llama", *family.causal_archs()):
        assert f"train:{model}@42" in out
    for task in lra.TASKS:
        assert f"{task}:dense_roberta" in out
    assert not list(tmp_path.iterdir())  # nothing ran, nothing was written


# ----------------------------------------------------------------------------------------------------------- report
def _results(rows_by_cell: dict[str, list[dict]]) -> dict[str, dict]:
    return {key: {"rows": rows, "seconds": 1.0, "cpu_seconds": 1.0} for key, rows in rows_by_cell.items()}


def test_report_folds_seeds_draws_references_and_prints_the_lra_table(tmp_path):
    settings = parse_settings(build_parser().parse_args(["--quick", "--cpu"]))
    rows = {
        "perplexity:unigram": [
            row("causal", "unigram", "perplexity by position", 900.0, setting=s) for s in ("0-128", "overall")
        ]
    }
    for seed, (dense, xl) in ((1, (300.0, 280.0)), (2, (320.0, 300.0))):
        rows[f"s{seed}"] = [
            row("causal", "dense_llama", "perplexity by position", dense, setting="overall", seed=seed),
            row("causal", "transfo_xl", "perplexity by position", xl, setting="overall", seed=seed),
            row("causal", "dense_llama", "optimizer steps", 300, seed=seed),
            row("causal", "transfo_xl", "optimizer steps", 300, seed=seed),
            row("causal", "dense_llama", "passkey accuracy", 0.9, setting="distance 16", seed=seed),
            row("causal", "dense_llama", "passkey accuracy", 0.1, setting="distance 320", seed=seed),
            row("encoder", "longformer", "LRA Image accuracy", 0.5 + 0.1 * seed, seed=seed),
            row("encoder", "longformer", "LRA Image majority-class accuracy", 0.11, seed=seed),
        ]
    write_report(
        tmp_path,
        _results(rows),
        settings,
        {"machine": "m", "torch": "t", "transformers": "x", "tf_family": "f"},
        {"argv": ["--quick"]},
        1.0,
    )
    text = (tmp_path / "compare.md").read_text()
    assert "| dense_llama | – | 310.0 ± 10.0 |" in text  # the mean of two seeds and half their range
    assert "every model beats it" in text and "every causal model took 300 optimizer steps" in text
    assert "| longformer (ours) | – | – | – | 65.0 ± 5.0 | – |" in text
    assert "| Transformer (LRA paper) | 36.37 | 64.27 | 57.46 | 42.44 | 71.40 |" in text
    assert "Path-X" not in text and "bracket-stripping" in text  # the differences in scale are stated
    document = json.loads((tmp_path / "compare.json").read_text())
    assert len([r for r in document["rows"] if r["metric"] == "optimizer steps"]) == 4  # one row per seed kept
    page = (tmp_path / "report.html").read_text()
    assert "<h3>Long Range Arena: ours beside the published table (accuracy, %)</h3>" in page
    assert "<td>310.0 ± 10.0</td>" in page and "unigram" in page


def test_fold_seeds_keeps_single_rows_and_statuses():
    rows = [
        row("causal", "m", "x", 1.0, seed=1),
        row("causal", "m", "x", 3.0, seed=2),
        row("causal", "m", "y", None, status="out of memory"),
        row("causal", "n", "x", 5.0, seed=1),
    ]
    folded = {(r["model"], r["metric"]): r for r in fold_seeds(rows)}
    assert (
        folded[("m", "x")]["value"] == 2.0 and folded[("m", "x")]["spread"] == 1.0 and folded[("m", "x")]["seeds"] == 2
    )
    assert folded[("m", "y")]["status"] == "out of memory" and "seeds" not in folded[("n", "x")]


# ------------------------------------------------------------------------------------------- Long Range Arena tasks
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
    reference = {
        "[MIN": min,
        "[MAX": max,
        "[MED": lambda v: int(sorted(v)[(len(v) - 1) // 2] / 2 + sorted(v)[len(v) // 2] / 2),
        "[SM": lambda v: sum(v) % 10,
    }

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


def test_char_tokenizer_reads_one_token_per_character_brackets_included(tmp_path):
    tokenizer = lra.char_tokenizer(tmp_path / "tok")
    text = "[MAX 2 [MIN 4 7 ] ]"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.convert_ids_to_tokens(ids)[0] == "["
    assert tokenizer.unk_token_id not in ids and len(set(ids)) == len(set(text))
    examples = lra.listops_examples(3, seed=0, words=(5, 20), max_depth=3)
    assert all(len(e["text"]) + 2 <= lra.input_length("listops", {"listops_words": [5, 20]}) for e in examples)


def test_text_task_balances_imaginative_and_informative_brown_passages():
    examples = lra.text_examples(10, seed=0, length=50, split="validation")
    assert sorted(e["label"] for e in examples) == [0] * 5 + [1] * 5
    assert all(len(e["text"]) == 50 for e in examples)
    assert examples == lra.text_examples(10, seed=0, length=50, split="validation")


def test_retrieval_pairs_come_from_one_address_or_two():
    from tf_family.data import load_sotu

    documents = list(load_sotu()["validation"]["text"])
    for example in lra.retrieval_examples(6, seed=1, length=61, split="validation"):
        first, second = example["text"].split(lra.PAIR_SEPARATOR)
        assert len(first) == len(second) == 30
        same = any(first in d and second in d for d in documents)
        assert same == bool(example["label"])


def test_image_task_reads_upscaled_digits_pixel_by_pixel():
    pytest.importorskip("sklearn")
    square = [[0.0, 16.0], [16.0, 0.0]]
    big = lra.upscale(square, 5)
    assert big[0][0] == 0.0 and big[0][4] == 16.0 and big[2][2] == 8.0
    examples = lra.image_examples(4, seed=0, side=12, split="validation")
    assert all(len(e["text"]) == 144 and set(e["text"]) <= set(lra.GREY_LEVELS) for e in examples)
    assert all(0 <= e["label"] <= 9 for e in examples)


def test_pathfinder_labels_are_the_connectivity_of_the_dots():
    examples = lra.pathfinder_examples(20, seed=0, side=10)
    assert [e["label"] for e in examples] == [0, 1] * 10
    for example in examples:
        assert len(example["text"]) == 100 and example["text"].count(lra.DOT) == 2
        assert lra.connected(example["text"], 10) == bool(example["label"])
    with pytest.raises(ValueError, match="too small"):
        lra.pathfinder_examples(1, seed=0, side=4)


def test_processes_take_each_chain_once_from_the_shared_queue(tmp_path):
    from tf_family.compare.grid import Cell, claims_folder, run_claimed

    grid = Grid.__new__(Grid)
    grid.cache = tmp_path
    ran: list[str] = []

    def cell(key, measure, needs=()):
        return Cell(key, "causal", key.split(":")[1], measure, lambda: ran.append(key) or [], list(needs))

    cells = [
        cell("train:a", "train"),
        cell("passkey:a", "passkey", ["train:a"]),
        cell("train:b", "train"),
        cell("listops:c", "listops"),
    ]
    claims_folder(grid).mkdir(parents=True)
    (claims_folder(grid) / "train--b.claim").touch()  # another process took b's chain
    first = run_claimed(grid, cells)
    assert ran == ["train:a", "passkey:a", "listops:c"]  # the heaviest chain first, b left to its taker
    assert set(first) == {"train:a", "passkey:a", "listops:c"}
    assert run_claimed(grid, cells) == {} and len(ran) == 3  # a second process finds every chain taken


def test_a_retrieval_model_trains_its_lm_alone_on_the_passkey_task():
    import copy

    import torch

    from tests.models.knn_lm.test_knn_lm import knn_lm_with_a_datastore
    from tf_family.compare.measures import RETRIEVAL_OFF, _passkey_step

    model = knn_lm_with_a_datastore(lmbda=0.5)
    lm = copy.deepcopy(model.lm)
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(4):
        ids = torch.randint(1, 128, (24,), generator=generator).tolist()
        samples.append((ids, [-100] * 18 + ids[19:] + [-100]))
    with torch.no_grad():  # with retrieval on, the model's distribution is not its LM's
        assert not torch.allclose(
            model(input_ids=torch.tensor([ids])).logits, lm(input_ids=torch.tensor([ids])).logits
        )
    model.train(), lm.train()
    torch.manual_seed(1)  # the same dropout masks for both
    _passkey_step(model, samples, 16, 32, torch.optim.AdamW(model.parameters(), lr=1e-2), **RETRIEVAL_OFF)
    torch.manual_seed(1)
    _passkey_step(lm, samples, 16, 32, torch.optim.AdamW(lm.parameters(), lr=1e-2))
    # the same update up to rounding (its logits are log-probabilities; Adam scales tiny gradients up to about
    # 2e-6 apart here), not the update with retrieval on (0.02 apart: a whole Adam step of lr 1e-2)
    for (name, trained), alone in zip(model.lm.named_parameters(), lm.parameters(), strict=True):
        torch.testing.assert_close(trained, alone, rtol=0, atol=1e-4, msg=name)


def test_passkey_steps_project_only_the_answers_where_the_model_can(monkeypatch):
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tf_family.compare import measures

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    config.num_attention_heads = config.num_key_value_heads = 2
    full, kept = LlamaForCausalLM(config), None
    kept = copy.deepcopy(full)
    generator = torch.Generator().manual_seed(0)
    samples = []
    for length in (20, 26, 31):  # rows of different lengths: padded in front, the answers line up at the end
        ids = torch.randint(1, 64, (length,), generator=generator).tolist()
        samples.append((ids, [-100] * (length - 6) + ids[-5:] + [-100]))
    projected = []
    forward = kept.forward
    kept.forward = lambda **kw: projected.append(kw.get("logits_to_keep")) or forward(**kw)
    monkeypatch.setattr(measures, "_takes", lambda model, name: model is kept)
    counts = [
        measures._passkey_step(m, samples, 16, 64, torch.optim.SGD(m.parameters(), lr=0.1)) for m in (full, kept)
    ]
    assert projected == [measures.KEY_LENGTH + 1] and counts[0] == counts[1] and counts[0][1] == 15
    for a, b in zip(full.parameters(), kept.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
