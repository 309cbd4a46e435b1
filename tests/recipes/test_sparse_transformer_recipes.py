"""The blockwise encoder (BlockBERT) through the masked-LM and sequence-classification recipes (tiny model, tiny real
data): each trains, and the saved folder reloads through the Auto classes as the bidirectional head it was; a
causal-only pattern is refused with the field named."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

from tf_family.recipes import masked_lm, sequence_classification

from .conftest import data_args

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "3", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]
BLOCKWISE = ["--arch", "sparse_transformer", "--variant", "tiny-blockwise", "--max_length", "32"]


@pytest.fixture(scope="module")
def classification_files(corpus, tmp_path_factory):
    """The corpus's addresses labelled by century (a two-class JSON-lines task on real text)."""
    folder = tmp_path_factory.mktemp("by-century")
    files = {}
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in Path(corpus[split]).read_text().splitlines()]
        labelled = [{"text": r["text"][:300], "label": "19th" if r["year"] < 1900 else "20th+"} for r in rows]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled))
        files[split] = str(folder / f"{split}.jsonl")
    return files


def test_masked_lm_recipe_trains_the_blockwise_encoder(corpus, tmp_path):
    results = masked_lm.main([*BLOCKWISE, *data_args(corpus), *STEPS, "--output_dir", str(tmp_path)])
    assert results["train_steps"] == 3
    assert all(torch.isfinite(torch.tensor(float(v))) for v in results.values() if isinstance(v, (int, float)))
    model = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == "TffSparseTransformerForMaskedLM" and model.config.causal is False
    with torch.no_grad():
        assert model(torch.tensor([[5, 6, 7, 8, 9]])).logits.shape == (1, 5, model.config.vocab_size)


def test_sequence_classification_recipe_trains_the_blockwise_encoder(classification_files, tmp_path):
    data = ["--train_file", classification_files["train"], "--validation_file", classification_files["validation"]]
    results = sequence_classification.main([*BLOCKWISE, *data, *STEPS, "--output_dir", str(tmp_path)])
    assert results["train_steps"] == 3 and 0.0 <= results["eval_accuracy"] <= 1.0
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == "TffSparseTransformerForSequenceClassification"
    assert model.config.causal is False and set(model.config.label2id) == {"19th", "20th+"}


def test_recipe_refuses_a_causal_only_pattern(corpus, tmp_path):
    args = ["--arch", "sparse_transformer", "--variant", "tiny", "--max_length", "32", *data_args(corpus), *STEPS]
    with pytest.raises(ValueError, match="sparsity_pattern='strided'"):
        masked_lm.main([*args, "--output_dir", str(tmp_path)])
