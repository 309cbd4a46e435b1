"""The sequence-classification, masked-LM and question-answering recipes end to end on tiny models and tiny real
data (seconds each): the saved folder reloads through the Auto classes and predicts what the run evaluated."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from tf_family.data import load_brown
from tf_family.metrics import accuracy, macro_f1
from tf_family.recipes import masked_lm, question_answering, sequence_classification
from tf_family.training import encoder

from .conftest import launch_two_processes

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "3", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "3"]


def front_matter(path: Path) -> dict:
    return yaml.safe_load(path.read_text().split("---\n")[1])


def card_metrics(path: Path) -> dict:
    return {m["type"]: m["value"] for m in front_matter(path)["model-index"][0]["results"][0]["metrics"]}


@pytest.fixture(scope="module")
def brown_files(tmp_path_factory):
    """Openings of Brown Corpus documents (four genres) as local JSON-lines classification files."""
    brown = load_brown()
    names = brown["train"].features["genre"].names
    folder = tmp_path_factory.mktemp("brown")
    files = {}
    for split, per_genre in (("train", 2), ("validation", 1), ("test", 1)):
        rows = []
        for genre in ("news", "religion", "humor", "learned"):
            chosen = [row for row in brown[split] if names[row["genre"]] == genre][:per_genre]
            rows += [{"text": row["text"][:400], "label": genre} for row in chosen]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(folder / f"{split}.jsonl")
    return files


@pytest.fixture(scope="module")
def squad_files(tmp_path_factory):
    """A tiny SQuAD v1.1 file (the official nested format): questions about the words of Brown Corpus sentences,
    with contexts long enough to need several windows."""
    brown = load_brown()
    folder = tmp_path_factory.mktemp("squad")
    for split, source, count in (("train", brown["train"], 6), ("validation", brown["validation"], 3)):
        paragraphs = []
        for n, row in enumerate(source.select(range(count))):
            context = row["text"][:600]
            words = context.split()
            answer = words[40]
            start = context.index(f" {answer} ", len(" ".join(words[:40])) - 1) + 1
            qas = [
                {"id": f"{split}-{n}", "question": f"Which word follows {words[39]!r}?",
                 "answers": [{"text": answer, "answer_start": start}, {"text": f"{answer} {words[41]}", "answer_start": start}]},
            ]  # fmt: skip
            paragraphs.append({"context": context, "qas": qas})
        document = {"version": "1.1", "data": [{"title": split, "paragraphs": paragraphs}]}
        (folder / f"{split}.json").write_text(json.dumps(document))
    return {"train": str(folder / "train.json"), "validation": str(folder / "validation.json")}


def test_sequence_classification_recipe(tmp_path, brown_files):
    output = tmp_path / "run"
    data = ["--train_file", brown_files["train"], "--validation_file", brown_files["validation"]]
    args = ["--arch", "longformer", "--variant", "tiny", *data, "--test_file", brown_files["test"]]
    results = sequence_classification.main([*args, "--max_length", "40", *STEPS, "--output_dir", str(output)])
    assert results["train_steps"] == 3 and results["eval_examples"] == 4 and results["test_examples"] == 4
    assert results["truncated_inputs"] == {"train": 8, "validation": 4, "test": 4}  # 400 characters > 38 tokens

    model = AutoModelForSequenceClassification.from_pretrained(output).eval()
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert model.config.id2label == {0: "humor", 1: "learned", 2: "news", 3: "religion"}
    # the saved tokenizer frames a text as the recipe did: <cls> text <sep>
    rows = [json.loads(line) for line in Path(brown_files["validation"]).read_text().splitlines()]
    encoded, _ = sequence_classification.encode([r["text"] for r in rows], tokenizer, 40)
    assert tokenizer(rows[0]["text"], truncation=True, max_length=40)["input_ids"] == encoded[0]
    batch = tokenizer([r["text"] for r in rows], truncation=True, max_length=40, padding=True, return_tensors="pt")
    with torch.no_grad():
        predictions = model(**batch).logits.argmax(-1).tolist()
    labels = [model.config.label2id[r["label"]] for r in rows]
    assert results["eval_accuracy"] == pytest.approx(
        sum(p == t for p, t in zip(predictions, labels, strict=True)) / len(rows)
    )

    metrics = card_metrics(output / "README.md")
    assert metrics["accuracy"] == pytest.approx(results["eval_accuracy"]) and "f1" in metrics
    card = front_matter(output / "README.md")
    assert card["pipeline_tag"] == "text-classification"
    assert "AutoModelForSequenceClassification.from_pretrained" in (output / "README.md").read_text()


def test_sequence_classification_resumes_exactly(tmp_path, brown_files):
    data = ["--train_file", brown_files["train"], "--validation_file", brown_files["validation"]]
    args = [
        "--arch",
        "big_bird",
        "--variant",
        "tiny",
        *data,
        "--max_length",
        "32",
        *STEPS[2:],
        "--max_train_steps",
        "4",
    ]
    straight = sequence_classification.main([*args, "--output_dir", str(tmp_path / "a")])
    first = [*args, "--output_dir", str(tmp_path / "b"), "--checkpointing_steps", "2"]
    sequence_classification.main(first)
    resumed = sequence_classification.main([*first, "--resume_from_checkpoint", "latest", "--overwrite_output_dir"])
    assert resumed["rank_weight_sha256"] == straight["rank_weight_sha256"]


@pytest.fixture(scope="module")
def trained_mlm(tmp_path_factory, corpus):
    output = tmp_path_factory.mktemp("mlm")
    data = ["--train_file", corpus["train"], "--validation_file", corpus["validation"]]
    args = ["--arch", "longformer", "--variant", "tiny", *data, "--max_length", "32", *STEPS]
    return output, masked_lm.main([*args, "--output_dir", str(output)])


def test_masked_lm_recipe(trained_mlm):
    output, results = trained_mlm
    assert results["eval_masked_tokens"] > 0 and 0.0 <= results["masked_accuracy"] <= 1.0
    assert results["perplexity"] == pytest.approx(torch.tensor(results["eval_loss"]).exp().item(), rel=1e-5)
    model = AutoModelForMaskedLM.from_pretrained(output).eval()
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert tokenizer.mask_token == "<mask>" and tokenizer.pad_token_id == 0
    batch = tokenizer([f"The {tokenizer.mask_token} of the Union"], return_tensors="pt")
    with torch.no_grad():
        assert model(**batch).logits.shape == (1, batch["input_ids"].shape[1], len(tokenizer))
    assert front_matter(output / "README.md")["pipeline_tag"] == "fill-mask"
    assert card_metrics(output / "README.md")["perplexity"] == pytest.approx(results["perplexity"], rel=1e-5)


def test_masking_follows_bert_and_is_reproducible():
    special, vocab = {0, 1, 2}, list(range(3, 100))
    block = [1, *range(3, 403), 2]
    masked, labels = masked_lm.mask_block(block, 0.15, 7, special, 2, vocab)
    again = masked_lm.mask_block(block, 0.15, 7, special, 2, vocab)
    assert (masked, labels) == again
    chosen = [i for i, label in enumerate(labels) if label != -100]
    assert 0 not in chosen and len(block) - 1 not in chosen  # never the special tokens
    assert 30 < len(chosen) < 95  # about 15 % of 400
    assert all(labels[i] == block[i] for i in chosen)
    as_mask = sum(masked[i] == 2 for i in chosen) / len(chosen)
    assert 0.6 < as_mask < 0.95
    assert all(masked[i] == block[i] for i in range(len(block)) if i not in chosen)


def test_question_answering_recipe(tmp_path, squad_files):
    output = tmp_path / "qa"
    data = ["--train_file", squad_files["train"], "--validation_file", squad_files["validation"]]
    args = ["--arch", "longformer", "--variant", "tiny", *data, "--max_length", "48", "--doc_stride", "8"]
    results = question_answering.main([*args, "--max_question_length", "16", *STEPS, "--output_dir", str(output)])
    assert results["eval_examples"] == 3 and results["eval_features"] > 3  # long contexts take several windows
    assert 0.0 <= results["exact_match"] <= results["f1"] <= 100.0
    model = AutoModelForQuestionAnswering.from_pretrained(output)
    assert model.config.sep_token_id == AutoTokenizer.from_pretrained(output).sep_token_id
    card = front_matter(output / "README.md")
    assert card["pipeline_tag"] == "question-answering"
    assert card_metrics(output / "README.md")["exact_match"] == pytest.approx(results["exact_match"])


def test_question_answering_windows_hold_the_answer(squad_files):
    files = ["--train_file", squad_files["train"], "--validation_file", squad_files["validation"]]
    args = question_answering.parse_args(
        ["--arch", "longformer", *files, "--max_length", "48", "--doc_stride", "8", "--max_question_length", "16"]
    )
    raw = question_answering.load_data(args)  # the official nested JSON, flattened
    assert raw["train"].column_names[:2] == ["id", "title"] and len(raw["validation"]) == 3
    tokenizer = encoder.load_tokenizer(args)
    features = question_answering.build_features(raw["train"], tokenizer, args, train=True)
    holding = [f for f in features if f["start_positions"] > 0]
    assert {f["example"] for f in holding} == set(range(len(raw["train"])))  # every answer is in some window
    for feature in holding:  # the labelled tokens spell the first gold answer
        example = raw["train"][feature["example"]]
        offsets = feature["offsets"]
        first, last = (
            feature["start_positions"] - feature["context_start"],
            feature["end_positions"] - feature["context_start"],
        )
        span = example["context"][offsets[first][0] : offsets[last][1]]
        assert span.strip() == example["answers"]["text"][0]
        assert len(feature["input_ids"]) <= 48
    # the best-span decoding finds a span given logits peaked on it
    feature = holding[0]
    n = len(feature["offsets"])
    start_logits = [0.0] * n
    end_logits = [0.0] * n
    start_logits[feature["start_positions"] - feature["context_start"]] = 10.0
    end_logits[feature["end_positions"] - feature["context_start"]] = 10.0
    predictions = question_answering.best_answers(raw["train"], [feature], [(start_logits, end_logits)], args)
    assert predictions[feature["example"]].strip() == raw["train"][feature["example"]]["answers"]["text"][0]


def test_lora_fine_tunes_the_masked_lm_into_a_classifier(tmp_path, trained_mlm, brown_files):
    """--model_name_or_path a recipe's MLM folder: its tokenizer already has every special token, the new head trains
    in full beside the LoRA adapters, and the merged classifier reloads through Auto."""
    mlm, _ = trained_mlm
    output = tmp_path / "cls"
    data = ["--train_file", brown_files["train"], "--validation_file", brown_files["validation"]]
    args = ["--model_name_or_path", str(mlm), *data, "--max_length", "32", *STEPS, "--learning_rate", "1e-2"]
    sequence_classification.main([*args, "--lora_r", "4", "--merge_lora", "--output_dir", str(output)])
    base = AutoModelForMaskedLM.from_pretrained(mlm)
    model = AutoModelForSequenceClassification.from_pretrained(output)
    assert len(AutoTokenizer.from_pretrained(output)) == len(AutoTokenizer.from_pretrained(mlm))
    # the merged attention weights moved (adapters trained), the head exists and trained
    before = base.longformer.layers[0].attention.query.weight
    after = model.longformer.layers[0].attention.query.weight
    assert not torch.equal(before, after)
    assert model.config.num_labels == 4
    with pytest.raises(ValueError, match="add --merge_lora"):
        sequence_classification.main([*args, "--lora_r", "4", "--output_dir", str(tmp_path / "never")])


@pytest.mark.parametrize(
    ("recipe", "argv", "message"),
    [
        (sequence_classification, ["--arch", "compressive"], "has no sequence_classification model"),
        (sequence_classification, ["--arch", "longformer", "--max_length", "2"], "--max_length=2"),
        (sequence_classification, ["--arch", "longformer", "--train_file", "x.txt"], "--train_file='x.txt'"),
        (sequence_classification, ["--arch", "longformer", "--variant", "tiny", "--max_length", "4096"],
         "--max_length 4096 is longer than the 63 tokens"),
        (sequence_classification, ["--arch", "longformer", "--label_column", "nope"], "--label_column='nope'"),
        (masked_lm, ["--arch", "longformer", "--mlm_probability", "1.5"], "--mlm_probability=1.5"),
        (masked_lm, ["--arch", "decision_transformer"], "has no masked_lm model"),
        (question_answering, ["--arch", "longformer"], "No data"),
        (question_answering, ["--arch", "longformer", "--train_file", "a.json", "--doc_stride", "500"],
         "--doc_stride=500 must be smaller"),
        (question_answering, ["--model_name_or_path", "x", "--arch", "longformer"], "exactly one of"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused(recipe, argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the data files named exist (a missing one is refused first, naming it)
    for name in ("x.txt", "a.json"):
        (tmp_path / name).touch()
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        recipe.main([*argv, "--output_dir", str(tmp_path / "never")])


@pytest.mark.slow
def test_two_processes_classify_like_one(tmp_path, brown_files):
    """Two gloo CPU processes: same final weights on both ranks, and the gathered evaluation covers every
    validation document once, in order (it equals the saved model's predictions in this process)."""
    data = ["--train_file", brown_files["train"], "--validation_file", brown_files["validation"]]
    launch_two_processes(
        "tf_family.recipes.sequence_classification",
        ["--arch", "longformer", "--variant", "tiny", *data, "--max_length", "32", "--max_train_steps", "2",
         "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "1", "--output_dir", str(tmp_path)],
    )  # fmt: skip
    run = json.loads((tmp_path / "training_run.json").read_text())
    assert run["world_size"] == 2 and len(set(run["rank_weight_sha256"])) == 1
    assert run["metrics"]["eval_examples"] == 4

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    rows = [json.loads(line) for line in Path(brown_files["validation"]).read_text().splitlines()]
    batch = tokenizer([r["text"] for r in rows], truncation=True, max_length=32, padding=True, return_tensors="pt")
    with torch.no_grad():
        predictions = model(**batch).logits.argmax(-1).tolist()
    labels = [model.config.label2id[r["label"]] for r in rows]
    assert run["metrics"]["eval_accuracy"] == pytest.approx(accuracy(predictions, labels))
    assert run["metrics"]["eval_macro_f1"] == pytest.approx(macro_f1(predictions, labels, labels=range(4)))


def test_question_answering_reads_flat_rows_like_the_hub(tmp_path, squad_files):
    """JSON lines with id / question / context / answers columns (the Hub's SQuAD layout) give the same rows as the
    official nested file; a question without an answer is refused (SQuAD v1.1 scoring)."""
    files = ["--train_file", squad_files["train"], "--validation_file", squad_files["validation"]]
    nested = question_answering.load_data(question_answering.parse_args(["--arch", "longformer", *files]))
    flat = {}
    for split, path in (("train", squad_files["train"]), ("validation", squad_files["validation"])):
        rows = question_answering.read_squad_json(path).to_list()
        flat[split] = tmp_path / f"{split}.jsonl"
        flat[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = question_answering.parse_args(
        ["--arch", "longformer", "--train_file", str(flat["train"]), "--validation_file", str(flat["validation"])]
    )
    raw = question_answering.load_data(args)
    assert raw["train"].to_list() == nested["train"].to_list()
    rows = raw["train"].to_list()
    rows[0]["answers"] = {"text": [], "answer_start": []}
    with pytest.raises(ValueError, match="has no answer"):
        question_answering.build_features(
            type(raw["train"]).from_list(rows), encoder.load_tokenizer(args), args, train=True
        )
