"""`tf-family compare` (also ``python -m tf_family.compare``): the family side by side on one corpus, against dense
baselines. The command line is `tf_family.compare.cli` (settings in `presets`); the grid of cells `grid`; who takes
part `family` (read from the registry) and the dense baselines `models`; training `training`; the measurements
`measures` and `cost`; the data `data`, with the Long Range Arena's tasks in `lra` (ListOps in `listops`); the
tables, plots and HTML `report` (its page a jinja2 template under ``templates/``)."""

from .cli import build_parser, main

__all__ = ["build_parser", "main"]
