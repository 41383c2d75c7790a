"""What every framework backend does alike: host operands, device and dtype look-ups, placement and accuracy checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from crossover_monitor.errors import DeviceUnavailable, MeasurementFailed, PlacementError
from crossover_monitor.measure.guard.hostinfo import cpu_model
from crossover_monitor.model import FORK_JOIN, THREAD_POOL, DeviceInfo, Mode, describe_point

T = TypeVar("T")


def cpu_device(backend: str, name: str, threads: int, *, thread_pool: str = FORK_JOIN) -> DeviceInfo:
    """The host CPU as every backend reports it: its model name, the threads the framework uses and how they
    share a parallel call (``THREAD_POOL``)."""
    details = (("threads", str(threads)), (THREAD_POOL, thread_pool))
    return DeviceInfo(backend=backend, device=name, kind="cpu", name=cpu_model(), details=details)


def host_operands(size: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Two n×n float32 operands in [0, 1), the same for every backend and run; cast to the timed dtype by the caller."""
    rng = np.random.default_rng(size)
    return rng.random((size, size), dtype=np.float32), rng.random((size, size), dtype=np.float32)


def lookup_device(backend: str, name: str, known: Mapping[str, T]) -> T:
    """The framework's handle for a device this backend discovered; any other name is fatal for that device."""
    try:
        return known[name]
    except KeyError:
        reason = f"{backend} has no such device (it has: {', '.join(known) or 'none'})"
        raise DeviceUnavailable(name, reason, fatal=True) from None


def lookup_dtype(table: Mapping[str, T], device: str, size: int, dtype: str, mode: Mode) -> T:
    """The framework's dtype for a dtype name; one it cannot time fails that point, not the sweep."""
    try:
        return table[dtype]
    except KeyError:
        reason = f"unsupported dtype {dtype!r} (this backend times {', '.join(table)})"
        raise MeasurementFailed(device, describe_point(size, dtype, mode), reason) from None


def check_placement(where: str, actual: str) -> None:
    """Refuse a result that lives anywhere but on the timed device (no silent fallback to the CPU)."""
    if actual.lower() != where.lower():
        raise PlacementError(where, actual)


def relative_error(product: npt.ArrayLike, a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """max |C − A·B| / max |A·B|, with A·B computed in float64 from the operands as the device held them."""
    reference = np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)
    error = np.abs(np.asarray(product, dtype=np.float64) - reference).max(initial=0.0)
    scale = np.abs(reference).max(initial=0.0)
    return float(error / scale) if scale > 0 else float(error)
