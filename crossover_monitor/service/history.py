"""The run history: every sweep and retry recorded in SQLite, and what was served, so a restart resumes it.

One file, ``history.sqlite3``, in the state directory. Each run is written in one transaction
together with the state the service serves after it (the snapshot, the counters, the last success),
in WAL mode with full sync: a SIGKILL at any moment leaves either the run and its state or neither,
never half a sweep. On start the served state is read back, so /metrics shows the last results with
their original timestamps and the counters go on from where they were.

A file that is not this history (corrupt, foreign, from a newer schema) is moved aside with a
timestamp and a new one started; a write that fails (a full disk) is logged and the service goes on
serving from memory. Neither stops the service. The file is also checked before each write: one
replaced, removed, truncated or overwritten while the service runs is said in the log, moved aside,
and the history the service still holds open is written to a new file at the path.

SQLite's locks are POSIX record locks, which belong to the process and the file: closing *any* descriptor of
the file in this process drops them all. A process without its shared lock looks gone to another program
that opens the file (the ``sqlite3`` shell, a backup script), and that program, closing as what it takes for
the last user, checkpoints the WAL and deletes it while this one goes on writing into the deleted file. So
this process never opens and closes the file beside its connection: the checks read it through the
connection and through one descriptor held as long as the connection.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossover_monitor.codec import DecodeError, from_data, parse_json, to_data
from crossover_monitor.model import (
    HostReference,
    PointMedians,
    RecentCrossovers,
    RetryResult,
    ServiceState,
    Snapshot,
    SweepOutcome,
    SweepResult,
)
from crossover_monitor.text import printable

log = logging.getLogger(__name__)

FILE_NAME = "history.sqlite3"
# PRAGMA application_id marks the file as this program's ("XMON"); user_version is the schema's version.
APPLICATION_ID = 0x584D4F4E
SCHEMA_VERSION = 1
_SQLITE_HEADER = b"SQLite format 3\x00"
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
    started_at: float | None  # None: the row's times cannot be read (the reason says why)
    finished_at: float | None
    result: str
    reason: str
    devices: tuple[tuple[str, str, str], ...]  # (device, state, reason)
    crossovers: tuple[tuple[str, str, str, float | None], ...]  # (gpu, mode, state, size)


# The rows' JSON columns, written and read through the codec. They belong to SCHEMA_VERSION: bump it when
# one of these fields is renamed or changes meaning (a file of a newer version is moved aside, not misread).
@dataclass(frozen=True)
class _DeviceRow:
    device: str
    state: str
    reason: str


@dataclass(frozen=True)
class _CrossoverRow:
    gpu: str
    mode: str
    state: str
    size: float | None


# The served state's JSON is {"format": SERVED_FORMAT, "served": {...}}. Format 1 is the bare object
# that releases before the version was written stored. Bump it when a field of _Served (or of what it
# holds) is renamed or changes meaning, and bring the older formats up to it in _upgraded.
# Format 3: the n = 1 point's role is "fixed_cost" (it was "probe"). Format 4: points say what others used of the
# host over them, and the state keeps each point's calm medians (new fields, absent in older files; a release
# before it would refuse them, so it says the file is newer rather than damaged). Format 5: the state keeps each
# sweep's typical others (a new field, as format 4's).
SERVED_FORMAT = 5


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
    host_references: tuple[HostReference, ...] = ()  # likewise
    point_medians: tuple[PointMedians, ...] = ()  # likewise
    point_medians_timed_as: str = ""
    others_typical: tuple[float, ...] = ()  # absent in files before format 5


class HistoryUnavailable(Exception):
    """The history cannot be opened at all (e.g. the directory cannot be made); the service runs without it."""


class HistoryBusy(HistoryUnavailable):
    """Another process holds the file locked (or it cannot be read just now): tried again later, never taken
    for a damaged file."""


# How long a write waits for another process's lock before the run is kept for the next write, and a read for
# the landing page before it says the history is busy: neither may hold the sweep or the HTTP threads.
WRITE_WAIT_S = 2.0
READ_WAIT_S = 0.25
_TRANSIENT = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR}  # primary result codes


def _transient(exc: sqlite3.Error) -> bool:
    """A lock held by another process, or an I/O error (the file is not damaged for it, and a new file on
    the same disk would fare no better): try again later."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _TRANSIENT


