"""The run history: real SQLite files, bad ones moved aside, a full disk, and the service restarted after SIGKILL."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossover_monitor.model import (
    DeviceInfo,
    HostReference,
    PointMedians,
    RecentCrossovers,
    ServiceState,
    SweepOutcome,
    SweepResult,
    Withheld,
    WithheldReason,
)
from crossover_monitor.service.history import FILE_NAME, SERVED_FORMAT, HistoryUnavailable, RunHistory, read_recent
from crossover_monitor.view.report import render_history
from tests.builders import FULL_SNAPSHOT, measurement
from tests.conftest import REPO
from tests.service import RunningService, fake_config, find

Labels = frozenset[tuple[str, str]]
SUCCESS = SweepOutcome(result=SweepResult.SUCCESS, started_at=1.0, finished_at=2.0, snapshot=FULL_SNAPSHOT)
FAILED = SweepOutcome(result=SweepResult.FAILED, started_at=3.0, finished_at=4.0, reason="the worker exited (status 1)")


def served_after(*outcomes: SweepOutcome) -> ServiceState:
    state = ServiceState()
    for outcome in outcomes:
        counts = tuple((r, n + (r is outcome.result)) for r, n in state.sweeps)
        state = dataclasses.replace(state, sweeps=counts, last_outcome=outcome)
        if outcome.snapshot is not None:
            state = dataclasses.replace(state, latest=outcome.snapshot, last_success_at=outcome.finished_at)
    return state


def test_runs_and_what_was_served_survive_a_reopen(tmp_path: Path) -> None:
    """Runs, the served snapshot, counts, the last outcome and the recent n* all come back after a reopen."""
    history = RunHistory.open(tmp_path, keep_runs=100)
    assert history.restore() is None  # a new history
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    recent = RecentCrossovers(
        backend="torch", gpu="cuda:0", cpu="cpu", dtype="float32", mode="compute", sizes=(138.0, 140.5)
    )
    state = dataclasses.replace(served_after(SUCCESS, FAILED), recent=(recent,))
    assert history.record("sweep", FAILED, state, "torch")
    history.close()

    reopened = RunHistory.open(tmp_path, keep_runs=100)
    restored = reopened.restore()
    assert restored is not None
    restored_state, backend = restored
    assert backend == "torch"
    assert restored_state.latest == FULL_SNAPSHOT  # every measurement, crossover, withheld device and timestamp
    assert restored_state.last_success_at == 2.0
    assert restored_state.count(SweepResult.SUCCESS) == 1
    assert restored_state.count(SweepResult.FAILED) == 1
    assert restored_state.last_outcome == dataclasses.replace(FAILED, snapshot=None)
    assert restored_state.recent == (recent,)  # the recent n* that widen the served interval
    newest, oldest = reopened.recent(10)
    assert (newest.result, newest.reason) == ("failed", "the worker exited (status 1)")
    assert oldest.devices == (("cuda:0", "measured", ""),)
    assert oldest.crossovers == (("cuda:0", "compute", "found", 140.5),)
    table = render_history(read_recent(tmp_path, 10))
    assert "the worker exited (status 1)" in table
    assert "cuda:0 compute 140" in table


def test_each_device_is_recorded_in_the_state_its_metrics_serve(tmp_path: Path) -> None:
    """Measured, withheld with its reason, failed: a GPU the sweep never reached measured nothing, so it failed."""
    busy = Withheld(backend="torch", device="cuda:1", reason=WithheldReason.GPU_BUSY, detail="1 other process")
    never = DeviceInfo(backend="torch", device="cuda:2", kind="gpu", name="H200")
    devices = (*FULL_SNAPSHOT.devices, DeviceInfo(backend="torch", device="cuda:1", kind="gpu", name="H200"), never)
    served = dataclasses.replace(FULL_SNAPSHOT, devices=devices, withheld=(busy,))
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", dataclasses.replace(SUCCESS, snapshot=served), served_after(SUCCESS), "torch")
    (run,) = history.recent(1)
    assert run.devices == (
        ("cuda:0", "measured", ""),
        ("cuda:1", "withheld", "gpu_busy"),
        ("cuda:2", "failed", "nothing was measured"),
    )


def test_only_the_newest_runs_are_kept(tmp_path: Path) -> None:
    """Past keep_runs, the oldest runs are dropped and the newest kept."""
    history = RunHistory.open(tmp_path, keep_runs=3)
    for index in range(7):
        outcome = dataclasses.replace(FAILED, started_at=float(index), finished_at=index + 0.5)
        history.record("sweep", outcome, served_after(outcome), "torch")
    assert [run.started_at for run in history.recent(10)] == [6.0, 5.0, 4.0]


@pytest.mark.parametrize(
    ("make_bad", "said"),
    [
        (lambda path: path.write_bytes(b"this is not a database" * 100), "is not a readable database"),
        (
            lambda path: sqlite3.connect(path).executescript(
                "CREATE TABLE orders (id INTEGER); PRAGMA user_version=3;"
            ),
            "is another program's database",
        ),
        (
            lambda path: RunHistory.open(path.parent, 10)._db.execute("PRAGMA user_version=99"),
            "has schema version 99, newer than this program's 1",
        ),
    ],
    ids=["garbage", "foreign", "newer"],
)
def test_a_bad_file_is_moved_aside_and_a_new_history_started(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, make_bad: object, said: str
) -> None:
    """A history file that cannot be read is moved aside with a warning and a new history is started."""
    path = tmp_path / FILE_NAME
    make_bad(path)  # type: ignore[operator]
    with pytest.raises(HistoryUnavailable, match=said):  # the CLI reads without touching it
        read_recent(tmp_path, 5)
    with caplog.at_level(logging.WARNING):
        history = RunHistory.open(tmp_path, keep_runs=10)
    assert said in caplog.text
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith(f"{FILE_NAME}.bad-")]
    assert aside, f"nothing moved aside: {list(tmp_path.iterdir())}"
    assert history.restore() is None
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    assert len(history.recent(5)) == 1


def test_a_directory_that_cannot_be_made_is_reported(tmp_path: Path) -> None:
    """A history directory that cannot be made is HistoryUnavailable saying so."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HistoryUnavailable, match="cannot make"):
        RunHistory.open(blocker / "state", keep_runs=10)


