"""What a new user meets first: the command line, the recipes' first runs and the kernel's messages. Each test is one
of the frictions of a first run from a fresh clone: a missing local folder said as such at once; one native-kernel build per
environment; one ``error: ...`` line (exit code 2, "did you mean") instead of a traceback, under ``accelerate
launch`` too; short runs labelled; timestamped run folders for every recipe; ``train --help`` without doubled
defaults or architectures it refuses; ``register_for_auto_class`` + ``save_pretrained`` working; a run that names
only what it saved; the kernel's message on a line of its own; ``tf-family export`` saying why its code files lie
beside the weights."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from tf_family import TffTransfoXLLMHeadModel, cli, create_model
from tf_family.attention import native
from tf_family.recipes import causal_lm, decision_transformer
from tf_family.training import encoder
from tf_family.utils.user_errors import MissingLocalPathError

ROOT = Path(__file__).resolve().parents[1]
TIMESTAMPED = r"runs/{}-\d{{8}}-\d{{6}}(-\d+)?$"


# ---- 1. a missing local folder ------------------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["runs/my-run", "./my-run", "~/no-such-tf-family-run", "a/b/c"])
def test_from_pretrained_says_a_missing_local_folder_is_missing(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # `runs/my-run`: its first part is a local folder, so it is no Hub id
    with pytest.raises(MissingLocalPathError, match=r"from_pretrained '.*': no such file or folder"):
        TffTransfoXLLMHeadModel.from_pretrained(source)


def test_recipes_and_cli_say_a_missing_local_folder_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    args = causal_lm.parse_args(["--model_name_or_path", "runs/my-run"])
    with pytest.raises(ValueError, match="--model_name_or_path 'runs/my-run': no such file or folder"):
        causal_lm.validate_args(args)
    args = causal_lm.parse_args(["--arch", "transfo_xl", "--train_file", "notes.txt"])
    with pytest.raises(ValueError, match="--train_file 'notes.txt': no such file or folder"):
        causal_lm.validate_args(args)
    assert cli.main(["export", "runs/my-run"]) == 2
    assert "tf-family export 'runs/my-run': no such file or folder" in capsys.readouterr().err


# ---- 2. one native-kernel build per environment -------------------------------------------------------------------
def test_kernel_build_key_is_the_same_for_every_way_of_starting_the_environments_python(monkeypatch):
    """`python`, `python3` and a console script (`tf-family`) of one environment differ in `sys.executable` only."""
    keys = set()
    for name in ("python", "python3", "tf-family"):
        monkeypatch.setattr(sys, "executable", str(Path(sys.prefix) / "bin" / name))
        keys.add(native.build_key())
    assert len(keys) == 1, keys


# ---- 3. one line for a user's mistake, "did you mean", exit code 2, --debug -------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--arch", "reformr"], "Unknown architecture 'reformr' (did you mean 'reformer'?)"),
        (
            ["train", "--arch", "transfo_xl", "--config_overrides", "n_layr=2"],
            "--config_overrides n_layr=2: TffTransfoXLConfig has no field 'n_layr' (did you mean 'n_layer'?)",
        ),
    ],
)
def test_cli_mistakes_are_one_line_with_did_you_mean(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tf-family: error: ") and message in err
    with pytest.raises(ValueError, match=re.escape(message)):
        cli.main([*argv, "--debug"])


def test_a_recipe_under_accelerate_launch_prints_one_line_and_no_launcher_warnings(tmp_path):
    """The README's set-up (`accelerate config default` once) and command form (`accelerate launch -q ...`): no
    `--num_processes was set` lines and no `CalledProcessError` traceback, only the recipe's one line."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(["accelerate", "config", "default"], env=env, check=True, capture_output=True)
    command = ["accelerate", "launch", "-q", "recipes/sequence_classification.py", "--arch", "longformr"]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "was set to a value" not in output and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("error: Unknown architecture 'longformr' (did you mean")


