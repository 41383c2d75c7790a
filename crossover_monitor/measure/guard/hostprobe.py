"""The host reference: a short, fixed, host-only workload whose time says how fast the host runs right now.

A GPU point at small n is the host's dispatch path (tens of microseconds of interpreter, allocator and
driver code per call), so whatever slows the host's cores, caches or memory slows it, with or without
a wait for a CPU: a neighbour's BLAS threads or memory traffic, an SMT sibling, the hypervisor taking
time. The reference does the same kinds of work (interpreter, small allocations, a copy through the
caches) on the thread that times the points, and nothing else: standard library only, so that it does
not move when the framework, CUDA or the driver changes, and a real change of the dispatch path is
told apart from a host that other work slowed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

_COPY = (bytearray(2 * 2**20), bytearray(2 * 2**20))


def _interpreter() -> None:
    x = 1
    for _ in range(2_000):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def _allocator() -> None:
    for i in range(500):
        _ = {"a": i, "b": [i, i + 1], "c": (i,)}


def _copy() -> None:
    source, target = _COPY
    target[:] = source


PARTS: dict[str, Callable[[], None]] = {"interpreter": _interpreter, "allocator": _allocator, "copy": _copy}
READING_RUNS = 5  # a reading is the median of this many runs: one preempted run does not move it


def _run_once() -> float:
    start = time.perf_counter()
    for part in PARTS.values():
        part()
    return time.perf_counter() - start


def reading(runs: int = READING_RUNS) -> float:
    """One reading of the reference: the median time of ``runs`` runs of every part, in seconds."""
    return statistics.median(_run_once() for _ in range(runs))


def part_readings(runs: int = READING_RUNS) -> dict[str, float]:
    """Each part's median over ``runs`` runs, in seconds (benchmarks/host_probe.py compares them)."""
    found = {}
    for name, part in PARTS.items():
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            part()
            samples.append(time.perf_counter() - start)
        found[name] = statistics.median(samples)
    return found