def fill(path: Path) -> None:
    """Write zeros to ``path`` until the disk is full."""
    handle = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(handle, b"\0" * 4096)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(handle)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="mounts a small tmpfs: needs root")
def test_a_full_disk_is_logged_and_the_history_goes_on_afterwards(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A full disk fails a record with a clear error, keeps what was committed intact, and recording resumes after."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        history = RunHistory.open(disk, keep_runs=10_000)
        assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
        filler = disk / "filler"
        fill(filler)
        with caplog.at_level(logging.ERROR):
            written = [history.record("sweep", FAILED, served_after(SUCCESS, FAILED), "torch") for _ in range(50)]
        assert not all(written)
        assert "could not record the sweep" in caplog.text
        assert "the filesystem holding it is full" in caplog.text  # issue 18 #10: once "cannot rollback ..."
        assert "cannot rollback" not in caplog.text
        restored = history.restore()
        assert restored is not None
        assert restored[0].latest == FULL_SNAPSHOT  # never half a run: what was committed is intact
        filler.unlink()
        assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
        history.close()
        check = sqlite3.connect(disk / FILE_NAME).execute("PRAGMA integrity_check").fetchone()[0]
        assert check == "ok"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def run_until_killed(service: RunningService, served: dict[Labels, float], completed: int) -> dict[Labels, float]:
    """One life of the service: checks what it serves at start, lets it sweep, SIGKILLs it mid-sweep."""
    try:
        if served:  # served again at once, and the counters go on from where they were
            service.wait_for(lambda: service.get("/readyz")[0] == 200, 5, "the restored results")
            again = service.scrape()
            assert find(again, "matmul_crossover_size") == served
            assert next(iter(find(again, "matmul_sweeps_total", result="success").values())) >= completed
        samples = service.wait_for_sweeps("success", count=completed + 2)
        # Into the next sweep's worker, then SIGKILL: no chance to clean up.
        service.wait_for(lambda: "sweep started" in service.logs().rsplit("sweep finished", 1)[-1], 10, "a sweep")
        return find(samples, "matmul_crossover_size")
    finally:
        service.process.send_signal(signal.SIGKILL)
        service.stop()


@pytest.mark.slow
def test_sigkill_mid_sweep_then_restart_serves_the_last_results_and_keeps_every_completed_sweep(
    tmp_path: Path,
) -> None:
    """Killed with SIGKILL mid-sweep and restarted, over and over: every completed sweep stays in the history."""
    state = tmp_path / "state"
    config = fake_config(interval="2s") + f"history: {{directory: {state}}}\n"
    completed = 0
    served: dict[Labels, float] = {}
    kills = 5
    for restart in range(kills):
        run_dir = tmp_path / f"run{restart}"
        run_dir.mkdir()
        service = RunningService(run_dir, config)
        served = run_until_killed(service, served, completed)
        completed += service.log.read_text().count("sweep finished result=success")
    runs = read_recent(state, 1000)
    # Every sweep the log saw finish is in the history. A kill can land between a sweep's commit and its
    # log line (seen under load), so the history may hold up to one more per kill, never fewer.
    assert completed <= sum(run.result == "success" for run in runs) <= completed + kills
    assert sqlite3.connect(state / FILE_NAME).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_history_command_prints_the_runs_and_names_a_missing_history(tmp_path: Path) -> None:
    """`crossover-monitor history` prints the runs and their devices; a missing history is exit 1 with a clear line."""
    history = RunHistory.open(tmp_path, keep_runs=10)
    history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    history.close()
    command = [sys.executable, "-m", "crossover_monitor", "history", "--directory"]
    done = subprocess.run([*command, str(tmp_path)], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    assert "success" in done.stdout
    assert "cuda:1 withheld (gpu_busy)" not in done.stdout  # only devices the snapshot listed
    assert "cuda:0 measured" in done.stdout
    missing = subprocess.run([*command, str(tmp_path / "none")], capture_output=True, text=True, cwd=REPO, check=False)
    assert missing.returncode == 1
    assert "no run history at" in missing.stderr
    assert "Traceback" not in missing.stderr


def _overwrite(path: Path) -> None:
    path.write_bytes(b"not a database at all " * 300)


def _truncate(path: Path) -> None:
    os.truncate(path, 0)


def _rename_over(path: Path) -> None:
    other = path.with_name("other.sqlite3")
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    other.replace(path)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _other_database_copied_in_after_a_checkpoint(path: Path) -> None:
    """Another SQLite database written over the file in place once the WAL is checkpointed (the connection's
    cache then still holds the history's pages)."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    other.close()
    foreign = path.with_name("foreign.sqlite3")
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    path.write_bytes(foreign.read_bytes())


@pytest.mark.parametrize(
    ("damage", "said", "runs_kept"),
    [
        (_overwrite, "was changed by something else", 1),
        (_truncate, "was changed by something else: it is empty", 1),
        (_rename_over, "was replaced by another file", 2),
        (_directory, "is not a file any more", 2),
        (lambda path: path.unlink(), "was removed", 2),
        (_other_database_copied_in_after_a_checkpoint, "is another program's database", 1),
    ],
    ids=["garbage", "truncated", "renamed-over", "directory", "removed", "foreign-copied-in"],
)
def test_a_history_file_replaced_while_running_is_said_and_the_runs_land_at_the_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, said: str, runs_kept: int
) -> None:
    """Issue 18 #9: replaced while the service ran, nothing was logged and later runs went to the old file."""
    path = tmp_path / FILE_NAME
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    damage(path)  # type: ignore[operator]
    with caplog.at_level(logging.WARNING):
        assert history.record("sweep", FAILED, served_after(SUCCESS, FAILED), "torch")
    assert said in caplog.text
    assert "while the service ran" in caplog.text
    history.close()
    runs = read_recent(tmp_path, 5)  # what an operator reads at the path
    assert [r.result for r in runs][: min(runs_kept, 2)] == ["failed", "success"][:runs_kept]
    assert len(runs) >= runs_kept
    reopened = RunHistory.open(tmp_path, keep_runs=10).restore()
    assert reopened is not None
    assert reopened[0].last_outcome is not None
    assert reopened[0].last_outcome.result is SweepResult.FAILED


@pytest.mark.slow
def test_the_running_service_says_when_its_history_file_was_replaced_and_records_at_the_path(
    tmp_path: Path,
) -> None:
    """Issue 18 #9 against the real service: another file renamed over the history while it runs."""
    state = tmp_path / "state"
    service = RunningService(tmp_path, fake_config() + f"history: {{directory: {state}}}\n")
    try:
        service.wait_for_sweeps("success", 1)
        other = tmp_path / "other.sqlite3"
        sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
        other.replace(state / FILE_NAME)
        service.process.send_signal(signal.SIGUSR1)  # a sweep now: its run is the next write
        service.wait_for_sweeps("success", 2, timeout=30)
        service.wait_for(lambda: "while the service ran" in service.logs(), 10, "the replacement to be logged")
    finally:
        service.stop()
    assert "was replaced by another file" in service.log.read_text()
    runs = read_recent(state, 10)  # where the operator looks: both runs, the earlier one kept
    assert [run.result for run in runs][:2] == ["success", "success"]
    assert any(p.name.startswith(f"{FILE_NAME}.bad-") for p in state.iterdir())


def _stored_state(path: Path) -> object:
    with sqlite3.connect(path / FILE_NAME) as db:
        return json.loads(db.execute("SELECT state FROM served WHERE id = 1").fetchone()[0])


def _store_state(path: Path, state: object) -> None:
    with sqlite3.connect(path / FILE_NAME) as db:
        db.execute("UPDATE served SET state = ? WHERE id = 1", (json.dumps(state),))


def test_the_served_state_carries_its_format_and_an_unversioned_one_still_restores(tmp_path: Path) -> None:
    """Issue 20: the JSON says its format; the bare object earlier releases wrote (format 1) is read as it is."""
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    history.close()
    stored = _stored_state(tmp_path)
    assert isinstance(stored, dict)
    assert stored["format"] == SERVED_FORMAT
    _store_state(tmp_path, stored["served"])  # as an earlier release wrote it
    restored = RunHistory.open(tmp_path, keep_runs=10).restore()
    assert restored is not None
    assert restored[0].latest == FULL_SNAPSHOT


def test_a_served_state_from_a_newer_release_is_left_alone_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A format this program does not know is not guessed at: the service starts without it, and says why."""
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    history.close()
    stored = _stored_state(tmp_path)
    assert isinstance(stored, dict)
    _store_state(tmp_path, {**stored, "format": SERVED_FORMAT + 1})
    with caplog.at_level(logging.WARNING):
        assert RunHistory.open(tmp_path, keep_runs=10).restore() is None
    assert f"format {SERVED_FORMAT + 1}; this one reads up to {SERVED_FORMAT}" in caplog.text


def test_a_run_row_whose_details_cannot_be_read_is_listed_with_why(tmp_path: Path) -> None:
    """A row edited by hand (a key renamed) is shown with its reason, not a KeyError from `history`."""
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    history.close()
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        db.execute("""UPDATE runs SET devices = '[{"name": "cuda:0", "state": "measured", "reason": ""}]'""")
    db.close()
    (run,) = read_recent(tmp_path, 10)
    assert (run.kind, run.result, run.devices, run.crossovers) == ("sweep", "success", (), ())
    assert run.reason.startswith("this row's details cannot be read (devices[0]")
    assert "this row's details cannot be read" in render_history([run])


def test_a_served_state_of_format_2_restores_its_n1_point_under_the_new_role(tmp_path: Path) -> None:
    """Format 2 named the n = 1 point's role "probe"; format 3 "fixed_cost": the older file still restores."""
    fixed_cost = measurement("cuda:0", 1, 1e-5, role="fixed_cost")
    served = dataclasses.replace(FULL_SNAPSHOT, measurements=(*FULL_SNAPSHOT.measurements, fixed_cost))
    state = dataclasses.replace(served_after(SUCCESS), latest=served)
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, state, "torch")
    history.close()
    stored = _stored_state(tmp_path)
    assert isinstance(stored, dict)
    as_format_2 = json.loads(json.dumps(stored["served"]).replace('"role": "fixed_cost"', '"role": "probe"'))
    assert '"probe"' in json.dumps(as_format_2)
    _store_state(tmp_path, {"format": 2, "served": as_format_2})
    restored = RunHistory.open(tmp_path, keep_runs=10).restore()
    assert restored is not None
    assert restored[0].latest == served


def test_a_served_state_of_format_4_restores_with_no_usual_load_yet(tmp_path: Path) -> None:
    """Format 4 kept no sweep's typical others: the older file restores everything else (the host's figure, the
    points' calm medians), and the node's usual load starts over from the next sweeps, not from a guess."""
    key = measurement("cuda:0", 64, 1e-5).key
    state = dataclasses.replace(
        served_after(SUCCESS),
        host_references=(HostReference(median_s=4e-4, spread=0.05),),
        point_medians=(PointMedians(key=key, medians_s=(1e-5, 1.1e-5, 1e-5, 1.05e-5)),),
        others_typical=(1.2,) * 12,
    )
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, state, "torch")
    history.close()
    stored = _stored_state(tmp_path)
    assert isinstance(stored, dict)
    as_format_4 = {k: v for k, v in stored["served"].items() if k != "others_typical"}
    _store_state(tmp_path, {"format": 4, "served": as_format_4})
    restored = RunHistory.open(tmp_path, keep_runs=10).restore()
    assert restored is not None
    served, backend = restored
    assert backend == "torch"
    assert (served.latest, served.host_references, served.point_medians) == (
        state.latest,
        state.host_references,
        state.point_medians,
    )
    assert served.others_typical == ()
    assert served.usual_others_if_known is None  # ten sweeps must say before a load counts as usual


