"""Pure: from measurements to the crossover size of each GPU against the CPU."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from monitor.model import Crossover, CrossoverState, DeviceInfo, Measurement, Mode


def find_crossover(
    curve: Sequence[tuple[int, float, float]],
) -> tuple[CrossoverState, float | None, int | None, int | None]:
    """State, n*, and bracket from ``(size, cpu_seconds, gpu_seconds)`` points.

    n* is the smallest size from which the GPU is faster at every larger measured size,
    interpolated where log(t_cpu / t_gpu) crosses zero, linear in log n, between the two
    bracketing sizes. If the GPU was also faster somewhere below the bracket, the curves cross
    more than once and the state is AMBIGUOUS, with no size.
    """
    points = sorted(curve)
    if not points:
        raise ValueError("no points to compare")
    log_ratios = [math.log(cpu / gpu) for _, cpu, gpu in points]
    gpu_faster = [r > 0 for r in log_ratios]
    if all(gpu_faster):
        return CrossoverState.GPU_ALWAYS_FASTER, None, None, None
    if not gpu_faster[-1]:
        state = CrossoverState.AMBIGUOUS if any(gpu_faster) else CrossoverState.GPU_NEVER_FASTER
        return state, None, None, None
    first = max(i for i, faster in enumerate(gpu_faster) if not faster) + 1
    if any(gpu_faster[:first]):
        return CrossoverState.AMBIGUOUS, None, None, None
    (n0, r0), (n1, r1) = (points[first - 1][0], log_ratios[first - 1]), (points[first][0], log_ratios[first])
    fraction = -r0 / (r1 - r0)
    size = math.exp(math.log(n0) + fraction * (math.log(n1) - math.log(n0)))
    return CrossoverState.FOUND, size, n0, n1


def crossovers(devices: Iterable[DeviceInfo], measurements: Iterable[Measurement]) -> tuple[Crossover, ...]:
    """One crossover per (GPU, CPU, dtype, mode) of each backend that has common sizes measured.

    A CPU with no GPU found beside it gets the explicit state NO_GPU (gpu="none"); a GPU that was
    found but measured nothing gets no crossover (its ``matmul_device_up`` says why).
    """
    medians: dict[tuple[str, str, str, Mode], dict[int, float]] = {}
    for m in measurements:
        medians.setdefault((m.key.backend, m.key.device, m.key.dtype, m.key.mode), {})[m.key.size] = m.timing.median_s
    devices = list(devices)
    gpus = [d for d in devices if d.kind == "gpu"]
    cpus = [d for d in devices if d.kind == "cpu"]
    combos = sorted({(k[0], k[2], k[3]) for k in medians})
    found: list[Crossover] = []
    for backend, dtype, mode in combos:
        for cpu in (c for c in cpus if c.backend == backend):
            pairs = [
                _pair(medians=medians, backend=backend, gpu=gpu.device, cpu=cpu.device, dtype=dtype, mode=mode)
                for gpu in gpus
                if gpu.backend == backend
            ]
            found.extend(p for p in pairs if p is not None)
            if not pairs:
                found.extend(_no_gpu(medians, backend, cpu.device, dtype, mode))
    return tuple(found)


def _no_gpu(
    medians: Mapping[tuple[str, str, str, Mode], Mapping[int, float]], backend: str, cpu: str, dtype: str, mode: Mode
) -> list[Crossover]:
    if (backend, cpu, dtype, mode) not in medians:
        return []
    return [Crossover(backend=backend, gpu="none", cpu=cpu, dtype=dtype, mode=mode, state=CrossoverState.NO_GPU)]


def _pair(
    *,
    medians: Mapping[tuple[str, str, str, Mode], Mapping[int, float]],
    backend: str,
    gpu: str,
    cpu: str,
    dtype: str,
    mode: Mode,
) -> Crossover | None:
    gpu_times = medians.get((backend, gpu, dtype, mode), {})
    cpu_times = medians.get((backend, cpu, dtype, mode), {})
    common = sorted(set(gpu_times) & set(cpu_times))
    if not common:
        return None
    state, size, lower, upper = find_crossover([(n, cpu_times[n], gpu_times[n]) for n in common])
    return Crossover(
        backend=backend,
        gpu=gpu,
        cpu=cpu,
        dtype=dtype,
        mode=mode,
        state=state,
        size=size,
        lower=lower,
        upper=upper,
    )
