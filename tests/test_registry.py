"""Backend lookup: built-in names and plugins, and what a missing framework tells the user to install."""

from __future__ import annotations

import sys

import pytest

from crossover_monitor.errors import BackendUnavailable
from crossover_monitor.measure.contract import BackendOptions
from crossover_monitor.measure.registry import load_backend

OPTIONS = BackendOptions(cpu_threads=1, tf32=False)


@pytest.mark.parametrize(
    ("name", "install"),
    [
        ("tensorflow", "pip install 'crossover-monitor'"),
        ("torch", "pip install 'crossover-monitor[torch]'"),
        ("jax", "pip install 'crossover-monitor[jax]'"),
    ],
)
def test_a_builtin_backend_that_cannot_be_imported_names_what_to_install(
    name: str, install: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each framework's own install line (there is no 'crossover-monitor[tensorflow]' extra: it is a dependency)."""
    monkeypatch.setitem(
        sys.modules, f"crossover_monitor.measure.backends.{name}_backend", None
    )  # import fails, as without the framework
    with pytest.raises(BackendUnavailable) as raised:
        load_backend(name, OPTIONS)
    assert f"install it: {install})" in str(raised.value)


def test_a_plugin_that_cannot_be_imported_gets_no_install_line() -> None:
    """A plugin's package is the user's own: no pip line is guessed for it."""
    with pytest.raises(BackendUnavailable) as raised:
        load_backend("no_such_package.anywhere:create", OPTIONS)
    assert "cannot import no_such_package" in str(raised.value)
    assert "pip install" not in str(raised.value)
