"""The recipe unchanged on two CPU processes (gloo), the way the README says to launch it."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from .conftest import TINY_TXL, data_args, launch_two_processes

pytestmark = [pytest.mark.recipe, pytest.mark.slow]


def test_two_processes_train_the_same_weights(tmp_path, corpus):
    launch_two_processes(
        "tf_family.recipes.causal_lm",
        [*TINY_TXL, *data_args(corpus), "--max_train_steps", "3", "--per_device_train_batch_size", "2",
         "--checkpointing_steps", "3", "--logging_steps", "1", "--output_dir", str(tmp_path)],
    )  # fmt: skip
    run = json.loads((tmp_path / "training_run.json").read_text())
    assert run["world_size"] == 2 and run["hyperparameters"]["world_size"] == 2
    # the learning-rate schedule runs in optimizer steps, however many processes step it (cosine over 3 steps)
    learning_rates = [record["learning_rate"] for record in run["train_history"]]
    assert learning_rates == pytest.approx([5e-4 * 0.75, 5e-4 * 0.25, 0.0], abs=1e-12)
    first, second = run["rank_weight_sha256"]
    assert first == second  # both ranks ended with identical weights
    # each rank kept (and checkpointed) the memory of its own streams
    assert {p.name for p in (tmp_path / "checkpoints" / "step_3").glob("memory_rank*")} == {
        "memory_rank0.safetensors",
        "memory_rank1.safetensors",
    }
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(1, 9)[None]).logits).all()


def test_two_processes_stream_their_own_parts_of_the_data(tmp_path, corpus, tiny_gpt2):
    """--streaming on two processes: each reads its own part of the stream (split_dataset_by_node) and checkpoints
    how far it read; the weights stay identical across ranks."""
    launch_two_processes(
        "tf_family.recipes.causal_lm",
        ["--model_name_or_path", tiny_gpt2, "--block_size", "16", "--streaming", *data_args(corpus),
         "--max_train_steps", "3", "--per_device_train_batch_size", "2", "--checkpointing_steps", "3",
         "--output_dir", str(tmp_path)],
    )  # fmt: skip
    run = json.loads((tmp_path / "training_run.json").read_text())
    first, second = run["rank_weight_sha256"]
    assert run["world_size"] == 2 and first == second
    states = [json.loads((tmp_path / "checkpoints" / "step_3" / f"data_rank{r}.json").read_text()) for r in (0, 1)]
    assert states[0]["buffer"] != states[1]["buffer"]  # different documents, different leftovers
    assert run["dataset"]["train_documents_read"] == sum(state["documents_read"] for state in states)