def test_a_history_nested_too_deep_or_with_odd_columns_starts_the_service_and_lists_the_rows(tmp_path: Path) -> None:
    """Issue 34 #5: a served state nested deeper than the JSON parser goes, a row with a text start time and one
    with deeply nested devices. The service starts without the state (not a RecursionError crash loop), its
    page answers, and `history` lists each row with why it cannot be read."""
    state = tmp_path / "state"
    history = RunHistory.open(state, keep_runs=10)
    for outcome in (SUCCESS, FAILED, SUCCESS):
        assert history.record("sweep", outcome, served_after(outcome), "torch")
    history.close()
    deep = "[" * 100_000 + "]" * 100_000
    with sqlite3.connect(state / FILE_NAME) as db:
        db.execute(
            "UPDATE served SET state = ? WHERE id = 1",
            (json.dumps({"format": SERVED_FORMAT})[:-1] + f', "served": {deep}}}',),
        )
        first, second, third = (row[0] for row in db.execute("SELECT id FROM runs ORDER BY id"))
        db.execute("UPDATE runs SET started_at = 'yesterday' WHERE id = ?", (first,))
        db.execute("UPDATE runs SET devices = ? WHERE id = ?", (deep, second))
        db.execute("UPDATE runs SET finished_at = 1e300 WHERE id = ?", (third,))
    db.close()
    done = subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "history", "--directory", str(state)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "this row cannot be read (run.started_at: expected a finite number, got 'yesterday')" in done.stdout
    assert "this row's details cannot be read (JSON nested too deeply to read)" in done.stdout
    assert "Traceback" not in done.stderr
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    service = RunningService(run_dir, fake_config() + f"history: {{directory: {state}}}\n")
    try:
        service.wait_for(lambda: service.get("/")[0] == 200, 30, "the landing page")
        status, _, page = service.get("/")
        assert status == 200
        assert "this row cannot be read" in page
        assert "cannot be read (JSON nested too deeply to read); starting without it" in service.logs()
    finally:
        assert service.stop() == 0
    assert "Traceback" not in service.log.read_text()


