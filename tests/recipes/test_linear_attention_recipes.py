"""The linear-time attention models (Performer, Linear Transformer, RFA, Linformer) through the causal-LM, masked-LM
and sequence-classification recipes (tiny model, tiny real data): each trains to finite metrics, and the saved folder
reloads through the Auto classes and gives the outputs of the trained model it saved."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification

from tf_family.recipes import causal_lm, masked_lm, sequence_classification

from .conftest import data_args

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "2", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]
CASES = [
    ("performer", causal_lm, AutoModelForCausalLM),
    ("linear_transformer", causal_lm, AutoModelForCausalLM),
    ("rfa", causal_lm, AutoModelForCausalLM),
    ("performer", masked_lm, AutoModelForMaskedLM),
    ("linformer", masked_lm, AutoModelForMaskedLM),
    ("linformer", sequence_classification, AutoModelForSequenceClassification),
]


@pytest.fixture(scope="module")
def labelled(corpus, tmp_path_factory):
    """The corpus's rows labelled alternately (two classes in each split): local JSON-lines classification files."""
    folder = tmp_path_factory.mktemp("labelled")
    files = {}
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in Path(corpus[split]).read_text().splitlines()]
        rows = [{"text": r["text"][:300], "label": ("first", "second")[n % 2]} for n, r in enumerate(rows)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[split] = str(folder / f"{split}.jsonl")
    return files


@pytest.mark.parametrize(
    ("arch", "recipe", "auto_class"), CASES, ids=[f"{a}-{r.__name__.split('.')[-1]}" for a, r, _ in CASES]
)
def test_recipe_trains_and_reloads(arch, recipe, auto_class, corpus, labelled, tmp_path):
    files = data_args(labelled) if recipe is sequence_classification else data_args(corpus)
    extra = [] if recipe is causal_lm else ["--max_length", "32"]
    argv = ["--arch", arch, "--variant", "tiny", *files, *STEPS, *extra, "--output_dir", str(tmp_path)]
    results = recipe.main(argv)
    assert results and all(torch.isfinite(torch.tensor(float(v))) for v in results.values() if type(v) in (int, float))
    model = auto_class.from_pretrained(tmp_path).eval()
    assert model.config.model_type == f"tff_{arch}"
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        first, second = model(ids).logits, auto_class.from_pretrained(tmp_path).eval()(ids).logits
    assert torch.isfinite(first).all() and torch.equal(first, second)
