"""The crossover: synthetic curves with a known answer, and every explicit state."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from crossover_monitor.analysis.crossover import (
    RECENT_SWEEPS,
    SpeedupPoint,
    crossovers,
    find_crossover,
    last_crossing,
    locate,
    with_recent_moves,
)
from crossover_monitor.model import (
    Crossover,
    CrossoverState,
    DeviceInfo,
    Measurement,
    Mode,
    PointKey,
    RecentCrossovers,
)
from tests import builders
from tests.builders import measurement

SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def _measurement(device: str, size: int, seconds: float, mode: Mode = "compute", dtype: str = "float32") -> Measurement:
    return measurement(device, size, seconds, mode=mode, dtype=dtype)


CPU = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
GPU0 = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
GPU1 = DeviceInfo(backend="fake", device="/GPU:1", kind="gpu", name="gpu")


@given(
    n0=st.floats(min_value=1.5, max_value=4000.0),
    slope=st.floats(min_value=0.1, max_value=5.0),
)
def test_interpolation_is_exact_when_log_ratio_is_linear_in_log_n(n0: float, slope: float) -> None:
    """If t_cpu/t_gpu = (n/n0)^k, the interpolated crossover is n0 itself, inside its bracket."""
    assume(all(abs(math.log(n / n0)) > 1e-9 for n in SIZES))
    curve = [(n, (n / n0) ** slope, 1.0) for n in SIZES]
    state, size, lower, upper = find_crossover(curve)
    assert state is CrossoverState.FOUND
    assert size == pytest.approx(n0, rel=1e-9)
    assert lower is not None
    assert upper is not None
    assert lower < n0 < upper


@given(
    cpu_rate=st.floats(min_value=1e9, max_value=1e11),
    gpu_speedup=st.floats(min_value=5.0, max_value=1000.0),
    launch=st.floats(min_value=1e-6, max_value=1e-3),
)
def test_realistic_curves_bracket_the_true_crossover(cpu_rate: float, gpu_speedup: float, launch: float) -> None:
    """CPU = 2n³/rate; GPU = launch + 2n³/(speedup·rate): n* lies in the bracket that holds the true n."""
    true_n = (launch / (2 / cpu_rate - 2 / (cpu_rate * gpu_speedup))) ** (1 / 3)
    assume(SIZES[0] < true_n < SIZES[-1])
    assume(all(abs(n / true_n - 1) > 1e-6 for n in SIZES))
    curve = [(n, 2 * n**3 / cpu_rate, launch + 2 * n**3 / (cpu_rate * gpu_speedup)) for n in SIZES]
    state, size, lower, upper = find_crossover(curve)
    assert state is CrossoverState.FOUND
    assert lower is not None
    assert upper is not None
    assert size is not None
    assert lower < true_n < upper
    assert lower <= size <= upper
    assert upper == 2 * lower  # adjacent measured sizes


def test_gpu_never_faster() -> None:
    """A GPU slower at every size gives the never-faster state and no number."""
    assert find_crossover([(n, 1.0, 2.0) for n in SIZES]) == (CrossoverState.GPU_NEVER_FASTER, None, None, None)


def test_gpu_always_faster() -> None:
    """A GPU faster at every size gives the always-faster state and no number."""
    assert find_crossover([(n, 2.0, 1.0) for n in SIZES]) == (CrossoverState.GPU_ALWAYS_FASTER, None, None, None)


def test_equal_times_do_not_count_as_gpu_faster() -> None:
    """A tie is not a win: equal times at every size mean the GPU is never faster."""
    assert find_crossover([(n, 1.0, 1.0) for n in SIZES])[0] is CrossoverState.GPU_NEVER_FASTER


def test_curves_that_cross_twice_are_ambiguous() -> None:
    """GPU faster, then slower, then faster again: ambiguous, and no made-up number."""
    curve = [(8, 2.0, 1.0), (16, 1.0, 2.0), (32, 1.0, 2.0), (64, 2.0, 1.0)]
    assert find_crossover(curve) == (CrossoverState.AMBIGUOUS, None, None, None)


def test_gpu_faster_only_in_the_middle_is_ambiguous() -> None:
    """GPU wins at a middle size but loses at the largest: not 'never faster', ambiguous."""
    curve = [(8, 1.0, 2.0), (16, 2.0, 1.0), (32, 1.0, 2.0)]
    assert find_crossover(curve)[0] is CrossoverState.AMBIGUOUS


def test_points_are_sorted_by_size() -> None:
    """The order of the input does not matter."""
    curve = [(64, 4.0, 1.0), (16, 1.0, 4.0), (32, 1.0, 1.0)]
    state, size, lower, upper = find_crossover(curve)
    assert (state, lower, upper) == (CrossoverState.FOUND, 32, 64)
    assert size == pytest.approx(32)


def test_crossovers_pair_each_gpu_with_the_cpu_per_mode() -> None:
    """Each GPU gets its own crossover per dtype and mode, from the sizes both devices measured."""
    measurements = []
    for n in (16, 32, 64, 128):
        measurements.append(_measurement("/CPU:0", n, n**3 * 1e-9))
        measurements.append(_measurement("/GPU:0", n, 1e-4 + n**3 * 1e-11))
        measurements.append(_measurement("/GPU:1", n, 1e-3 + n**3 * 1e-11))
    found = {c.gpu: c for c in crossovers([CPU, GPU0, GPU1], measurements)}
    assert set(found) == {"/GPU:0", "/GPU:1"}
    assert found["/GPU:0"].state is CrossoverState.FOUND
    assert (found["/GPU:0"].lower, found["/GPU:0"].upper) == (32, 64)
    assert found["/GPU:1"].state is CrossoverState.FOUND
    assert (found["/GPU:1"].lower, found["/GPU:1"].upper) == (64, 128)
    assert all(c.cpu == "/CPU:0" and c.mode == "compute" for c in found.values())


def test_cpu_alone_says_no_gpu() -> None:
    """With only the CPU measured, each dtype and mode gets the explicit no_gpu state."""
    measurements = [_measurement("/CPU:0", n, 1.0, mode) for n in (1, 2) for mode in ("compute", "end_to_end")]
    found = crossovers([CPU], measurements)
    assert {(c.mode, c.state, c.gpu, c.size) for c in found} == {
        ("compute", CrossoverState.NO_GPU, "none", None),
        ("end_to_end", CrossoverState.NO_GPU, "none", None),
    }


def test_gpu_that_measured_nothing_gives_no_crossover() -> None:
    """A GPU that failed before any measurement leaves no crossover, not a made-up state."""
    measurements = [_measurement("/CPU:0", n, 1.0) for n in (1, 2)]
    assert crossovers([CPU, GPU0], measurements) == ()


def _gapped(cpu_s: dict[int, float], gpu_s: dict[int, float], gap: tuple[str, int]) -> Crossover:
    """The one crossover of a CPU and a GPU measured at the sizes given, ``gap`` (device, size) withheld alone."""
    measurements = [_measurement("/CPU:0", n, t) for n, t in cpu_s.items() if ("/CPU:0", n) != gap]
    measurements += [_measurement("/GPU:0", n, t) for n, t in gpu_s.items() if ("/GPU:0", n) != gap]
    device, size = gap
    withheld = [PointKey(backend="fake", device=device, dtype="float32", mode="compute", size=size)]
    (found,) = crossovers([CPU, GPU0], measurements, withheld)
    return found


@pytest.mark.parametrize(
    ("gap", "state"),
    [
        (("/GPU:0", 16), CrossoverState.FOUND),  # below 32, where the CPU already wins
        (("/CPU:0", 32), CrossoverState.FOUND),  # between 16 and 64, both won by the CPU: the bracket stays 64-128
        (("/GPU:0", 64), CrossoverState.WITHHELD),  # the CPU wins at 32, the GPU at 128: the change may be at 64
        (("/CPU:0", 128), CrossoverState.WITHHELD),  # 64 (CPU) and 256 (GPU) either side
        (("/GPU:0", 512), CrossoverState.FOUND),  # above 256, where the GPU already wins
    ],
)
def test_a_gap_withholds_the_crossover_only_where_a_point_there_could_move_it(
    gap: tuple[str, int], state: CrossoverState
) -> None:
    """The CPU wins up to 64, the GPU from 128: a size withheld alone (the host slowed it) withholds the
    crossover where the lead changes across it, and nowhere else."""
    sizes = (16, 32, 64, 128, 256, 512)
    cpu = {n: n**3 * 1e-9 for n in sizes}
    gpu = {n: 1e-3 + n**3 * 1e-11 for n in sizes}
    found = _gapped(cpu, gpu, gap)
    assert found.state is state
    if state is CrossoverState.FOUND:
        assert (found.lower, found.upper) == (64, 128)


def test_a_gap_at_an_end_withholds_a_state_it_could_change() -> None:
    """The GPU wins at every size measured: a withheld smallest size could have been a CPU win (a crossover),
    so the state is withheld; where the CPU wins everywhere, a withheld largest size likewise."""
    sizes = (16, 32, 64)
    always = _gapped(dict.fromkeys(sizes, 1.0), dict.fromkeys(sizes, 0.5), ("/GPU:0", 16))
    assert always.state is CrossoverState.WITHHELD
    never = _gapped(dict.fromkeys(sizes, 0.5), dict.fromkeys(sizes, 1.0), ("/CPU:0", 64))
    assert never.state is CrossoverState.WITHHELD
    assert _gapped(dict.fromkeys(sizes, 0.5), dict.fromkeys(sizes, 1.0), ("/CPU:0", 16)).state is (
        CrossoverState.GPU_NEVER_FASTER
    )


# The end_to_end medians (seconds) of an idle TensorFlow sweep on an H100, 2026-12-07
# (benchmarks/results/shared-node-tensorflow-cpu-timeline-h100-2026-12-07.json, idle sweep 1): the host slowed
# its GPU points at 432 (a refinement) and 512, which were withheld. The curves ran within 1.04-1.07x of each
# other from 360 to 728 and crossed three times in the sweeps around it; published, n* was 344.
_H100_E2E_CPU = {96: 64.3e-6, 128: 84.5e-6, 160: 116.6e-6, 256: 342.4e-6, 304: 573.9e-6, 360: 834.8e-6}
_H100_E2E_CPU |= {432: 909.8e-6, 512: 1046.8e-6, 728: 2277.99e-6, 1024: 7296.1e-6, 2048: 32720.9e-6}
_H100_E2E_GPU = {96: 259.8e-6, 128: 347.7e-6, 160: 323.5e-6, 256: 576.0e-6, 304: 711.8e-6, 360: 804.1e-6}
_H100_E2E_GPU |= {728: 2119.3e-6, 1024: 4037.3e-6, 2048: 15079.7e-6}


def test_a_gap_between_sizes_the_gpu_wins_by_little_withholds_the_crossover() -> None:
    """The recorded sweep: its GPU points at 432 (timed on the CPU only) and 512 (withheld) lie between GPU
    wins of 1.04x and 1.07x, where a point may lead the other way: the crossover is withheld, not n* = 344."""
    found = _gapped(_H100_E2E_CPU, _H100_E2E_GPU, ("/GPU:0", 512))
    assert found.state is CrossoverState.WITHHELD
    # The same sizes with the GPU's lead from 360 on clear (1.5x): the missing points would lead as both
    # neighbours do, so the crossover stands, between 304 and 360.
    clear = {n: t if n < 360 else _H100_E2E_CPU[n] / 1.5 for n, t in _H100_E2E_GPU.items()}
    found = _gapped(_H100_E2E_CPU, clear, ("/GPU:0", 512))
    assert found.state is CrossoverState.FOUND
    assert (found.lower, found.upper) == (304, 360)


@pytest.mark.parametrize(
    ("lead", "state"),
    [(1.2, CrossoverState.WITHHELD), (1.3, CrossoverState.WITHHELD), (1.4, CrossoverState.FOUND)],
)
def test_a_size_timed_on_one_side_only_is_a_gap_unless_its_neighbours_lead_clearly(
    lead: float, state: CrossoverState
) -> None:
    """A refinement's GPU point the guard withheld leaves its size on the CPU's curve only (no withheld point
    is named for it): it withholds the crossover as a named gap would, where the GPU wins around it by less
    than 1.35x."""
    cpu = {64: 1.0, 128: 1.0, 192: 1.0, 256: 1.0, 512: 1.0}
    gpu = {64: 2.0, 128: 1 / lead, 256: 1 / lead, 512: 0.1}
    measurements = [_measurement("/CPU:0", n, t) for n, t in cpu.items()]
    measurements += [_measurement("/GPU:0", n, t) for n, t in gpu.items()]
    (found,) = crossovers([CPU, GPU0], measurements)
    assert found.state is state
    # Without the size 192 there is no gap: the same curve gives its crossover whatever the lead.
    (whole,) = crossovers([CPU, GPU0], [m for m in measurements if m.key.size != 192])
    assert whole.state is CrossoverState.FOUND


def test_a_size_past_the_common_sizes_on_one_side_only_is_no_gap() -> None:
    """The CPU skipped above where the GPU won by far (skip_cpu_above_speedup), or a GPU point that failed at the
    largest size: the sizes timed on one side only lie past the common ones, and the crossover stands, as does
    a GPU that never wins and failed at its largest size."""
    cpu = {64: 1.0, 128: 1.0, 256: 1.0}
    gpu = {64: 2.0, 128: 0.9, 256: 0.85, 512: 0.1, 1024: 0.1}
    measurements = [_measurement("/CPU:0", n, t) for n, t in cpu.items()]
    measurements += [_measurement("/GPU:0", n, t) for n, t in gpu.items()]
    (found,) = crossovers([CPU, GPU0], measurements)
    assert found.state is CrossoverState.FOUND
    never = [_measurement("/CPU:0", n, 1.0) for n in (64, 128, 256)] + [_measurement("/GPU:0", 64, 2.0)]
    never += [_measurement("/GPU:0", 128, 1.1)]  # the GPU's 256 failed: the CPU's stands alone past the rest
    (lost,) = crossovers([CPU, GPU0], never)
    assert lost.state is CrossoverState.GPU_NEVER_FASTER


@pytest.mark.parametrize(("lead", "state"), [(1.2, CrossoverState.WITHHELD), (1.5, CrossoverState.FOUND)])
def test_a_gap_at_an_end_beside_a_narrow_lead_withholds_the_crossover(lead: float, state: CrossoverState) -> None:
    """A withheld smallest size below a CPU win of only 1.2x could have been a GPU win (a second crossing); a
    withheld largest size above a GPU win of 1.2x could have been a CPU win (the crossover above it). Beside
    wins of 1.5x both stand."""
    cpu = dict.fromkeys((16, 32, 64, 128), 1.0)
    small_end = {16: 9.9, 32: lead, 64: 0.1, 128: 0.1}  # the CPU wins at 32 by ``lead``, the GPU from 64
    assert _gapped(cpu, small_end, ("/GPU:0", 16)).state is state
    large_end = {16: 9.9, 32: 9.9, 64: 1 / lead, 128: 0.1}  # the GPU wins at 64 by ``lead``; 128 withheld
    assert _gapped(cpu, large_end, ("/GPU:0", 128)).state is state


def test_find_crossover_needs_points() -> None:
    """An empty curve is a programming error, not a state."""
    with pytest.raises(ValueError, match="no points"):
        find_crossover([])


def _visited(log_ratios: dict[int, float], visits: int = 5) -> list[SpeedupPoint]:
    """Points each timed in ``visits`` visits that all read this log speed-up."""
    return [SpeedupPoint(n, (r,) * visits) for n, r in log_ratios.items()]


REFINED = (64, 76, 91, 108, 128)


@given(n0=st.floats(min_value=70.0, max_value=120.0), slope=st.floats(min_value=0.2, max_value=4.0))
def test_the_fitted_crossover_is_exact_on_a_straight_curve(n0: float, slope: float) -> None:
    """Revisited sizes on ln(t_cpu/t_gpu) = k ln(n/n0): the line through them crosses zero at n0, between neighbours."""
    assume(all(abs(math.log(n / n0)) > 1e-6 for n in REFINED))
    found = locate(_visited({n: slope * math.log(n / n0) for n in (16, *REFINED, 512)}))
    assert found.state is CrossoverState.FOUND
    assert found.size == pytest.approx(n0, rel=1e-9)
    assert found.lower is not None
    assert found.upper is not None
    assert found.lower < n0 < found.upper


def test_one_sizes_level_does_not_decide_the_fitted_crossover() -> None:
    """A bracketing size read 8% high (its level in this process) moves the interpolation far, the fit a little."""
    n0, slope = 95.0, 0.6  # a shallow curve, as TensorFlow's end_to_end is near its crossover
    ratios = {n: slope * math.log(n / n0) for n in REFINED}
    ratios[91] += 0.08
    found = locate(_visited(ratios))
    interpolated = last_crossing(sorted(ratios.items()))[1]
    assert interpolated is not None
    assert found.size is not None
    assert abs(math.log(interpolated / n0)) > 0.08
    assert abs(math.log(found.size / n0)) < abs(math.log(interpolated / n0)) / 3
    assert found.lower is not None
    assert found.upper is not None
    assert found.lower <= found.size < found.upper


def test_the_bracket_interpolates_where_the_line_does_not_rise() -> None:
    """A line through the revisited sizes that falls with n says nothing of n*: the bracket's interpolation stands."""
    ratios = {64: -0.001, 76: -0.001, 91: -0.001, 108: -1.0, 128: 0.001}
    found = locate(_visited(ratios))
    assert found.state is CrossoverState.FOUND
    assert found.size == pytest.approx(last_crossing(sorted(ratios.items()))[1])
    assert (found.lower, found.upper) == (108, 128)


