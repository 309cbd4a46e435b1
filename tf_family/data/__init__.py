"""Bundled real data and the loaders the recipes use."""

from .brown import BROWN_CORPUS_FILE, BROWN_GENRES, load_brown

__all__ = ["BROWN_CORPUS_FILE", "BROWN_GENRES", "load_brown"]
