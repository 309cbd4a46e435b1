"""The recipe unchanged on two CPU processes (gloo), the way the README says to launch it."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from .conftest import TINY_TXL, data_args

pytestmark = [pytest.mark.recipe, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_processes_train_the_same_weights(tmp_path, corpus):
    # `accelerate launch --cpu --num_processes 2` silently starts one process (accelerate 1.15); the shipped config
    # (distributed_type MULTI_GPU, 2 processes) with the recipe's --cpu starts two gloo processes
    config = Path(__file__).resolve().parents[2] / "recipes" / "accelerate_configs" / "two_cpu_processes.yaml"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--main_process_port", str(free_port()),
        "-m", "tf_family.recipes.causal_lm", "--cpu", *TINY_TXL, *data_args(corpus),
        "--max_train_steps", "3", "--per_device_train_batch_size", "2", "--checkpointing_steps", "3",
        "--logging_steps", "1", "--output_dir", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    # own process group: if the run hangs, the launcher and both ranks are killed together (no orphaned rank)
    launcher = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
    try:
        _, stderr = launcher.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        _, stderr = launcher.communicate()
        pytest.fail(f"two-process run did not finish in 300 s: {stderr[-3000:]}")
    assert launcher.returncode == 0, stderr[-3000:]
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