def test_sizes_timed_once_keep_the_bracket_interpolation() -> None:
    """With fewer than three revisited sizes there is no line to fit: n* is interpolated in its bracket."""
    ratios = {64: -0.3, 76: -0.2, 91: 0.05, 108: 0.1, 128: 0.4}
    points = [SpeedupPoint(n, (r,) * (5 if n in (76, 91) else 1)) for n, r in ratios.items()]
    found = locate(points)
    assert found.size == pytest.approx(last_crossing(sorted(ratios.items()))[1])
    assert (found.lower, found.upper) == (76, 91)


@pytest.mark.parametrize("sizes", [(524, 577, 657, 736), (1242, 1393, 1584, 1744)])
def test_a_fitted_crossover_on_an_end_size_stays_between_two_measured_sizes(sizes: tuple[int, ...]) -> None:
    """A line crossing zero exactly at the first or last fitted size: n* is that size, its bracket two sizes."""
    for n0 in (sizes[0], sizes[-1]):
        ratios = {n: 0.3 * math.log(n / n0) for n in sizes}
        ratios[sizes[-1]] = max(ratios[sizes[-1]], 1e-12)  # the GPU ahead at the largest size
        found = locate([*_visited(ratios), SpeedupPoint(4 * sizes[-1], (1.0,))])
        assert found.size is not None
        assert found.lower is not None
        assert found.upper is not None
        assert found.lower < found.upper
        assert found.lower <= found.size <= found.upper