class RunHistory:
    """The SQLite file; every method is safe from any thread."""

    def __init__(self, path: Path, keep_runs: int) -> None:
        self.path = path
        self._keep_runs = keep_runs
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, timeout=WRITE_WAIT_S, isolation_level=None, check_same_thread=False)
        self._pending: list[tuple[Any, ...]] = []  # run rows a busy file kept out, written with the next record
        self._pending_served: _Served | None = None  # and the state served after the last of them
        self._identity = _identity(path)  # the file this connection has open, to tell a replaced one
        self._header_fd: int | None = None  # the same file, held open beside the connection (the docstring says why)

    @classmethod
    def open(cls, directory: Path, keep_runs: int) -> RunHistory:
        """The history in ``directory``; a bad file there is moved aside (and logged), not used."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryUnavailable(f"cannot make {directory}: {exc.strerror or exc}") from None
        path = directory / FILE_NAME
        try:
            problem = _problem_with(path)
        except HistoryBusy as exc:  # looked at again before every record
            log.warning(f"run history: {path} {exc}; opening it as it is")
            problem = None
        if problem is not None:
            aside = _move_aside(path, problem)
            log.warning(f"run history: {path} {problem}; moved it to {aside.name} and started a new history")
        try:
            history = cls(path, keep_runs)
            history._prepare()
        except sqlite3.Error as exc:
            raise HistoryUnavailable(f"cannot open {path}: {exc}") from None
        history._hold_file()
        return history

    def _hold_file(self) -> None:
        """Open the descriptor the checks read the file's header through, once the connection made the file."""
        try:
            self._header_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # opened by the next check, which says why it cannot be
            self._identity = _identity(self.path)
            return
        stat = os.fstat(self._header_fd)  # the identity of the file opened, not of whatever is at the path now
        self._identity = (stat.st_dev, stat.st_ino)

    def _release_file(self) -> None:
        """Close the held descriptor; only once the connection to that file is closed (it drops its locks)."""
        if self._header_fd is not None:
            os.close(self._header_fd)
            self._header_fd = None

    def _still_ours(self) -> str | None:
        """Why the file at the path is no longer the one this history writes (None: it is). Under the lock."""
        now = _identity(self.path)
        if now is None:
            return "was removed" if not self.path.exists() and not self.path.is_symlink() else "is not a file any more"
        if now != self._identity:
            return "was replaced by another file"
        # The file's own first bytes: a reader would see the pages still in the WAL and miss an overwrite. Read
        # through the held descriptor (the same file: its identity was just compared), never a new one.
        try:
            if self._header_fd is None:  # not opened with the connection: held from now on
                self._header_fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            header = os.pread(self._header_fd, len(_SQLITE_HEADER), 0)
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        if header != _SQLITE_HEADER:
            return "was changed by something else: it " + ("is empty (truncated)" if not header else "was overwritten")
        # A connection of its own, not the one this history writes with: that one may answer from its cache and miss
        # another database copied over the file. (SQLite keeps a closed connection's descriptor open while another
        # connection of this process holds locks on the file, so this one drops none of them.)
        try:
            problem = _problem_with(self.path, ours=True)
        except HistoryBusy:
            # A read-only connection can keep failing (an I/O error on the shared-memory index) after another
            # process's exclusive lock went: ask through the connection this history writes with.
            try:
                problem = _problem_in(self._db, ours=True)
            except sqlite3.Error as exc:
                if _transient(exc):
                    raise HistoryBusy(f"is busy or cannot be read just now ({exc})") from None
                problem = f"is not a readable database ({exc})"
        return None if problem is None else f"was changed by something else: it {problem}"

    def _recover(self, problem: str) -> None:
        """A new file at the path with the history this connection still holds (it has the old file open)."""
        aside = None
        if self.path.exists() or self.path.is_symlink():
            try:
                aside = _move_aside(self.path, problem)
            except HistoryUnavailable as exc:
                log.error(f"run history: {exc}; runs are not recorded until it is fixed")  # noqa: TRY400 - no traceback
                return
        fresh = sqlite3.connect(self.path, timeout=WRITE_WAIT_S, isolation_level=None, check_same_thread=False)
        try:
            self._db.backup(fresh)
            kept = "the history held open"
        except sqlite3.Error as exc:  # overwritten in place: what was open is damaged too
            fresh.close()
            Path(self.path).unlink(missing_ok=True)
            fresh = sqlite3.connect(self.path, timeout=WRITE_WAIT_S, isolation_level=None, check_same_thread=False)
            kept = f"a new history (the one held open could not be read: {exc})"
        self._db.close()
        self._release_file()
        self._db = fresh
        self._hold_file()  # before anything can fail: the next check must know the new file for this history's own
        self._prepare()
        where = f"; moved what is there to {aside.name}" if aside is not None else ""
        log.warning(f"run history: {self.path} {problem} while the service ran{where}; wrote {kept} to {self.path}")

    def _prepare(self) -> None:
        db = self._db
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        if db.execute("PRAGMA user_version").fetchone()[0] == 0:  # a new file: the schema, in one transaction
            marks = f"PRAGMA application_id={APPLICATION_ID}; PRAGMA user_version={SCHEMA_VERSION};"
            db.executescript(f"BEGIN; {_SCHEMA} {marks} COMMIT;")

    def close(self) -> None:
        """Close the file, after one last try at the runs a busy file kept out (they would be lost)."""
        with self._lock:
            if self._pending and self._pending_served is not None:
                try:
                    self._write(self._pending, self._pending_served)
                    self._pending = []
                except (HistoryBusy, sqlite3.Error, OSError) as exc:
                    log.warning(f"run history: {len(self._pending)} run(s) not recorded in {self.path}: {exc}")
            self._db.close()
            self._release_file()

    def restore(self) -> tuple[ServiceState, str] | None:
        """What was served before the restart and the configured backend that timed it; None for a new history."""
        with self._lock:
            row = self._db.execute("SELECT state FROM served WHERE id = 1").fetchone()
        if row is None:
            return None
        try:
            stored = parse_json(row[0])
            written_as, data = (
                (stored["format"], stored.get("served"))
                if isinstance(stored, dict) and "format" in stored
                else (1, stored)
            )
            if not isinstance(written_as, int) or written_as > SERVED_FORMAT:
                log.warning(
                    f"run history: the served state in {self.path} was written by a newer crossover-monitor"
                    f" (format {written_as}; this one reads up to {SERVED_FORMAT}); starting without it"
                )
                return None
            served = from_data(_Served, _upgraded(data, written_as))
        except (ValueError, DecodeError) as exc:  # a file from an incompatible version of this program
            log.warning(f"run history: the served state in {self.path} cannot be read ({exc}); starting without it")
            return None
        fields = {f.name: getattr(served, f.name) for f in dataclasses.fields(ServiceState) if hasattr(served, f.name)}
        return ServiceState(**fields), served.backend

    def record(
        self,
        kind: str,
        outcome: SweepOutcome | None,
        state: ServiceState,
        backend: str,
        reason: str = "",
        *,
        since: float | None = None,
    ) -> bool:
        """One run and the state served after it; False if it could not be written.

        ``outcome`` None is a sweep skipped (``reason`` says why): nothing ran, but it counts. ``since``: when the
        first of a burst of them was skipped, for one row that spans the burst (its reason says how many).
        """
        served = _Served(
            backend=backend,
            latest=state.latest,
            last_success_at=state.last_success_at,
            last_outcome=_without_snapshot(state.last_outcome),
            sweeps=state.sweeps,
            retries=state.retries,
            recent=state.recent,
            host_references=state.host_references,
            point_medians=state.point_medians,
            point_medians_timed_as=state.point_medians_timed_as,
            others_typical=state.others_typical,
        )
        now = time.time()
        row = _run_row(kind, outcome, now, reason, since)
        try:
            with self._lock:
                rows = [*self._pending, row][-self._keep_runs :]
                self._pending = []
                try:
                    self._write(rows, served)
                except HistoryBusy as exc:
                    self._pending, self._pending_served = rows, served
                    log.warning(f"run history: {self.path} {exc}; the {kind} is kept and recorded with the next")
                    return False
        except (sqlite3.Error, OSError) as exc:  # a full disk, say: the service goes on from memory
            log.error(f"run history: could not record the {kind} in {self.path}: {_why(exc, self.path)}")  # noqa: TRY400 - no traceback for a full disk
            return False
        return True

    def _write(self, rows: list[tuple[Any, ...]], served: _Served) -> None:
        """The rows and the served state in one transaction, under the lock; HistoryBusy where another
        process holds the file."""
        problem = self._still_ours()
        if problem is not None:
            self._recover(problem)
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _transient(exc):
                raise HistoryBusy(f"is busy ({exc})") from None
            raise
        try:
            db.executemany(
                "INSERT INTO runs (kind, started_at, finished_at, result, reason, devices, crossovers)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            db.execute("DELETE FROM runs WHERE id <= (SELECT max(id) FROM runs) - ?", (self._keep_runs,))
            db.execute(
                "INSERT OR REPLACE INTO served (id, state) VALUES (1, ?)",
                (json.dumps({"format": SERVED_FORMAT, "served": to_data(served)}),),
            )
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:  # SQLite rolls back by itself on some errors (a full disk)
                db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and _transient(exc):
                raise HistoryBusy(f"is busy ({exc})") from None
            raise

    def recent(self, limit: int) -> list[Run]:
        """The latest ``limit`` runs, newest first; HistoryBusy rather than a wait of more than READ_WAIT_S
        (another process's lock, or a record waiting on one)."""
        if not self._lock.acquire(timeout=READ_WAIT_S):
            raise HistoryBusy("is busy: a record is waiting for another process's lock on it")
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(READ_WAIT_S * 1000)}")
            try:
                return _recent(self._db, limit)
            finally:
                self._db.execute(f"PRAGMA busy_timeout = {int(WRITE_WAIT_S * 1000)}")
        except sqlite3.Error as exc:
            raise HistoryBusy(f"cannot be read just now ({exc})") from None
        finally:
            self._lock.release()


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
    return [_run(row) for row in rows]


@dataclass(frozen=True)
class _RunHead:
    """A row's plain columns, read through the codec: a hand-edited row may hold anything."""

    kind: str
    started_at: float
    finished_at: float
    result: str
    reason: str


def _run(row: tuple[Any, ...]) -> Run:
    """One row as a Run; a row whose columns cannot be read (edited by hand, damaged) says so in its reason."""
    kind, started, finished, result, reason, devices, crossovers = row
    try:
        head = from_data(
            _RunHead,
            {"kind": kind, "started_at": started, "finished_at": finished, "result": result, "reason": reason},
            "run",
        )
    except DecodeError as exc:
        return Run(
            kind=printable(kind) if isinstance(kind, str) else "?",  # what the codec would have made of it
            started_at=None,
            finished_at=None,
            result=printable(result) if isinstance(result, str) else "?",
            reason=f"this row cannot be read ({exc})",
            devices=(),
            crossovers=(),
        )
    reason = head.reason
    try:
        device_rows = from_data(tuple[_DeviceRow, ...], parse_json(devices), "devices")
        crossover_rows = from_data(tuple[_CrossoverRow, ...], parse_json(crossovers), "crossovers")
    except (ValueError, TypeError, DecodeError) as exc:  # TypeError: a column that is not text at all
        device_rows, crossover_rows = (), ()
        reason = f"{reason}; this row's details cannot be read ({exc})".lstrip("; ")
    return Run(
        kind=head.kind,
        started_at=head.started_at,
        finished_at=head.finished_at,
        result=head.result,
        reason=reason,
        devices=tuple((d.device, d.state, d.reason) for d in device_rows),
        crossovers=tuple((c.gpu, c.mode, c.state, c.size) for c in crossover_rows),
    )


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the regular file at ``path``, or None if there is none."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino) if path.is_file() else None


