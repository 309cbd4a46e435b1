"""`tf_family._compat`: every module that moved into a package still imports under its old path, as the very module
it moved to (one module object, so monkeypatching either path reaches both), and tf_family's own code uses the new
paths only."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tf_family._compat import MOVED

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "tf_family" / "_compat"


def test_every_alias_file_is_listed_and_every_listed_name_has_its_file():
    assert {path.stem for path in COMPAT.glob("*.py")} - {"__init__"} == set(MOVED)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_path_is_the_moved_module(old):
    module = importlib.import_module(f"tf_family.{old}")
    assert module is importlib.import_module(MOVED[old])
    assert module.__name__ == MOVED[old]


def test_from_imports_and_attributes_of_old_paths_work_in_a_fresh_interpreter():
    code = (
        "from tf_family.validation import check_tensor\n"
        "from tf_family.modeling_heads import GenericForSequenceClassification\n"
        "import tf_family.fused_lm_head as old, tf_family.modeling.fused_lm_head as new\n"
        "import tf_family\n"
        "assert old is new and tf_family.cards is tf_family.shipping.cards\n"
        "assert check_tensor.__module__ == 'tf_family.modeling.validation'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _imported_modules(path: Path) -> set[str]:
    """The absolute module names ``path``'s ``import`` / ``from ... import`` statements name (relative ones resolved
    for files under tf_family/), with ``from package import module`` counted as ``package.module``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = list(parts[:-1])  # a module's package; an __init__'s is its own folder too
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def test_tf_family_code_imports_no_old_path():
    old_paths = {f"tf_family.{old}" for old in MOVED}
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for folder in ("tf_family", "recipes", "tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if COMPAT not in path.parents and path != Path(__file__).resolve()
        for name in sorted(_imported_modules(path) & old_paths)
    ]
    assert offenders == []


def test_the_remote_code_export_follows_an_old_path_to_the_moved_module():
    from tf_family.shipping.remote_code import _current

    for old, new in MOVED.items():
        assert _current(f"tf_family.{old}") == new
        assert _current(f"tf_family.{old}.name") == f"{new}.name"
    assert _current("tf_family.attention.backend") == "tf_family.attention.backend"
