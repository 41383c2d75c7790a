"""The run history: every sweep and retry recorded in SQLite, and what was served, so a restart resumes it.

One file, ``history.sqlite3``, in the state directory. Each run is written in one transaction
together with the state the service serves after it (the snapshot, the counters, the last success),
in WAL mode with full sync: a SIGKILL at any moment leaves either the run and its state or neither,
never half a sweep. On start the served state is read back, so /metrics shows the last results with
their original timestamps and the counters go on from where they were.

A file that is not this history (corrupt, foreign, from a newer schema) is moved aside with a
timestamp and a new one started; a write that fails (a full disk) is logged and the service goes on
serving from memory. Neither stops the service.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor.codec import DecodeError, from_data, to_data
from monitor.model import RecentCrossovers, RetryResult, ServiceState, Snapshot, SweepOutcome, SweepResult

log = logging.getLogger(__name__)

FILE_NAME = "history.sqlite3"
# PRAGMA application_id marks the file as this program's ("XMON"); user_version is the schema's version.
APPLICATION_ID = 0x584D4F4E
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,            -- sweep | retry | skipped
    started_at REAL NOT NULL,
    finished_at REAL NOT NULL,
    result TEXT NOT NULL,
    reason TEXT NOT NULL,
    devices TEXT NOT NULL,         -- JSON: [{"device", "state", "reason"}]
    crossovers TEXT NOT NULL       -- JSON: [{"gpu", "mode", "state", "size"}]
);
CREATE TABLE served (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL            -- JSON: what /metrics serves after the latest run
);
"""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One recorded run, as ``crossover-monitor history`` shows it."""

    kind: str
    started_at: float
    finished_at: float
    result: str
    reason: str
    devices: tuple[tuple[str, str, str], ...]  # (device, state, reason)
    crossovers: tuple[tuple[str, str, str, float | None], ...]  # (gpu, mode, state, size)


@dataclass(frozen=True, kw_only=True)
class _Served:
    """The part of ServiceState that outlives a restart, and the backend (as configured) that timed it."""

    backend: str
    latest: Snapshot | None
    last_success_at: float | None
    last_outcome: SweepOutcome | None
    sweeps: tuple[tuple[SweepResult, int], ...]
    retries: tuple[tuple[RetryResult, int], ...]
    recent: tuple[RecentCrossovers, ...] = ()  # absent in files of earlier versions


class HistoryUnavailable(Exception):
    """The history cannot be opened at all (e.g. the directory cannot be made); the service runs without it."""


class RunHistory:
    """The SQLite file; every method is safe from any thread."""

    def __init__(self, path: Path, keep_runs: int) -> None:
        self.path = path
        self._keep_runs = keep_runs
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)

    @classmethod
    def open(cls, directory: Path, keep_runs: int) -> RunHistory:
        """The history in ``directory``; a bad file there is moved aside (and logged), not used."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryUnavailable(f"cannot make {directory}: {exc.strerror or exc}") from None
        path = directory / FILE_NAME
        problem = _problem_with(path)
        if problem is not None:
            aside = path.with_name(f"{FILE_NAME}.bad-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            for suffix in ("", "-wal", "-shm"):
                try:
                    Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
                except FileNotFoundError:
                    continue
                except OSError as exc:  # a read-only directory, say: run without a history, say why
                    raise HistoryUnavailable(f"{path} {problem}, and it cannot be moved aside: {exc}") from None
            log.warning(f"run history: {path} {problem}; moved it to {aside.name} and started a new history")
        try:
            history = cls(path, keep_runs)
            history._prepare()
        except sqlite3.Error as exc:
            raise HistoryUnavailable(f"cannot open {path}: {exc}") from None
        return history

    def _prepare(self) -> None:
        db = self._db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        if db.execute("PRAGMA user_version").fetchone()[0] == 0:  # a new file: the schema, in one transaction
            marks = f"PRAGMA application_id={APPLICATION_ID}; PRAGMA user_version={SCHEMA_VERSION};"
            db.executescript(f"BEGIN; {_SCHEMA} {marks} COMMIT;")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def restore(self) -> tuple[ServiceState, str] | None:
        """What was served before the restart and the configured backend that timed it; None for a new history."""
        with self._lock:
            row = self._db.execute("SELECT state FROM served WHERE id = 1").fetchone()
        if row is None:
            return None
        try:
            served = from_data(_Served, json.loads(row[0]))
        except (ValueError, DecodeError) as exc:  # a file from an incompatible version of this program
            log.warning(f"run history: the served state in {self.path} cannot be read ({exc}); starting without it")
            return None
        fields = {f.name: getattr(served, f.name) for f in dataclasses.fields(ServiceState) if hasattr(served, f.name)}
        return ServiceState(**fields), served.backend

    def record(
        self, kind: str, outcome: SweepOutcome | None, state: ServiceState, backend: str, reason: str = ""
    ) -> bool:
        """One run and the state served after it; False if it could not be written.

        ``outcome`` None is a sweep skipped (``reason`` says why): nothing ran, but it counts.
        """
        served = _Served(
            backend=backend,
            latest=state.latest,
            last_success_at=state.last_success_at,
            last_outcome=_without_snapshot(state.last_outcome),
            sweeps=state.sweeps,
            retries=state.retries,
            recent=state.recent,
        )
        now = time.time()
        row = _run_row(kind, outcome, now, reason)
        try:
            with self._lock:
                db = self._db
                db.execute("BEGIN IMMEDIATE")
                try:
                    db.execute(
                        "INSERT INTO runs (kind, started_at, finished_at, result, reason, devices, crossovers)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        row,
                    )
                    db.execute("DELETE FROM runs WHERE id <= (SELECT max(id) FROM runs) - ?", (self._keep_runs,))
                    db.execute(
                        "INSERT OR REPLACE INTO served (id, state) VALUES (1, ?)", (json.dumps(to_data(served)),)
                    )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:  # a full disk, say: the service goes on from memory
            log.error(f"run history: could not record the {kind} in {self.path}: {exc}")  # noqa: TRY400 - no traceback for a full disk
            return False
        return True

    def recent(self, limit: int) -> list[Run]:
        """The latest ``limit`` runs, newest first."""
        with self._lock:
            return _recent(self._db, limit)


def read_recent(directory: Path, limit: int) -> list[Run]:
    """The latest runs in the history in ``directory``, read-only (for ``crossover-monitor history``)."""
    path = directory / FILE_NAME
    if not path.is_file():
        raise HistoryUnavailable(f"no run history at {path} (the service records one once it has run a sweep there)")
    problem = _problem_with(path)
    if problem is not None:
        raise HistoryUnavailable(f"{path} {problem} (the service moves such a file aside when it starts)")
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
            return _recent(db, limit)
    except sqlite3.Error as exc:
        raise HistoryUnavailable(f"cannot read {path}: {exc}") from None


def _recent(db: sqlite3.Connection, limit: int) -> list[Run]:
    rows = db.execute(
        "SELECT kind, started_at, finished_at, result, reason, devices, crossovers FROM runs ORDER BY id DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [
        Run(
            kind=kind,
            started_at=started,
            finished_at=finished,
            result=result,
            reason=reason,
            devices=tuple((d["device"], d["state"], d["reason"]) for d in json.loads(devices)),
            crossovers=tuple((c["gpu"], c["mode"], c["state"], c["size"]) for c in json.loads(crossovers)),
        )
        for kind, started, finished, result, reason, devices, crossovers in rows
    ]


def _problem_with(path: Path) -> str | None:
    """Why the file at ``path`` is not a usable history of this program, or None (also when it does not exist)."""
    if not path.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as db:
            application_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if application_id != APPLICATION_ID and (tables or version):
                return "is another program's database"
            if version > SCHEMA_VERSION:
                return f"has schema version {version}, newer than this program's {SCHEMA_VERSION}"
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                return f"is corrupt ({check})"
    except sqlite3.DatabaseError as exc:
        return f"is not a readable database ({exc})"
    return None


def _without_snapshot(outcome: SweepOutcome | None) -> SweepOutcome | None:
    return None if outcome is None else dataclasses.replace(outcome, snapshot=None)


def _run_row(kind: str, outcome: SweepOutcome | None, now: float, reason: str) -> tuple[Any, ...]:
    if outcome is None:
        return (kind, now, now, SweepResult.SKIPPED.value, reason, "[]", "[]")
    snapshot = outcome.snapshot
    devices: list[dict[str, str]] = []
    crossovers: list[dict[str, Any]] = []
    if snapshot is not None:
        withheld = {w.device: w.reason.value for w in snapshot.withheld}
        failed = {f.device: f.reason for f in snapshot.failures}
        for device in snapshot.devices:
            name = device.device
            if name in withheld:
                devices.append({"device": name, "state": "withheld", "reason": withheld[name]})
            elif name in failed and name not in snapshot.measured_devices:
                devices.append({"device": name, "state": "failed", "reason": failed[name]})
            else:
                devices.append({"device": name, "state": "measured", "reason": ""})
        crossovers = [
            {"gpu": c.gpu, "mode": c.mode, "state": c.state.value, "size": c.size} for c in snapshot.crossovers
        ]
    return (
        kind,
        outcome.started_at,
        outcome.finished_at,
        outcome.result.value,
        outcome.reason,
        json.dumps(devices),
        json.dumps(crossovers),
    )