def _move_aside(path: Path, problem: str) -> Path:
    """``path`` and its WAL files renamed with a timestamp; HistoryUnavailable if that cannot be done."""
    aside = path.with_name(f"{FILE_NAME}.bad-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    for suffix in ("", "-wal", "-shm"):
        try:
            Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
        except FileNotFoundError:
            continue
        except OSError as exc:  # a read-only directory, say: run without a history, say why
            raise HistoryUnavailable(f"{path} {problem}, and it cannot be moved aside: {exc}") from None
    return aside


def _why(exc: Exception, path: Path) -> str:
    """What a failed write means for the operator: a full disk named as such, with the room left."""
    full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or getattr(exc, "errno", None) == errno.ENOSPC
    if not full:
        return str(exc)
    try:
        free = f"{shutil.disk_usage(path.parent).free // 1024} KiB free"
    except OSError:
        free = "free space unknown"
    return (
        f"the filesystem holding it is full ({free}); the service goes on serving from memory and records "
        "again once there is room"
    )


def _problem_with(path: Path, *, ours: bool = False) -> str | None:
    """Why the file at ``path`` is not a usable history of this program, or None (also when it does not exist).

    ``ours``: the file must carry this program's mark (one it made), where an empty file would otherwise do.
    HistoryBusy where another process's lock (or an I/O error) keeps it from being read now.
    """
    if not path.exists():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=WRITE_WAIT_S)) as db:
            return _problem_in(db, ours=ours)
    except sqlite3.DatabaseError as exc:
        if _transient(exc):
            raise HistoryBusy(f"is busy or cannot be read just now ({exc})") from None
        return f"is not a readable database ({exc})"


