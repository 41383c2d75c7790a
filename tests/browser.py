"""A real headless Chromium for the tests that need a browser: the landing page, cross-site requests."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import tool


def browse(url: str, profile: Path, *flags: str, tries: int = 3) -> str:
    """The DOM after a headless Chromium loaded ``url`` and its picture (and ran the page's handlers); ``flags``
    are Chromium's own, added to these. Chromium prints nothing when its virtual time ran out while the page was
    still navigating (a form's post, on a busy CI machine: seen once in 1,300 tests), so an empty dump is loaded
    again, up to ``tries`` times; a page that never dumps returns empty and its test fails on what it lacks."""
    page = ""
    for _ in range(tries):
        page = _dump_dom(url, profile, *flags)
        if page.strip():
            break
    return page


def _dump_dom(url: str, profile: Path, *flags: str) -> str:
    done = subprocess.run(
        [
            tool("chromium", "chromium"),
            "--headless",
            "--no-sandbox",  # as root in CI
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",  # the machine has no network: no stray connections
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            *flags,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout
