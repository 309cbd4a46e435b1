"""recipes/knn_lm.py end to end on tiny data: build a datastore (with faiss indexes), evaluate a λ × k grid, reload
the saved kNN-LM through Auto and check that its own forward reproduces the recipe's perplexity."""

import importlib.util
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tf_family.data.packing import IGNORE_INDEX
from tf_family.data.sampling import sequential_block_loader
from tf_family.models.knn_lm.modeling_knn_lm import TffKNNLMForCausalLM
from tf_family.recipes import knn_lm
from tf_family.retrieval.datastore import DatastoreMismatchError

from .conftest import data_args

pytestmark = pytest.mark.recipe


def test_build_then_eval_then_reload(corpus, tiny_gpt2, tmp_path):
    faiss = importlib.util.find_spec("faiss") is not None
    datastore = tmp_path / "datastore"
    common = [*data_args(corpus), "--model_name_or_path", tiny_gpt2, "--block_size", "32", "--cpu"]
    built = knn_lm.main(
        ["build", *common, "--output_dir", str(datastore), *(["--index_types", "flat", "ivf_flat"] if faiss else [])]
    )
    assert built["keys"] > 500 and built["dim"] == 32 and built["tokens_per_second"] > 0
    description = json.loads((datastore / "datastore.json").read_text())
    assert description["size"] == built["keys"] and description["module_path"] == "lm_head"
    if faiss:
        assert (datastore / "index-flat" / "index.faiss").is_file() and "ivf_flat" in built["indexes"]

    out = tmp_path / "knn-model"
    grid = ["--ks", "4", "16", "--lmbdas", "0.0", "0.3", "0.6"]
    result = knn_lm.main(["eval", *common, "--datastore", str(datastore), *grid, "--output_dir", str(out)])
    assert set(result["grid"]) == {f"k={k},lmbda={x}" for k in (4, 16) for x in (0.0, 0.3, 0.6)}
    # λ = 0 is the base model, whatever k
    for k in (4, 16):
        assert math.isclose(result["grid"][f"k={k},lmbda=0.0"], result["validation_base"]["perplexity"], rel_tol=1e-9)
    best = result["best"]
    assert result["validation_knn"]["perplexity"] == min(result["grid"].values())
    assert "test_knn" not in result  # local files without a test split: validation only

    model = AutoModelForCausalLM.from_pretrained(out)
    assert type(model) is TffKNNLMForCausalLM and model.datastore is not None
    assert (model.config.k, model.config.lmbda) == (best["k"], best["lmbda"])
    run = json.loads((out / "training_run.json").read_text())
    assert run["model_type"] == "tff_knn_lm" and (out / "README.md").is_file()

    # the saved model's own forward reproduces the recipe's validation perplexity (grid path == model path)
    tokenizer = AutoTokenizer.from_pretrained(out)
    args = knn_lm.parse_args(["eval", *common, "--datastore", str(datastore)])
    blocks, _ = knn_lm.load_blocks(args, tokenizer, ["validation"])["validation"]
    nll, count = 0.0, 0
    with torch.no_grad():
        for batch in sequential_block_loader(blocks, 8):
            log_probs = model(batch["input_ids"]).logits
            keep = batch["labels"] != IGNORE_INDEX
            nll -= log_probs[keep].gather(1, batch["labels"][keep][:, None]).sum().item()
            count += int(keep.sum())
    assert count == result["validation_tokens"]
    assert math.isclose(math.exp(nll / count), result["validation_knn"]["perplexity"], rel_tol=1e-4)

    if faiss:  # the faiss Flat index gives the exact search's numbers
        flat = knn_lm.main(["eval", *common, "--datastore", str(datastore), *grid, "--index_type", "flat"])
        for key, value in result["grid"].items():
            assert math.isclose(flat["grid"][key], value, rel_tol=1e-4), key


