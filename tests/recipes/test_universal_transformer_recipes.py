"""The Universal Transformer through the causal-LM and masked-LM recipes (tiny model, tiny real data): the loss
with its ponder cost trains, the saved folder reloads through Auto and reports its ponder steps."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from tf_family.recipes import causal_lm, masked_lm

from .conftest import data_args

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "3", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]
TINY = ["--arch", "universal_transformer", "--variant", "tiny"]


@pytest.mark.parametrize(
    ("recipe", "auto_class"), [(causal_lm, AutoModelForCausalLM), (masked_lm, AutoModelForMaskedLM)]
)
def test_recipe_trains_and_reloads(recipe, auto_class, corpus, tmp_path):
    extra = ["--max_length", "32"] if recipe is masked_lm else []
    results = recipe.main([*TINY, *data_args(corpus), *STEPS, *extra, "--output_dir", str(tmp_path)])
    assert all(torch.isfinite(torch.tensor(float(v))) for v in results.values() if isinstance(v, (int, float)))
    model = auto_class.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        outputs = model(torch.tensor([[5, 6, 7, 8]]))
    assert outputs.ponder_steps.shape == (1, 4) and bool((outputs.ponder_steps >= 1).all())