def _problem_in(db: sqlite3.Connection, *, ours: bool) -> str | None:
    """What ``_problem_with`` reads, through a connection already open; sqlite3 errors propagate."""
    application_id = db.execute("PRAGMA application_id").fetchone()[0]
    version = db.execute("PRAGMA user_version").fetchone()[0]
    tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if application_id != APPLICATION_ID and (tables or version or ours):
        return "is another program's database" if tables or version else "is empty (truncated)"
    if version > SCHEMA_VERSION:
        return f"has schema version {version}, newer than this program's {SCHEMA_VERSION}"
    check = db.execute("PRAGMA quick_check").fetchone()[0]
    return None if check == "ok" else f"is corrupt ({check})"


def _upgraded(data: Any, written_as: int) -> Any:
    """The served state of an older format as this one writes it (still to be checked by the codec)."""
    if written_as < 3 and isinstance(data, dict):  # noqa: PLR2004 - format 3 renamed the n = 1 point's role
        with_current_roles(data.get("latest"))
    return data


# Roles of points under their earlier names: "probe" until format 3 of the served state (and `once --json`).
_RENAMED_ROLES = {"probe": "fixed_cost"}


def with_current_roles(snapshot: Any) -> None:
    """A snapshot's JSON data (from the history or an older ``once --json``) with its roles' current names."""
    measurements = snapshot.get("measurements") if isinstance(snapshot, dict) else None
    for measurement in measurements if isinstance(measurements, list) else ():
        if isinstance(measurement, dict) and measurement.get("role") in _RENAMED_ROLES:
            measurement["role"] = _RENAMED_ROLES[measurement["role"]]


def _without_snapshot(outcome: SweepOutcome | None) -> SweepOutcome | None:
    return None if outcome is None else dataclasses.replace(outcome, snapshot=None)


def _run_row(
    kind: str, outcome: SweepOutcome | None, now: float, reason: str, since: float | None = None
) -> tuple[Any, ...]:
    if outcome is None:  # a burst's start never after its end, should the wall clock have stepped back between
        return (kind, now if since is None else min(since, now), now, SweepResult.SKIPPED.value, reason, "[]", "[]")
    snapshot = outcome.snapshot
    devices: list[_DeviceRow] = []
    crossovers: list[_CrossoverRow] = []
    if snapshot is not None:
        for device in snapshot.devices:
            state, why = snapshot.device_state(device.device)
            devices.append(_DeviceRow(device.device, state.value, why))
        crossovers = [_CrossoverRow(c.gpu, c.mode, c.state.value, c.size) for c in snapshot.crossovers]
    return (
        kind,
        outcome.started_at,
        outcome.finished_at,
        outcome.result.value,
        outcome.reason,
        json.dumps(to_data(devices)),
        json.dumps(to_data(crossovers)),
    )
