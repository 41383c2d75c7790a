"""The guard's rule, pinned row by row: the facts a point was timed with, and its fate.

Each row of ``POINT_RULE`` is one line of the rule that decides a timed point (written out in docs/guard.md):
the guard is driven with fakes (a scripted host meter, host reference and idle range), as the runner drives it,
and the row says what it returns and whether the point counts as calm (the load it says others used, which lets
its median join its idle range; None: it joins none). ``WHAT_THE_RUNNER_DOES`` pins what the runner does with each
verdict (the point withheld alone, its device withheld, the sweep stopped) through the real runner. Both tables
exist so that moving the rule into one place can be shown to change no verdict: they pass before and after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from crossover_monitor.config.settings import RefineSettings
from crossover_monitor.measure.guard.guard import GpuSample, JudgedPoint
from crossover_monitor.measure.timing import BlockWatch
from crossover_monitor.model import DeviceInfo, HostReference, Measurement, PointKey, RangeTop, WithheldReason
from tests.conftest import make_plan
from tests.guardfakes import IDLE, JOB, FakeHost, FakeSampler, SlowedWhileTiming, fake_guard, run_guarded, withheld_in

CPU = DeviceInfo(backend="fake", device="/CPU:0", kind="cpu", name="cpu")
GPU = DeviceInfo(backend="fake", device="/GPU:0", kind="gpu", name="gpu")
IDLE_FIGURE = HostReference(median_s=1e-3, spread=0.02)  # the host reference's idle figure, and its spread
TOP_S = 10e-3  # the top of the point's idle range over its calm sweeps
PUBLISHED = "published"


@dataclass(frozen=True)
class Row:
    """One line of the rule: what was seen over each try of a point (the last repeats), and the point's fate."""

    rule: str
    fate: str  # PUBLISHED, or the reason it is withheld for
    calm: float | None  # what the point says others used (None: it joins no idle range)
    device: Literal["cpu", "gpu"] = "cpu"
    others: tuple[float, ...] = (0.2,)  # other programs' cores over each try
    steal: tuple[float, ...] = (0.0,)
    throttled_s: tuple[float, ...] = (0.0,)
    own_wait: tuple[float | None, ...] = (0.0,)  # a GPU point's timing thread's wait for a CPU, share of the point
    block_waits: tuple[float | None, ...] | None = None  # a CPU point's threads' wait over each of 5 blocks, cores
    reference: tuple[float, ...] | None = (1.0,)  # the host reference's readings over its idle figure, per try
    idle_figure: bool = True  # the reference has an idle figure from earlier sweeps
    past_range: tuple[float, ...] | None = None  # the point's median over the top of its idle range (None: no range)
    range_of_next_size: bool = False  # a refinement's size, held against the next configured size's range
    share: float | None = 1.0  # the share of the point's time that is the host's (None: not known)
    usual_others: float = 0.0  # what others use of the host in nine sweeps of ten
    tries: int = 2
    settings: dict[str, Any] = field(default_factory=dict)