def test_eval_refuses_a_datastore_of_another_model(corpus, tiny_gpt2, tmp_path):
    other = tmp_path / "other"
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2)
    with torch.no_grad():
        model.lm_head.weight.add_(0.01)  # tied: changes the embeddings too
    model.save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny_gpt2).save_pretrained(other)
    common = [*data_args(corpus), "--block_size", "32", "--cpu", "--max_samples", "2"]
    knn_lm.main(["build", *common, "--model_name_or_path", tiny_gpt2, "--output_dir", str(tmp_path / "ds")])
    with pytest.raises(DatastoreMismatchError, match="built by another model"):
        knn_lm.main(["eval", *common, "--model_name_or_path", str(other), "--datastore", str(tmp_path / "ds")])
    forced = knn_lm.main(
        ["eval", *common, "--model_name_or_path", str(other), "--datastore", str(tmp_path / "ds"), "--force"]
    )
    assert forced["validation_tokens"] > 0


def test_bad_arguments_are_refused_before_work(tmp_path):
    (tmp_path / "datastore.json").write_text("{}")
    with pytest.raises(ValueError, match="--lmbdas"):
        knn_lm.main(["eval", "--model_name_or_path", "x", "--datastore", str(tmp_path), "--lmbdas", "1.5"])
    with pytest.raises(ValueError, match="--ks"):
        knn_lm.main(["eval", "--model_name_or_path", "x", "--datastore", str(tmp_path), "--ks", "0"])
    with pytest.raises(ValueError, match="already holds a datastore"):
        knn_lm.main(["build", "--model_name_or_path", "x", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="not a datastore folder"):
        knn_lm.main(["eval", "--model_name_or_path", "x", "--datastore", str(tmp_path / "none")])


def test_the_saved_knn_lm_folder_is_portable_and_the_grid_is_a_table(corpus, tiny_gpt2, tmp_path, capsys):
    import shutil

    from tf_family.shipping.hub import files_to_push

    common = [
        *data_args(corpus),
        "--model_name_or_path",
        tiny_gpt2,
        "--block_size",
        "32",
        "--cpu",
        "--max_samples",
        "2",
    ]
    datastore = tmp_path / "ds"
    knn_lm.main(["build", *common, "--output_dir", str(datastore)])
    captured = capsys.readouterr()
    assert "saved a datastore of" in captured.out
    assert "tokenizing train" in captured.err and "building kNN datastore" in captured.err  # progress bars
    out = tmp_path / "run" / "knn-model"
    knn_lm.main(["eval", *common, "--datastore", str(datastore), "--ks", "4", "8", "--lmbdas", "0.0", "0.5",
                 "--output_dir", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert "λ \\ k" in printed and "best k=" in printed and "saved to" in printed  # a table, not one JSON line
    config = json.loads((out / "config.json").read_text())
    assert config.get("datastore_path") is None  # no absolute path: the datastore is in the folder
    assert (out / "datastore" / "datastore.json").is_file()
    assert "datastore/datastore.json" in files_to_push(out)  # a push takes what the model needs
    card = (out / "README.md").read_text()
    assert "**Depends on its datastore**" in card and "`datastore/`" in card and "by Hub id" in card
    assert "\nbase_model:" not in card.split("\n---\n")[0]  # a local base model is no Hub repository id
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert "is_local" not in tokenizer_config and "local_files_only" not in tokenizer_config

    moved = tmp_path / "elsewhere" / "copied"
    shutil.copytree(out, moved)
    shutil.rmtree(tmp_path / "run")
    shutil.rmtree(datastore)  # neither the original folder nor the datastore it was built from remain
    model = AutoModelForCausalLM.from_pretrained(moved)
    assert model.datastore is not None and model.datastore.size > 0


def test_missing_faiss_is_found_before_the_datastore_is_built(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "faiss" else real_find_spec(name, *a)
    )
    # a model that does not exist: the refusal must come before anything is loaded
    with pytest.raises(ValueError, match=r"faiss.*pip install"):
        knn_lm.main(
            ["build", "--model_name_or_path", "x", "--output_dir", str(tmp_path / "ds"), "--index_types", "ivf_pq"]
        )
    (tmp_path / "datastore.json").write_text("{}")
    with pytest.raises(ValueError, match=r"faiss.*pip install"):
        knn_lm.main(["eval", "--model_name_or_path", "x", "--datastore", str(tmp_path), "--index_type", "hnsw"])
