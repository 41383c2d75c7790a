"""The service says plainly when the host would make its figures wrong: no temp dir, no JIT memory."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from crossover_monitor.service.preflight import executable_memory_problem, host_problem, temp_dir_problem
from tests.conftest import REPO

# prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN): the kernel's own memory-deny-write-execute (Linux 6.3+),
# what systemd's MemoryDenyWriteExecute= sets (through seccomp before systemd 254).
_UNDER_MDWE = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(77)
from crossover_monitor.service.preflight import executable_memory_problem, host_problem
print(executable_memory_problem())
print(host_problem())
"""


def test_no_writable_temporary_directory_is_a_clear_readiness_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a usable temp dir every sweep would fail deep in a framework: readiness and the sweep say why."""
    assert temp_dir_problem() is None
    assert host_problem() is None
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent-crossover-monitor-tmp")
    problem = temp_dir_problem()
    assert problem is not None
    assert "no writable temporary directory" in problem
    assert "TMPDIR" in problem
    assert host_problem() == problem


def test_memory_deny_write_execute_is_named_with_its_remedy() -> None:
    """Under the kernel's write-xor-execute rule for real, the check names it and what to remove."""
    assert executable_memory_problem() is None
    done = subprocess.run([sys.executable, "-c", _UNDER_MDWE], capture_output=True, text=True, cwd=REPO, check=False)
    if done.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+); tests/test_deploy_systemd_boot.py covers the unit")
    assert done.returncode == 0, done.stderr
    problem, host = done.stdout.splitlines()
    assert problem.startswith("memory cannot be mapped writable and executable"), problem
    assert "MemoryDenyWriteExecute=" in problem
    assert host == problem
