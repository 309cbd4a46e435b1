"""Packaging glue that pyproject.toml cannot express: the top-level ``recipes/`` and ``model_cards/`` folders are
installed inside the package as ``tf_family.recipes`` and ``tf_family.model_cards``, so that
``accelerate launch -m tf_family.recipes.causal_lm`` and ``tf-family train`` run the same code from a checkout and
from an installed wheel."""

from setuptools import find_namespace_packages, setup

# every folder below tf_family/ is declared, data-only ones too (the bundled corpora, the kernel's C++ source):
# setuptools otherwise warns that each "would be ignored" (and pip shows it many times over)
PACKAGES = find_namespace_packages(include=["tf_family", "tf_family.*"], exclude=["*.__pycache__"])

setup(
    packages=[*PACKAGES, "tf_family.recipes", "tf_family.model_cards"],
    package_dir={"tf_family.recipes": "recipes", "tf_family.model_cards": "model_cards"},
)
