"""`tf-family compare` (also ``python -m tf_family.compare``): the family side by side on one corpus, against dense
baselines. The script is `tf_family.compare.grid`; the contestants `models`; the measurements `measures` and `cost`;
the ListOps generator `listops`; the tables, plots and HTML `report`."""

from .grid import build_parser, main

__all__ = ["build_parser", "main"]
