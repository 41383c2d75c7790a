"""Pure: from measurements to the crossover size of each GPU against the CPU, with its uncertainty.

A point's timed level moves between visits (fresh operands, the host thread's placement) by far
more than its blocks within one visit show: on an H200 with TensorFlow, 6-30% against 1-4%. The
sizes around a crossover are therefore timed in several visits, the CPU's and the GPU's k-th visits
of a size together (so that what they share, e.g. the framework's dispatch cost, cancels in their
ratio), and the crossover is located on the visits' median speed-ups: where a straight line
through the revisited sizes around the last change of lead crosses zero, so that no single size's
level decides it. Its interval comes from resampling those visits, not the blocks within one.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from crossover_monitor.model import (
    Crossover,
    CrossoverState,
    DeviceInfo,
    Measurement,
    Mode,
    PointKey,
    RecentCrossovers,
    Timing,
    gpu_cpu_pairs,
    speedup,
)
from crossover_monitor.model import curves as group_curves

BOOTSTRAP_RESAMPLES = 200
CONFIDENCE = 0.95
# Below this share of resamples that find a crossover, the interval would describe noise.
_MIN_FOUND_SHARE = 0.5
# A win of the GPU below the crossover makes the curves cross twice only when this share of the
# resamples agree on it: where the curves tie, noise alone makes either one win here and there.
_CLEAR_WIN_SHARE = 0.95
# The served interval also covers how far n* moved from sweep to sweep lately: this share of the
# moves between the latest RECENT_SWEEPS sweeps before it (95%, as the interval is), once there are
# _MIN_MOVES of them, and never their largest: a real change is one large move, and must not widen
# the interval that would show it. (90% let one of 8 PyTorch idle sweeps, +21%, fire a false alert
# in 10 simulated months: benchmarks/replay.py.)
RECENT_SWEEPS = 25
_MIN_MOVES = 4
_MOVE_SHARE = 0.95
# Until then, a service with little history says so with a wider interval: x1.3 either side, above the move
# between consecutive idle sweeps that 95% of them stayed within in the widest recorded case (H200, PyTorch
# compute x1.26, end_to_end x1.25; TensorFlow x1.14-1.15). Drawn as 200 fresh services' first 6 sweeps
# from the recorded idle sweeps (benchmarks/replay.py --young-only), the next n* landed inside in 96-100%
# of pairs per backend and mode, against 53-93% without it (issue 33 saw 9 of 14 on real starts).
_YOUNG_MOVE = math.log(1.3)
# The interval is for where the next sweep's n* lands, not where the true n* is: the next sweep's
# estimate has its own error, so the difference of two has sqrt(2) times the spread of one.
_NEXT_SWEEP_WIDENING = math.sqrt(2)
# A size missing from a curve is taken to have the lead its neighbours share only where they lead by more
# than this (log speed-up: 1.35x). In 256 recorded sweeps (benchmarks/crossover_gaps.py), of 1783
# sizes between two neighbours that shared a lead, 19 led the other way, each beside a neighbour leading by at
# most 1.26x (none of 1211 where both led by more than 1.35x); an H100's GPU points at 432 and 512 withheld
# between end_to_end wins of 1.04x (360) and 1.07x (728) had left n* = 344 published where the curves crossed
# three times.
_CLEAR_LEAD = math.log(1.35)
# n* is fitted through the revisited sizes within this factor of the bracket. Each sweep's levels
# move per size and per process (on an H200 with TensorFlow's end_to_end, 5-10% a size between
# fresh processes, beyond what 7 visits average out), and the curves there meet at a shallow angle,
# so the two bracketing sizes alone put n* anywhere in a x1.7 span; a line through the five to nine
# sizes around them halves the variance of log n* between idle sweeps (log SD 0.153 -> 0.103;
# PyTorch end_to_end 0.089 -> 0.077, TensorFlow compute 0.039 -> 0.032; PyTorch compute, whose steep
# curve two sizes already pin, 0.063 -> 0.077: benchmarks/README.md, "Fourth session").
_FIT_REACH = 1.5
_FIT_MIN_POINTS = 3


@dataclass(frozen=True)
class SpeedupPoint:
    """One size: ln(t_cpu / t_gpu) of each paired visit (a single value for a point timed once)."""

    size: int
    log_ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.log_ratios)


@dataclass(frozen=True)
class Located:
    """Where the GPU starts to win over a curve of speed-ups."""

    state: CrossoverState
    size: float | None = None
    lower: int | None = None  # the measured sizes either side of n*
    upper: int | None = None
    interval: tuple[float, float] | None = None  # where the next sweep's n* lands (95%), when visits show it


def last_crossing(points: Sequence[tuple[int, float]]) -> tuple[CrossoverState, float | None, int | None, int | None]:
    """The smallest size from which the GPU is faster at every larger size, from sorted (size, log speed-up).

    Interpolated where the log speed-up crosses zero, linear in log n, between the two bracketing
    sizes. Wins below the bracket are not looked at here.
    """
    faster = [r > 0 for _, r in points]
    if not faster[-1]:
        return CrossoverState.GPU_NEVER_FASTER, None, None, None
    first = len(faster)
    while first > 0 and faster[first - 1]:
        first -= 1
    if first == 0:
        return CrossoverState.GPU_ALWAYS_FASTER, None, None, None
    (n0, r0), (n1, r1) = points[first - 1], points[first]
    fraction = -r0 / (r1 - r0)
    size = math.exp(math.log(n0) + fraction * (math.log(n1) - math.log(n0)))
    return CrossoverState.FOUND, size, n0, n1


def locate(points: Sequence[SpeedupPoint]) -> Located:
    """The crossover of one GPU against one CPU from its speed-up points, with its interval.

    n* is the last crossing of the points' median speed-ups, fitted through the revisited sizes
    around it where there are enough of them (``_crossing``). A win of the GPU at a size below that
    last change of lead (or anywhere, when the GPU loses at the largest size) means the curves cross more than once
    (AMBIGUOUS) only when the visits agree on that win; a point timed once is taken at its word.
    The interval is the spread of n* over resampled visits, widened to where the next sweep's n*
    should land if nothing changed; None when no point was timed in several visits, or too few
    resamples find a crossover.
    """
    if not points:
        raise ValueError("no points to compare")
    points = sorted(points, key=lambda p: p.size)
    state, size, lower, upper = _crossing(points, [p.median for p in points])
    # Wins count below the last change of lead on the medians, wherever the fit put n* near it.
    change = last_crossing([(p.size, p.median) for p in points])[2]
    below = change if change is not None else math.inf
    always = state is CrossoverState.GPU_ALWAYS_FASTER
    wins = [i for i, p in enumerate(points) if p.size < below and p.median > 0 and not always]
    rng = random.Random(0)  # fixed seed: the same measurements always give the same answer
    resamples = BOOTSTRAP_RESAMPLES
    revisited = [(i, p.log_ratios, _smoothing(p.log_ratios)) for i, p in enumerate(points) if len(p.log_ratios) > 1]
    found: list[float] = []
    win_counts = dict.fromkeys(wins, 0)
    for _ in range(resamples if revisited else 0):
        medians = [p.median for p in points]
        for i, ratios, smoothing in revisited:
            # A median of a few visits resampled takes only a few values: smoothed, it shows its spread.
            medians[i] = statistics.median(rng.choices(ratios, k=len(ratios))) + rng.gauss(0, smoothing)
        for i in wins:
            win_counts[i] += medians[i] > 0
        # Each resample takes whichever path (line or bracket) its medians allow, as the next sweep's
        # visits will: a sweep near the edge of fitting lands where either path puts it.
        resampled = _crossing(points, medians)
        if resampled[0] is CrossoverState.FOUND and resampled[1] is not None:
            found.append(resampled[1])
    clear = [i for i in wins if len(points[i].log_ratios) == 1 or win_counts[i] >= _CLEAR_WIN_SHARE * resamples]
    if clear:
        return Located(CrossoverState.AMBIGUOUS)
    if state is not CrossoverState.FOUND or size is None:
        return Located(state)
    return Located(state, size, lower, upper, _next_sweep_interval(size, found, resamples))


def _crossing(
    points: Sequence[SpeedupPoint], medians: Sequence[float]
) -> tuple[CrossoverState, float | None, int | None, int | None]:
    """``last_crossing`` of these medians of the sorted points, with n* fitted where the visits allow.

    Where at least ``_FIT_MIN_POINTS`` sizes within ``_FIT_REACH`` of the bracket were timed in
    several visits, n* is where the least-squares line through their (log n, median log speed-up)
    crosses zero, and the bracket becomes the measured sizes either side of it. The bracket's own
    interpolation stands where that line does not rise with n or crosses outside those sizes.
    """
    sizes = [p.size for p in points]
    state, size, lower, upper = last_crossing(list(zip(sizes, medians, strict=True)))
    if state is not CrossoverState.FOUND or lower is None or upper is None:
        return state, size, lower, upper
    near = [
        (math.log(p.size), r)
        for p, r in zip(points, medians, strict=True)
        if len(p.log_ratios) > 1 and lower / _FIT_REACH <= p.size <= upper * _FIT_REACH
    ]
    if len(near) < _FIT_MIN_POINTS:
        return state, size, lower, upper
    xs, ys = [x for x, _ in near], [y for _, y in near]
    x_mean, y_mean = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in near) / spread if spread > 0 else 0.0
    if slope <= 0:
        return state, size, lower, upper
    zero = x_mean - y_mean / slope
    if not xs[0] <= zero <= xs[-1]:
        return state, size, lower, upper
    # The measured sizes either side, found on the log scale the zero was checked on (exp() may round
    # it past an end size); a zero on the largest size lies between it and the one before.
    logs = [math.log(n) for n in sizes]
    above = min(bisect.bisect_right(logs, zero), len(sizes) - 1)
    below, above = sizes[above - 1], sizes[above]
    return state, min(max(math.exp(zero), below), above), below, above


def _smoothing(ratios: Sequence[float]) -> float:
    """The spread of a median of these visits, sigma / sqrt(k), sigma from their median absolute deviation."""
    middle = statistics.median(ratios)
    sigma = 1.4826 * statistics.median(abs(r - middle) for r in ratios)
    return sigma / math.sqrt(len(ratios))


def _next_sweep_interval(size: float, found: Sequence[float], resamples: int) -> tuple[float, float] | None:
    """The resampled crossings' 95% range, widened about their median to where the next sweep's n* lands."""
    if not found or len(found) < resamples * _MIN_FOUND_SHARE:
        return None
    tail = (1 - CONFIDENCE) / 2
    ordered = sorted(found)
    middle = statistics.median(ordered)
    low = middle * (ordered[int(tail * (len(ordered) - 1))] / middle) ** _NEXT_SWEEP_WIDENING
    high = middle * (ordered[math.ceil((1 - tail) * (len(ordered) - 1))] / middle) ** _NEXT_SWEEP_WIDENING
    return min(low, size), max(high, size)


def crossing_span(points: Sequence[SpeedupPoint]) -> tuple[int, int] | None:
    """The measured sizes enclosing every change of which device is faster (on median speed-ups); None if none."""
    ordered = sorted(points, key=lambda p: p.size)
    faster = [p.median > 0 for p in ordered]
    changes = [i for i in range(1, len(ordered)) if faster[i] != faster[i - 1]]
    if not changes:
        return None
    return ordered[changes[0] - 1].size, ordered[changes[-1]].size


def find_crossover(
    curve: Sequence[tuple[int, float, float]],
) -> tuple[CrossoverState, float | None, int | None, int | None]:
    """State, n*, and bracket from ``(size, cpu_seconds, gpu_seconds)`` points, each timed once.

    n* is the smallest size from which the GPU is faster at every larger measured size,
    interpolated where log(t_cpu / t_gpu) crosses zero, linear in log n, between the two
    bracketing sizes. If the GPU was also faster somewhere below the bracket, the curves cross
    more than once and the state is AMBIGUOUS, with no size.
    """
    found = locate([SpeedupPoint(n, (_log_speedup(cpu, gpu),)) for n, cpu, gpu in curve])
    return found.state, found.size, found.lower, found.upper


def speedup_point(size: int, cpu: Timing, gpu: Timing) -> SpeedupPoint:
    """The paired visits of one size: the k-th visits of the CPU and the GPU were timed together.

    Visits are paired only when both have as many (the runner keeps a size's rounds whole); else
    the point counts as timed once, at its medians.
    """
    if cpu.visits_s and len(cpu.visits_s) == len(gpu.visits_s):
        pairs = zip(cpu.visits_s, gpu.visits_s, strict=True)
        return SpeedupPoint(size, tuple(_log_speedup(c, g) for c, g in pairs))
    return SpeedupPoint(size, (_log_speedup(cpu.median_s, gpu.median_s),))


def _log_speedup(cpu_s: float, gpu_s: float) -> float:
    """The speed-up on the scale the crossover is located on: 0 where the GPU and the CPU tie."""
    return math.log(speedup(cpu_s, gpu_s))


_Curves = Mapping[tuple[str, str, str, Mode], Mapping[int, Timing]]


def crossovers(
    devices: Iterable[DeviceInfo], measurements: Iterable[Measurement], withheld: Iterable[PointKey] = ()
) -> tuple[Crossover, ...]:
    """One crossover per (GPU, CPU, dtype, mode) of each backend that has common sizes measured.

    A CPU with no GPU found beside it gets the explicit state NO_GPU (gpu="none"); a GPU that was
    found but measured nothing gets no crossover (its ``matmul_device_up`` says why). ``withheld``: the
    configured sizes whose points were withheld alone (the host slowed them); with the sizes between timed on
    one side only, a pair whose state or n* such a gap could have changed gets the WITHHELD state instead
    (``_gap_could_move``).
    """
    # The n=1 fixed-cost point was not asked for: it must not sway the state.
    curves = {
        (key.backend, key.device, key.dtype, key.mode): {n: m.timing for n, m in points.items()}
        for key, points in group_curves(measurements, roles=("sweep", "refine")).items()
    }
    gaps: dict[tuple[str, str, str, str], set[int]] = {}
    for point in withheld:
        gaps.setdefault((point.backend, point.device, point.dtype, point.mode), set()).add(point.size)
    pairs = gpu_cpu_pairs(devices)
    found: list[Crossover] = []
    for backend, dtype, mode in sorted({(k[0], k[2], k[3]) for k in curves}):
        for cpu, gpus in pairs:
            if cpu.backend != backend:
                continue
            paired = [
                _pair(
                    curves,
                    gaps,
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
            ]
            found.extend(p for p in paired if p is not None)
            if not paired and (backend, cpu.device, dtype, mode) in curves:
                found.append(
                    Crossover(
                        backend=backend, gpu="none", cpu=cpu.device, dtype=dtype, mode=mode, state=CrossoverState.NO_GPU
                    )
                )
    return tuple(found)


def _pair(curves: _Curves, gaps: Mapping[tuple[str, str, str, str], set[int]], template: Crossover) -> Crossover | None:
    """The crossover for the pair named by ``template``, or None if they share no measured size."""
    gpu_key = (template.backend, template.gpu, template.dtype, template.mode)
    cpu_key = (template.backend, template.cpu, template.dtype, template.mode)
    gpu, cpu = curves.get(gpu_key, {}), curves.get(cpu_key, {})
    common = sorted(set(gpu) & set(cpu))
    # A size timed on one side only between two both timed (a refinement's point the host slowed on the other)
    # is a gap as well. Not past the common sizes: there the CPU was skipped where the GPU already won by far
    # (skip_cpu_above_speedup), or a point failed whole (its failure is reported), and a GPU that measured
    # nothing has no crossover, not a withheld one.
    one_sided = {n for n in set(gpu) ^ set(cpu) if common and common[0] < n < common[-1]}
    gap = gaps.get(gpu_key, set()) | gaps.get(cpu_key, set()) | one_sided
    points = [speedup_point(n, cpu[n], gpu[n]) for n in common]
    if gap and (not points or _gap_could_move(points, gap)):
        return replace(template, state=CrossoverState.WITHHELD)
    if not points:
        return None
    found = locate(points)
    interval = found.interval
    return replace(
        template,
        state=found.state,
        size=found.size,
        lower=found.lower,
        upper=found.upper,
        ci_lower=interval[0] if interval else None,
        ci_upper=interval[1] if interval else None,
    )


def _gap_could_move(points: Sequence[SpeedupPoint], gap: Iterable[int]) -> bool:
    """Whether sizes missing from a curve could change its state or n*: one between two sizes with different
    leads (the change of lead is inside it), one below the smallest size where the GPU already wins there
    (it may lose below, or not), one above the largest where it still loses; and one beside a size whose lead
    is not clear (``_CLEAR_LEAD``), where the curves run close enough for a point between to lead the other way.

    Elsewhere a point at the missing size would have the lead of both its neighbours (or of the one it
    has, at an end where that lead is the curve's expected one), as the timings either side say.
    """
    ordered = sorted(points, key=lambda p: p.size)
    for size in gap:
        below = [p.median for p in ordered if p.size < size][-1:]
        above = [p.median for p in ordered if p.size > size][:1]
        if not below:  # at the small end: it keeps the CPU's lead only below a clear CPU win
            could = not above or above[0] > -_CLEAR_LEAD
        elif not above:  # at the large end: the GPU's, above a clear GPU win
            could = below[0] < _CLEAR_LEAD
        else:
            could = (below[0] > 0) != (above[0] > 0) or min(abs(below[0]), abs(above[0])) < _CLEAR_LEAD
        if could:
            return True
    return False


def with_recent_moves(
    crossovers: Sequence[Crossover], recent: Sequence[RecentCrossovers], *, fresh_at: float
) -> tuple[tuple[Crossover, ...], tuple[RecentCrossovers, ...]]:
    """The crossovers with the intervals of those found in the sweep that ended at ``fresh_at`` widened, and
    the recent n* with theirs added.

    One sweep's visits show how much its points move within it; between sweeps (fresh processes,
    the host's day) n* can move further. So each fresh n* serves an interval at least as wide as
    the move from one sweep to the next that the sweeps before it rarely exceeded (``_MOVE_SHARE``
    of them, never the largest), about the new n*. Crossovers carried over from an earlier sweep
    stay as they were; the recent n* of a crossover missing from this sweep (a device that failed
    once) are kept for when it is back.
    """
    kept = {r.key: r.sizes for r in recent}
    served: list[Crossover] = []
    for crossover in crossovers:
        if crossover.derived_at == fresh_at and crossover.state is CrossoverState.FOUND and crossover.size is not None:
            earlier = kept.get(crossover.key, ())
            served.append(_widened(crossover, earlier))
            kept[crossover.key] = (*earlier, crossover.size)[-RECENT_SWEEPS:]
        else:
            served.append(crossover)
    history = tuple(
        RecentCrossovers(backend=k[0], gpu=k[1], cpu=k[2], dtype=k[3], mode=k[4], sizes=v) for k, v in kept.items()
    )
    return tuple(served), history


def _widened(c: Crossover, earlier: Sequence[float]) -> Crossover:
    """``c`` with an interval at least as wide as the moves between the ``earlier`` n* mostly were (with too few
    of them to say, as the widest recorded moves between idle sweeps)."""
    assert c.size is not None  # noqa: S101 - callers check
    moves = sorted(abs(math.log(b / a)) for a, b in itertools.pairwise(earlier))
    if len(moves) < _MIN_MOVES:
        move = _YOUNG_MOVE
    else:
        move = moves[min(math.ceil(_MOVE_SHARE * len(moves)), len(moves) - 1) - 1]
    low, high = c.size * math.exp(-move), c.size * math.exp(move)
    lower = low if c.ci_lower is None else min(c.ci_lower, low)
    upper = high if c.ci_upper is None else max(c.ci_upper, high)
    return replace(c, ci_lower=lower, ci_upper=upper)
