"""The README and docs/: every relative link and anchor resolves, and the README's YAML examples are valid."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crossover_monitor.config import load_settings
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))) if not re.match(r"^[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    """Every relative link of the page names a file that exists and, into Markdown, a heading that does."""
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []


def test_the_link_check_catches_a_moved_section(tmp_path: Path) -> None:
    """The link check finds every link of a page and tells an anchor with a heading from one without."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## Run history\n\nSee [there](#run-history), [gone](#verified-on), [x](nowhere.md).\n")
    targets = links(page)
    assert targets == ["#run-history", "#verified-on", "nowhere.md"]
    assert "run-history" in anchors(page)
    assert "verified-on" not in anchors(page)


def test_the_readmes_yaml_examples_pass_check_config(tmp_path: Path) -> None:
    """A configuration the README shows is one the service takes."""
    blocks = re.findall(
        r"^```yaml\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), re.DOTALL | re.MULTILINE
    )
    assert blocks
    for index, block in enumerate(blocks):
        path = tmp_path / f"example-{index}.yaml"
        path.write_text(block)
        load_settings(str(path))  # raises ConfigError, naming the key, if the example is wrong
