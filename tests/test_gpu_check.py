"""`bench/gpu_check.sh`, the GPU check: its syntax, and its ``--dry-run`` on CPU at tiny sizes (the same sections,
workers, guards and reports as on a GPU)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tf_family.registry import ARCHITECTURES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


@pytest.mark.slow
def test_dry_run_writes_every_section(tmp_path):
    env = {
        **os.environ,
        "PYTHON": sys.executable,  # this environment's interpreter (a GPU machine's is python3)
        "GPU_CHECK_SKIP_WHEELS": "1",  # transformers 5.24 is installed here; .whl/ is for the GPU machine
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    out = tmp_path / "gpu"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--out", str(out), "--budget", "300"],
        cwd=tmp_path,  # the script finds the repository itself
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    payload = json.loads((out / "gpu_check.json").read_text())
    assert payload["dry_run"] and payload["environment"]["device"] == "cpu (dry run)"
    records = payload["records"]
    smoke = {(r["arch"], r["dtype"]): r for r in records if r["section"] == "smoke" and "impl" not in r}
    for name in ARCHITECTURES:  # every architecture, forward + backward, float32 and bf16
        for dtype in ("fp32", "bf16"):
            assert smoke[(name, dtype)]["ok"], smoke[(name, dtype)]
    flex = {r["arch"]: r for r in records if r.get("impl") == "flex_vs_default"}
    assert set(flex) == {"longformer", "big_bird", "reformer"} and all(r["ok"] for r in flex.values()), flex
    fsdp = [r for r in records if r["section"] == "fsdp"]
    assert fsdp and any(r["ok"] for r in fsdp)
    timed = {(r["arch"], r["impl"]) for r in records if r["section"] == "time" and r["ok"]}
    for arch in ("longformer", "big_bird", "reformer"):
        assert {(arch, "tf_family_sdpa"), (arch, "tf_family_flex")} <= timed
    assert ("dense", "dense_sdpa_bert") in timed
    markdown = (out / "gpu_check.md").read_text()
    assert "## Training step" in markdown and "| bf16 | 256 | longformer |" in markdown
