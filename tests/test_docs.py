"""The README, docs/, benchmarks/README.md and the changelog: every relative link and anchor resolves, references to
a section by name name one that exists, the README's facts match pyproject.toml, and its YAML examples are valid."""

from __future__ import annotations

import collections
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from crossover_monitor.config.loader import load_settings
from tests.conftest import REPO

PAGES = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "benchmarks" / "README.md",
    *sorted((REPO / "benchmarks" / "journal").glob("*.md")),
    REPO / "CHANGELOG.md",
]
_FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
# [text](target) or ![alt](target), the target optionally in <...> and followed by a "title".
_INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.MULTILINE)
# A section named in prose instead of linked: README "Run history", benchmarks/README.md's "Fourth session".
_NAMED_SECTION = re.compile(r"\b((?:[\w./-]+/)?(?:README|[\w-]+\.md))(?:'s)?,?\s[\"“]([^\"”]+)[\"”]")


def prose(page: Path) -> str:
    """The page's Markdown without fenced code blocks, whose links and headings are not ones."""
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as GitHub numbers them."""
    seen: collections.Counter[str] = collections.Counter()
    found = set()
    for heading in _HEADING.findall(prose(page)):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if seen[base] else base)
        seen[base] += 1
    return found


def links(page: Path) -> list[str]:
    """The page's relative link targets, inline and reference-style, in order; code spans hold none."""
    text = _CODE_SPAN.sub("", prose(page))
    targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
    return [target for target in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def named_sections(page: Path) -> list[str]:
    """Sections named in prose (README "Run history") that their file has no heading for."""
    missing = []
    for named, wrapped in _NAMED_SECTION.findall(_CODE_SPAN.sub("", prose(page))):
        section = " ".join(wrapped.split())
        path = REPO / "README.md" if named == "README" else (page.parent / named).resolve()
        if not path.is_file():
            path = (REPO / named).resolve()
        if not path.is_file() or not any(a.startswith(slug(section)) for a in anchors(path)):
            missing.append(f'{named} "{section}"')
    return missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    """Every relative link of the page names a file that exists and, into Markdown, a heading that does."""
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_section_named_in_prose_exists(page: Path) -> None:
    """A reference such as README "Run history" names a heading of that file (better: link it, and it is checked)."""
    assert named_sections(page) == []


def test_the_link_check_catches_a_moved_section(tmp_path: Path) -> None:
    """The link check finds every link of a page and tells an anchor with a heading from one without."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Run history\n\n## Run history\n\n### `no_gpu` and n\\* — [HTTP](http.md)\n\n"
        'See [there](#run-history "a title"), [again](#run-history-1), [gone](#verified-on), [x](nowhere.md),\n'
        "`[code](not-a-link.md)`, <https://example.com>, and\n\n[ref]: other.md#x\n"
        "```\n# not a heading\n[nor](a-link.md)\n```\n"
    )
    assert links(page) == ["http.md", "#run-history", "#run-history-1", "#verified-on", "nowhere.md", "other.md#x"]
    assert anchors(page) == {"title", "run-history", "run-history-1", "no_gpu-and-n--http"}
    assert broken_links(page) == [
        "http.md: no such file",
        "#verified-on: no heading with that anchor",
        "nowhere.md: no such file",
        "other.md#x: no such file",
    ]


def test_the_section_check_catches_a_section_named_that_moved(tmp_path: Path) -> None:
    """README "Run history" passes while the README has that heading, and fails once it is gone."""
    page = tmp_path / "page.md"
    page.write_text('Served again at once (README "Run\nhistory"); see README.md\'s "Verified on".\n')
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "## Verified on" in readme
    assert "Run history" not in _HEADING.findall(readme)
    assert named_sections(page) == ['README "Run history"']


def test_the_readmes_runtime_dependencies_are_pyprojects() -> None:
    """The README's "Runtime dependencies are exactly ..." names each of pyproject.toml's dependencies, no other."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (sentence,) = re.findall(r"Runtime dependencies are exactly (.*?);", readme, re.DOTALL)
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert sorted(re.findall(r"`([^`]+)`", sentence)) == sorted(Requirement(d).name for d in project["dependencies"])


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
