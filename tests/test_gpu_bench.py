"""`bench/gpu_bench.py`, the GPU benchmark at real sizes: its ``--dry-run`` on CPU at tiny sizes runs every kernel
and model cell and writes its records as it goes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_writes_every_cell(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TF_FAMILY_NATIVE": "0"}
    out = tmp_path / "gpu"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_bench.py"), "--dry-run", "--out", str(out), "--budget", "600"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [json.loads(line) for line in (out / "gpu_bench.jsonl").read_text().splitlines()]
    environment, records = lines[0]["environment"], lines[1:]
    assert environment["dry_run"] and "--dry-run" in environment["command"]
    cells = {(record["level"], record["cell"]) for record in records}
    kernels = {"dense_sdpa", "window_sdpa", "window_flex", "big_bird_sdpa", "big_bird_flex", "lsh_chunks"}
    assert {("kernels", name) for name in kernels} <= cells
    ours = {"longformer sdpa", "longformer flex_attention", "big_bird sdpa", "big_bird flex_attention"}
    ours |= {"reformer sdpa", "reformer flex_attention", "floor (identity attention)", "dense BERT sdpa"}
    assert {("models", name) for name in ours} <= cells
    for record in records:
        if not record.get("peer"):
            assert record["ok"], record
            assert record["median_ms"] > 0 and record["tokens_per_s"] > 0
    assert all(record["mask_ms"] > 0 for record in records if record["cell"].endswith("_flex"))
    table = (out / "gpu_bench.md").read_text()
    assert table.count("\n| ") == len(records) + 1  # header + one row per record