POINT_RULE = (
    Row("the guard off: timed, not metered", PUBLISHED, None, others=(3.0,), tries=1, settings={"enabled": False}),
    Row("nothing seen", PUBLISHED, 0.2, tries=1),
    Row(
        "others within the cores the threads leave free plus cpu_max_other_cores",
        PUBLISHED,
        3.5,
        others=(3.5,),
        tries=1,
    ),
    Row("others past that on both tries: the CPU withheld", "cpu_contended", 3.6, others=(3.6,)),
    Row("others past that on the first try only: timed again, stands", PUBLISHED, 3.6, others=(3.6, 0.2)),
    Row("steal counts as others for calm", PUBLISHED, 1.4, steal=(1.4,), tries=1),
    Row("a CPU quota throttled it over 2% of a try, twice", "cpu_contended", 0.2, throttled_s=(0.05,)),
    Row("throttled up to 2%", PUBLISHED, 0.2, throttled_s=(0.02,), tries=1),
    Row(
        "its threads waited for a CPU in too many of its blocks (fork-join pool), twice",
        "cpu_contended",
        0.2,
        block_waits=(0.5,),
    ),
    Row("its threads waited within the allowance", PUBLISHED, 0.2, block_waits=(0.05,), tries=1),
    Row(
        "a GPU point's timing thread waited for a CPU past gpu_max_host_wait, twice",
        "cpu_contended",
        0.2,
        device="gpu",
        own_wait=(0.2,),
    ),
    Row("... once, then not", PUBLISHED, 0.2, device="gpu", own_wait=(0.2, 0.0)),
    Row("an unknown wait is no reason", PUBLISHED, 0.2, device="gpu", own_wait=(None,), tries=1),
    Row(
        "the reference read the host slowed past the allowance: its slowdown moves the point, twice",
        "host_slowed",
        None,
        reference=(1.5,),
    ),
    Row("... once, then not: stands, calm by the try that stood", PUBLISHED, 0.2, reference=(1.5, 1.0)),
    Row("a slowdown within host_max_slowdown", PUBLISHED, 0.2, reference=(1.09,), tries=1),
    Row(
        "a slowed reference times a GPU point's small host share moves it within the allowance: stands, not calm",
        PUBLISHED,
        None,
        device="gpu",
        reference=(1.5,),
        share=0.1,
        tries=1,
    ),
    Row(
        "a slowed reference, but the point read inside its own idle range: stands, not calm",
        PUBLISHED,
        None,
        reference=(1.5,),
        past_range=(1.05,),
        tries=1,
    ),
    Row(
        "no idle figure and under 8 readings of its own: not judged, not calm",
        PUBLISHED,
        None,
        reference=(1.5,),
        idle_figure=False,
        tries=1,
    ),
    Row(
        "beside others at range_others_cores, past its idle range by more than range_max_slowdown, twice",
        "host_slowed",
        0.75,
        others=(0.75,),
        past_range=(1.3,),
    ),
    Row(
        "... beside fewer others: a real change, published",
        PUBLISHED,
        0.74,
        others=(0.74,),
        past_range=(1.3,),
        tries=1,
    ),
    Row("... past it by a burst that passed", PUBLISHED, 1.0, others=(1.0,), past_range=(1.3, 1.05)),
    Row("... with no idle range yet", PUBLISHED, 1.0, others=(1.0,), tries=1),
    Row(
        "... a GPU point under a quarter of whose time is the host's",
        PUBLISHED,
        1.0,
        device="gpu",
        others=(1.0,),
        past_range=(1.3,),
        share=0.2,
        tries=1,
    ),
    Row(
        "... a GPU point whose host share is not known",
        PUBLISHED,
        1.0,
        device="gpu",
        others=(1.0,),
        past_range=(1.3,),
        share=None,
        tries=1,
    ),
    Row(
        "... on a node whose others usually use 1.5 cores, the gate moves to 0.75 above that",
        PUBLISHED,
        2.0,
        others=(2.0,),
        past_range=(1.3,),
        usual_others=1.5,
        tries=1,
    ),
    Row(
        "... and beside 0.75 above it the point is withheld",
        "host_slowed",
        2.25,
        others=(2.25,),
        past_range=(1.3,),
        usual_others=1.5,
    ),
    Row(
        "a refinement's size past the next configured size's range beside others",
        "host_slowed",
        1.0,
        others=(1.0,),
        past_range=(1.3,),
        range_of_next_size=True,
    ),
    Row(
        "a refinement's size inside the next size's range is not let through by it when the reference read slowed",
        "host_slowed",
        None,
        reference=(1.5,),
        past_range=(1.0,),
        range_of_next_size=True,
    ),
    Row(
        "past its range while the reference read the host slowed, no others",
        "host_slowed",
        None,
        reference=(1.5,),
        past_range=(1.6,),
    ),
    Row(
        "reference_max_slowdown and range_max_slowdown large: the reference and the range judge nothing",
        PUBLISHED,
        1.0,
        others=(1.0,),
        reference=(1.5,),
        past_range=(1.6,),
        tries=1,
        settings={"reference_max_slowdown": 100.0, "range_max_slowdown": 100.0},
    ),
)


