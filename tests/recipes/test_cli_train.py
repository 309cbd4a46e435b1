"""`tf-family train` (the main job, with tiny overrides), `tf-family card` and `tf-family push`."""

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from tf_family import cli
from tf_family.data import SOTU_TOKENIZER_DIR
from tf_family.recipes import causal_lm
from tf_family.training import architectures_with, parse_config_overrides
from tf_family.training.arguments import SMOKE_EVAL_SAMPLES, SMOKE_RUN_STEPS

from .conftest import TINY_TXL, data_args

pytestmark = pytest.mark.recipe


def test_train_reports_perplexity_against_unigram_and_samples(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *TINY_TXL, *data_args(corpus), "--max_train_steps", "2"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "evaluating" in captured.err  # the evaluation's progress bar
    assert "saved to runs/transfo_xl-" in out
    assert "validation perplexity" in out and "unigram perplexity of the same data" in out
    assert "short run              2 steps (under 100): a smoke test, not a trained model" in out
    assert "reloaded with          AutoModelForCausalLM.from_pretrained -> TffTransfoXLLMHeadModel" in out
    sample = out.split("sample ")[1]
    assert len(sample.strip()) > len(cli.SAMPLE_PROMPT)
    runs = list((tmp_path / "runs").iterdir())  # a fresh folder under ./runs/ for every run
    assert len(runs) == 1 and runs[0].name.startswith("transfo_xl-")
    assert (runs[0] / "README.md").is_file()


def test_main_job_defaults_are_a_small_transformer_xl_on_the_bundled_corpus():
    args = causal_lm.parse_args([], defaults=cli.train_defaults([]))
    assert (args.arch, args.variant, args.config_overrides) == ("transfo_xl", "small", ["pre_lnorm=true"])
    assert args.dataset_name == "sotu" and args.train_file is None  # the recipe's default: the bundled corpus
    assert args.max_train_steps == 400 and args.output_dir.startswith("runs/transfo_xl-")


def test_the_main_jobs_model_options_stay_with_the_main_jobs_model():
    for argv in (["--arch", "longformer"], ["--arch=compressive"], ["--model_name_or_path", "runs/my-run"]):
        defaults = cli.train_defaults(argv)
        assert "config_overrides" not in defaults and "block_size" not in defaults and "arch" not in defaults
        assert defaults["max_train_steps"] == 400  # the run's length is every model's default
    assert cli.train_defaults(["--model_name_or_path", "runs/my-run/"])["output_dir"].startswith("runs/my-run-")
    assert cli.train_defaults(["--arch", "transfo_xl", "--variant", "tiny"])["config_overrides"] == ["pre_lnorm=true"]


def test_train_help_names_the_command_and_shows_the_defaults_in_force(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: tf-family train")
    assert "(default: ['pre_lnorm=true'])" in out and "(default: 400)" in out and "(default: 128)" in out


@pytest.mark.parametrize("arch", architectures_with("causal_lm"))
def test_every_causal_lm_arch_starts_from_its_name_alone(arch):
    """`tf-family train --arch NAME` with nothing else: the arguments pass the recipe's checks, the model builds and
    the block size fits it (a wrapper such as kNN-LM trains the base model its variant names)."""
    args = causal_lm.parse_args(["--arch", arch], defaults=cli.train_defaults(["--arch", arch]))
    causal_lm.validate_args(args)
    tokenizer = AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR)
    overrides = parse_config_overrides(args.config_overrides)
    with torch.device("meta"):  # the real sizes, without allocating them
        model = causal_lm.build_model(args, tokenizer, tokenizer.eos_token_id, overrides)
    assert causal_lm.choose_block_size(args.block_size, model) >= 16
    assert model.config.vocab_size == len(tokenizer)


def test_train_knn_lm_from_its_name_trains_the_base_then_builds_the_datastore(tmp_path, corpus, capsys, monkeypatch):
    from tf_family.models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM

    monkeypatch.chdir(tmp_path)
    argv = ["train", "--arch", "knn_lm", *data_args(corpus), "--max_train_steps", "2", "--datastore_tokens", "300"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "-> TffKNNLMForCausalLM" in out and "validation perplexity" in out
    assert re.search(r"base model perplexity  \d+\.\d   \(the kNN-LM without its datastore\)", out)
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("knn_lm-") and (folder / "datastore" / "datastore.json").is_file()
    model = TffKNNLMForCausalLM.from_pretrained(folder)
    assert model.datastore is not None and 300 <= model.datastore.size < 300 + 64  # whole blocks of 64 tokens
    run = json.loads((folder / "training_run.json").read_text())
    assert run["metrics"]["datastore_keys"] == model.datastore.size and "base_perplexity" in run["metrics"]
    assert (
        "**Depends on its datastore**, stored in this folder under `datastore/`" in (folder / "README.md").read_text()
    )


def test_a_wrapper_variant_without_a_base_model_is_refused_before_any_work():
    args = causal_lm.parse_args(["--arch", "knn_lm", "--variant", "paper"])
    with pytest.raises(ValueError, match="names no base model to train.*'tiny'"):
        causal_lm.validate_args(args)
    with pytest.raises(ValueError, match="--datastore_tokens sizes a kNN-LM"):
        causal_lm.validate_args(causal_lm.parse_args(["--arch", "transfo_xl", "--datastore_tokens", "5"]))


def test_train_longformer_with_nothing_but_its_arch_and_smoke_sizes(tmp_path, corpus, capsys, monkeypatch):
    # the main job's own `pre_lnorm=true` used to be applied to every --arch
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--arch", "longformer", "--variant", "tiny", *data_args(corpus), "--max_train_steps", "1"]
    assert cli.main(argv) == 0
    assert "-> TffLongformerForCausalLM" in capsys.readouterr().out


def test_card_and_push_commands(tmp_path, corpus, capsys, monkeypatch):
    from huggingface_hub import HfApi

    folder = tmp_path / "model"
    cli.main(["train", *TINY_TXL, *data_args(corpus), "--max_train_steps", "1", "--output_dir", str(folder)])
    (folder / "README.md").unlink()
    assert cli.main(["card", str(folder), "--repo_id", "org/tiny"]) == 0
    assert 'from_pretrained("org/tiny")' in (folder / "README.md").read_text()

    uploads = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: None)
    monkeypatch.setattr(
        HfApi, "create_commit", lambda self, repo_id, ops, **kw: uploads.append([o.path_in_repo for o in ops])
    )
    assert cli.main(["push", str(folder), "org/other"]) == 0
    assert "README.md" in uploads[0] and "model.safetensors" in uploads[0]
    assert not any(path.startswith("checkpoints") for path in uploads[0])
    assert 'from_pretrained("org/other")' in (folder / "README.md").read_text()  # the card names the new repo
    capsys.readouterr()
    assert cli.main(["card", str(tmp_path)]) == 2  # a user's mistake: one line, exit code 2
    assert "training_run.json" in capsys.readouterr().err
    run = json.loads((folder / "training_run.json").read_text())
    assert run["recipe"] == "recipes/causal_lm.py"


def test_train_fine_tunes_a_plain_transformers_model_from_a_dataset_folder(tmp_path, corpus, tiny_gpt2, capsys):
    # --dataset_name goes through `datasets.load_dataset`, as a Hub id would (a local folder here: no network)
    folder = str(tmp_path / "gpt2-run")
    dataset_folder = str(Path(corpus["train"]).parent)
    args = ["train", "--model_name_or_path", tiny_gpt2, "--dataset_name", dataset_folder, "--block_size", "32",
            "--max_train_steps", "2", "--output_dir", folder]  # fmt: skip
    assert cli.main(args) == 0
    assert "-> GPT2LMHeadModel" in capsys.readouterr().out
    run = json.loads((Path(folder) / "training_run.json").read_text())
    assert run["arch"] is None and run["base_model"] == tiny_gpt2
    assert run["dataset"]["train_documents"] == 8 and run["dataset"]["eval_documents"] == 2


def test_a_smoke_run_caps_its_evaluation_unless_asked_otherwise():
    def resolved(*argv):
        args = causal_lm.parse_args(["--arch", "transfo_xl", *argv])
        causal_lm.validate_args(args)
        return args.max_eval_samples

    assert resolved("--max_train_steps", "2") == SMOKE_EVAL_SAMPLES
    assert resolved("--max_train_steps", "2", "--max_eval_samples", "0") is None  # 0: all of it
    assert resolved("--max_train_steps", "2", "--max_eval_samples", "7") == 7
    assert resolved("--max_train_steps", str(SMOKE_RUN_STEPS)) is None and resolved() is None