def test_ties_below_a_fitted_crossover_are_not_read_as_a_second_crossing() -> None:
    """The line puts n* above sizes where the GPU led by 1%: a tie inside the bracket's reach, not ambiguity."""
    found = locate(_visited({64: -0.5, 76: -0.45, 91: 0.01, 108: 0.01, 128: 0.01, 512: 1.0}))
    assert found.state is CrossoverState.FOUND
    assert found.size is not None
    assert 108 < found.size < 128
    assert (found.lower, found.upper) == (108, 128)


def _found(size: float, at: float, interval: tuple[float, float] | None = None) -> Crossover:
    """A crossover found at n* = ``size`` in a sweep that ended at ``at``, bracketed by 64 and 128."""
    low, high = interval or (None, None)
    return builders.crossover(size=size, lower=64, upper=128, ci_lower=low, ci_upper=high, derived_at=at)


def _serve(
    sizes: list[float], interval: tuple[float, float] | None = None
) -> tuple[Crossover, tuple[RecentCrossovers, ...]]:
    """Each size served in turn as a fresh sweep's n*; the last one served, and the recent n* after it."""
    recent: tuple[RecentCrossovers, ...] = ()
    served = None
    for at, size in enumerate(sizes):
        (served,), recent = with_recent_moves([_found(size, float(at), interval)], recent, fresh_at=float(at))
    assert served is not None
    return served, recent