# ---- 4, 5. short runs labelled; the kNN-LM's base perplexity -----------------------------------------------------
def test_summary_labels_a_short_run_and_names_the_base_models_perplexity():
    short = {"perplexity": 900.0, "unigram_perplexity": 1060.0, "train_steps": 20}
    short |= {"eval_documents": 4, "validation_documents": 15, "base_perplexity": 950.0}
    lines = cli.evaluation_summary(short)
    assert any(line.startswith("short run") and "20 steps" in line and "first 4 of 15" in line for line in lines)
    assert any(line.startswith("base model perplexity  950.0") for line in lines)
    full = {"perplexity": 319.1, "unigram_perplexity": 1125.1, "train_steps": 400}
    assert cli.evaluation_summary(full | {"eval_documents": 15, "validation_documents": 15}) == [
        "validation perplexity  319.1   (unigram perplexity of the same data: 1125.1)"
    ]


# ---- 6, 10. rerunnable recipes; a run names only what it saved ----------------------------------------------------
def test_every_recipe_names_a_fresh_folder_for_each_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = causal_lm.parse_args(["--arch", "transfo_xl"])
    assert re.match(TIMESTAMPED.format("transfo_xl-sotu"), causal_lm.default_output_dir(args))
    args = argparse_namespace(arch="longformer", model_name_or_path=None, train_file=None, dataset_name="brown")
    assert re.match(TIMESTAMPED.format("longformer-sequence_classification-brown"),
                    encoder.default_output_dir(args, "sequence_classification"))  # fmt: skip


def argparse_namespace(**values):
    import argparse

    return argparse.Namespace(**values)


def test_decision_transformer_reruns_with_the_same_command_and_claims_no_tokenizer(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gymnasium")
    monkeypatch.chdir(tmp_path)
    argv = ["--env_id", "CartPole-v1", "--dataset_steps", "300", "--reference_episodes", "1", "--variant", "tiny",
            "--per_device_train_batch_size", "4", "--max_train_steps", "1", "--eval_episodes", "1",
            "--eval_target_returns", "100"]  # fmt: skip
    decision_transformer.main(argv)
    decision_transformer.main(argv)  # the same command again: a second folder, not "holds an earlier run"
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all(re.match(TIMESTAMPED.format(".*"), f"runs/{run.name}") for run in runs)
    saved = [line for line in capsys.readouterr().out.splitlines() if line.startswith("saved to ")]
    assert len(saved) == 2 and all("weights, config" in line and "tokenizer" not in line for line in saved)


# ---- 8. train --help ----------------------------------------------------------------------------------------------
def test_train_help_says_each_default_once_and_offers_only_causal_lm_architectures(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 'small' where the arch has it) (default: small)" not in out
    arch_help = out.split("--arch ARCH train from scratch")[1].split("--variant")[0]
    assert "reformer" in arch_help and "big_bird" not in arch_help and "decision_transformer" not in arch_help


# ---- 9. register_for_auto_class + save_pretrained ----------------------------------------------------------------
def test_register_for_auto_class_then_save_pretrained_exports_the_code(tmp_path):
    """transformers' documented way to ship custom code gives what `save_pretrained(..., remote_code=True)` gives
    (whose folders load without tf_family: tests/test_remote_code.py), not a FileNotFoundError from inside it."""
    model = create_model("transfo_xl", "causal_lm", "tiny").eval()
    model.save_pretrained(tmp_path / "exported", remote_code=True)
    type(model).register_for_auto_class("AutoModelForCausalLM")
    try:
        model.save_pretrained(tmp_path / "shipped")
    finally:
        type(model)._auto_class = None
    files = {path.name for path in (tmp_path / "shipped").iterdir()}
    assert files == {path.name for path in (tmp_path / "exported").iterdir()} and "modeling_transfo_xl.py" in files
    config = json.loads((tmp_path / "shipped" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_transfo_xl.TffTransfoXLLMHeadModel"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "shipped", trust_remote_code=True).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 12))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


# ---- 10. the kernel's message on a line of its own; export says why its files lie beside the weights -------------
def test_kernel_message_does_not_continue_a_progress_bar_line(capsys):
    bar = tqdm(total=10, desc="training", file=sys.stderr, ascii=True)
    bar.update(3)
    native.say("tf_family: compiling the native CPU attention kernel")
    bar.close()
    segments = re.split(r"[\r\n]", capsys.readouterr().err)
    assert "tf_family: compiling the native CPU attention kernel" in segments


def test_export_explains_its_code_files(tmp_path, capsys):
    create_model("transfo_xl", "causal_lm", "tiny").save_pretrained(tmp_path / "run")
    assert cli.main(["export", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "must lie beside config.json" in out and "never a sub-folder" in out
