"""mkdocs hooks: the pages that list commands or architectures are generated from the code, so they cannot drift.

- The command-line reference (docs/cli.md) shows the ``--help`` of every ``tf-family`` command and recipe as the
  installed code prints it: a line ``<!-- help: NAME -->`` in a page is replaced by the help of NAME:
  ``tf-family``, ``tf-family <command>``, or a recipe module (``recipes/causal_lm.py``).
- The registry (`tf_family.registry.ARCHITECTURES`) drives the rest: the nav's Architectures section lists
  ``architectures/<name>.md`` for every architecture, in registry order (`architecture_nav`); ``<!-- zoo -->`` is
  replaced by the zoo table (`tf_family.cli.zoo_table`); ``<!-- architectures -->`` by the table of architectures,
  each row from its page's front matter (``changes:`` and ``use_when:``); ``<!-- model-reference -->`` by every
  architecture's config and model classes (their docstrings, through mkdocstrings).

A new architecture therefore needs its own page (``docs/architectures/<name>.md``, with that front matter) and no
edit to mkdocs.yml or to any shared page (docs/guides/adding-an-architecture.md).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
from pathlib import Path

from mkdocs.utils.meta import get_data

MARKER = re.compile(r"^<!-- help: (?P<name>[^>]+?) -->$", re.M)
ARCHITECTURES_SECTION = "Architectures"
DOCS = Path(__file__).resolve().parent / "docs"


def architecture_nav(nav: list) -> list:
    """``nav`` (mkdocs.yml's) with ``architectures/<name>.md`` appended to its Architectures section for every
    architecture of the registry that the section does not name yet, in registry order."""
    from tf_family.registry import ARCHITECTURES

    for entry in nav:
        if isinstance(entry, dict) and ARCHITECTURES_SECTION in entry:
            section = entry[ARCHITECTURES_SECTION]
            named = {next(iter(item.values())) if isinstance(item, dict) else item for item in section}
            section.extend(page for name in ARCHITECTURES if (page := f"architectures/{name}.md") not in named)
            return nav
    raise ValueError(f"mkdocs.yml's nav has no {ARCHITECTURES_SECTION!r} section to list the architectures in.")


def page_meta(name: str) -> dict:
    """The front matter of ``docs/architectures/<name>.md``; a missing page or key is an error naming the fix."""
    path = DOCS / "architectures" / f"{name}.md"
    if not path.is_file():
        raise ValueError(f"architecture {name!r} has no page: write {path.relative_to(DOCS.parent)}.")
    _, meta = get_data(path.read_text())
    missing = [key for key in ("changes", "use_when") if not meta.get(key)]
    if missing:
        raise ValueError(f"{path.relative_to(DOCS.parent)} lacks {missing} in its front matter (see its neighbours).")
    return meta


def architecture_table() -> str:
    """The Markdown table of docs/architectures/index.md: link, what it changes, when to reach for it."""
    from tf_family.registry import ARCHITECTURES

    rows = ["| architecture | what it changes | reach for it when |", "| --- | --- | --- |"]
    for name in ARCHITECTURES:
        meta = page_meta(name)
        title = _page_title(name)
        rows.append(f"| [{title}]({name}.md) | {meta['changes']} | {meta['use_when']} |")
    return "\n".join(rows)


def _page_title(name: str) -> str:
    markdown, _ = get_data((DOCS / "architectures" / f"{name}.md").read_text())
    return next(line[2:].strip() for line in markdown.splitlines() if line.startswith("# "))


def model_reference() -> str:
    """Every architecture's config and model classes as mkdocstrings blocks, a section per architecture."""
    from tf_family.registry import ARCHITECTURES

    blocks = []
    for spec in ARCHITECTURES.values():
        blocks.append(f"## {spec.title}")
        references = [spec.config, *dict.fromkeys(spec.models.values())]
        for position, reference in enumerate(references):
            members = "false" if position == 0 else "[forward]"
            path = reference.replace(":", ".")
            blocks.append(f"::: {path}\n    options:\n      members: {members}\n      heading_level: 3")
    return "\n\n".join(blocks)


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

    markdown = MARKER.sub(replace, markdown)
    generated = {"zoo": _zoo_table, "architectures": architecture_table, "model-reference": model_reference}
    for name, make in generated.items():
        marker = f"<!-- {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def _zoo_table() -> str:
    from tf_family.cli import zoo_table

    return zoo_table()


def on_config(config):
    config["nav"] = architecture_nav(config["nav"])
    return config
