"""The memory a sweep's worker may use, what a point's matrices take of it, and the OOM killer's count (stdlib only).

The daemon and its worker share one memory cgroup (the unit's, the container's, the pod's): the daemon warns at
load about sizes that cannot fit and names an OOM kill when its worker dies of one; the worker refuses those points.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
MEMINFO = Path("/proc/meminfo")
_V1_UNLIMITED = 1 << 62  # at or above this a v1 limit is the controller's "no limit"

# Bytes per element of each dtype the settings allow (model.DTYPES).
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def size_text(count: int) -> str:
    """A byte count as a person reads it: MiB below a GiB, else GiB."""
    if count < 1 << 30:
        return f"{count / (1 << 20):.0f} MiB"
    return f"{count / (1 << 30):.2f} GiB"


@dataclass(frozen=True, kw_only=True)
class MemoryLimit:
    """The most memory this process and its children may use, and where that figure comes from."""

    bytes: int
    source: str  # "cgroup memory.max", "MemTotal, the host's RAM", …

    def __str__(self) -> str:
        return f"{size_text(self.bytes)} ({self.source})"


def matrices_bytes(size: int, dtype: str, mode: str, kind: str) -> int:
    """The least host memory one point's n×n matrices hold at once; the framework's own memory comes on top.

    On a CPU A, B and the product live in host memory; end_to_end adds the host copies of A and B (the result
    read back may share the product's memory). On a GPU the matrices live in its memory, and only end_to_end
    holds host copies: A, B and the result copied back.
    """
    square = size * size * ITEMSIZE[dtype]
    on_device = 3 if kind == "cpu" else 0
    copies = 0 if mode != "end_to_end" else 2 if kind == "cpu" else 3
    return (on_device + copies) * square


def refusal(size: int, dtype: str, mode: str, kind: str, limit: MemoryLimit | None) -> str | None:
    """Why the point cannot be timed within ``limit`` (its matrices alone do not fit), or None."""
    need = matrices_bytes(size, dtype, mode, kind)
    if limit is None or need < limit.bytes:
        return None
    return (
        f"n={size} refused: the matrices of {size}x{size} {dtype} {mode} on the {kind.upper()} need at least "
        f"{size_text(need)}, and the worker may use {limit}; leave the size out or give the service more memory"
    )


def _own_cgroups(proc_self_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup path in the unified (v2) hierarchy and in the v1 memory controller's, where it has one."""
    unified = memory = None
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            unified = path
        elif "memory" in controllers.split(","):
            memory = path
    return unified, memory


def _first_dir(*candidates: Path) -> Path | None:
    """The first that exists: the cgroup by its path, else the mount itself (a container's own cgroup namespace,
    or a v1 mount of the container's cgroup, where /proc/self/cgroup still names the host's path)."""
    return next((c for c in candidates if c.is_dir()), None)


def _v2_dir(root: Path, proc_self_cgroup: Path) -> Path | None:
    unified, _ = _own_cgroups(proc_self_cgroup)
    if unified is None:
        return None
    return _first_dir(root / unified.lstrip("/"), root) if (root / "cgroup.controllers").is_file() else None


def _v1_dir(root: Path, proc_self_cgroup: Path) -> Path | None:
    _, memory = _own_cgroups(proc_self_cgroup)
    if memory is None:
        return None
    return _first_dir(root / "memory" / memory.lstrip("/"), root / "memory")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _field(path: Path, name: str) -> int | None:
    """``name VALUE`` from a flat keyed file (memory.events, memory.stat, memory.oom_control, /proc/meminfo)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[0] == name and parts[1].isdigit():  # noqa: PLR2004 - a name and a value
            return int(parts[1])
    return None


def _cgroup_limit(root: Path, proc_self_cgroup: Path) -> MemoryLimit | None:
    """The tightest memory limit on this process's cgroup and its ancestors, where one is set."""
    own = _v2_dir(root, proc_self_cgroup)
    if own is not None:
        limits = []
        for directory in (own, *own.parents):  # a limit on a parent (a slice, a pod) binds as well
            try:
                text = (directory / "memory.max").read_text().strip()
            except OSError:
                text = "max"
            if text.isdigit():
                limits.append(int(text))
            if directory == root:
                break
        return MemoryLimit(bytes=min(limits), source="cgroup memory.max") if limits else None
    own = _v1_dir(root, proc_self_cgroup)
    if own is None:
        return None
    # The v1 controller folds its ancestors' limits in here; "unlimited" is 2**63 rounded down to a page.
    limit = _field(own / "memory.stat", "hierarchical_memory_limit") or _read_int(own / "memory.limit_in_bytes")
    if not limit or limit >= _V1_UNLIMITED:
        return None
    return MemoryLimit(bytes=limit, source="cgroup memory.limit_in_bytes")


def memory_limit(
    root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP, meminfo: Path = MEMINFO
) -> MemoryLimit | None:
    """What this process (and the worker it starts, in the same cgroup) may use: its memory cgroup's limit, or the
    host's RAM where that is less or there is none; None where neither can be read."""
    kib = _field(meminfo, "MemTotal")
    ram = MemoryLimit(bytes=kib * 1024, source="MemTotal, the host's RAM") if kib else None
    cgroup = _cgroup_limit(root, proc_self_cgroup)
    if cgroup is None or (ram is not None and ram.bytes <= cgroup.bytes):
        return ram
    return cgroup


def oom_kills(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> int | None:
    """How many processes of this process's memory cgroup the kernel's OOM killer has killed (v2 ``memory.events``,
    v1 ``memory.oom_control``); None where the cgroup does not say (the root cgroup, an older kernel)."""
    own = _v2_dir(root, proc_self_cgroup)
    if own is not None:
        return _field(own / "memory.events", "oom_kill")
    own = _v1_dir(root, proc_self_cgroup)
    return None if own is None else _field(own / "memory.oom_control", "oom_kill")
