"""The documentation site: `mkdocs build --strict` passes (a broken link, a page missing from the nav, an
unparsable docstring or a stale API reference fails it), every architecture of the registry and every command has
its page or section, and the built pages render with their navigation in a real headless browser (Chromium)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mkdocs_hooks
from tf_family import cli
from tf_family.registry import ARCHITECTURES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BROWSER_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
]


def nav_pages(entries) -> list[str]:
    """Every page file the nav of mkdocs.yml names."""
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def mkdocs_config() -> dict:
    """mkdocs.yml, with the nav as the build sees it (the hook adds every architecture's page from the registry)."""
    # mkdocs.yml is plain YAML apart from python/name tags, which it does not use
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["nav"] = mkdocs_hooks.architecture_nav(config["nav"])
    return config


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with `mkdocs build --strict` into a temporary folder."""
    folder = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return folder


def test_the_site_builds_strictly(site):
    assert (site / "index.html").is_file() and (site / "architectures" / "longformer" / "index.html").is_file()
    cli_page = (site / "cli" / "index.html").read_text()
    assert "usage: tf-family train" in cli_page and "usage: tf-family convert" in cli_page  # generated help


def test_every_architecture_has_a_page_in_the_nav_with_its_config_fields():
    pages = nav_pages(mkdocs_config()["nav"])
    for name, spec in ARCHITECTURES.items():
        page = f"architectures/{name}.md"
        assert page in pages, f"{page} is not in mkdocs.yml's nav"
        text = (DOCS / page).read_text()
        configs = (f"::: tf_family.{spec.config_class.__name__}", f"::: {spec.config.replace(':', '.')}")
        assert any(config in text for config in configs), f"{page} does not render its config's fields"
        assert "## Benchmarks" in text and "## Recipes and clients" in text
    assert sorted(p.stem for p in (DOCS / "architectures").glob("*.md")) == sorted([*ARCHITECTURES, "index"])


def test_the_cli_reference_has_every_command_and_recipe():
    text = (DOCS / "cli.md").read_text()
    helped = set(re.findall(r"<!-- help: ([^>]+?) -->", text))
    commands = next(a for a in cli.build_parser()._actions if a.dest == "command").choices
    assert {f"tf-family {name}" for name in commands} <= helped
    recipes = {f"recipes/{p.name}" for p in (ROOT / "recipes").glob("*.py") if p.stem not in ("__init__", "causal_lm")}
    assert recipes <= {name.split()[0] for name in helped}  # causal_lm is `tf-family train`


def _browser() -> str | None:
    return next(
        (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
    )


def _png_colours(path: Path) -> int:
    from PIL import Image

    with Image.open(path) as image:
        return len(image.convert("RGB").getcolors(maxcolors=1 << 20) or [])


@pytest.mark.parametrize("page", ["index.html", "architectures/longformer/index.html"])
def test_pages_render_with_navigation_in_a_headless_browser(site, page, tmp_path):
    browser = _browser()
    if browser is None:
        if os.environ.get("TF_FAMILY_REQUIRE_BROWSER") == "1":  # .ci/run installs Chromium and sets it
            pytest.fail("no Chromium found: apt-get install -y chromium")
        pytest.skip("no Chromium on this machine (apt-get install -y chromium); .ci/run installs it")
    url = (site / page).as_uri()
    flags = [*BROWSER_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # the rendered document has the site navigation with every section and architecture
    nav = dom.stdout[dom.stdout.index('class="md-nav md-nav--primary"') :]
    for label in ("Getting started", "Architectures", "Longformer", "Decision Transformer", "Command line"):
        assert f">{label}<" in re.sub(r">\s+", ">", re.sub(r"\s+<", "<", nav)), label
    shot = tmp_path / "page.png"
    result = subprocess.run([browser, *flags, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    assert _png_colours(shot) > 50  # text, header, navigation: not a blank page


def test_the_generated_tables_have_every_architecture():
    """The hook writes the architectures table from each page's front matter and the API reference from the specs:
    every architecture has its row and its section (a page without the front matter fails, naming the fix)."""
    table = mkdocs_hooks.architecture_table()
    reference = mkdocs_hooks.model_reference()
    for name, spec in ARCHITECTURES.items():
        assert f"]({name}.md) |" in table
        assert f"## {spec.title}" in reference and spec.config.replace(":", ".") in reference
