"""Pure: the fixed per-call cost and the per-FLOP rate of each device, from its measurements."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from crossover_monitor.model import CostModel, Measurement, curves, matmul_flops


def cost_models(measurements: Iterable[Measurement]) -> tuple[CostModel, ...]:
    """One model per (backend, device, dtype, mode) that has its n=1 point measured.

    A 1x1 product does two FLOPs, so its time is the fixed cost: dispatch, launch and
    synchronisation (plus the copies in end_to_end mode). The rate at the largest size, after
    taking the fixed cost off, is what each further FLOP costs.
    """
    models = []
    for key, points in sorted(curves(measurements).items(), key=lambda item: dataclasses.astuple(item[0])):
        if 1 not in points:
            continue
        fixed = points[1].timing.median_s
        largest = max(points)
        excess = points[largest].timing.median_s - fixed
        models.append(
            CostModel(
                backend=key.backend,
                device=key.device,
                dtype=key.dtype,
                mode=key.mode,
                fixed_s=fixed,
                peak_flops=matmul_flops(largest) / excess if largest > 1 and excess > 0 else None,
                largest_size=largest,
            )
        )
    return tuple(models)
