"""`bench/sparse_vs_dense_4k_seeds.py`: seed 1's two parts merge into one table, the two-seed table holds the means,
the per-seed figures and each against dense, and parts of different configurations are refused."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARGS = {"steps": 100, "length": 4096, "batch": 1, "width": 64, "layers": 2, "heads": 4, "stride": 64, "summary": 8}
ARGS.update(lr=0.003, eval_windows=4, threads=1)


def _script():
    spec = importlib.util.spec_from_file_location(
        "sparse_vs_dense_4k_seeds", ROOT / "bench" / "sparse_vs_dense_4k_seeds.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(bits: dict, first_seed: int, **args) -> dict:
    return {
        "command": f"python bench/bench_sparse_vs_dense_4k.py --first_seed {first_seed}",
        "date": "2026-11-29T00:00:00+00:00",
        "machine": {"loadavg": [1.0, 1.0, 1.0]},
        "environment": {"TF_FAMILY_NATIVE": "0"},
        "args": {**ARGS, "first_seed": first_seed, **args},
        "quality": {v: {"bits_per_byte": b, "train_seconds": 1.0, "parameters": 10} for v, b in bits.items()},
    }


def _write(folder: Path, seed1_dense_args: dict | None = None) -> None:
    files = {
        "sparse_vs_dense_4k": _record({"dense": 4.0, "strided": 4.2, "fixed": 3.9}, 0),
        "sparse_vs_dense_4k_seed1": _record({"strided": 3.7, "fixed": 3.8}, 1),
        "sparse_vs_dense_4k_seed1_dense": _record({"dense": 3.6}, 1, **(seed1_dense_args or {})),
    }
    for name, record in files.items():
        (folder / f"{name}.json").write_text(json.dumps(record))


def test_merge_and_two_seed_table(tmp_path):
    _write(tmp_path)
    script = _script()
    script.main(["--results", str(tmp_path)])
    script.main(["--results", str(tmp_path)])  # a second run reads the merged file and writes the same
    seed1 = json.loads((tmp_path / "sparse_vs_dense_4k_seed1.json").read_text())
    assert {v: r["bits_per_byte"] for v, r in seed1["quality"].items()} == {"dense": 3.6, "strided": 3.7, "fixed": 3.8}
    assert set(seed1["parts"]) == {"strided, fixed", "dense"}
    both = json.loads((tmp_path / "sparse_vs_dense_4k_2seeds.json").read_text())
    assert both["bits_per_byte"]["strided"] == [4.2, 3.7]
    assert both["mean_bits_per_byte"]["dense"] == pytest.approx(3.8)
    assert both["vs_dense_percent_of_means"]["fixed"] == pytest.approx(100 * (3.85 / 3.8 - 1))
    assert both["vs_dense_percent_per_seed"]["strided"] == pytest.approx([5.0, 100 * (3.7 / 3.6 - 1)])
    table = (tmp_path / "sparse_vs_dense_4k_2seeds.md").read_text()
    assert "| fixed | 10 | 3.8500 | 3.9000, 3.8000 | +1.32 % | -2.50 %, +5.56 % |" in table


def test_parts_of_different_configurations_are_refused(tmp_path):
    _write(tmp_path, {"steps": 50})
    with pytest.raises(ValueError, match="steps=50"):
        _script().main(["--results", str(tmp_path)])


def test_a_missing_dense_part_says_how_to_run_it(tmp_path):
    _write(tmp_path)
    (tmp_path / "sparse_vs_dense_4k_seed1_dense.json").unlink()
    with pytest.raises(FileNotFoundError, match="--variants dense"):
        _script().main(["--results", str(tmp_path)])


def test_later_seeds_join_the_table(tmp_path):
    _write(tmp_path)
    bits = {"dense/seed2": 3.5, "strided/seed2": 3.6, "fixed/seed2": 3.4}
    bits.update({"dense/seed3": 3.7, "strided/seed3": 3.8, "fixed/seed3": 3.6})
    later = _record(bits, 2, seeds=2)
    (tmp_path / "later.json").write_text(json.dumps(later))
    _script().main(["--results", str(tmp_path), "--later", "later"])
    table = json.loads((tmp_path / "sparse_vs_dense_4k_4seeds.json").read_text())
    assert table["seeds"] == [0, 1, 2, 3]
    assert table["bits_per_byte"]["strided"] == [4.2, 3.7, 3.6, 3.8]
    assert table["mean_bits_per_byte"]["dense"] == pytest.approx((4.0 + 3.6 + 3.5 + 3.7) / 4)
    assert table["vs_dense_percent_per_seed"]["fixed"][3] == pytest.approx(100 * (3.6 / 3.7 - 1))
    markdown = (tmp_path / "sparse_vs_dense_4k_4seeds.md").read_text()
    assert "| dense | 10 | 3.7000 | 4.0000, 3.6000, 3.5000, 3.7000 | +0.00 % |" in markdown


def test_later_seeds_without_a_variant_are_refused(tmp_path):
    _write(tmp_path)
    later = _record({"dense/seed2": 3.5, "strided/seed2": 3.6, "dense/seed3": 3.7, "strided/seed3": 3.8}, 2, seeds=2)
    (tmp_path / "later.json").write_text(json.dumps(later))
    with pytest.raises(ValueError, match="fixed/seed2"):
        _script().main(["--results", str(tmp_path), "--later", "later"])
