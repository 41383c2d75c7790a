"""What the host must give a sweep before its figures can be right: a temporary directory and JIT memory.

Both are checked before every sweep and by readiness, so a container or unit that lacks one says so
on /readyz and in the sweep's reason instead of failing deep in a framework or, worse, timing slowly.
"""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path


def temp_dir_problem() -> str | None:
    """Why no temporary file can be made here (the frameworks in the worker need one), or None."""
    try:
        handle, path = tempfile.mkstemp(prefix="crossover-monitor-")
    except OSError as exc:
        where = os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - naming where it looked, not using it
        return (
            f"no writable temporary directory ({where}: {exc.strerror or exc}); mount one there "
            "(e.g. an emptyDir or tmpfs at /tmp) or point TMPDIR at one"
        )
    os.close(handle)
    Path(path).unlink()
    return None


def executable_memory_problem() -> str | None:
    """Why memory cannot be mapped writable and executable here, or None.

    The frameworks JIT-compile their CPU kernels (oneDNN, XLA) into such memory. Under systemd's
    MemoryDenyWriteExecute= TensorFlow does not fail: it falls back to kernels about 4x slower
    (n = 4000: 1.80 s against 0.42 s), so every CPU timing and crossover would be quietly wrong.
    """
    try:
        region = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except OSError as exc:
        return (
            f"memory cannot be mapped writable and executable ({exc.strerror or exc}): the frameworks' "
            "JIT-compiled kernels would fall back to slow ones and every timing would be wrong; remove "
            "MemoryDenyWriteExecute= from the unit (or the seccomp or prctl rule that denies it)"
        )
    region.close()
    return None


def host_problem() -> str | None:
    """The first reason this host cannot run a sweep that gives right figures, or None."""
    return temp_dir_problem() or executable_memory_problem()
