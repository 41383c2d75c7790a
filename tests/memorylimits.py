"""The measured peak memory of the embedded defaults, and the deploy files' memory limits matched to it.

The peak is the worker's plus the daemon's resident memory in each recorded footprint of a TensorFlow sweep
(``benchmarks/results/footprint-tensorflow-defaults-*.json``, written by ``benchmarks/footprint.py``).
"""

from __future__ import annotations

import json
import re

from tests.conftest import REPO

FOOTPRINTS = sorted((REPO / "benchmarks" / "results").glob("footprint-tensorflow-defaults-*.json"))
HEADROOM = 1.5  # a limit this many times the peak: room for another GPU's context, a newer framework, the cache

# Binary multiples, as systemd (MemoryMax=), Docker (mem_limit) and Kubernetes (Gi, Mi) read them.
_UNITS = {"": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def recorded_peak_mib() -> float:
    """The highest worker peak plus daemon resident memory of any recorded footprint, in MiB."""
    peaks = []
    for path in FOOTPRINTS:
        phases = json.loads(path.read_text(encoding="utf-8"))["phases"]
        peaks.append(max(p["worker_peak_rss_mib"] for p in phases) + max(p["daemon_rss_mib"] for p in phases))
    assert peaks, "no benchmarks/results/footprint-tensorflow-defaults-*.json to match the limits to"
    return max(peaks)


def mib(quantity: str) -> float:
    """``3G``, ``3g``, ``3Gi``, ``512M`` or a byte count, in MiB."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)i?[bB]?", str(quantity).strip())
    assert match, f"not a memory quantity: {quantity!r}"
    return float(match.group(1)) * _UNITS[match.group(2).lower()]
