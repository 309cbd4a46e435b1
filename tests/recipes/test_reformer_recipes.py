"""`--arch reformer` in the causal-LM and masked-LM recipes: end to end on tiny real data, reloads through Auto."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

import tf_family
from tf_family.recipes import causal_lm, masked_lm

from .conftest import data_args

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "3", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]
# block 24: beyond the tiny variant's LSH chunk of 16, so training runs the hashed path reversibly
TINY = ["--arch", "reformer", "--variant", "tiny", "--config_overrides", "hidden_dropout_prob=0.1"]


def test_causal_lm_recipe_trains_a_reformer(tmp_path, corpus):
    results = causal_lm.main([*TINY, "--block_size", "24", *data_args(corpus), *STEPS, "--output_dir", str(tmp_path)])
    assert results["scored_tokens"] > 0 and results["perplexity"] > 1
    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(model) is tf_family.TffReformerForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    batch = tokenizer(["Fellow citizens of the Senate"], return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert generated.shape[1] == batch["input_ids"].shape[1] + 3


def test_masked_lm_recipe_trains_a_reformer(tmp_path, corpus):
    args = [*TINY, *data_args(corpus), "--max_length", "24", *STEPS, "--output_dir", str(tmp_path)]
    results = masked_lm.main(args)
    assert results["eval_masked_tokens"] > 0 and 0.0 <= results["masked_accuracy"] <= 1.0
    model = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(model) is tf_family.TffReformerForMaskedLM
