"""`tf_family.allocator`: freed memory is kept (fewer page faults when a large block is freed and allocated again),
with the opt-out honoured. Each check runs in a fresh interpreter (mallopt settings last for the process)."""

import json
import os
import subprocess
import sys

import pytest

from tf_family.allocator import ENV_VAR

_CODE = """
import json, resource
from tf_family.allocator import describe, keep_freed_memory
kept = keep_freed_memory()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):  # a 64 MiB block freed and allocated again, as a training step's activations are
    block = bytearray(64 * 2**20)
    del block
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"kept": kept, "faults": faults, "allocator": describe()}))
"""


def _run(**env: str) -> dict:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    environment.pop("LD_PRELOAD", None)
    environment.pop(ENV_VAR, None)
    result = subprocess.run(
        [sys.executable, "-c", _CODE], env={**environment, **env}, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_memory_is_kept_and_the_opt_out_is_honoured():
    kept, default = _run(), _run(**{ENV_VAR: "0"})
    assert kept["kept"] and kept["allocator"].startswith("glibc malloc, freed memory kept")
    assert not default["kept"] and ENV_VAR in default["allocator"]
    # glibc's defaults map and unmap the block each time: ~16k faults per allocation; kept, only the first faults
    assert default["faults"] > 10 * 16_000
    assert kept["faults"] < 3 * 16_000


def test_user_malloc_settings_are_left_alone():
    report = _run(MALLOC_TRIM_THRESHOLD_="1000000")
    assert not report["kept"] and "MALLOC_TRIM_THRESHOLD_=1000000" in report["allocator"]