def test_the_interval_is_widened_to_the_moves_between_recent_sweeps() -> None:
    """After n* moved by 10% between earlier sweeps, the served interval spans 10% either side of the new n*."""
    served, recent = _serve([100, 110, 100, 110, 100, 110], interval=(108, 112))
    assert served.ci_lower == pytest.approx(100)
    assert served.ci_upper == pytest.approx(121)
    assert recent[0].sizes == (100, 110, 100, 110, 100, 110)


def test_a_young_service_serves_the_widest_recorded_move_until_its_own_sweeps_say_more() -> None:
    """With fewer than four earlier moves, how n* moves between sweeps is not known yet: the interval spans
    x1.3 either side (beyond the widest recorded idle moves), or the sweep's own where that is wider; from four on,
    the sweeps' own moves decide, narrower or wider."""
    first, _ = _serve([100])
    assert first.ci_lower == pytest.approx(100 / 1.3)
    assert first.ci_upper == pytest.approx(130)
    served, _ = _serve([100, 101, 100, 101, 100], interval=(98, 102))
    assert served.ci_lower == pytest.approx(100 / 1.3)
    assert served.ci_upper == pytest.approx(130)
    served, _ = _serve([100, 130, 100, 130, 100], interval=(60, 140))
    assert (served.ci_lower, served.ci_upper) == (60, 140)
    served, _ = _serve([100, 101, 100, 101, 100, 101])  # four earlier moves: an interval from them alone
    assert served.ci_lower == pytest.approx(100)
    assert served.ci_upper == pytest.approx(102.01)
    served, _ = _serve([100, 130, 100, 130, 100, 130])
    assert served.ci_lower == pytest.approx(100)
    assert served.ci_upper == pytest.approx(169)


