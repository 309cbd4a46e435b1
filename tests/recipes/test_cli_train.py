"""`tf-family train` (the main job, with tiny overrides), `tf-family card` and `tf-family push`."""

import json
from pathlib import Path

import pytest

from tf_family import cli

from .conftest import TINY_TXL, data_args

pytestmark = pytest.mark.recipe


def test_train_reports_perplexity_against_unigram_and_samples(tmp_path, corpus, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", *TINY_TXL, *data_args(corpus), "--max_train_steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "validation perplexity" in out and "unigram perplexity of the same data" in out
    assert "reloaded with          AutoModelForCausalLM.from_pretrained -> TffTransfoXLLMHeadModel" in out
    sample = out.split("sample ")[1]
    assert len(sample.strip()) > len(cli.SAMPLE_PROMPT)
    runs = list((tmp_path / "runs").iterdir())  # a fresh folder under ./runs/ for every run
    assert len(runs) == 1 and runs[0].name.startswith("transfo_xl-")
    assert (runs[0] / "README.md").is_file()


def test_main_job_defaults_are_a_small_transformer_xl_on_the_bundled_corpus():
    args = cli.MAIN_JOB_ARGS
    assert args[args.index("--arch") + 1] == "transfo_xl" and args[args.index("--variant") + 1] == "small"
    assert "--dataset_name" not in args and "--train_file" not in args  # the recipe's default: the bundled corpus


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
    with pytest.raises(ValueError, match="training_run.json"):
        cli.main(["card", str(tmp_path)])
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
