"""Marked copies (``# Copied from tf_family.<module>.<object> [with A->B, C->D]``) stay identical to their source.

STYLE.md: a model folder never imports another model folder; a module one model needs from another is copied
and marked, and this test fails as soon as the copy and its source drift apart.
"""

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "tf_family"
MARKER = re.compile(r"^\s*# Copied from (tf_family\.[\w.]+)(?: with (.+))?$")


def marked_copies():
    # recipes may mark copies of tf_family code too (a recipe's loop stays visible, and in step)
    for path in sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "recipes").rglob("*.py")]):
        lines = path.read_text().splitlines()
        nodes = {
            (node.decorator_list[0].lineno if node.decorator_list else node.lineno): node
            for node in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(node, ast.FunctionDef | ast.ClassDef)
        }
        for number, line in enumerate(lines, start=1):
            match = MARKER.match(line)
            if match:
                yield pytest.param(path, number, match, nodes.get(number + 1), id=f"{path.name}:{number}")


def resolve(dotted: str):
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:]:
            target = getattr(target, name)
        return target.fget if isinstance(target, property) else target  # a property: its getter's source
    raise ImportError(dotted)


COPIES = list(marked_copies())


def test_there_are_marked_copies():
    # the Transformer-XL family shares its code (tf_family.layers.xl_scaffold, xl_config) instead of marked copies
    assert len(COPIES) >= 1


@pytest.mark.parametrize(("path", "number", "match", "node"), COPIES)
def test_marked_copy_is_identical(path, number, match, node):
    assert node is not None, f"{path}:{number}: a '# Copied from' marker must sit right above a def or class"
    source = textwrap.dedent(inspect.getsource(resolve(match.group(1))))
    for replacement in (match.group(2) or "").split(","):
        if replacement.strip():
            old, new = (part.strip() for part in replacement.split("->"))
            source = source.replace(old, new)
    lines = path.read_text().splitlines()[node.lineno - 1 - len(node.decorator_list) : node.end_lineno]
    copy = textwrap.dedent("\n".join(lines) + "\n")
    assert copy == source, f"{path}:{number} drifted from {match.group(1)}; re-copy it or drop the marker"


def imported_modules(path: Path, package: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            yield ".".join([*base, *([node.module] if node.module else [])])


MODEL_FOLDERS = sorted(p for p in (PACKAGE / "models").iterdir() if p.is_dir() and not p.name.startswith("_"))


@pytest.mark.parametrize("folder", MODEL_FOLDERS, ids=lambda folder: folder.name)
def test_model_folders_import_no_other_model_folder(folder):
    package = f"tf_family.models.{folder.name}"
    for path in folder.glob("*.py"):
        for module in imported_modules(path, package):
            if module.startswith("tf_family.models."):
                assert module.startswith(package), f"{path.name} imports {module}: copy and mark instead"


def test_import_check_sees_relative_imports(tmp_path):
    path = tmp_path / "modeling_x.py"
    path.write_text("from ..transfo_xl.modeling_transfo_xl import A\nfrom ...memory import B\nfrom . import c\n")
    assert list(imported_modules(path, "tf_family.models.x")) == [
        "tf_family.models.transfo_xl.modeling_transfo_xl",
        "tf_family.memory",
        "tf_family.models.x",
    ]