def test_one_real_change_does_not_widen_the_interval_that_shows_it() -> None:
    """The jump to a new level is left out: the sweeps at it serve intervals as narrow as the steady moves."""
    steady = [100.0, 102.0] * 12
    jumped, _ = _serve([*steady, 200.0])
    assert jumped.ci_lower == pytest.approx(200 / 1.02)  # its own move is not counted
    after, recent = _serve([*steady, 200.0, 204.0])
    assert after.ci_lower == pytest.approx(204 / 1.02)  # the jump is the largest move: never counted
    assert after.ci_upper == pytest.approx(204 * 1.02)
    assert len(recent[0].sizes) == RECENT_SWEEPS
    early, _ = _serve([100.0, 102.0, 100.0, 102.0, 100.0, 102.0, 200.0, 204.0])  # a young history: still left out
    assert early.ci_lower == pytest.approx(204 / 1.02)


def test_carried_crossovers_are_served_as_they_were_and_not_counted_again() -> None:
    """A crossover from an earlier sweep (a withheld device) keeps its interval and adds no move."""
    _, recent = _serve([100, 110, 100, 110, 100])
    carried = _found(100, 4.0, (98, 102))
    (served,), after = with_recent_moves([carried], recent, fresh_at=5.0)
    assert served == carried
    assert after == recent


def test_a_crossover_missing_from_one_sweep_keeps_its_recent_moves() -> None:
    """A device that failed for one sweep has no crossover in it; its recent n* wait for it, not start again."""
    _, recent = _serve([100, 110, 100, 110, 100])
    served, after = with_recent_moves([], recent, fresh_at=9.0)
    assert served == ()
    assert after == recent