LOCK_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
# The write lock, held. (locking_mode=EXCLUSIVE cannot be had beside the service: it holds its shared lock on the
# file while it runs, which is what tells other programs it has the WAL open; before issue 51 N1 it lost it.)
db.execute("BEGIN EXCLUSIVE")
db.execute("UPDATE served SET state = state WHERE id = 1")  # a write: the lock is taken now
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("COMMIT")
db.close()
"""


@pytest.mark.slow  # a real service for 15 s
def test_a_history_another_process_holds_locked_holds_up_nothing_and_loses_no_run(tmp_path: Path) -> None:
    """Issue 34 #4: another process held the file in an exclusive transaction: /metrics took up to 9.7 s (the
    page's history read held the handler threads), sweeps were skipped, and once the lock went the healthy
    file was declared unreadable and moved aside. Now nothing waits more than a moment, the runs made meanwhile
    are recorded once the lock is gone, and the file stays where it is."""
    state = tmp_path / "state"
    service = RunningService(tmp_path, fake_config(interval="2s") + f"history: {{directory: {state}}}\n")
    try:
        service.wait_for_sweeps("success", 1)
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(state / FILE_NAME), "8"], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        slowest = 0.0
        pages = []
        while holder.poll() is None:
            for path in ("/metrics", "/"):
                began = time.monotonic()
                status, _, body = service.get(path)
                slowest = max(slowest, time.monotonic() - began)
                assert status == 200
                if path == "/":
                    pages.append(body)
            time.sleep(0.2)
        sweeps_then = service.scrape()[("matmul_sweeps_total", frozenset({("result", "success")}))]
        service.wait_for_sweeps("success", int(sweeps_then) + 1)  # one more, recorded after the lock went
    finally:
        assert service.stop() == 0
    assert slowest < 2.0  # a page waits READ_WAIT_S at most for the history, never the writer's lock
    assert all("Recent runs" in page for page in pages)
    assert not list(state.glob(f"{FILE_NAME}.bad-*"))
    logs = service.log.read_text()
    assert "moved it to" not in logs
    runs = read_recent(state, 1000)
    recorded = sum(run.result == "success" for run in runs)
    assert recorded >= int(sweeps_then), (runs, logs[-3000:])


def test_a_run_a_busy_file_kept_out_is_written_with_the_next_or_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer holding the file's write lock: the record waits WRITE_WAIT_S, keeps the run and says so;
    the next record writes both; a run kept at close is written then."""
    # The wait's length is not what this shows: 0.2 s instead of the service's 2 s, twice (issue 36).
    monkeypatch.setattr("crossover_monitor.service.history.WRITE_WAIT_S", 0.2)
    history = RunHistory.open(tmp_path, keep_runs=10)
    assert history.record("sweep", SUCCESS, served_after(SUCCESS), "torch")
    other = sqlite3.connect(tmp_path / FILE_NAME, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
    with caplog.at_level(logging.WARNING):
        assert not history.record("sweep", FAILED, served_after(SUCCESS, FAILED), "torch")
    assert "is kept and recorded with the next" in caplog.text
    assert "moved it" not in caplog.text
    other.execute("COMMIT")
    assert history.record("retry", SUCCESS, served_after(SUCCESS, FAILED, SUCCESS), "torch")
    assert [r.result for r in history.recent(10)] == ["success", "failed", "success"]
    other.execute("BEGIN IMMEDIATE")
    assert not history.record("sweep", FAILED, served_after(SUCCESS, FAILED, SUCCESS, FAILED), "torch")
    other.execute("COMMIT")
    other.close()
    history.close()
    assert [r.result for r in read_recent(tmp_path, 10)] == ["failed", "success", "failed", "success"]


# Another program at the history while the service runs: a Python reader and writer (a write transaction on the
# served row, then a checkpoint that truncates the WAL), looping until told to stop.
READER_WRITER = """
import sqlite3, sys, time
path, stop = sys.argv[1], sys.argv[2]
import os
while not os.path.exists(stop):
    db = sqlite3.connect(path, isolation_level=None, timeout=5)
    db.execute("SELECT count(*) FROM runs").fetchone()
    db.execute("BEGIN IMMEDIATE")
    db.execute("UPDATE served SET state = state WHERE id = 1")
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    time.sleep(0.3)
"""


def _sweeps_in_log(service: RunningService) -> int:
    return service.logs().count("sweep finished result=success")


def _one_life_beside_other_programs(service: RunningService, history: Path, sweeps: int) -> None:
    """Sweeps while the sqlite3 shell reads the file between them and a Python process reads and writes it."""
    stop = history.parent / "stop-reader"
    stop.unlink(missing_ok=True)
    service.wait_for_sweeps("success", 1)
    other = subprocess.Popen([sys.executable, "-c", READER_WRITER, str(history), str(stop)])
    try:
        deadline = time.monotonic() + 120
        while _sweeps_in_log(service) < sweeps and time.monotonic() < deadline:
            shell = subprocess.run(
                ["sqlite3", str(history), "select count(*) from runs"], capture_output=True, text=True, check=False
            )
            assert shell.returncode == 0, shell.stderr
            time.sleep(0.5)
    finally:
        stop.touch()
        other.wait(timeout=30)
    assert other.returncode == 0


@pytest.mark.slow  # a real service through two lives, ~40 s
@pytest.mark.skipif(shutil.which("sqlite3") is None, reason="the sqlite3 shell is not installed (scripts/test does)")
def test_the_history_keeps_every_run_while_other_programs_read_and_write_it(tmp_path: Path) -> None:
    """Issue 51 N1: the sqlite3 shell or Python opening the history while the service ran sent every later run into a
    deleted WAL file (10 sweeps left 4 rows after a SIGKILL). Now every run survives readers, writers, a clean
    stop and a SIGKILL, row for row, and the restart counts them all."""
    state = tmp_path / "state"
    history = state / FILE_NAME
    config = fake_config(interval="1s") + f"history: {{directory: {state}}}\n"
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    first = RunningService(first_dir, config)
    try:
        _one_life_beside_other_programs(first, history, sweeps=6)
    finally:
        assert first.stop() == 0
    in_first = first.log.read_text().count("sweep finished result=success")
    assert sum(run.result == "success" for run in read_recent(state, 1000)) == in_first  # a clean stop: row for row

    second = RunningService(second_dir, config)
    try:
        restored = second.wait_for_sweeps("success", in_first)  # the restart counts every run the history kept
        assert restored[("matmul_sweeps_total", frozenset({("result", "success")}))] >= in_first
        _one_life_beside_other_programs(second, history, sweeps=6)
    finally:
        second.process.send_signal(signal.SIGKILL)
        second.stop()
    in_second = second.log.read_text().count("sweep finished result=success")
    recorded = sum(run.result == "success" for run in read_recent(state, 1000))
    # A kill can land between a sweep's commit and its log line: one more row than the log says, never fewer.
    assert in_first + in_second <= recorded <= in_first + in_second + 1
    assert not list(state.glob(f"{FILE_NAME}.bad-*"))
    assert sqlite3.connect(history).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
