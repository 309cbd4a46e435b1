"""`bench/bench_linear_attention.py`: its ``--dry-run`` (tiny sizes, CPU, seconds) fills every table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_fills_every_table(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TF_FAMILY_NATIVE": "0"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_linear_attention.py"), "--dry-run", "--out", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "linear_attention_dry_run.json").read_text())
    assert "--dry-run" in record["command"] and record["machine"]["torch"]
    assert [cell["length"] for cell in record["scaling"]] == [64, 128]
    for cell in record["scaling"]:
        assert set(cell["step"]) == {"Performer (favor)", "Linear Transformer (elu)", "RFA", "dense Llama, SDPA"}
        assert all(step["median_s"] > 0 for step in cell["step"].values())
        assert all(size > 0 for size in cell["saved_bytes"].values())
    # the recurrent state does not grow with the prompt; the dense KV cache does
    short, long = record["cache"]
    for name in ("Performer (favor)", "Linear Transformer (elu)", "RFA"):
        assert short[name] == long[name] > 0
    assert long["dense Llama, SDPA"] == 4 * short["dense Llama, SDPA"]
    if not record["not_measured"]:  # the PyPI references are installed
        assert len(record["references"][0]["step"]) == 4
    assert (tmp_path / "linear_attention_dry_run.md").read_text().count("## ") == 3
