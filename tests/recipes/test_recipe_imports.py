"""No recipe imports another recipe: they share machinery through `tf_family.training` (DESIGN §1, §5)."""

import ast
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
RECIPE_MODULES = {path.stem for path in RECIPES.glob("*.py") if path.stem != "__init__"}
PACKAGES = ("tf_family.recipes", "recipes")


def recipe_imports(source: str) -> list[str]:
    """The recipe modules a module's source imports, in any of the forms ``import tf_family.recipes.X``,
    ``import recipes.X``, ``from tf_family.recipes(.X) import …``, ``from recipes(.X) import …``,
    ``from .X import …`` and ``from . import X`` (at any depth in the module, e.g. inside a function)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                for package in PACKAGES:
                    if alias.name.startswith(f"{package}."):
                        found.append(alias.name.removeprefix(f"{package}.").split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from . import X, from .X import y, from ..recipes import X
                parts = module.split(".") if module else []
                if node.level > 1 and parts[:1] == ["recipes"]:
                    parts = parts[1:]
                found.extend([parts[0]] if parts else [alias.name for alias in node.names])
                continue
            for package in PACKAGES:
                if module == package:
                    found.extend(alias.name for alias in node.names)
                elif module.startswith(f"{package}."):
                    found.append(module.removeprefix(f"{package}.").split(".")[0])
    return [name for name in found if name in RECIPE_MODULES or name == "*"]


@pytest.mark.parametrize(
    "source",
    [
        "from tf_family.recipes.causal_lm import make_accelerator",
        "from tf_family.recipes import masked_lm as other",
        "import tf_family.recipes.causal_lm",
        "import recipes.causal_lm as lm",
        "from recipes.causal_lm import main",
        "from recipes import causal_lm",
        "from .causal_lm import main",
        "from . import causal_lm",
        "from . import *",
        "def f():\n    from tf_family.recipes import causal_lm",
    ],
)
def test_the_check_sees_every_form_of_import(source):
    assert recipe_imports(source), source


def test_the_check_lets_the_library_through():
    assert not recipe_imports("from tf_family.training import save_run\nfrom tf_family import recipes\nimport os")


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.py")), ids=lambda path: path.name)
def test_no_recipe_imports_another_recipe(path):
    imported = recipe_imports(path.read_text())
    assert not imported, f"{path.name} imports the recipe(s) {imported}; share code through tf_family.training"
