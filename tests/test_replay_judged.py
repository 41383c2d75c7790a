"""Recorded sweeps judged as the guard judges one now: scrapes read back into sweeps, and a sweep recorded before
the service metered each point held against its points' idle ranges (benchmarks/replay.py, issue 32).

The scrapes are a copy of ../shared/data/h200-2026-12-04 (an H200, PyTorch, main at 1878786): two idle sweeps and
a third under 0.73 cores of steal and 0.82 cores of others, whose small points ran 1.07-2.45x the first's.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.measure.guard.guard import host_share_at
from crossover_monitor.measure.guard.rule import past_idle_range
from crossover_monitor.model import CrossoverState, ServiceState, SweepOutcome, WithheldReason
from crossover_monitor.service.state import StateStore
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import replay

STEAL = REPO / "tests" / "fixtures" / "h200-2026-12-04" / "torch-idle-with-steal"
RESULTS = REPO / "benchmarks" / "results"
IDLE_TORCH = (
    "gpu-proof-torch-h200-2026-12-03b.jsonl",
    "gpu-proof-torch-idlemeter-h200-2026-12-03.jsonl",
    "gpu-proof-torch-more-h200-2026-12-01b.jsonl",
)
GUARD = GuardSettings()


def _scrapes() -> list[SweepOutcome]:
    return [replay.scraped_sweep(path) for path in sorted(STEAL.glob("*.prom"))]


def _calm_state(*sweeps: SweepOutcome) -> ServiceState:
    """The state a service keeps after ``sweeps``, each judged (and so metered) before it is recorded."""
    store = StateStore()
    for index, sweep in enumerate(sweeps):
        store.record(replay.at(replay.judged(sweep, store.read(), GUARD), replay.START + index * replay.SWEEP_S))
    return store.read()


def _points(outcome: SweepOutcome) -> set[str]:
    assert outcome.snapshot is not None
    return {f"{w.device} {w.point.mode} {w.point.size}" for w in outcome.snapshot.withheld if w.point is not None}


def test_a_scrape_reads_back_as_the_sweep_it_served() -> None:
    """Every timing of the scrape, its devices, environment and the CPU's load readings; the crossovers the current
    code derives from the medians land where the scrape served them (its n* lines)."""
    first, _, steal = _scrapes()
    assert steal.snapshot is not None
    snapshot = steal.snapshot
    assert len(snapshot.measurements) == 40  # 10 sizes, 2 modes, 2 devices
    assert {d.kind for d in snapshot.devices} == {"cpu", "gpu"}
    assert dict(snapshot.environment)["framework"] == "torch"
    assert dict(snapshot.environment)["framework_version"] == "2.11.0+cu130"
    (cpu,) = snapshot.hardware
    assert cpu.other_cpu_cores == pytest.approx(0.8169, abs=1e-3)
    assert cpu.cpu_steal_cores == pytest.approx(0.7280, abs=1e-3)
    assert steal.finished_at - steal.started_at == pytest.approx(69.72, abs=0.01)
    served = {c.mode: c.size for c in replay._derived(steal)}
    assert served["end_to_end"] == pytest.approx(455.7, rel=0.1)  # matmul_crossover_size in scrape-02
    assert served["compute"] == pytest.approx(139.5, rel=0.1)
    assert first.snapshot is not None
    assert all(m.others_cores is None for m in first.snapshot.measurements)  # recorded before points were metered


def test_the_steal_sweep_judged_by_its_ranges_withholds_its_slowed_points_and_both_crossovers() -> None:
    """Against ranges from the two idle scrapes (each drawn twice: four calm sweeps), the steal sweep's slowed
    host-bound points are withheld and the crossovers they could move with them; its GPU compute points of
    n >= 1024 (kernel-bound, not the host's) stand."""
    first, second, steal = _scrapes()
    state = _calm_state(first, second, first, second)
    assert state.range_tops, "four calm sweeps give every point a range"
    judged = replay.judged(steal, state, GUARD)
    withheld = _points(judged)
    assert {"cpu end_to_end 512", "cuda:0 compute 128", "cuda:0 end_to_end 256", "cpu compute 1"} <= withheld
    assert not {f"cuda:0 compute {n}" for n in (1024, 2048, 4096, 8192)} & withheld
    assert judged.snapshot is not None
    assert {w.reason for w in judged.snapshot.withheld} == {WithheldReason.HOST_SLOWED}
    assert all("replayed" in w.detail and "0.82 cores" in w.detail for w in judged.snapshot.withheld)
    states = {c.mode: c.state for c in replay._derived(judged)}
    assert states == {"compute": CrossoverState.WITHHELD, "end_to_end": CrossoverState.WITHHELD}
    # What the service publishes of it leaves the withheld points out, and no range takes its medians.
    published = replay.at(judged, replay.START).snapshot
    assert published is not None
    assert len(published.measurements) == 40 - len(withheld)
    after = _calm_state(first, second, first, second, steal)
    assert {f.key: f.sweeps for f in after.range_tops} == {f.key: f.sweeps for f in state.range_tops}


def _others(outcome: SweepOutcome) -> float:
    assert outcome.snapshot is not None
    return max(max(h.other_cpu_cores or 0.0, h.cpu_steal_cores or 0.0) for h in outcome.snapshot.hardware)


def test_idle_sweeps_that_read_others_stay_inside_a_long_running_services_ranges() -> None:
    """Every idle PyTorch H200 sweep of 2026-12-01 to 12-04 that read 0.75 cores of others or more, judged against
    the ranges of all the others that read less (what a service running those days would keep): none withholds
    a point. (Two idle scrapes alone make ranges too narrow for that: points move up to 1.8x between processes.)"""
    pool = replay.load([str(RESULTS / name) for name in IDLE_TORCH])
    beside = [o for o in pool if _others(o) >= GUARD.range_others_cores]
    calm = [o for o in pool if _others(o) < GUARD.range_others_cores]
    assert beside, "no idle sweep read others: the test's premise is gone"
    state = _calm_state(*calm)
    assert len(state.range_tops) >= 20
    for sweep in beside:
        assert _points(replay.judged(sweep, state, GUARD)) == set(), _others(sweep)


def test_too_few_calm_sweeps_judge_nothing_and_a_metered_sweep_judged_itself() -> None:
    """Below four calm sweeps a point has no range (the service's first sweeps); a sweep that metered its points
    when it ran (the guard judged it then) is drawn as it is."""
    first, second, steal = _scrapes()
    assert _points(replay.judged(steal, _calm_state(first, second, first), GUARD)) == set()
    state = _calm_state(first, second, first, second)
    metered = replay.judged(first, state, GUARD)
    assert metered is not first
    assert replay.judged(metered, state, GUARD) is metered
    assert steal.snapshot is not None
    unread = dataclasses.replace(steal, snapshot=dataclasses.replace(steal.snapshot, hardware=()))
    assert replay.judged(unread, state, GUARD) is unread  # no reading to gate on


def test_a_scraped_sweep_that_withheld_a_device_is_left_out_and_one_that_withheld_points_is_refused(
    tmp_path: Path,
) -> None:
    """A device withheld: its timings in the scrape are an earlier sweep's, so the sweep is drawn only with
    --keep-withheld; points withheld alone: /metrics does not say which sizes, so the scrape is refused."""
    text = (STEAL / "scrape-00.prom").read_text()
    device = tmp_path / "device.prom"
    device.write_text(
        text + "# TYPE matmul_device_withheld gauge\n"
        'matmul_device_withheld{backend="torch",device="cpu",reason="cpu_contended"} 1.0\n'
    )
    assert replay.load([str(device)]) == []
    (kept,) = replay.load([str(device)], keep_withheld=True)
    assert kept.snapshot is not None
    assert [(w.device, w.reason) for w in kept.snapshot.withheld] == [("cpu", WithheldReason.CPU_CONTENDED)]
    points = tmp_path / "points.prom"
    points.write_text(
        text + "# TYPE matmul_points_withheld gauge\n"
        'matmul_points_withheld{backend="torch",device="cpu",dtype="float32",mode="compute",reason="host_slowed"} 2.0\n'
    )
    with pytest.raises(SystemExit, match="withheld points alone"):
        replay.load([str(points)])
    (fine,) = replay.load([str(STEAL / "scrape-00.prom")])
    assert fine.snapshot is not None
    assert not fine.snapshot.withheld


def test_an_unreadable_scrape_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "scrape.prom"
    bad.write_text("matmul_duration_seconds{size=\n")
    with pytest.raises(SystemExit, match=r"scrape\.prom: not a Prometheus text exposition"):
        replay.scraped_sweep(bad)
    empty = tmp_path / "empty.prom"
    empty.write_text("matmul_sweeps_total 1\n")
    with pytest.raises(SystemExit, match="no timings or no completed sweep"):
        replay.scraped_sweep(empty)


@pytest.mark.parametrize(
    ("median", "top", "share", "expected"),
    [
        (1.2, 1.0, 1.0, 1.2),  # past the top by 20%: withheld
        (1.09, 1.0, 1.0, None),  # within the allowance (10%): kept
        (1.5, 1.0, 0.2, None),  # mostly the GPU's at the top: NVML's business
        (1.5, 1.0, None, None),  # share not known
        (1.5, 0.0, 1.0, None),  # a top that is not a time
        (1.5, float("nan"), 1.0, None),
    ],
)
def test_the_range_rule(median: float, top: float, share: float | None, expected: float | None) -> None:
    found = past_idle_range(median, top, share, GUARD.range_max_slowdown)
    assert found == (None if expected is None else pytest.approx(expected))


def test_the_host_share_of_a_point() -> None:
    """All of a CPU, end_to_end or n = 1 point's time is the host's; a GPU compute point's share is its fixed cost."""
    assert host_share_at("cpu", "compute", 512, None, 1.0) == 1.0
    assert host_share_at("gpu", "end_to_end", 512, None, 1.0) == 1.0
    assert host_share_at("gpu", "compute", 1, None, 1.0) == 1.0
    assert host_share_at("gpu", "compute", 512, 2e-5, 8e-5) == pytest.approx(0.25)
    assert host_share_at("gpu", "compute", 64, 2e-5, 1e-5) == 1.0  # never more than all of it
    assert host_share_at("gpu", "compute", 512, None, 8e-5) is None
