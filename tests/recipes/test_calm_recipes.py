"""CALM in the recipes: the causal-LM recipe trains every exit (anytime loss), and calm_calibrate writes a
Learn-then-Test threshold with its guarantee into the config and the model card (tiny models, seconds)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tf_family import TffCalmForCausalLM
from tf_family.early_exit import calibrate_threshold
from tf_family.recipes import calm_calibrate, causal_lm
from tf_family.training.early_exit import run_calibration, score_grid

from .conftest import data_args

pytestmark = pytest.mark.recipe

TINY_CALM = ["--arch", "calm", "--variant", "tiny", "--block_size", "16"]
STEPS = ["--max_train_steps", "3", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]


@pytest.fixture(scope="module")
def trained_calm(tmp_path_factory, corpus):
    output = tmp_path_factory.mktemp("calm")
    causal_lm.main([*TINY_CALM, *data_args(corpus), *STEPS, "--output_dir", str(output)])
    return output


def test_causal_lm_recipe_trains_every_exit(tmp_path, corpus, monkeypatch):
    seen = []
    forward = TffCalmForCausalLM.forward

    def spy(self, *args, **kwargs):
        outputs = forward(self, *args, **kwargs)
        if self.training:
            seen.append((kwargs.get("exit_targets") is not None, outputs.aux_loss))
        return outputs

    monkeypatch.setattr(TffCalmForCausalLM, "forward", spy)
    causal_lm.main([*TINY_CALM, *data_args(corpus), *STEPS, "--output_dir", str(tmp_path / "run")])
    assert len(seen) == 3 and all(given and aux is not None and torch.isfinite(aux) for given, aux in seen)
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "run")) is TffCalmForCausalLM


def test_calibration_writes_threshold_and_guarantee(trained_calm, corpus, tmp_path):
    output = tmp_path / "calibrated"
    grid = ["1.0", "0.5", "0.2", "0.0"]
    summary = calm_calibrate.main(
        [
            "--model_name_or_path", str(trained_calm), "--output_dir", str(output), *data_args(corpus),
            "--num_prompts", "6", "--prompt_length", "8", "--max_new_tokens", "4", "--batch_size", "3",
            "--delta", "0.5", "--epsilon", "0.3", "--thresholds", *grid,
        ]
    )  # fmt: skip
    record = json.loads((output / "calibration.json").read_text())
    config = json.loads((output / "config.json").read_text())
    assert config["exit_threshold"] == record["threshold"] == summary["threshold"]
    assert config["calibration"]["guarantee"] == record["guarantee"]
    assert record["n"] == 6 and record["grid"] == [1.0, 0.5, 0.2, 0.0]
    # the written threshold is Learn-then-Test's on the recorded risks (fixed-sequence over the grid)
    rejected = [p <= 0.3 for p in record["p_values"]]
    expected_index = (rejected + [False]).index(False) - 1
    assert record["threshold"] == (record["grid"][expected_index] if expected_index >= 0 else None)
    # 1.0 never exits (softmax_diff < 1): risk 0 there
    assert record["risks"][0] == 0.0
    card = (output / "README.md").read_text()
    assert "## Early-exit calibration" in card and record["guarantee"] in card
    assert "tff_calm" in card  # the recipe-trained card, with the section added
    reloaded = AutoModelForCausalLM.from_pretrained(output)
    assert reloaded.config.exit_threshold == record["threshold"]
    same = calibrate_threshold(record["grid"], torch.zeros(6, 4), 0.5, 0.3)
    assert same.threshold == 0.0


def test_calibration_refuses_other_models_and_bad_arguments(tiny_gpt2, corpus, tmp_path):
    with pytest.raises(ValueError, match="tff_calm"):
        calm_calibrate.main(
            ["--model_name_or_path", tiny_gpt2, "--output_dir", str(tmp_path / "x"), *data_args(corpus)]
        )
    with pytest.raises(ValueError, match="descending"):
        calm_calibrate.main(
            ["--model_name_or_path", tiny_gpt2, "--output_dir", str(tmp_path / "y"), "--thresholds", "0.1", "0.5"]
        )
    with pytest.raises(ValueError, match="--delta"):
        calm_calibrate.main(["--model_name_or_path", tiny_gpt2, "--output_dir", str(tmp_path / "z"), "--delta", "2"])


def test_calibration_sweep_stops_at_the_first_failed_test_with_the_same_result(trained_calm):
    """Fixed-sequence testing stops at the first p > ε, so the sweep does too: same threshold, fewer generations."""
    model = AutoModelForCausalLM.from_pretrained(trained_calm).eval()
    prompts = torch.randint(0, model.config.vocab_size, (6, 8), generator=torch.Generator().manual_seed(0))
    continuations = torch.zeros(6, 4, dtype=torch.long)
    grid = [1.0, 0.5, 0.2, 0.1, 0.05, 0.0]
    swept = run_calibration(model, prompts, continuations, grid, delta=0.2, epsilon=0.3, batch_size=3)
    full = score_grid(model, prompts, continuations, grid, batch_size=3)
    everything = calibrate_threshold(grid, full.losses, 0.2, 0.3)
    assert swept.result.threshold == everything.threshold
    evaluated = len(swept.result.thresholds)
    assert swept.record()["grid"] == grid and swept.record()["evaluated_thresholds"] == evaluated
    assert evaluated == min(len(grid), (everything.index + 2) if everything.index is not None else 1)
    torch.testing.assert_close(swept.result.p_values, everything.p_values[:evaluated])
