"""The causal-LM recipe end to end on tiny models and tiny real data (seconds each)."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel
from tf_family.recipes import causal_lm
from tf_family.training import find_checkpoint

from .conftest import TINY_TXL, data_args, run_killed_in_step_5

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "4", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]


@pytest.fixture(scope="module")
def trained_txl(tmp_path_factory, corpus):
    output = tmp_path_factory.mktemp("txl")
    results = causal_lm.main([*TINY_TXL, *data_args(corpus), *STEPS, "--output_dir", str(output)])
    return output, results


def front_matter(path: Path) -> dict:
    text = path.read_text()
    return yaml.safe_load(text.split("---\n")[1])


def test_memory_model_saves_a_hub_ready_folder(trained_txl, corpus):
    output, results = trained_txl
    assert {p.name for p in output.iterdir()} >= {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md", "training_run.json"
    }  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(output)
    assert type(model) is TffTransfoXLLMHeadModel
    # every validation token is scored once, plus one end-of-document prediction per document
    validation = [json.loads(line)["text"] for line in Path(corpus["validation"]).read_text().splitlines()]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(output)
    expected_tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in validation)
    assert results["scored_tokens"] == expected_tokens
    nll_bits = results["bits_per_token"] * results["scored_tokens"]
    assert math.isclose(results["bits_per_character"] * sum(map(len, validation)), nll_bits, rel_tol=1e-9)
    assert math.isclose(results["perplexity"], math.exp(results["eval_loss"]), rel_tol=1e-9)

    card = front_matter(output / "README.md")
    metrics = {m["type"]: m["value"] for m in card["model-index"][0]["results"][0]["metrics"]}
    assert metrics["perplexity"] == pytest.approx(results["perplexity"], rel=1e-5)
    assert card["hyperparameters"]["block_size"] == 16 and card["hyperparameters"]["memory_streams"] is True
    assert "tff_transfo_xl" in card["tags"]
    run = json.loads((output / "training_run.json").read_text())
    assert run["train_steps"] == 4 and run["world_size"] == 1


def test_memory_is_carried_and_reset_at_document_starts(tmp_path, corpus, monkeypatch):
    calls = []
    forward = TffTransfoXLLMHeadModel.forward

    def spy(self, input_ids=None, mems=None, reset_mems=None, **kwargs):
        if self.training:
            calls.append((input_ids.clone(), mems is not None, None if reset_mems is None else reset_mems.tolist()))
        return forward(self, input_ids=input_ids, mems=mems, reset_mems=reset_mems, **kwargs)

    monkeypatch.setattr(TffTransfoXLLMHeadModel, "forward", spy)
    causal_lm.main(
        [
            *TINY_TXL,
            *data_args(corpus),
            *STEPS,
            "--max_train_steps",
            "12",
            "--block_size",
            "64",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert len(calls) == 12
    assert calls[0][1] is False and all(has_memory for _, has_memory, _ in calls[1:])
    separator = 0
    for input_ids, _, reset in calls[1:]:
        # a row is reset exactly when its block starts a document (its first input is the separator)
        assert reset == (input_ids[:, 0] == separator).tolist()
    assert any(any(r) for _, _, r in calls[1:]) and any(not all(r) for _, _, r in calls[1:])


TINY_COMPRESSIVE = [
    "--arch",
    "compressive",
    "--variant",
    "tiny",
    "--config_overrides",
    "dropout=0.1",
    "--block_size",
    "8",
]


@pytest.mark.parametrize("kind", ["memory", "compressive", "plain"])
def test_killed_run_resumes_to_the_same_weights(tmp_path, corpus, tiny_gpt2, monkeypatch, kind):
    model_args = {
        "memory": TINY_TXL,
        "compressive": TINY_COMPRESSIVE,
        "plain": ["--model_name_or_path", tiny_gpt2, "--block_size", "16"],
    }[kind]
    args = [*model_args, *data_args(corpus), *STEPS, "--max_train_steps", "6", "--gradient_accumulation_steps", "2",
            "--checkpointing_steps", "3"]  # fmt: skip
    causal_lm.main([*args, "--output_dir", str(tmp_path / "straight")])

    interrupted = tmp_path / "interrupted"
    run_killed_in_step_5(monkeypatch, args, interrupted)  # step 5 = micro-batches 9 and 10
    assert [p.name for p in (interrupted / "checkpoints").iterdir()] == ["step_3"]
    assert not (interrupted / "model.safetensors").exists()

    with pytest.raises(ValueError, match="holds an earlier run"):  # nothing saved is overwritten by accident
        causal_lm.main([*args, "--output_dir", str(interrupted)])
    causal_lm.main([*args, "--output_dir", str(interrupted), "--resume_from_checkpoint", "latest"])
    straight, resumed = (
        load_file(tmp_path / "straight" / "model.safetensors"),
        load_file(interrupted / "model.safetensors"),
    )
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-5, atol=1e-6)
    untrained = load_file(tmp_path / "straight" / "checkpoints" / "step_3" / "model.safetensors")
    assert any(not torch.equal(untrained[k], straight[k]) for k in untrained)  # the comparison can fail


def test_streaming_trains_and_a_killed_run_resumes_to_the_same_weights(tmp_path, corpus, tiny_gpt2, monkeypatch):
    """--streaming: the training file is read as a datasets IterableDataset and packed on the fly; a checkpoint
    records how far the stream was read, so a run killed after it and resumed ends with the weights of a run that
    never stopped, having read the same data."""
    args = ["--model_name_or_path", tiny_gpt2, "--block_size", "16", "--streaming", *data_args(corpus), *STEPS,
            "--max_train_steps", "6", "--gradient_accumulation_steps", "2", "--checkpointing_steps", "3"]  # fmt: skip
    import datasets

    streamed = []
    real_load = datasets.load_dataset

    def recording_load(*a, **k):
        streamed.append(k.get("streaming", False))
        return real_load(*a, **k)

    monkeypatch.setattr("tf_family.data.text.load_dataset", recording_load)
    causal_lm.main([*args, "--output_dir", str(tmp_path / "straight")])
    assert streamed == [True, False]  # the training split streamed, the validation split loaded
    interrupted = tmp_path / "interrupted"
    run_killed_in_step_5(monkeypatch, args, interrupted)  # step 5 = micro-batches 9 and 10
    assert (interrupted / "checkpoints" / "step_3" / "data_rank0.json").is_file()
    causal_lm.main([*args, "--output_dir", str(interrupted), "--resume_from_checkpoint", "latest"])
    straight, resumed = (
        load_file(tmp_path / "straight" / "model.safetensors"),
        load_file(interrupted / "model.safetensors"),
    )
    assert straight.keys() == resumed.keys()
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-5, atol=1e-6)
    untrained = load_file(tmp_path / "straight" / "checkpoints" / "step_3" / "model.safetensors")
    assert any(not torch.equal(untrained[k], straight[k]) for k in untrained)  # the comparison can fail
    records = [
        json.loads((folder / "training_run.json").read_text()) for folder in (tmp_path / "straight", interrupted)
    ]
    assert records[0]["dataset"]["streaming"] and records[0]["dataset"]["train_tokens_read"] > 0
    assert records[0]["dataset"]["train_tokens_read"] == records[1]["dataset"]["train_tokens_read"]


def test_streaming_is_refused_where_it_cannot_work(tmp_path, corpus):
    with pytest.raises(ValueError, match="--streaming needs --max_train_steps"):
        causal_lm.main(["--arch", "calm", "--streaming", *data_args(corpus), "--output_dir", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="--arch transfo_xl reads ordered"):
        causal_lm.main([*TINY_TXL, "--streaming", *data_args(corpus), *STEPS, "--output_dir", str(tmp_path / "b")])
    with pytest.raises(ValueError, match="needs --validation_file"):
        causal_lm.main(["--arch", "calm", "--variant", "tiny", "--streaming", "--train_file", corpus["train"], *STEPS,
                        "--output_dir", str(tmp_path / "c")])  # fmt: skip


def test_interrupted_checkpoint_save_keeps_the_last_checkpoint(tmp_path, corpus, monkeypatch):
    from accelerate import Accelerator

    real_save = Accelerator.save_state
    saves = {"n": 0}

    def save_then_die(self, output_dir=None, **kwargs):
        saves["n"] += 1
        if saves["n"] == 2:
            real_save(self, output_dir, **kwargs)
            raise OSError("disk full")
        return real_save(self, output_dir, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", save_then_die)
    args = [*TINY_TXL, *data_args(corpus), *STEPS, "--checkpointing_steps", "2", "--output_dir", str(tmp_path)]
    with pytest.raises(OSError, match="disk full"):
        causal_lm.main(args)
    assert find_checkpoint(str(tmp_path), "latest").name == "step_2"
    assert (tmp_path / "checkpoints" / "step_2" / "trainer_state.json").is_file()
    monkeypatch.setattr(Accelerator, "save_state", real_save)
    results = causal_lm.main([*args, "--resume_from_checkpoint", "latest"])
    assert results["train_steps"] == 4


def test_plain_transformers_model_with_lora(tmp_path, corpus, tiny_gpt2):
    from peft import PeftModel

    common = [*data_args(corpus), *STEPS, "--model_name_or_path", tiny_gpt2, "--block_size", "32", "--lora_r", "4",
              "--learning_rate", "1e-2"]  # fmt: skip
    adapter_results = causal_lm.main([*common, "--output_dir", str(tmp_path / "adapter")])
    adapter_files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "README.md"} <= adapter_files
    assert "model.safetensors" not in adapter_files
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_gpt2), tmp_path / "adapter").eval()

    causal_lm.main([*common, "--merge_lora", "--output_dir", str(tmp_path / "merged")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora" in name for name in merged.state_dict())
    ids = torch.arange(1, 30)[None]
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=1e-4, atol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(tiny_gpt2).eval()
        assert not torch.allclose(base(ids).logits, merged(ids).logits)
    assert adapter_results["perplexity"] > 0


def test_an_adapter_of_a_local_base_loads_from_anywhere_and_its_card_says_what_it_needs(
    tmp_path, corpus, tiny_gpt2, monkeypatch
):
    # the user typed a relative path to the base model; the adapter used to record it as typed
    monkeypatch.chdir(Path(tiny_gpt2).parent)
    relative = Path(tiny_gpt2).name
    out = tmp_path / "adapter"
    causal_lm.main([*data_args(corpus), *STEPS, "--model_name_or_path", relative, "--block_size", "32",
                    "--lora_r", "2", "--output_dir", str(out)])  # fmt: skip
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(Path(tiny_gpt2).resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    model = AutoModelForCausalLM.from_pretrained(out)  # transformers + peft: the base, then the adapter
    assert any("lora_" in name for name, _ in model.named_parameters())
    card = (out / "README.md").read_text()
    assert "\nbase_model:" not in card.split("\n---\n")[0]  # the YAML takes Hub ids only
    assert "**Depends on a base model.**" in card and str(Path(tiny_gpt2).resolve()) in card
    assert "--merge_lora" in card


def test_a_base_model_pushed_before_is_named_by_its_hub_id(tmp_path, corpus, trained_txl):
    import shutil

    folder = tmp_path / "pushed-base"
    shutil.copytree(trained_txl[0], folder)
    run = json.loads((folder / "training_run.json").read_text())
    (folder / "training_run.json").write_text(json.dumps({**run, "hub_model_id": "someone/tiny-txl"}))
    out = tmp_path / "fine-tuned"
    causal_lm.main([*data_args(corpus), *STEPS, "--model_name_or_path", str(folder), "--block_size", "16",
                    "--output_dir", str(out)])  # fmt: skip
    meta = front_matter(out / "README.md")
    assert meta["base_model"] == "someone/tiny-txl"


def test_the_card_is_consistent_and_its_usage_snippet_runs(trained_txl, monkeypatch, tmp_path):
    import re

    output, _ = trained_txl
    card = (output / "README.md").read_text()
    tokenizer_config = json.loads((output / "tokenizer_config.json").read_text())
    assert "is_local" not in tokenizer_config and "local_files_only" not in tokenizer_config
    # one name, one value: a quantity shown in two tables of the card (e.g. eval_tokens) must agree
    seen = {}
    for key, value in re.findall(r"^\| (\w+) \| (.+?) \|$", card, re.M):
        assert seen.setdefault(key, value) == value, f"{key}: {seen[key]} and {value}"
    snippet = re.search(r"## How to use\n\n```python\n(.*?)```", card, re.S)[1]
    assert "tokenizer" in snippet and "generate(" in snippet
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "model card snippet", "exec"), {"__name__": "card_snippet"})


def test_lora_on_a_memory_model_uses_registry_targets(tmp_path, corpus, trained_txl):
    folder, _ = trained_txl
    out = tmp_path / "lora"
    causal_lm.main([*data_args(corpus), *STEPS, "--model_name_or_path", str(folder), "--block_size", "16",
                    "--lora_r", "2", "--output_dir", str(out)])  # fmt: skip
    config = json.loads((out / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {"qkv", "out_proj"}


def test_push_to_hub_uploads_exactly_the_model_folder(tmp_path, corpus, monkeypatch):
    from huggingface_hub import HfApi

    recorded = {}

    def create_repo(self, repo_id, **kwargs):
        recorded["repo"] = (repo_id, kwargs)

    def create_commit(self, repo_id, operations, **kwargs):
        recorded["files"] = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}
        recorded["commit"] = (repo_id, kwargs)

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setattr(
        "tf_family.shipping.hub.check_push_access", lambda repo_id, token=None: None
    )  # no network here
    results = causal_lm.main([*TINY_TXL, *data_args(corpus), *STEPS, "--checkpointing_steps", "2",
                              "--output_dir", str(tmp_path), "--push_to_hub", "--hub_model_id", "someone/tiny-txl",
                              "--hub_private"])  # fmt: skip
    assert recorded["repo"][0] == "someone/tiny-txl" and recorded["repo"][1]["private"] is True
    assert set(recorded["files"]) == {
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "training_run.json",
    }  # fmt: skip  (no checkpoints/)
    card = recorded["files"]["README.md"].decode()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["model-index"][0]["name"] == "tiny-txl"
    result = meta["model-index"][0]["results"][0]
    assert result["task"]["type"] == "text-generation" and result["dataset"]["split"] == "validation"
    assert {m["type"]: m["value"] for m in result["metrics"]}["perplexity"] == pytest.approx(results["perplexity"])
    assert 'from_pretrained("someone/tiny-txl")' in card
    # the folder remembers where it went: a run fine-tuned from it will name the Hub id
    assert json.loads((tmp_path / "training_run.json").read_text())["hub_model_id"] == "someone/tiny-txl"


def test_tensorboard_tracking(tmp_path, corpus):
    causal_lm.main([*TINY_TXL, *data_args(corpus), *STEPS, "--logging_steps", "1", "--report_to", "tensorboard",
                    "--output_dir", str(tmp_path)])  # fmt: skip
    assert list(tmp_path.rglob("events.out.tfevents.*"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--arch", "nope"], r"Unknown architecture 'nope'; choose one of \['transfo_xl'"),
        (["--arch", "transfo_xl", "--variant", "huge"], "has no variant 'huge'"),
        (["--arch", "transfo_xl", "--train_file", "/nonexistent/train.txt"], "--train_file '/nonexistent/train.txt': no such file or folder"),
        (["--arch", "transfo_xl", "--lora_r", "4"], "--lora_r adapts a trained model"),
        (["--model_name_or_path", "GPT2", "--lora_r", "2", "--lora_target_modules", "q_proj"],
         r"--lora_target_modules 'q_proj' matches no module of GPT2LMHeadModel; its linear layers are named"),
        (["--model_name_or_path", "GPT2", "--block_size", "128"], "--block_size 128 is longer than the 64 positions"),
        (["--arch", "transfo_xl", "--report_to", "nothing"], "--report_to 'nothing' is not supported"),
        ([], "exactly one of --arch"),
    ],
)  # fmt: skip
def test_bad_input_stops_before_training(tmp_path, corpus, tiny_gpt2, monkeypatch, extra, message):
    monkeypatch.setattr(causal_lm.torch.optim, "AdamW", None)  # training would crash on this, not a clean error
    extra = [tiny_gpt2 if arg == "GPT2" else arg for arg in extra]
    data = [] if "--train_file" in extra else data_args(corpus)
    with pytest.raises(ValueError, match=message):
        causal_lm.main([*data, *extra, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_compressive_transformer_trains_its_compression_through_the_auxiliary_loss(tmp_path, corpus):
    causal_lm.main([*TINY_COMPRESSIVE, *data_args(corpus), *STEPS, "--max_train_steps", "3",
                    "--checkpointing_steps", "1", "--output_dir", str(tmp_path)])  # fmt: skip
    first = load_file(tmp_path / "checkpoints" / "step_2" / "model.safetensors")
    last = load_file(tmp_path / "checkpoints" / "step_3" / "model.safetensors")
    compression = [key for key in first if ".compression." in key]
    assert compression and all(not torch.equal(first[k], last[k]) for k in compression)


def test_bf16_mixed_precision(tmp_path, corpus):
    results = causal_lm.main([*TINY_TXL, *data_args(corpus), *STEPS, "--mixed_precision", "bf16",
                              "--output_dir", str(tmp_path)])  # fmt: skip
    assert math.isfinite(results["eval_loss"])
    run = json.loads((tmp_path / "training_run.json").read_text())
    assert run["hyperparameters"]["mixed_precision"] == "bf16"
    assert all(math.isfinite(record["train_loss"]) for record in run["train_history"])


def test_lora_prints_no_deprecation_noise(trained_txl):
    import argparse
    import warnings

    from tf_family.training import apply_lora

    model = AutoModelForCausalLM.from_pretrained(trained_txl[0])
    args = argparse.Namespace(lora_r=2, lora_alpha=4.0, lora_dropout=0.0, lora_target_modules=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(model, args, task_type="CAUSAL_LM")
    assert not [w for w in caught if "deprecated" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.parametrize(
    ("arch", "task"),
    [
        ("compressive", "causal_lm"),
        ("memorizing", "causal_lm"),
        ("longformer", "causal_lm"),
        ("big_bird", "masked_lm"),
        ("reformer", "causal_lm"),
        ("calm", "causal_lm"),
        ("universal_transformer", "masked_lm"),
        ("spalm", "causal_lm"),
        (None, "causal_lm"),
    ],
)
def test_every_card_template_usage_snippet_runs(arch, task, tmp_path, monkeypatch, tiny_gpt2):
    """The "How to use" code of the templates, run against a tiny saved folder (the Transformer-XL card's is run by
    the test above on a trained one; the Decision Transformer's needs a simulator, the kNN-LM's a datastore)."""
    import re
    import shutil

    from transformers import AutoTokenizer

    from tf_family.data import SOTU_TOKENIZER_DIR
    from tf_family.registry import get_arch
    from tf_family.shipping.cards import write_model_card

    folder = tmp_path / "model"
    if arch is None:  # a plain transformers model: the generic template
        shutil.copytree(tiny_gpt2, folder)
    else:
        spec = get_arch(arch)
        spec.model_classes[task](spec.make_config("tiny", vocab_size=8192, pad_token_id=0)).save_pretrained(folder)
        AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR).save_pretrained(folder)
    (folder / "training_run.json").write_text(json.dumps({"task": task, "metrics": {}, "dataset": {}}))
    write_model_card(folder)
    snippet = re.search(r"## How to use\n\n```python\n(.*?)```", (folder / "README.md").read_text(), re.S)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, f"{arch} card snippet", "exec"), {"__name__": "card_snippet"})
