"""mkdocs hook: the command-line reference (docs/cli.md) shows the ``--help`` of every ``tf-family`` command and
recipe as the installed code prints it, so the page cannot drift from the parsers. A line ``<!-- help: NAME -->`` in a
page is replaced by the help of NAME: ``tf-family``, ``tf-family <command>``, or a recipe module
(``recipes/causal_lm.py``)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re

MARKER = re.compile(r"^<!-- help: (?P<name>[^>]+?) -->$", re.M)


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    raise ValueError(f"tf-family has no command {command!r} (docs/cli.md names it)")


def help_text(name: str) -> str:
    """The ``--help`` output of ``name`` (see the module docstring)."""
    os.environ["COLUMNS"] = "110"  # argparse wraps to the terminal width: a fixed one for the page
    from tf_family import cli

    if name == "tf-family train":
        from tf_family.recipes import causal_lm

        return causal_lm.build_parser("tf-family train", cli.train_defaults([])).format_help()
    if name == "tf-family compare":  # it parses its own options, as train does
        from tf_family.compare import build_parser

        return build_parser().format_help()
    if name == "tf-family":
        return cli.build_parser().format_help()
    if name.startswith("tf-family "):
        return _subparser(cli.build_parser(), name.split()[1]).format_help()
    script, *command = name.split()  # a recipe, with its sub-command if it has them (recipes/knn_lm.py build)
    module = importlib.import_module(f"tf_family.recipes.{script.removeprefix('recipes/').removesuffix('.py')}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        module.parse_args([*command, "--help"])
    return printed.getvalue().replace("usage: mkdocs", f"usage: {script}")


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        text = help_text(match["name"]).replace(os.getcwd() + os.sep, "")
        text = re.sub(r"runs/transfo_xl-\d{8}-\d{6}(-\d+)?", "runs/transfo_xl-<time>", text)
        return f"```text\n{text.rstrip()}\n```"

    return MARKER.sub(replace, markdown)
