"""The fleet profile: what /metrics?profile=fleet serves a fleet's central store, against the whole curve."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from crossover_monitor.metrics import METRICS, parse_exposition, render_state, with_process_metrics
from tests.nodes import DEFAULTS, node_state
from tests.service import RunningService, fake_config, parse

PER_POINT = {
    "matmul_duration_seconds",
    "matmul_duration_iqr_seconds",
    "matmul_duration_noisy",
    "matmul_flops_per_second",
    "matmul_duration_timestamp_seconds",
}


def _series(gpus: int, profile: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples one node with ``gpus`` GPUs serves in ``profile``, the process's own series included."""
    body, _ = render_state(node_state(gpus), "", backend="tensorflow", profile=profile)  # type: ignore[arg-type]
    return parse_exposition(with_process_metrics(body, "").decode())


@pytest.mark.parametrize(("profile", "per_gpu", "per_node"), [("fleet", 30, 40), ("node", 200, 200)])
def test_a_gpu_and_a_node_cost_few_series_in_the_fleet_profile(profile: str, per_gpu: int, per_node: int) -> None:
    """Issue 52: 101 series a GPU reached the central store. The fleet profile serves at most 30 a GPU and 40 a
    node (the shard's budget), the node profile the whole curve."""
    one, eight = len(_series(1, profile)), len(_series(8, profile))
    gpu = (eight - one) / 7
    assert gpu <= per_gpu
    assert one - gpu <= per_node
    if profile == "node":  # the whole curve is far more: the figures above are the fleet's, not any profile's
        assert gpu > 2 * 30


def test_the_fleet_profile_leaves_the_curve_on_the_node_and_keeps_what_the_alerts_read() -> None:
    """No per-point series in the fleet profile; the crossover, its interval and time, up and the largest size's
    throughput of every GPU are there."""
    fleet = _series(8, "fleet")
    names = collections.Counter(name for name, _, _ in fleet)
    assert PER_POINT & set(names) == set()
    assert names["matmul_crossover_size"] == 8 * len(DEFAULTS.dtypes) * 2
    for name in ("matmul_crossover_ci_lower_size", "matmul_crossover_timestamp_seconds", "matmul_device_up"):
        assert names[name] > 0, name
    largest = {
        (labels["device"], labels["mode"]): labels["size"]
        for name, labels, _ in fleet
        if name.startswith("matmul_largest")
    }
    assert largest == {
        (f"/GPU:{i}", mode): str(DEFAULTS.sizes[-1]) for i in range(8) for mode in ("compute", "end_to_end")
    }
    # Every family served is one the metric table marks for the fleet (or the process's own).
    fleet_names = {spec.exposed_name for spec in METRICS.values() if spec.fleet}
    assert {n for n in names if n.startswith("matmul_")} <= fleet_names


def test_a_pairs_state_is_one_series_in_the_fleet_profile_and_every_state_in_the_node_profile() -> None:
    """Issue 52: six state series a pair, five of them 0. The fleet profile serves the current state's alone."""
    for profile, expected in (("fleet", {1.0}), ("node", {0.0, 1.0})):
        states = [
            (labels["gpu"], labels["mode"], v) for n, labels, v in _series(2, profile) if n == "matmul_crossover_state"
        ]
        pairs = collections.Counter((gpu, mode) for gpu, mode, _ in states)
        assert {value for _, _, value in states} == expected
        assert set(pairs.values()) == ({1} if profile == "fleet" else {6})


def test_the_largest_size_throughput_follows_the_gpu() -> None:
    """A slower GPU serves a lower largest-size rate, the value the throughput alert compares with its baseline."""
    fast = {
        labels["device"]: v
        for n, labels, v in _series(1, "fleet")
        if n.startswith("matmul_largest") and labels["mode"] == "compute"
    }
    body, _ = render_state(node_state(1, speed=0.5), "", backend="tensorflow", profile="fleet")
    slow = {
        labels["device"]: v
        for n, labels, v in parse_exposition(body.decode())
        if n.startswith("matmul_largest") and labels["mode"] == "compute"
    }
    assert 0.4 < slow["/GPU:0"] / fast["/GPU:0"] < 0.6


@pytest.mark.slow  # a real service, ~5 s
def test_the_service_serves_the_fleet_profile_on_request_and_the_whole_curve_by_default(tmp_path: Path) -> None:
    """The real service: /metrics has the curve, /metrics?profile=fleet has no point series, an unknown profile is
    a 400 that names the known ones."""
    service = RunningService(tmp_path, fake_config())
    try:
        whole = service.wait_for_sweeps("success")
        status, _, body = service.get("/metrics?profile=fleet")
        assert status == 200
        fleet = parse(body)
        status, _, refused = service.get("/metrics?profile=everything")
    finally:
        assert service.stop() == 0
    assert {name for name, _ in whole} & PER_POINT == PER_POINT
    assert {name for name, _ in fleet} & PER_POINT == set()
    assert any(name == "matmul_crossover_size" for name, _ in fleet)
    assert len(fleet) < len(whole) / 2
    assert status == 400
    assert "unknown profile 'everything'" in refused
    assert "node or fleet" in refused
