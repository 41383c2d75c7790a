"""The statistics the guard judges by, kept by the service and read by the worker alike (pure, stdlib only): the host
reference's idle figure over recent sweeps, the top of a point's idle range over its calm sweeps, the usual load
of other programs, and the gate from which a point counts as timed beside them. ``model`` holds the values;
``measure/guard/rule.py`` decides from them; ``service/state.py`` keeps the sweeps they are read from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

# A point's idle range needs this many calm sweeps' medians of it; fewer, and it is not judged by its own.
POINT_MEDIANS_TO_JUDGE = 4
_UPPER_DECILE_FROM = 10  # calm sweeps from which the range's top is their upper decile, not the slowest
# Sweeps whose typical load of other programs must be kept before the node's usual load is read from them.
OTHERS_SWEEPS_TO_JUDGE = 10
_LOWER_HALF_FROM = 4  # of fewer sweeps the lower half is one sweep: no spread between them


def relative_iqr(median_s: float, iqr_s: float) -> float:
    """A spread against its level (a timing's, what the noise target is held to; the host reference's); infinite at
    a zero median (a broken clock), which no target accepts."""
    return iqr_s / median_s if median_s > 0 else math.inf


def idle_figure(medians_s: Sequence[float], spreads: Sequence[float]) -> tuple[float, float] | None:
    """The idle figure of recent sweeps: the lower decile of their medians (one sweep's own median); as
    spread, the larger of their typical spread within a sweep and how far their medians move between
    sweeps (each sweep is its own process, and on a VM a fresh process can run its host side 10-30%
    slower or faster).

    Why the lower decile: a slowed host only ever reads slower, so the figure must not follow sweeps the host
    or a neighbour slowed. The median, and then the first quartile, did follow a host slow for most of a
    stretch, and points slowed 1.4-1.8x were then judged against it and published; the lower decile lets a
    lasting change in once nine sweeps in ten read it (about a day at the default schedule). From two sweeps
    on, as from many: the median of a young service's first sweeps sat between the two states of a host that
    slows by itself. Of three or fewer the lower half is one sweep, so the spread is theirs within only.
    The spread between sweeps is read from the lower half too, against the figure (the first quartile less
    the figure, and twice median less first quartile): slowed sweeps in the upper half would widen the
    allowance until slowed points pass. The measurements behind each step: benchmarks/README.md's index
    ("HostReference.of")."""
    if not medians_s:
        return None
    within = statistics.median(spreads)
    if len(medians_s) == 1:
        return medians_s[0], within
    figure = statistics.quantiles(medians_s, n=10, method="inclusive")[0]
    if len(medians_s) < _LOWER_HALF_FROM:
        return figure, within
    q1, median, _ = statistics.quantiles(medians_s, n=4, method="inclusive")
    # From the lower half, against the figure: how far a typical sweep reads above it, plus as much again
    # above the first quartile, so that a host whose sweeps move apart between processes is allowed as
    # far past its typical reading as with the first quartile for a figure.
    between = (q1 - figure) + 2 * (median - q1)
    return figure, max(within, relative_iqr(figure, between))


def range_top(medians_s: Sequence[float]) -> float | None:
    """The top of a point's idle range, once ``POINT_MEDIANS_TO_JUDGE`` calm sweeps timed it: the slowest of them,
    or from ``_UPPER_DECILE_FROM`` on their upper decile (one calm sweep that ran slow among dozens does not
    widen it for half a day; among a few, the slowest is the range a person would read off them)."""
    if len(medians_s) < POINT_MEDIANS_TO_JUDGE:
        return None
    if len(medians_s) < _UPPER_DECILE_FROM:
        return max(medians_s)
    return statistics.quantiles(medians_s, n=10, method="inclusive")[-1]


def usual_others(typical: Sequence[float]) -> float | None:
    """What other programs used of the host in at least nine of the kept sweeps in ten, in cores: each sweep's
    typical load, the one a tenth of the way up (an order statistic, not interpolated, so that it is a load nine
    sweeps in ten reached); None until ``OTHERS_SWEEPS_TO_JUDGE`` sweeps say (a service that starts beside a
    neighbour must not take it for the node's usual load). A node whose data loaders always use a core or two is
    calm at that load (``others_gate``); a neighbour there in fewer than nine sweeps of ten cannot raise it, one
    there in 87 of the 96 kept (about 22 hours at the default schedule) becomes usual."""
    if len(typical) < OTHERS_SWEEPS_TO_JUDGE:
        return None
    return sorted(typical)[len(typical) // 10]


def others_gate(usual_others: float, gate: float) -> float:
    """The load of other programs (cores) from which a point counts as timed beside others: ``gate``
    (``guard.range_others_cores``) on a node quiet by it in at least one recent sweep of ten; on a node whose
    others use the gate or more in nine sweeps of ten (``ServiceState.usual_others``), that usual load plus the gate
    (a step: at a usual load of just the gate, the gate doubles). Not the usual load plus the gate everywhere: on a
    quiet node whose others read 0.28-0.52 cores, a sweep with 0.82 cores of the hypervisor's steal (its host-bound
    points 1.07-2.45x) would have counted calm. A gate of 0 stays 0 (beside others always)."""
    return gate if gate <= 0 or usual_others < gate else usual_others + gate
