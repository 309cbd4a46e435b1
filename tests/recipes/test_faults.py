"""Faults across processes, through the recipes' machinery (`tf_family.training`): a rank killed mid-step, a resume
with another number of processes, two runs on one output folder, a disk that fills during a checkpoint or a
datastore build. Each test starts real processes (the recipe run as a user runs it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from .conftest import TINY_TXL, _free_port, data_args, launch_two_processes

pytestmark = [pytest.mark.recipe, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "recipes" / "accelerate_configs" / "two_cpu_processes.yaml"
# a model that sees shuffled blocks, without dropout (its masks could not continue across another process count)
TINY_SHUFFLED = ["--arch", "longformer", "--variant", "tiny", "--block_size", "16"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def _run(args: list[str]) -> dict:
    from tf_family.recipes import causal_lm

    return causal_lm.main(args)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def _max_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max(float((first[k].float() - second[k].float()).abs().max()) for k in first)


def _rank_pids(marker: str) -> dict[int, int]:
    """Local rank -> pid of the recipe processes whose command line holds ``marker`` (the run's output folder)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() not in (entry / "cmdline").read_bytes():
                continue
            environ = dict(
                item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item
            )
        except OSError:
            continue
        if b"LOCAL_RANK" in environ:
            ranks[int(environ[b"LOCAL_RANK"])] = int(entry.name)
    return ranks


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------- 1. a rank killed mid-step
def test_a_rank_killed_mid_step_stops_the_other_and_keeps_the_last_checkpoint(tmp_path, corpus):
    """SIGKILL rank 1 while the run trains: rank 0 and the launcher exit with an error naming the killed process
    within 60 s (no hang), and the last checkpoint resumes, here on one process (2 -> 1, the memory re-split)."""
    output = tmp_path / "run"
    args = [*TINY_TXL, *data_args(corpus), "--per_device_train_batch_size", "1", "--max_train_steps", "100000",
            "--checkpointing_steps", "2", "--logging_steps", "1000", "--output_dir", str(output)]  # fmt: skip
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG),
               "--main_process_port", str(_free_port()), "-m", "tf_family.recipes.causal_lm", "--cpu", *args]  # fmt: skip
    launcher = subprocess.Popen(
        command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _wait_for(lambda: (output / "checkpoints" / "step_4").is_dir(), 240, "the checkpoint of step 4")
        ranks = _rank_pids(str(output))
        assert set(ranks) == {0, 1}, ranks
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            for pid in _rank_pids(str(output)).values():
                os.kill(pid, signal.SIGKILL)
            launcher.communicate()
    print(f"launcher exited {elapsed:.1f} s after rank 1 was killed; last lines:\n{stderr[-1500:]}")
    assert launcher.returncode != 0
    assert f"pid {ranks[1]}" in stderr.replace(": ", " ") or str(ranks[1]) in stderr
    assert "SIGKILL" in stderr or "Signal 9" in stderr
    assert not _rank_pids(str(output))  # no rank left behind
    # the last complete checkpoint resumes on one process: its two processes' memories joined by rows
    last = max((int(p.name.split("_")[1]), p) for p in (output / "checkpoints").glob("step_*") if "." not in p.name)
    steps = last[0]
    assert json.loads((last[1] / "trainer_state.json").read_text())["world_size"] == 2
    summary = _run([*TINY_TXL, *data_args(corpus), "--per_device_train_batch_size", "2", "--max_train_steps",
                    str(steps + 1), "--checkpointing_steps", "1", "--output_dir", str(output),
                    "--resume_from_checkpoint", str(last[1])])  # fmt: skip
    assert summary is not None and summary["train_steps"] == steps + 1


def test_another_number_of_processes_on_a_memory_checkpoint_must_keep_its_rows(tmp_path, corpus):
    """A memory model's checkpoint from one process (2 rows) is refused at start by 2 processes of 2 rows each (the
    memory's rows could not be re-split); the message says which batch size continues the run."""
    output = tmp_path / "run"
    _run([*TINY_TXL, *data_args(corpus), "--per_device_train_batch_size", "2", "--max_train_steps", "2",
          "--checkpointing_steps", "2", "--output_dir", str(output)])  # fmt: skip
    from tf_family.training.checkpointing import check_world_change, read_trainer_state

    checkpoint = output / "checkpoints" / "step_2"
    wrong = type("Args", (), {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1})
    with pytest.raises(ValueError, match="pass --per_device_train_batch_size 1 --gradient_accumulation_steps 1"):
        check_world_change(checkpoint, read_trainer_state(checkpoint), wrong, 2)
    three = type("Args", (), {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1})
    with pytest.raises(ValueError, match="do not divide among 3 processes"):
        check_world_change(checkpoint, read_trainer_state(checkpoint), three, 3)


# ------------------------------------------------------------------------- 2. resume with another number of processes
def test_shuffled_blocks_resume_exactly_on_another_number_of_processes(tmp_path, corpus):
    """One process (4 rows a step) checkpoints every 2 steps; two processes (2 rows each) resume its step 2 and
    train to step 8 (1 -> 2); one process resumes their step 4 to step 8 (2 -> 1). Both match the uninterrupted
    run."""
    common = [*TINY_SHUFFLED, *data_args(corpus), "--checkpointing_steps", "2", "--logging_steps", "100",
              "--max_train_steps", "8"]  # fmt: skip
    reference = tmp_path / "reference"
    _run([*common, "--per_device_train_batch_size", "4", "--output_dir", str(reference)])
    two = tmp_path / "two"
    (two / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step_2", two / "checkpoints" / "step_2")
    launch_two_processes(
        "tf_family.recipes.causal_lm",
        [*common, "--per_device_train_batch_size", "2", "--output_dir", str(two),
         "--resume_from_checkpoint", "latest"],
    )  # fmt: skip
    state = json.loads((two / "checkpoints" / "step_8" / "trainer_state.json").read_text())
    assert state["world_size"] == 2
    one_to_two = _max_difference(_weights(two), _weights(reference))
    again = tmp_path / "again"
    (again / "checkpoints").mkdir(parents=True)
    shutil.copytree(two / "checkpoints" / "step_4", again / "checkpoints" / "step_4")
    _run([*common, "--per_device_train_batch_size", "4", "--output_dir", str(again), "--resume_from_checkpoint",
          "latest"])  # fmt: skip
    two_to_one = _max_difference(_weights(again), _weights(reference))
    print(f"max |dw| against the uninterrupted run: 1 -> 2 {one_to_two:.2e}, 2 -> 1 {two_to_one:.2e}")
    assert one_to_two <= 1e-5 and two_to_one <= 1e-5


def test_a_memory_model_resumes_on_the_same_two_processes_to_the_uninterrupted_weights(tmp_path, corpus):
    """The most common resume: two processes (accelerate launch, as the README runs it) resume the memory model's
    checkpoint that two processes wrote (2 -> 2: each rank reads back its own carried memory) and end on the weights
    of the uninterrupted two-process run."""
    common = [*TINY_TXL, *data_args(corpus), "--per_device_train_batch_size", "1", "--checkpointing_steps", "2",
              "--logging_steps", "100", "--max_train_steps", "4"]  # fmt: skip
    reference = tmp_path / "reference"
    launch_two_processes("tf_family.recipes.causal_lm", [*common, "--output_dir", str(reference)])
    checkpoint = reference / "checkpoints" / "step_2"
    assert sorted(path.name for path in checkpoint.glob("memory_rank*.safetensors")) == [
        "memory_rank0.safetensors",
        "memory_rank1.safetensors",
    ]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(checkpoint, resumed / "checkpoints" / "step_2")
    launch_two_processes(
        "tf_family.recipes.causal_lm", [*common, "--output_dir", str(resumed), "--resume_from_checkpoint", "latest"]
    )
    assert json.loads((resumed / "checkpoints" / "step_4" / "trainer_state.json").read_text())["world_size"] == 2
    difference = _max_difference(_weights(resumed), _weights(reference))
    print(f"max |dw| of the 2 -> 2 resume against the uninterrupted run: {difference:.2e}")
    assert difference <= 1e-6


# -------------------------------------------------------------------------------- 3. two runs on one output folder
def test_a_second_run_on_the_same_output_folder_is_refused_and_the_first_finishes_intact(tmp_path, corpus):
    output = tmp_path / "run"
    args = [*TINY_TXL, *data_args(corpus), "--per_device_train_batch_size", "1", "--max_train_steps", "6",
            "--checkpointing_steps", "3", "--output_dir", str(output)]  # fmt: skip
    first = subprocess.Popen(
        [sys.executable, "-m", "tf_family.recipes.causal_lm", "--cpu", *args],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: (output / ".tf_family_run.lock").is_file() or first.poll() is not None, 120, "the lock")
        assert first.poll() is None, first.communicate()[1][-2000:]
        # even --overwrite_output_dir does not let a second run write there while the first runs
        with pytest.raises(ValueError, match=rf"in use by another run: process {first.pid} on "):
            _run([*args, "--overwrite_output_dir"])
        _, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, stderr[-3000:]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(output) is not None
    assert not (output / ".tf_family_run.lock").exists()  # released at the end of the run
    assert json.loads((output / "checkpoints" / "step_6" / "trainer_state.json").read_text())["completed_steps"] == 6


# ---------------------------------------------------------------------------------------------- 4. the disk fills
LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
sys.argv = sys.argv[1:]
{body}
"""


def _limited(body: str, limit: int, *args: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a Python process whose files may not grow past ``limit`` bytes (``RLIMIT_FSIZE``)."""
    script = textwrap.dedent(LIMITED).format(body=textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, "-c", script, str(limit), *args], env=ENV, capture_output=True, text=True, timeout=300
    )


def test_a_disk_full_during_a_checkpoint_keeps_the_previous_one(tmp_path, corpus):
    output = tmp_path / "run"
    args = [*TINY_TXL, *data_args(corpus), "--per_device_train_batch_size", "1", "--checkpointing_steps", "2",
            "--output_dir", str(output)]  # fmt: skip
    _run([*args, "--max_train_steps", "2"])
    before = {p.name: p.read_bytes() for p in (output / "checkpoints" / "step_2").iterdir()}
    limit = (output / "checkpoints" / "step_2" / "model.safetensors").stat().st_size // 2
    run = _limited(
        """
        from tf_family.recipes import causal_lm
        causal_lm.main(sys.argv[1:])
        """,
        limit, "--cpu", *args, "--max_train_steps", "4", "--resume_from_checkpoint", "latest",
    )  # fmt: skip
    assert run.returncode != 0
    assert "DiskFullError" in run.stderr and "the disk is full" in run.stderr, run.stderr[-3000:]
    assert f"the last complete checkpoint, {output / 'checkpoints' / 'step_2'}, is intact" in run.stderr
    assert sorted(p.name for p in (output / "checkpoints").iterdir()) == ["step_2"]  # nothing half-written left
    assert {p.name: p.read_bytes() for p in (output / "checkpoints" / "step_2").iterdir()} == before
    summary = _run([*args, "--max_train_steps", "3", "--resume_from_checkpoint", "latest"])  # it still resumes
    assert summary["train_steps"] == 3


def test_a_disk_full_during_a_datastore_build_keeps_the_previous_datastore(tmp_path):
    from tf_family import create_model
    from tf_family.retrieval.datastore import KNNDatastore, build_datastore

    torch.manual_seed(0)
    base = create_model("knn_lm", "causal_lm", "tiny").lm.eval()
    generator = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(1, 128, (2, 12), generator=generator)} for _ in range(3)]
    for batch in batches:
        batch["labels"] = torch.cat([batch["input_ids"][:, 1:], torch.full((2, 1), -100)], 1)
    folder = tmp_path / "datastore"
    build_datastore(base, batches, folder, shard_size=20, show_progress=False)
    torch.save({"base": base.state_dict(), "config": base.config.to_dict(), "batches": batches}, tmp_path / "in.pt")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    run = _limited(
        """
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from tf_family.retrieval.datastore import build_datastore
        saved = torch.load(sys.argv[1], weights_only=False)
        config = AutoConfig.for_model(**saved["config"])
        base = AutoModelForCausalLM.from_config(config)
        base.load_state_dict(saved["base"])
        build_datastore(base.eval(), saved["batches"] * 40, sys.argv[2], shard_size=10_000, show_progress=False)
        """,
        4096, str(tmp_path / "in.pt"), str(folder),
    )  # fmt: skip
    assert run.returncode != 0
    assert "DiskFullError" in run.stderr and f"{folder} is unchanged" in run.stderr, run.stderr[-3000:]
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left behind
    assert KNNDatastore.load(folder, model=base).size == 3 * 2 * 11  # every scored token of the first build
