"""Packaging glue that pyproject.toml cannot express: the top-level ``recipes/`` and ``model_cards/`` folders are
installed inside the package as ``tf_family.recipes`` and ``tf_family.model_cards``, so that
``accelerate launch -m tf_family.recipes.causal_lm`` and ``tf-family train`` run the same code from a checkout and
from an installed wheel."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["tf_family", "tf_family.*"]), "tf_family.recipes", "tf_family.model_cards"],
    package_dir={"tf_family.recipes": "recipes", "tf_family.model_cards": "model_cards"},
)
