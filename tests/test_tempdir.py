"""The service says plainly when the machine gives it no writable temporary directory."""

from __future__ import annotations

import tempfile

import pytest

from monitor.daemon import temp_dir_problem


def test_no_writable_temporary_directory_is_a_clear_readiness_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a usable temp dir every sweep would fail deep in a framework: readiness and the sweep say why."""
    assert temp_dir_problem() is None
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-crossover-monitor-tmp")
    problem = temp_dir_problem()
    assert problem is not None
    assert "no writable temporary directory" in problem
    assert "TMPDIR" in problem
