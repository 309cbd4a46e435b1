"""`--remote_code` on a recipe: the saved folder carries its code (loading it without tf_family is tested for
every architecture in tests/test_remote_code.py)."""

import json

import pytest

from tf_family.recipes import causal_lm

from .conftest import TINY_TXL, data_args

pytestmark = pytest.mark.recipe


def test_a_run_with_remote_code_saves_its_code_and_says_so(tmp_path, corpus):
    out = tmp_path / "run"
    causal_lm.main(
        [*TINY_TXL, *data_args(corpus), "--max_train_steps", "1", "--output_dir", str(out), "--remote_code"]
    )
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_transfo_xl.TffTransfoXLLMHeadModel"
    assert (out / "modeling_transfo_xl.py").is_file() and (out / "attention_relative.py").is_file()
    assert "trust_remote_code=True" in (out / "README.md").read_text()


def test_remote_code_with_an_unmerged_adapter_is_refused_before_any_work():
    args = causal_lm.parse_args(["--model_name_or_path", "x", "--lora_r", "4", "--remote_code"])
    with pytest.raises(ValueError, match="--remote_code exports a whole model's code.*--merge_lora"):
        causal_lm.validate_args(args)
