import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from tf_family.data import SOTU_TOKENIZER_DIR, load_sotu


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """Short real documents (openings of SOTU addresses) as local JSON-lines train / validation files."""
    sotu = load_sotu()
    folder = tmp_path_factory.mktemp("corpus")
    for split, source, count in (("train", sotu["train"], 8), ("validation", sotu["validation"], 2)):
        rows = [{"text": row["text"][:1200], "year": row["year"]} for row in source.select(range(count))]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"train": str(folder / "train.jsonl"), "validation": str(folder / "validation.jsonl")}


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    """A plain transformers GPT-2 (no memory, absolute positions up to 64) with the bundled tokenizer."""
    folder = tmp_path_factory.mktemp("gpt2")
    config = GPT2Config(
        vocab_size=8192,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_positions=64,
        eos_token_id=0,
        bos_token_id=0,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
    )
    GPT2LMHeadModel(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(SOTU_TOKENIZER_DIR).save_pretrained(folder)
    return str(folder)


def data_args(corpus) -> list[str]:
    return ["--train_file", corpus["train"], "--validation_file", corpus["validation"]]


TINY_TXL = ["--arch", "transfo_xl", "--variant", "tiny", "--config_overrides", "dropout=0.1", "--block_size", "16"]


def run_killed_in_step_5(monkeypatch, recipe_args: list[str], output_dir: Path) -> None:
    """Run `causal_lm` with ``recipe_args`` into ``output_dir`` and kill it (a RuntimeError) at the 9th micro-batch's
    loss: step 5 with gradient accumulation 2, step 9 without; the checkpoints written before stay."""
    from tf_family.recipes import causal_lm

    calls = {"n": 0}
    real_loss = causal_lm.next_token_loss

    def dies_in_step_5(*a, **k):
        calls["n"] += 1
        if calls["n"] == 9:
            raise RuntimeError("killed")
        return real_loss(*a, **k)

    monkeypatch.setattr(causal_lm, "next_token_loss", dies_in_step_5)
    with pytest.raises(RuntimeError, match="killed"):
        causal_lm.main([*recipe_args, "--output_dir", str(output_dir)])
    monkeypatch.setattr(causal_lm, "next_token_loss", real_loss)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Each recipe run in this process starts from a fresh accelerate state (it is a process-wide singleton, and a
    second `Accelerator` with another mixed precision would be refused)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _kill_ranks(recipe_args: list[str]) -> None:
    """SIGKILL every process whose command line holds this run's --output_dir (a hung rank keeps the pipes open)."""
    marker = recipe_args[recipe_args.index("--output_dir") + 1].encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue


def launch_two_processes(module: str, recipe_args: list[str], timeout: float = 300) -> None:
    """Run ``python -m module`` on two gloo CPU processes the way the README says, and fail with the run's stderr.

    `accelerate launch --cpu --num_processes 2` silently starts one process (accelerate 1.15); the shipped config
    (distributed_type MULTI_GPU, 2 processes) with the recipe's --cpu starts two. The rendezvous port is a free one
    picked here (port 0 let two ranks wait for each other forever), and the launcher runs in its own process group,
    so a hang kills the launcher and both ranks together instead of orphaning a rank.
    """
    config = Path(__file__).resolve().parents[2] / "recipes" / "accelerate_configs" / "two_cpu_processes.yaml"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
        "--main_process_port", str(_free_port()), "-m", module, "--cpu", *recipe_args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    launcher = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        _kill_ranks(recipe_args)  # the ranks run in sessions of their own: find them by their command line
        _, stderr = launcher.communicate()
        pytest.fail(f"two-process run of {module} did not finish in {timeout} s: {stderr[-3000:]}")
    assert launcher.returncode == 0, stderr[-3000:]
