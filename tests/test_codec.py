"""The one path between the model's dataclasses and JSON: round trips, and errors that name the field."""

from __future__ import annotations

import json

import pytest

from crossover_monitor.codec import DecodeError, from_data, to_data
from crossover_monitor.config.settings import GuardSettings
from crossover_monitor.model import Snapshot, SweepOutcome, SweepResult
from crossover_monitor.protocol import ProtocolError, decode
from tests.builders import FULL_SNAPSHOT


@pytest.mark.parametrize(
    "value",
    [
        FULL_SNAPSHOT,
        SweepOutcome(result=SweepResult.SUCCESS, started_at=1, finished_at=2, snapshot=FULL_SNAPSHOT),
        GuardSettings(),
    ],
    ids=["snapshot", "outcome", "settings"],
)
def test_round_trip_through_json(value: object) -> None:
    """from_data(type, json(to_data(x))) == x for the nested types the service writes out."""
    assert from_data(type(value), json.loads(json.dumps(to_data(value)))) == value


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (
            lambda d: d["measurements"][0]["timing"]["samples_s"].append("x"),
            "measurements[0].timing.samples_s[2]",
            "finite number",
        ),
        (lambda d: d["devices"][0].update(kind="tpu"), "devices[0].kind", "one of 'cpu', 'gpu'"),
        (lambda d: d["crossovers"][0].update(state="lost"), "crossovers[0].state", "one of 'found'"),
        (lambda d: d["withheld"][0].pop("detail"), "withheld[0].detail", "missing"),
        (lambda d: d["hardware"][0].update(volts=1), "hardware[0]", "unknown field 'volts'"),
        (lambda d: d.update(measured_at=[["cuda:0"]]), "measured_at[0]", "expected 2 items"),
        (lambda d: d["measurements"][0]["key"].update(size=True), "measurements[0].key.size", "an integer"),
    ],
)
def test_bad_data_names_the_field_at_fault(change: object, path: str, message: str) -> None:
    """Each kind of mismatch is a DecodeError whose path points at the field."""
    data = to_data(FULL_SNAPSHOT)
    change(data)  # type: ignore[operator]
    with pytest.raises(DecodeError, match=message) as caught:
        from_data(Snapshot, data)
    assert caught.value.path == path


def test_a_malformed_worker_message_names_its_field() -> None:
    """A worker line that is JSON but not a message says which field is wrong (no bare 'malformed')."""
    (point,) = FULL_SNAPSHOT.measurements
    body = {
        "type": "measurement",
        "key": to_data(point.key),
        "timing": {**to_data(point.timing), "blocks": "five"},
        "role": "sweep",
    }
    with pytest.raises(
        ProtocolError, match=r"malformed measurement message from the worker: timing\.blocks: expected an integer"
    ):
        decode(json.dumps(body))


def test_an_integer_beyond_any_float_is_a_decode_error_not_a_crash() -> None:
    """10**400 where a float belongs: a DecodeError naming the field (an OverflowError would kill the reader)."""
    data = to_data(FULL_SNAPSHOT)
    data["finished_at"] = 10**400
    with pytest.raises(DecodeError, match="finished_at: expected a finite number"):
        from_data(Snapshot, data)


def test_a_plan_from_the_wire_holds_the_benchmark_rules() -> None:
    """A plan whose JSON breaks a declared rule (a size of 0, an unknown dtype) is refused with the key named."""
    from crossover_monitor.config.settings import BenchmarkSettings  # noqa: PLC0415
    from crossover_monitor.protocol import Plan  # noqa: PLC0415

    good = json.loads(Plan(bench=BenchmarkSettings(), guard=GuardSettings()).to_json())
    for change, message in (
        (("sizes", [0, 10]), r"sizes\[0\]"),
        (("dtypes", ["float8"]), r"dtypes\[0\]: unknown dtype"),
    ):
        with pytest.raises(DecodeError, match=message):
            from_data(Plan, {**good, "bench": {**good["bench"], change[0]: change[1]}})


def test_settings_built_in_code_refuse_text_durations() -> None:
    """A duration field holds seconds: text is YAML's business, and a string there is a TypeError, not kept."""
    from crossover_monitor.config.settings import TimingSettings  # noqa: PLC0415

    with pytest.raises(TypeError, match="block_time: must be a number"):
        TimingSettings(block_s="30s")  # type: ignore[arg-type]


def test_a_field_of_an_earlier_release_in_the_run_history_is_read_and_dropped() -> None:
    """HardwareContext no longer records the threads' wait over a whole point; a snapshot the history wrote with it
    still reads back, without it. Any other unknown field is still refused."""
    data = to_data(FULL_SNAPSHOT)
    data["hardware"][0]["cpu_threads_wait_cores"] = 0.2
    assert from_data(Snapshot, data) == FULL_SNAPSHOT
    data["hardware"][0]["cpu_thread_wait_cores"] = 0.2
    with pytest.raises(DecodeError, match="unknown field 'cpu_thread_wait_cores'"):
        from_data(Snapshot, data)
