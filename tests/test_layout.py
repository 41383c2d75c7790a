"""The package's layout: folders that show the two processes and the guard, and the directions imports go in.

    model, errors, text, codec, protocol, memory, metrics, scrape   what both processes share
    config/     the settings and their reader               analysis/   crossover, costs, carry-over (pure)
    measure/    the worker: runner, backends/, guard/       service/    the daemon: sweeps, schedule, store, history
    http/       the server and the page                     view/       reports, charts      cli/   the commands

The worker's side never imports the service, HTTP, the views or the command line; the shared modules, the
configuration and the analysis import none of the daemon's or the worker's folders; nothing imports the command
line but ``python -m crossover_monitor``. Read from every import
statement, a function's own (lazy) ones included.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "crossover_monitor"
FOLDERS = ("config", "analysis", "measure", "service", "http", "view", "cli", "bench")
# What each part may not import (by folder; "" is the package's top-level modules).
NEVER: dict[str, set[str]] = {
    "": {"measure", "service", "http", "view", "cli"},
    "config": {"analysis", "measure", "service", "http", "view", "cli"},
    "analysis": {"measure", "service", "http", "view", "cli"},
    "measure": {"service", "http", "view", "cli"},
    "view": {"measure", "http", "cli"},
    "service": {"cli"},
    "http": {"cli"},
}
# Where a rule is broken on purpose, and why.
ALLOWED = {
    # A cron line's fields are APScheduler's to judge, and schedule.py is its only importer: imported in the one
    # function that reads a cron line, so the worker (which imports the settings) never loads a scheduler.
    ("config/loader.py", "crossover_monitor.service.schedule"),
}


def _part(module: str) -> str | None:
    """The folder of a ``crossover_monitor.`` module ("" for a top-level one), None outside the package."""
    parts = module.split(".")
    if parts[0] != "crossover_monitor":
        return None
    return parts[1] if len(parts) > 2 and parts[1] in FOLDERS else ""


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, lazily or not (``from crossover_monitor.x import y`` counts x and x.y)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("crossover_monitor")}


def _broken() -> list[tuple[str, str]]:
    broken = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        part = where.split("/")[0] if "/" in where else ("__main__" if where == "__main__.py" else "")
        for module in _imports(path):
            target = _part(module)
            allowed = any(where == place and module.startswith(name) for place, name in ALLOWED)
            if target is not None and target in NEVER.get(part, set()) and not allowed:
                broken.append((where, module))
    return broken


def test_imports_go_one_way() -> None:
    assert _broken() == []


def test_the_check_reads_lazy_imports_and_sees_a_broken_direction(tmp_path: Path) -> None:
    module = tmp_path / "runner.py"
    module.write_text("def f():\n    from crossover_monitor.service.daemon import Service\n", encoding="utf-8")
    assert "crossover_monitor.service.daemon" in _imports(module)
    assert _part("crossover_monitor.service.daemon") == "service"
    assert _part("crossover_monitor.model") == ""


def test_every_module_is_in_a_folder_of_the_layout_or_shared() -> None:
    """A new folder (or module) is placed in the layout on purpose: the shared top level stays small."""
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(FOLDERS)
    shared = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    assert shared == {"model", "errors", "text", "codec", "protocol", "memory", "metrics", "scrape"}


def test_the_worker_starts_without_the_service_http_or_a_yaml_parser() -> None:
    """The worker's entry module, imported in a fresh interpreter, loads nothing of the daemon's side."""
    probe = (
        "import sys, crossover_monitor.measure.worker; "
        "print(sorted(m for m in sys.modules if m.startswith(('crossover_monitor.service', "
        "'crossover_monitor.http', 'crossover_monitor.cli', 'crossover_monitor.view', 'yaml', 'apscheduler'))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "old", ["contract", "common", "timing", "nogpu", "runner", "worker", "registry", "guard", "rule", "hostinfo"]
)
def test_modules_of_earlier_releases_import_as_the_same_modules_by_their_old_names(old: str) -> None:
    """The README listed crossover_monitor/bench/*.py (a plugin backend imports .contract, the Backend protocol and
    its errors, and .common and .timing): each old name is the same module object as its new home."""
    from crossover_monitor.bench import MOVED  # noqa: PLC0415

    assert importlib.import_module(f"crossover_monitor.bench.{old}") is importlib.import_module(MOVED[old])
    namespace: dict[str, object] = {}
    exec(f"from crossover_monitor.bench.{old} import *", namespace)  # noqa: S102 - the import a plugin writes
    assert len(namespace) > 1


def test_a_plugin_backend_of_an_earlier_release_runs_in_a_fresh_worker(tmp_path: Path) -> None:
    """A plugin written against crossover_monitor.bench.contract, in a fresh interpreter: its Backend protocol and
    timing module are today's (isinstance and the timing loop are the same across the two names)."""
    probe = (
        "from crossover_monitor.bench.contract import Backend; "
        "from crossover_monitor.measure.contract import Backend as New; "
        "import crossover_monitor.bench.timing as old_timing, crossover_monitor.measure.timing as timing; "
        "print(Backend is New, old_timing is timing)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.split() == ["True", "True"]


def test_no_function_in_the_package_is_over_sixty_lines() -> None:
    """A function a reader cannot hold in view is split where its steps are (issue 53's bound)."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines} lines)")
    assert long == []


def test_the_package_says_why_not_when() -> None:
    """Dated evidence lives in benchmarks/journal/, linked from benchmarks/README.md's index; the code's docstrings
    and comments say why, and no date ties them to one investigation."""
    dated = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\b20\d\d-[01]\d-[0-3]\d\b", line)
    ]
    assert dated == []
