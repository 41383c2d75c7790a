"""Pure: from measurements to the crossover size of each GPU against the CPU, with its uncertainty."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from monitor.model import Crossover, CrossoverState, DeviceInfo, Measurement, Mode
from monitor.model import curves as group_curves

BOOTSTRAP_RESAMPLES = 200
CONFIDENCE = 0.95
# Below this share of resamples that find a crossover, the interval would describe noise.
_MIN_FOUND_SHARE = 0.5


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
    n0, r0 = points[first - 1][0], log_ratios[first - 1]
    n1, r1 = points[first][0], log_ratios[first]
    fraction = -r0 / (r1 - r0)
    size = math.exp(math.log(n0) + fraction * (math.log(n1) - math.log(n0)))
    return CrossoverState.FOUND, size, n0, n1


# Per-call block times of one point; the median of these is the point's time.
Samples = Sequence[float]


def bootstrap_interval(
    curve: Sequence[tuple[int, Samples, Samples]], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """A confidence interval for n* from ``(size, cpu_samples, gpu_samples)``, by resampling blocks.

    Each resample draws every point's blocks with replacement, takes their median and finds the
    crossover again. None when too few resamples find one (the answer is then noise-dominated).
    """
    rng = random.Random(seed)  # fixed seed: the same measurements always give the same interval

    def resampled(samples: Samples) -> float:
        return statistics.median(rng.choices(samples, k=len(samples))) if len(samples) > 1 else samples[0]

    found = []
    for _ in range(resamples):
        state, size, _, _ = find_crossover([(n, resampled(c), resampled(g)) for n, c, g in curve])
        if state is CrossoverState.FOUND and size is not None:
            found.append(size)
    if len(found) < resamples * _MIN_FOUND_SHARE:
        return None
    tail = (1 - CONFIDENCE) / 2
    ordered = sorted(found)
    return ordered[int(tail * (len(ordered) - 1))], ordered[math.ceil((1 - tail) * (len(ordered) - 1))]


@dataclass(frozen=True)
class _Point:
    median: float
    samples: Samples


_Curves = Mapping[tuple[str, str, str, Mode], Mapping[int, _Point]]


def crossovers(devices: Iterable[DeviceInfo], measurements: Iterable[Measurement]) -> tuple[Crossover, ...]:
    """One crossover per (GPU, CPU, dtype, mode) of each backend that has common sizes measured.

    A CPU with no GPU found beside it gets the explicit state NO_GPU (gpu="none"); a GPU that was
    found but measured nothing gets no crossover (its ``matmul_device_up`` says why).
    """
    # The n=1 fixed-cost probe was not asked for: it must not sway the state.
    curves = {
        (key.backend, key.device, key.dtype, key.mode): {
            n: _Point(m.timing.median_s, m.timing.samples_s or (m.timing.median_s,)) for n, m in points.items()
        }
        for key, points in group_curves(measurements, roles=("sweep", "refine")).items()
    }
    devices = list(devices)
    gpus = [d for d in devices if d.kind == "gpu"]
    cpus = [d for d in devices if d.kind == "cpu"]
    found: list[Crossover] = []
    for backend, dtype, mode in sorted({(k[0], k[2], k[3]) for k in curves}):
        for cpu in (c for c in cpus if c.backend == backend):
            pairs = [
                _pair(
                    curves,
                    Crossover(
                        backend=backend,
                        gpu=gpu.device,
                        cpu=cpu.device,
                        dtype=dtype,
                        mode=mode,
                        state=CrossoverState.NO_GPU,
                    ),
                )
                for gpu in gpus
                if gpu.backend == backend
            ]
            found.extend(p for p in pairs if p is not None)
            if not pairs and (backend, cpu.device, dtype, mode) in curves:
                found.append(
                    Crossover(
                        backend=backend, gpu="none", cpu=cpu.device, dtype=dtype, mode=mode, state=CrossoverState.NO_GPU
                    )
                )
    return tuple(found)


def _pair(curves: _Curves, template: Crossover) -> Crossover | None:
    """The crossover for the pair named by ``template``, or None if they share no measured size."""
    gpu = curves.get((template.backend, template.gpu, template.dtype, template.mode), {})
    cpu = curves.get((template.backend, template.cpu, template.dtype, template.mode), {})
    common = sorted(set(gpu) & set(cpu))
    if not common:
        return None
    state, size, lower, upper = find_crossover([(n, cpu[n].median, gpu[n].median) for n in common])
    interval = None
    if state is CrossoverState.FOUND:
        interval = bootstrap_interval([(n, cpu[n].samples, gpu[n].samples) for n in common])
    return replace(
        template,
        state=state,
        size=size,
        lower=lower,
        upper=upper,
        ci_lower=interval[0] if interval else None,
        ci_upper=interval[1] if interval else None,
    )
