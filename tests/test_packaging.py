"""What a built wheel holds: every bundled data file, the recipes and the card templates (as tf_family.*)."""

import fnmatch
import tomllib
from pathlib import Path

import tf_family

ROOT = Path(__file__).resolve().parents[1]


def test_every_bundled_data_file_is_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data_dir = ROOT / "tf_family" / "data"
    files = [p for p in data_dir.glob("*/**/*") if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
    assert files
    for path in files:
        relative = path.relative_to(data_dir).as_posix()
        assert any(fnmatch.fnmatch(relative, pattern) and relative.count("/") == pattern.count("/")
                   for pattern in patterns["tf_family.data"]), f"{relative} would be missing from the wheel"  # fmt: skip


def test_recipes_and_cards_are_importable_from_the_package():
    from tf_family import model_cards, recipes
    from tf_family.recipes import causal_lm

    assert Path(recipes.__file__).parent.name == "recipes" and callable(causal_lm.main)
    assert (Path(model_cards.__file__).parent / "transfo_xl.md").is_file()
    assert tf_family.__version__
