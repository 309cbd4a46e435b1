"""Model cards' YAML front matter, as the Hub reads it: ``datasets`` holds Hub dataset ids only, ``base_model`` and
``base_model_relation`` say what a fine-tuned model or an adapter came from."""

import json

import pytest
import yaml

from tf_family.shipping.cards import render_model_card


def _front_matter(folder) -> dict:
    text = str(render_model_card(folder, "org/name"))
    return yaml.safe_load(text.split("---\n")[1])


def _run_folder(tmp_path, **run):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "tff_transfo_xl"}))
    record = {"recipe": "recipes/causal_lm.py", "task": "causal_lm", "metrics": {"perplexity": 9.5}, **run}
    (folder / "training_run.json").write_text(json.dumps(record))
    return folder


def test_a_fine_tuned_model_names_its_base_model_and_hub_dataset(tmp_path):
    folder = _run_folder(
        tmp_path,
        base_model="someone/tiny-txl",
        base_model_on_hub=True,
        dataset={"name": "someone/corpus", "on_hub": True},
    )
    meta = _front_matter(folder)
    assert meta["datasets"] == ["someone/corpus"]
    assert meta["base_model"] == "someone/tiny-txl" and meta["base_model_relation"] == "finetune"
    assert meta["model-index"][0]["results"][0]["dataset"]["type"] == "someone/corpus"


def test_an_adapter_is_related_to_its_base_model_as_an_adapter(tmp_path):
    folder = _run_folder(tmp_path, base_model="someone/tiny-txl", base_model_on_hub=True, adapter=True, dataset={})
    (folder / "adapter_config.json").write_text("{}")
    meta = _front_matter(folder)
    assert meta["base_model"] == "someone/tiny-txl" and meta["base_model_relation"] == "adapter"
    assert "datasets" not in meta


@pytest.mark.parametrize("where", ["local_folder", "bundled", "not_an_id"])
def test_datasets_lists_hub_ids_only(tmp_path, where):
    """A local folder passed as --dataset_name (read by datasets.load_dataset like a Hub id), a bundled corpus and a
    name that is no repository id stay out of the YAML (the Hub would link to a dataset that does not exist)."""
    local = tmp_path / "my_corpus"
    local.mkdir()
    name, on_hub = {"local_folder": (str(local), True), "bundled": ("sotu", False), "not_an_id": ("a b/c d", True)}[
        where
    ]
    folder = _run_folder(tmp_path, dataset={"name": name, "on_hub": on_hub})
    meta = _front_matter(folder)
    assert "datasets" not in meta and "base_model" not in meta and "base_model_relation" not in meta