class _Point:
    """One point's tries: the host reference's readings around each and the point's median in each."""

    def __init__(self, row: Row) -> None:
        self.row = row
        self.tried = 0
        self.read = 0

    def _of_try(self, values: tuple[Any, ...]) -> Any:
        return values[min(max(self.tried - 1, 0), len(values) - 1)]

    def measure(self, watch: BlockWatch | None = None) -> None:
        self.tried += 1
        if watch is not None:
            for _ in range(5):
                watch.disturbed(watch.mark())

    def reading(self) -> float:
        """Read twice a try, before it and after it."""
        assert self.row.reference is not None
        self.read += 1
        return self.row.reference[min((self.read - 1) // 2, len(self.row.reference) - 1)] * IDLE_FIGURE.median_s

    def median(self) -> float | None:
        return None if self.row.past_range is None else self._of_try(self.row.past_range) * TOP_S


def judge(row: Row) -> tuple[str, float | None, int]:
    """The guard's verdict on the point of ``row``, what it says others used, and how many times it was timed."""
    size = 48 if row.range_of_next_size else 64
    key = PointKey(backend="fake", device=f"/{row.device.upper()}:0", dtype="float32", mode="compute", size=size)
    ranged = dataclasses.replace(key, size=64)
    point = _Point(row)
    host = FakeHost(
        list(row.others),
        cores=4,
        waits=list(row.own_wait),
        throttled=list(row.throttled_s),
        block_waits=row.block_waits,
    )
    if any(row.steal):
        stop = host.stop

        def with_steal(started: object) -> Any:
            load = stop(started)
            return dataclasses.replace(load, steal_cores=row.steal[min(host.windows - 1, len(row.steal) - 1)])

        host.stop = with_steal  # type: ignore[method-assign]
    guard = fake_guard(
        None,
        host,
        reference=None if row.reference is None else point.reading,
        baseline=IDLE_FIGURE if row.idle_figure else None,
        figures=[RangeTop(key=ranged, upper_s=TOP_S, sweeps=12)],
        usual_others=row.usual_others,
        **row.settings,
    )
    judged = JudgedPoint(
        key,
        point.median,
        lambda _: row.share,
        range_from=ranged if row.range_of_next_size else None,
    )
    if row.device == "cpu":
        verdict = guard.time_cpu_point(CPU, 1, point.measure, judged)
    else:
        verdict = guard.time_gpu_point(GPU, point.measure, lambda: 1.0 if row.share is None else row.share, judged)
    fate = PUBLISHED if verdict is None else verdict.reason.value
    return fate, guard.last_point_others, point.tried


@pytest.mark.parametrize("row", POINT_RULE, ids=lambda row: row.rule)
def test_a_points_fate_is_its_rows(row: Row) -> None:
    fate, calm, tried = judge(row)
    assert fate == row.fate
    assert calm == (None if row.calm is None else pytest.approx(row.calm))
    assert tried == row.tries


def test_the_rule_has_a_row_for_every_verdict_a_point_can_get() -> None:
    """A verdict the guard can give that no row pins would change unseen."""
    assert {row.fate for row in POINT_RULE} == {
        PUBLISHED,
        WithheldReason.CPU_CONTENDED.value,
        WithheldReason.HOST_SLOWED.value,
    }


# --- what the runner does with each verdict ---------------------------------------------------------------------


def _busy_from(look: int) -> Callable[[int], GpuSample]:
    """A GPU a job holds from the ``look``-th look on."""
    return lambda n: IDLE if n < look else dataclasses.replace(IDLE, processes=(*IDLE.processes, JOB))


def _fates(messages: list[Any]) -> dict[str, str]:
    """Per device: 'device withheld: REASON', 'points withheld alone: REASON', or 'published'."""
    found: dict[str, str] = {}
    for verdict in withheld_in(messages):
        whole = verdict.point is None
        found.setdefault(
            verdict.device, f"{'device withheld' if whole else 'points withheld alone'}: {verdict.reason.value}"
        )
    for message in messages:
        if isinstance(message, Measurement):
            found.setdefault(message.key.device, PUBLISHED)
    return found


def _slowed_points() -> list[Any]:
    backend = SlowedWhileTiming({("/CPU:0", 32)})
    guard = fake_guard(FakeSampler(lambda _: IDLE), FakeHost([0.0]), reference=backend.reference, baseline=IDLE_FIGURE)
    plan = make_plan("tests.fakes:curve", modes=("compute",), refine=RefineSettings(enabled=False))
    return run_guarded(guard, plan, backend)[1]


WHAT_THE_RUNNER_DOES: tuple[tuple[str, Callable[[], list[Any]], dict[str, str]], ...] = (
    (
        "a GPU busy before its first point: that GPU withheld, the CPU goes on",
        lambda: run_guarded(fake_guard(FakeSampler(_busy_from(1)), FakeHost([0.0])))[1],
        {"/GPU:0": "device withheld: gpu_busy", "/CPU:0": PUBLISHED},
    ),
    (
        "a job arriving on a GPU after its first point: the sweep stops, every device withheld",
        lambda: run_guarded(fake_guard(FakeSampler(_busy_from(5)), FakeHost([0.0])))[1],
        {"/GPU:0": "device withheld: gpu_busy", "/CPU:0": "device withheld: yielded"},
    ),
    (
        "no NVML and require_nvml: the GPU withheld as unguarded",
        lambda: run_guarded(fake_guard(None, FakeHost([0.0])))[1],
        {"/GPU:0": "device withheld: unguarded", "/CPU:0": PUBLISHED},
    ),
    (
        "cpu_contended: the device withheld, nothing more timed on it",
        lambda: run_guarded(fake_guard(FakeSampler(lambda _: IDLE), FakeHost([3.6])))[1],
        {"/GPU:0": PUBLISHED, "/CPU:0": "device withheld: cpu_contended"},
    ),
    (
        "host_slowed: the point withheld alone, its device goes on",
        _slowed_points,
        {"/GPU:0": PUBLISHED, "/CPU:0": "points withheld alone: host_slowed"},
    ),
)


@pytest.mark.parametrize(
    ("fates", "expected"),
    [(run, expected) for _, run, expected in WHAT_THE_RUNNER_DOES],
    ids=[rule for rule, _, _ in WHAT_THE_RUNNER_DOES],
)
def test_what_the_runner_does_with_each_verdict(fates: Callable[[], list[Any]], expected: dict[str, str]) -> None:
    assert _fates(fates()) == expected
