"""What a built wheel holds: every bundled data file, the recipes and the card templates (as tf_family.*)."""

import fnmatch
import tomllib
from pathlib import Path

from setuptools import find_namespace_packages

import tf_family

ROOT = Path(__file__).resolve().parents[1]


def test_every_bundled_data_file_is_package_data():
    # setuptools ships a package's files matching its package-data patterns; every folder must be a declared package
    # (one that is not makes setuptools warn "Package would be ignored", and its files may be left out)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    packages = set(
        find_namespace_packages(where=str(ROOT), include=["tf_family", "tf_family.*"], exclude=["*.__pycache__"])
    )
    files = [p for p in (ROOT / "tf_family").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")]
    files = [p for p in files if "__pycache__" not in p.parts]
    assert len(files) >= 5
    for path in files:
        package = ".".join(path.parent.relative_to(ROOT).parts)
        assert package in packages, f"{package} is not a declared package: setuptools would warn and may skip it"
        assert any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns), (
            f"{path} would be missing from the wheel"
        )


def test_setup_declares_every_folder_below_tf_family():
    source = (ROOT / "setup.py").read_text()
    assert "find_namespace_packages" in source and "find_packages(" not in source


def test_recipes_and_cards_are_importable_from_the_package():
    from tf_family import model_cards, recipes
    from tf_family.recipes import causal_lm

    assert Path(recipes.__file__).parent.name == "recipes" and callable(causal_lm.main)
    assert (Path(model_cards.__file__).parent / "transfo_xl.md").is_file()
    assert tf_family.__version__
