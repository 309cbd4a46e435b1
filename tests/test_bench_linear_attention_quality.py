"""`bench/bench_linear_attention_quality.py`: its ``--quick`` run (tiny model, a few steps, seconds) trains every model
on the same batches and scores each on the same held-out windows."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run_scores_every_model(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TF_FAMILY_NATIVE": "0"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_linear_attention_quality.py"), "--quick", "--out", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "linear_attention_quality_quick.json").read_text())
    assert "--quick" in record["command"] and record["machine"]["torch"]
    runs = record["runs"]
    assert list(runs) == [
        "dense GPT-2 (SDPA)", "Performer (FAVOR+, causal)", "Linear Transformer (elu)", "RFA-Gate", "RFA (ungated)",
    ]  # fmt: skip
    for run in runs.values():
        assert len(run["step_times_s"]) == record["args"]["steps"]
        # a few steps from a uniform start: below 8 bits (uniform over 256 bytes), finite
        assert 0 < run["bits_per_byte"] < 8 and math.isclose(run["perplexity_per_byte"], 2 ** run["bits_per_byte"])
    # same size: the kernelised models differ from the dense one by a few vectors (RFA-Gate: its gate)
    dense = runs["dense GPT-2 (SDPA)"]["parameters"]
    assert all(abs(run["parameters"] - dense) / dense < 0.02 for run in runs.values())
    assert "perplexity" in (tmp_path / "linear_attention_quality_quick.md").read_text()
