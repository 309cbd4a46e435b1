"""The README's commands work as written: every fenced Python snippet of README.md, recipes/README.md and the
documentation pages in `DOCS_PAGES` runs, and every command line of their fenced shell blocks is accepted by the
parser that will read it (the recipe's ``parse_args``, the ``tf-family`` parser, accelerate's and torchrun's
launchers), the files it names that ship with tf_family exist, and every ``pip install`` extra it names is
declared.

Shrunk or skipped, and why:
- the first README snippet loads ``"path/or/hub-id"`` and a transformers 4.x folder: placeholders for the reader's
  own folders, so the test puts a tiny saved tf_family model and the committed 4.x fixture in their place;
- no command is run: each would train (minutes to hours) or install packages; their parsing is what is checked.
  ``...`` / ``…`` in a command stand for "more options" and are dropped.
"""

from __future__ import annotations

import importlib
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the documentation pages that repeat or extend the README's snippets and commands are held to the same rule
DOCS_PAGES = [
    "index",
    "getting-started",
    "guides/recipes",
    "guides/trainer",
    "guides/data",
    "guides/loading-without-tf-family",
]
DOCS = [ROOT / "README.md", ROOT / "recipes" / "README.md", *(ROOT / "docs" / f"{page}.md" for page in DOCS_PAGES)]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
LEGACY_FOLDER = ROOT / "tests" / "fixtures" / "transfo_xl_4x" / "plain_softmax_safetensors"


def fenced_blocks(language: str) -> list[tuple[str, str]]:
    """(document name, dedented body) of every fenced block in ``language`` in the two READMEs."""
    blocks = []
    for doc in DOCS:
        for match in FENCE.finditer(doc.read_text(encoding="utf-8")):
            if match["lang"] == language:
                blocks.append((f"{doc.relative_to(ROOT)}", textwrap.dedent(match["body"])))
    return blocks


# a full command quoted inline: `tf-family train ...`, or `accelerate launch ...` of a recipe
INLINE_COMMAND = re.compile(r"`(tf-family train[^`]*|accelerate launch [^`]*recipes[^`]*)`")


def command_lines() -> list[str]:
    """The command lines of the fenced shell blocks, and the full commands quoted inline in the text."""
    lines = [m[1].replace("\n", " ") for doc in DOCS for m in INLINE_COMMAND.finditer(doc.read_text(encoding="utf-8"))]
    for _, body in fenced_blocks("bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                lines.extend(part.strip() for part in line.split("&&"))
    return lines


def test_the_readmes_have_snippets_and_commands():
    assert len(fenced_blocks("python")) >= 2 and len(command_lines()) >= 10


@pytest.mark.parametrize("index", range(len(fenced_blocks("python"))))
def test_python_snippet_runs(index, tmp_path, monkeypatch):
    doc, code = fenced_blocks("python")[index]
    if "path/or/hub-id" in code:
        from tf_family import create_model

        create_model("transfo_xl", "causal_lm", "tiny").save_pretrained(tmp_path / "tiny")
        code = code.replace('"path/or/hub-id"', repr(str(tmp_path / "tiny")))
        code = code.replace('"folder saved by transformers 4.x TransfoXLLMHeadModel"', repr(str(LEGACY_FOLDER)))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{doc} python snippet {index}", "exec"), {"__name__": "readme_snippet"})


def _recipe_module(script: str | None, module: str | None):
    if module:
        assert module.startswith("tf_family.recipes."), module
        return importlib.import_module(module)
    assert script is not None and script.startswith("recipes/") and (ROOT / script).is_file(), script
    return importlib.import_module(f"tf_family.recipes.{Path(script).stem}")


def _parse_recipe(module, argv: list[str]) -> None:
    module.parse_args(argv)  # argparse exits (SystemExit) on anything it does not accept


def _check(tokens: list[str]) -> None:
    tokens = [t for t in tokens if t not in ("...", "…")]
    program, rest = tokens[0], tokens[1:]
    if program == "pip":  # extras named must exist; torch pins are PyPI's business
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for token in rest:
            named = re.fullmatch(r"(?:-e )?\.\[(.+)\]", token)
            if named:
                assert set(named[1].split(",")) <= extras, token
        return
    if program in ("ruff", "python") and rest[:2] in (["check", "."], ["-m", "pytest"]):
        return  # the test command itself
    if program == "tf-family":
        from tf_family import cli
        from tf_family.recipes import causal_lm

        if rest[:1] == ["train"]:
            causal_lm.parse_args(rest[1:], prog="tf-family train", defaults=cli.train_defaults(rest[1:]))
        else:
            cli.build_parser().parse_args(rest)
        return
    if program == "accelerate":
        from accelerate.commands.launch import launch_command_parser

        assert rest[0] == "launch", tokens
        launch = launch_command_parser().parse_args(rest[1:])
        if launch.config_file:
            assert (ROOT / launch.config_file).is_file(), launch.config_file
        module = launch.training_script if launch.module else None
        script = None if launch.module else launch.training_script
        _parse_recipe(_recipe_module(script, module), launch.training_script_args)
        return
    if program == "torchrun":
        from torch.distributed.run import get_args_parser

        run = get_args_parser().parse_args(rest)
        _parse_recipe(_recipe_module(run.training_script, None), run.training_script_args)
        return
    if program == "python":
        if rest[0] == "-m":
            _parse_recipe(_recipe_module(None, rest[1]), rest[2:])
        else:
            _parse_recipe(_recipe_module(rest[0], None), rest[1:])
        return
    raise AssertionError(f"the README runs {program!r}: teach tests/test_readme.py how to check it")


@pytest.mark.parametrize("line", command_lines())
def test_command_line_parses(line):
    try:
        _check(shlex.split(line))
    except SystemExit as exit_info:  # --help exits with 0
        if exit_info.code not in (0, None):
            pytest.fail(f"argparse refused {line!r} (exit {exit_info.code})")


def test_subpackages_are_attributes_after_a_bare_import():
    # in a fresh interpreter: this test session has imported tf_family.data already
    code = "import tf_family; print(tf_family.data.SOTU_TOKENIZER_DIR.is_dir(), callable(tf_family.data.load_sotu))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "True"]
