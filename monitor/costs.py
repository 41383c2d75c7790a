"""Pure: the fixed per-call cost and the per-FLOP rate of each device, from its measurements."""

from __future__ import annotations

from collections.abc import Iterable

from monitor.model import CostModel, Measurement, Mode


def cost_models(measurements: Iterable[Measurement]) -> tuple[CostModel, ...]:
    """One model per (backend, device, dtype, mode) that has its n=1 point measured.

    A 1x1 product does two FLOPs, so its time is the fixed cost: dispatch, launch and
    synchronisation (plus the copies in end_to_end mode). The rate at the largest size, after
    taking the fixed cost off, is what each further FLOP costs.
    """
    curves: dict[tuple[str, str, str, Mode], dict[int, float]] = {}
    for m in measurements:
        curves.setdefault((m.key.backend, m.key.device, m.key.dtype, m.key.mode), {})[m.key.size] = m.timing.median_s
    models = []
    for (backend, device, dtype, mode), times in sorted(curves.items()):
        if 1 not in times:
            continue
        fixed = times[1]
        largest = max(times)
        excess = times[largest] - fixed
        models.append(
            CostModel(
                backend=backend,
                device=device,
                dtype=dtype,
                mode=mode,
                fixed_s=fixed,
                peak_flops=2.0 * largest**3 / excess if largest > 1 and excess > 0 else None,
                largest_size=largest,
            )
        )
    return tuple(models)
