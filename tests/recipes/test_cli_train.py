"""`tf-family train` (the main job, with tiny overrides), `tf-family card` and `tf-family push`."""

import json

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
