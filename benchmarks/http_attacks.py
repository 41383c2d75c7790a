"""The service under attack (issue 18): each attack against the real service while a normal client scrapes.

Runs ``python -m crossover_monitor run`` from a checkout (the fake ``curve`` backend, as ``http_surface.py``
does) and, for each attack, scrapes /metrics every 0.1 s from a thread of its own on a new connection
each time: that scraper's errors and p99 during the attack, and the service's RSS before, at its peak
during, and 5 s after, are recorded beside what the attack itself was answered.

1. ``signals``: SIGHUP sent in a tight loop for 3 s (2,000 at a time), then one more with a changed
   configuration (was it reloaded?) and SIGTERM (how long until it exited);
2. ``passwords``: 8 connections sending wrong passwords for 12 s; a second in, a scraper with the right
   password begins (a new connection each time), and 5 s later the web config file is touched (a
   reload); the log lines about refusals;
3. ``accept``: 20,000 scrapes each with a different ``Accept: application/openmetrics-text; version=1.k.i``,
   then ``version=abc`` and ``version=1.1.\\xff`` (status, tracebacks logged);
4. ``readers``: 260 connections with small receive buffers, each pipelining 1,500 GETs and never reading;
5. ``smuggle``: Content-Length and Transfer-Encoding together with a second request in the body;
6. ``sweeps``: 8 simultaneous ``POST /-/sweep`` while idle (``--web.enable-lifecycle``): how many 202s,
   how many sweeps began;
7. ``certbot``: TLS from ``live/cert.pem``, a symlink switched to a new archive file: seconds until new
   connections get the new certificate;
8. ``renewed_readers`` (issue 34 #1): 280 such non-readers renewed every 15 s for 45 s, fresh /healthz
   probes meanwhile;
9. ``guessers`` (issue 34 #2): 300 connections each pipelining 20 new wrong passwords, renewed as they
   close, for 20 s; /healthz probes and a scraper with the right password meanwhile;
10. ``flood`` (issue 34, a just-connected scraper evicted): new connections that never send, opened
    (not waited for) 50 at a time every 50 ms by each of 4 threads for 15 s, each keeping its last 100;
    /healthz probes meanwhile;
11. ``history_lock`` (issue 34 #4): with the history on, another process holds its SQLite file in an
    exclusive transaction for 20 s; the /metrics scraper and one of the landing page meanwhile (p50, p99,
    failures), then whether the file was kept and what the log said;
12. ``tls_handshakes`` (issue 34 #3): TLS on; 20 rounds of 600 connections that send the start of a ClientHello
    and stall, while a TLS scraper and /healthz prober run; tracebacks logged, then how long SIGTERM takes
    with 40 such handshakes pending;
13. ``worker_garbage`` (issue 34 #7): a plugin backend (a module written into the scratch directory) that
    writes JSON nested 200,000 deep on the worker's message channel, and one that writes 256 MiB to stderr
    without a newline: how long until the sweep is recorded failed, and the daemon's peak RSS;
14. ``hostile_answers`` (issue 34 #6): ``node-check --timeout 5s`` against a loopback server that drips a byte
    a second, one that sends 600 MiB, and one that redirects to the dripper: wall time, the command's peak
    RSS, its exit status and the length of its first output line; and ``--check drift`` against a Prometheus
    with 100,000 alerts firing.

``--checkout DIR`` runs another checkout (a git worktree of an earlier commit) for the "before" figures::

    python benchmarks/http_attacks.py --out benchmarks/results/http-attacks.json
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import errno
import http.client
import http.server
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_surface import REPO, Service, percentile, scratch_dir

sys.path.insert(0, str(REPO))
from tests import fakeserver

PASSWORD = b"bench"  # a benchmark's credential, hashed at run time


def rss_mib(service: Service, field: str = "VmRSS") -> float:
    """The service's resident memory now (``VmHWM``: its peak so far), MiB."""
    status = Path(f"/proc/{service.process.pid}/status").read_text().splitlines()
    return int(next(line.split()[1] for line in status if line.startswith(f"{field}:"))) / 1024


class Scraper(threading.Thread):
    """/metrics every 0.1 s on a new connection; latencies, errors and the service's peak RSS meanwhile."""

    def __init__(
        self,
        service: Service,
        headers: dict[str, str] | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        path: str = "/metrics",
    ):
        super().__init__(daemon=True)
        self._service, self._headers, self._tls, self._path = service, headers or {}, tls, path
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.peak_rss = 0.0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            began = time.monotonic()
            try:
                if self._tls is None:
                    connection = http.client.HTTPConnection("127.0.0.1", self._service.port, timeout=10)
                else:
                    connection = http.client.HTTPSConnection(
                        "127.0.0.1", self._service.port, timeout=10, context=self._tls
                    )
                connection.request("GET", self._path, headers=self._headers)
                status = connection.getresponse().status
                connection.close()
                if status != 200:
                    self.errors.append(str(status))
            except OSError as exc:
                self.errors.append(type(exc).__name__)
            self.latencies.append(time.monotonic() - began)
            with contextlib.suppress(OSError, StopIteration):
                self.peak_rss = max(self.peak_rss, rss_mib(self._service))
            self._done.wait(0.1)

    def result(self) -> dict[str, Any]:
        self._done.set()
        self.join(15)
        return {
            "scrapes": len(self.latencies),
            "errors": len(self.errors),
            "error_kinds": sorted(set(self.errors)),
            "p50_ms": round(percentile(self.latencies, 0.5) * 1000, 1) if self.latencies else None,
            "p99_ms": round(percentile(self.latencies, 0.99) * 1000, 1) if self.latencies else None,
            "max_ms": round(max(self.latencies) * 1000, 1) if self.latencies else None,
            "peak_rss_mib": round(self.peak_rss, 1),
        }


@contextlib.contextmanager
def watched(
    service: Service,
    row: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    tls: ssl.SSLContext | None = None,
) -> Iterator[None]:
    """The scraper and the RSS around an attack, written into ``row``."""
    row["rss_before_mib"] = round(rss_mib(service), 1)
    scraper = Scraper(service, headers, tls=tls)
    scraper.start()
    try:
        yield
    finally:
        row["scraper_during"] = scraper.result()
        time.sleep(5)
        if service.process.poll() is None:
            row["rss_after_mib"] = round(rss_mib(service), 1)


def signals(service: Service) -> dict[str, Any]:
    row: dict[str, Any] = {}
    storm = (
        "import os, sys, time\n"
        "pid, end, sent = int(sys.argv[1]), time.monotonic() + 3, 0\n"
        "while time.monotonic() < end:\n"
        "    for _ in range(2000):\n"
        "        os.kill(pid, 1)\n"
        "    sent += 2000\n"
        "print(sent)\n"
    )
    with watched(service, row):
        sent = subprocess.run(
            [sys.executable, "-c", storm, str(service.process.pid)], capture_output=True, text=True, check=False
        )
        row["sighups_sent"] = int(sent.stdout or 0)
        time.sleep(2)
    if service.process.poll() is not None:
        row["exited_during_storm"] = service.process.returncode
        row["log_tail"] = service.log.read_text()[-600:]
        return row
    before = service.log.read_text().count("configuration reloaded")
    service.config.write_text(service.config.read_text().replace("[16, 32, 64, 128]", "[16, 32]"))
    service.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and service.log.read_text().count("configuration reloaded") == before:
        time.sleep(0.1)
    row["reloaded_after_storm"] = service.log.read_text().count("configuration reloaded") > before
    began = time.monotonic()
    service.process.send_signal(signal.SIGTERM)
    try:
        service.process.wait(15)
        row["sigterm_exit_s"] = round(time.monotonic() - began, 2)
    except subprocess.TimeoutExpired:
        row["sigterm_exit_s"] = "not within 15 s (killed)"
    return row


def _basic(password: bytes) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(b"bench:" + password).decode()}


def passwords(service: Service) -> dict[str, Any]:
    row: dict[str, Any] = {}
    stop = threading.Event()
    tries = [0] * 8

    def attack(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
        while not stop.is_set():
            try:
                connection.request("GET", "/metrics", headers=_basic(b"guess-%d" % tries[index]))
                connection.getresponse().read()
            except OSError:
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
            tries[index] += 1
        connection.close()

    lines_before = service.log.read_text().count("unauthorized")
    attackers = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(8)]
    for thread in attackers:
        thread.start()
    time.sleep(1)  # the flood first: the scraper's password is not yet remembered when it begins
    with watched(service, row, _basic(PASSWORD)):
        time.sleep(5)
        web = Path(service.command[service.command.index("--web.config.file") + 1])
        web.write_text(web.read_text() + "# touched: reloaded\n")  # a reload of the file mid-flood
        time.sleep(6)
        stop.set()
        for thread in attackers:
            thread.join(30)
    row["wrong_tries_per_s"] = round(sum(tries) / 12, 1)
    row["refusal_log_lines"] = service.log.read_text().count("unauthorized") - lines_before
    return row


def _scrape(service: Service, headers: dict[str, str]) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        connection.request("GET", "/metrics", headers=headers)
        response = connection.getresponse()
        response.read()
    except OSError:
        return -1
    else:
        return response.status
    finally:
        connection.close()


def accept(service: Service, count: int = 20_000) -> dict[str, Any]:
    row: dict[str, Any] = {}
    statuses: dict[int, int] = {}
    with watched(service, row), concurrent.futures.ThreadPoolExecutor(8) as pool:
        headers = ({"Accept": f"application/openmetrics-text; version=1.{i // 100}.{i % 100}"} for i in range(count))
        for status in pool.map(lambda h: _scrape(service, h), headers):
            statuses[status] = statuses.get(status, 0) + 1
    row["distinct_accept_scrapes"] = {str(k): v for k, v in statuses.items()}
    tracebacks = service.log.read_text().count("Traceback")
    row["version_abc"] = _scrape(service, {"Accept": "application/openmetrics-text; version=abc"})
    row["version_xff"] = _scrape(service, {"Accept": "application/openmetrics-text; version=1.1.\xff"})
    time.sleep(0.5)
    row["tracebacks_logged_by_the_two"] = service.log.read_text().count("Traceback") - tracebacks
    return row


def readers(service: Service, connections: int = 260, pipelined: int = 1500) -> dict[str, Any]:
    row: dict[str, Any] = {}
    with watched(service, row):
        greedy = _greedy_readers(service, connections, pipelined)
        row["greedy_connections"] = len(greedy)
        time.sleep(35)  # beyond the 30 s write timeout: what a fresh client met meanwhile
        row["rss_with_greedy_open_mib"] = round(rss_mib(service), 1)
        for sock in greedy:
            sock.close()
    return row


def _greedy_readers(service: Service, connections: int, pipelined: int) -> list[socket.socket]:
    """Connections with 4 KiB receive buffers, each pipelining ``pipelined`` GET /metrics it never reads."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * pipelined
    greedy = []
    for _ in range(connections):
        try:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", service.port))
            sock.setblocking(False)  # noqa: FBT003 - the socket API
            with contextlib.suppress(BlockingIOError):
                sock.send(request)
            greedy.append(sock)
        except OSError:
            break
    return greedy


def renewed_readers(service: Service, connections: int = 280, pipelined: int = 1500) -> dict[str, Any]:
    """Issue 34 #1: non-readers renewed every 15 s for 45 s; fresh /healthz probes meanwhile."""
    row: dict[str, Any] = {}
    probe = Scraper(service, path="/healthz")
    probe.start()
    with watched(service, row):
        for _ in range(3):
            greedy = _greedy_readers(service, connections, pipelined)
            row["greedy_connections"] = len(greedy)
            time.sleep(15)
            row["rss_with_greedy_open_mib"] = round(rss_mib(service), 1)
            for sock in greedy:
                sock.close()
    row["healthz_probes"] = probe.result()
    return row


def guessers(service: Service, connections: int = 300, tries: int = 20) -> dict[str, Any]:
    """Issue 34 #2: connections each pipelining new wrong passwords (renewed when closed) for 20 s; /healthz
    probes and a scraper with the right password meanwhile."""
    row: dict[str, Any] = {}
    stop = threading.Event()

    def guess(index: int) -> None:
        while not stop.is_set():
            guesses = b"".join(
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: "
                + _basic(b"g%d-%d" % (index, n))["Authorization"].encode()
                + b"\r\n\r\n"
                for n in range(tries)
            )
            try:
                with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
                    sock.sendall(guesses)
                    while sock.recv(65536) and not stop.is_set():
                        pass
            except OSError:
                time.sleep(0.1)

    attackers = [threading.Thread(target=guess, args=(i,), daemon=True) for i in range(connections)]
    for thread in attackers:
        thread.start()
    time.sleep(2)
    probe = Scraper(service, path="/healthz")
    probe.start()
    with watched(service, row, _basic(PASSWORD)):
        time.sleep(20)
    stop.set()
    row["healthz_probes"] = probe.result()
    return row


def flood(service: Service, threads: int = 4, burst: int = 50, kept: int = 100, seconds: float = 15) -> dict[str, Any]:
    """New connections that never send, ``burst`` at a time every 50 ms from each of ``threads`` threads (faster,
    most are dropped by the kernel's accept queue before the server sees them); /healthz probes meanwhile."""
    row: dict[str, Any] = {}
    stop = threading.Event()
    opened = [0] * threads

    def open_silent(index: int) -> None:
        ring: list[socket.socket] = []
        while not stop.is_set():
            sock = socket.socket()
            sock.settimeout(0)  # connects not waited for: bursts as fast as Python opens sockets
            if sock.connect_ex(("127.0.0.1", service.port)) in (0, errno.EINPROGRESS):
                ring.append(sock)
                opened[index] += 1
            else:
                sock.close()
                time.sleep(0.01)
            if len(ring) > kept:
                ring.pop(0).close()
            if opened[index] % burst == 0:
                time.sleep(0.05)
        for sock in ring:
            sock.close()

    probe = Scraper(service, path="/healthz")
    with watched(service, row):
        flooders = [threading.Thread(target=open_silent, args=(i,), daemon=True) for i in range(threads)]
        for thread in flooders:
            thread.start()
        time.sleep(0.5)
        probe.start()
        time.sleep(seconds)
        row["rss_during_mib"] = round(rss_mib(service), 1)
        stop.set()
        for thread in flooders:
            thread.join(10)
    row["connections_opened"] = sum(opened)
    row["healthz_probes"] = probe.result()
    return row


# Another process: an exclusive transaction on the file named by its first argument, for its second in seconds.
_HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def history_lock(service: Service, seconds: float = 20) -> dict[str, Any]:
    """Another process holds the history file in an exclusive transaction; /metrics and / meanwhile."""
    history = service.config.parent / "state" / "history.sqlite3"
    began = time.monotonic()
    while not history.exists() and time.monotonic() - began < 60:  # the first sweep's record creates it
        time.sleep(0.2)
    time.sleep(1)
    log_before = len(service.log.read_text())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLD_LOCK,
            str(history),
            str(seconds),
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout is not None  # asked for above
    row: dict[str, Any] = {"locked": holder.stdout.readline().strip() == b"locked"}
    locked_at = time.monotonic()
    page = Scraper(service, path="/")
    page.start()
    with watched(service, row):
        holder.wait(seconds + 30)
        row["held_s"] = round(time.monotonic() - locked_at, 1)
        time.sleep(5)  # the next sweep's record, after the release
    row["landing_page"] = page.result()
    row["history_file_kept"] = history.exists() and not list(history.parent.glob("history.sqlite3.*"))
    said = service.log.read_text()[log_before:]
    row["log_lines_about_history"] = [line[-200:] for line in said.splitlines() if "run history" in line][:5]
    return row


def smuggle(service: Service) -> dict[str, Any]:
    hidden = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    data = (
        b"POST /-/reload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n%s"
        % (5 + len(hidden), hidden)
    )
    sock = socket.create_connection(("127.0.0.1", service.port), timeout=3)
    sock.sendall(data)
    answer = bytearray()
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(65536):
            answer += chunk
    closed = True
    try:
        sock.settimeout(0.5)
        sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        closed = sock.recv(100) == b""
    except OSError:
        pass
    sock.close()
    return {
        "first_status": answer[:12].decode(errors="replace"),
        "responses": answer.count(b"HTTP/1.1 "),
        "connection_closed": closed,
    }


def sweeps(service: Service) -> dict[str, Any]:
    time.sleep(4)  # the first sweep done: idle
    before = service.log.read_text().count("manual sweep requested")
    barrier = threading.Barrier(8)

    def post(_: int) -> int:
        barrier.wait()
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
        connection.request("POST", "/-/sweep")
        status = connection.getresponse().status
        connection.close()
        return status

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = sorted(pool.map(post, range(8)))
    time.sleep(1)
    accepted = service.log.read_text().count("manual sweep requested") - before
    return {"answers": answers, "manual_sweeps_accepted_in_log": accepted}


def certbot(checkout: Path, scratch: Path) -> dict[str, Any]:
    archive, live = scratch / "archive", scratch / "live"
    archive.mkdir()
    live.mkdir()
    for number in (1, 2):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"privkey{number}.pem",
             "-out", f"cert{number}.pem", "-days", "2", "-subj", f"/CN=renewal-{number}",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            cwd=archive, check=True, capture_output=True,
        )  # fmt: skip
    (live / "cert.pem").symlink_to("../archive/cert1.pem")
    (live / "privkey.pem").symlink_to("../archive/privkey1.pem")
    web = scratch / "web.yml"
    web.write_text("tls_server_config: {cert_file: live/cert.pem, key_file: live/privkey.pem}\n")
    service = Service(checkout, scratch, extra=("--web.config.file", str(web)))

    def served() -> str:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with context.wrap_socket(socket.create_connection(("127.0.0.1", service.port), timeout=5)) as tls:
            der = tls.getpeercert(binary_form=True) or b""
        return "renewal-2" if b"renewal-2" in der else "renewal-1"

    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if served():
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(service.log.read_text()[-2000:])
            time.sleep(0.2)
        for link, target in (("privkey.pem", "privkey2.pem"), ("cert.pem", "cert2.pem")):
            (live / f"{link}.new").symlink_to(f"../archive/{target}")
            (live / f"{link}.new").replace(live / link)
        switched = time.monotonic()
        while served() != "renewal-2" and time.monotonic() - switched < 20:
            time.sleep(0.1)
        took = time.monotonic() - switched
        return {"new_certificate_served_after_s": round(took, 2) if took < 20 else "not within 20 s"}
    finally:
        service.stop()


def _web_config(scratch: Path) -> Path:
    import bcrypt  # noqa: PLC0415 - only the password phase needs it

    web = scratch / "web.yml"
    web.write_text(f"basic_auth_users: {{bench: '{bcrypt.hashpw(PASSWORD, bcrypt.gensalt(rounds=10)).decode()}'}}\n")
    return web


def _wait_answering(service: Service, path: str, context: ssl.SSLContext | None = None, timeout: float = 60) -> None:
    """Until ``path`` answers at all (over TLS with ``context``): /readyz waits for a good sweep, which some
    phases never let happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if context is None:
            connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=2)
        else:
            connection = http.client.HTTPSConnection("127.0.0.1", service.port, timeout=2, context=context)
        try:
            connection.request("GET", path)
            connection.getresponse().read()
        except OSError:
            time.sleep(0.1)
        else:
            return
        finally:
            connection.close()
    raise RuntimeError(f"no answer in {timeout}s: {service.log.read_text()[-2000:]}")


# The start of a ClientHello: a handshake record announcing 512 bytes, of which only the first 43 ever come.
_PARTIAL_HELLO = b"\x16\x03\x01\x02\x00" + b"\x01\x00\x01\xfc\x03\x03" + bytes(32)


def _stalled_handshakes(service: Service, count: int) -> tuple[list[socket.socket], int]:
    """``count`` connections that send a partial ClientHello and stall; and how many could not be made."""
    stalled, failed = [], 0
    for _ in range(count):
        try:
            sock = socket.create_connection(("127.0.0.1", service.port), timeout=3)
        except OSError:
            failed += 1
            if failed >= 20:  # the kernel's accept queue is full: each further try waits its timeout
                break
            continue
        try:
            sock.sendall(_PARTIAL_HELLO)
        except OSError:  # evicted already
            failed += 1
            sock.close()
        else:
            stalled.append(sock)
    return stalled, failed


def tls_handshakes(
    checkout: Path, scratch: Path, *, rounds: int = 20, each: int = 600, hold_s: float = 2, pending: int = 40
) -> dict[str, Any]:
    """Issue 34 #3: TLS on; rounds of ``each`` stalled handshakes, each round held ``hold_s`` then closed, while a
    TLS scraper and /healthz prober run; then SIGTERM with ``pending`` handshakes stalled."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.crt",
         "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
        cwd=scratch, check=True, capture_output=True,
    )  # fmt: skip
    web = scratch / "web.yml"
    web.write_text("tls_server_config: {cert_file: server.crt, key_file: server.key}\n")
    context = ssl.create_default_context(cafile=str(scratch / "server.crt"))
    service = Service(checkout, scratch, extra=("--web.config.file", str(web)))
    row: dict[str, Any] = {"rounds": rounds, "connections_each": each, "held_s": hold_s}
    try:
        _wait_answering(service, "/healthz", context)
        time.sleep(3)  # the first sweep done
        probe = Scraper(service, tls=context, path="/healthz")
        with watched(service, row, tls=context):
            probe.start()
            began, failed, opened = time.monotonic(), 0, 0
            for _ in range(rounds):
                stalled, round_failed = _stalled_handshakes(service, each)
                opened, failed = opened + len(stalled), failed + round_failed
                time.sleep(hold_s)
                row["rss_end_of_rounds_mib"] = [*row.get("rss_end_of_rounds_mib", []), round(rss_mib(service), 1)]
                for sock in stalled:
                    sock.close()
            row["attack_s"] = round(time.monotonic() - began, 1)
            row["service_peak_rss_mib"] = round(rss_mib(service, "VmHWM"), 1)
            row["handshakes_stalled"], row["connections_failed"] = opened, failed
            row["healthz_probes"] = probe.result()
        log = service.log.read_text()
        row["traceback_lines"] = log.count("Traceback")
        row["unhandled_exception_lines"] = log.count("Unhandled exception")
        row["log_kib"] = round(len(log.encode()) / 1024, 1)
        stalled, _ = _stalled_handshakes(service, pending)
        time.sleep(1)
        row["pending_at_sigterm"] = len(stalled)
        began = time.monotonic()
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(15)
            row["sigterm_exit_s"] = round(time.monotonic() - began, 2)
            row["exit_status"] = service.process.returncode
        except subprocess.TimeoutExpired:
            row["sigterm_exit_s"] = "not within 15 s (killed)"
        for sock in stalled:
            sock.close()
        log = service.log.read_text()
        row["task_destroyed_lines"] = log.count("Task was destroyed but it is pending")
        row["tracebacks_in_log"] = log.count("Traceback")
    finally:
        service.stop()
    return row


# Plugin backends that write garbage (issue 34 #7), loaded by the real worker from the scratch directory. Each
# starts as the fake curve does, and after DELAY seconds (the daemon's RSS measured before) misbehaves.
_GARBAGE_PLUGIN = '''
"""Plugin backends that write garbage: benchmarks/http_attacks.py's worker_garbage phase."""
import fcntl, os, sys, time
from pathlib import Path
from tests.fakes import CurveBackend

DELAY = 3


def _begin(name):
    time.sleep(DELAY)
    Path(__file__).with_name(name + ".began").write_text(repr(time.time()))


def _channel():
    """The worker's message channel: the pipe it writes to other than stderr (fd 1 was pointed at stderr)."""
    stderr = os.readlink("/proc/self/fd/2")
    for fd in sorted(int(name) for name in os.listdir("/proc/self/fd")):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            writes = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
        except OSError:
            continue
        if fd > 2 and link.startswith("pipe:") and link != stderr and writes:
            return fd
    raise RuntimeError("no message channel found")


class Nested(CurveBackend):
    """JSON nested 200,000 deep on the message channel, then a hang."""

    def discover(self):
        _begin("nested")
        os.write(_channel(), b"[" * 200_000 + b"\\n")
        time.sleep(3600)
        return super().discover()


class StderrFlood(CurveBackend):
    """256 MiB on stderr without a newline, a last line, and the worker gone (exit 3)."""

    def discover(self):
        _begin("stderr_flood")
        chunk = b"e" * (1 << 20)
        for _ in range(256):
            sys.stderr.buffer.write(chunk)
        sys.stderr.buffer.write(b"\\nthe end\\n")
        sys.stderr.flush()
        os._exit(3)


nested = Nested
stderr_flood = StderrFlood
'''


def _sweeps(service: Service) -> tuple[dict[str, float], float | None]:
    """From /metrics: sweeps by result, and how long the latest took."""
    try:
        _, body = service.get("/metrics", timeout=5)
    except OSError:
        return {}, None
    text = body.decode()
    counts = {r: float(v) for r, v in re.findall(r'^matmul_sweeps_total\{result="(\w+)"\} (\S+)$', text, re.MULTILINE)}
    duration = re.search(r"^matmul_sweep_duration_seconds (\S+)$", text, re.MULTILINE)
    return counts, float(duration.group(1)) if duration else None


def worker_garbage(checkout: Path, scratch: Path) -> dict[str, Any]:
    """Issue 34 #7: a plugin that writes nested JSON on the message channel, one that floods stderr."""
    (scratch / "garbage_worker.py").write_text(_GARBAGE_PLUGIN)
    return {kind: _garbage_sweep(checkout, scratch, kind) for kind in ("nested", "stderr_flood")}


def _garbage_sweep(checkout: Path, scratch: Path, kind: str, wait_s: float = 90) -> dict[str, Any]:
    service = Service(checkout, scratch, backend=f"garbage_worker:{kind}", pythonpath=(scratch,), interval="1h")
    row: dict[str, Any] = {"sweep_timeout_s": 30}  # http_surface.CONFIG's benchmark.timeout
    began = scratch / f"{kind}.began"
    try:
        _wait_answering(service, "/healthz")
        with watched(service, row):
            deadline = time.monotonic() + wait_s
            counts: dict[str, float] = {}
            while time.monotonic() < deadline and not any(counts.values()):
                time.sleep(0.1)
                counts, duration = _sweeps(service)
            ended = time.time()
            row["sweeps"] = {result: count for result, count in counts.items() if count}
            row["sweep_duration_s"] = duration
            if began.exists():
                row["garbage_to_sweep_ended_s"] = round(ended - float(began.read_text()), 2)
            row["daemon_peak_rss_mib"] = round(rss_mib(service, "VmHWM"), 1)
        log = service.log.read_text()
        said = [line for line in log.splitlines() if "sweep failed" in line or "sweep finished" in line]
        if said:
            row["sweep_log_line_chars"] = len(said[0])
            row["sweep_log_line"] = said[0][:400]
        row["tracebacks_in_log"] = log.count("Traceback")
    finally:
        service.stop()
    return row


@contextlib.contextmanager
def _hostile(answer: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """tests/fakeserver.py's loopback server, whose every GET ``answer`` handles; its /metrics URL."""
    with fakeserver.server(answer) as base:
        yield f"{base}/metrics"


def _good_metrics(handler: http.server.BaseHTTPRequestHandler) -> None:
    """A service's /metrics with one working GPU, swept a minute ago."""
    body = (
        'matmul_monitor_build_info{version="x"} 1\n'
        'matmul_device_info{device="/GPU:0",kind="gpu"} 1\nmatmul_device_up{device="/GPU:0"} 1\n'
        f"matmul_sweep_last_success_timestamp_seconds {time.time() - 60:.0f}\n"
    ).encode()
    fakeserver.reply(handler, body)


def _many_alerts(handler: http.server.BaseHTTPRequestHandler) -> None:
    """Prometheus with 100,000 MatmulCrossoverDrift alerts firing for the node (and its build_info present)."""
    if "ALERTS" in urllib.parse.unquote(handler.path):
        result = [
            {"metric": {"alertname": "MatmulCrossoverDrift", "gpu": f"/GPU:{i}", "mode": "compute"}, "value": [0, "1"]}
            for i in range(100_000)
        ]
    else:
        result = [{"metric": {"__name__": "matmul_monitor_build_info"}, "value": [0, "1"]}]
    body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    fakeserver.reply(handler, body, "application/json")


def hostile_answers(checkout: Path, _scratch: Path) -> dict[str, Any]:
    """Issue 34 #6: node-check against a server that drips, one that floods, one that redirects to the dripper,
    and a Prometheus with 100,000 alerts firing (``--check drift``, 20 s as in tests/test_nodecheck.py)."""
    with (
        _hostile(fakeserver.drip(120)) as drip,
        _hostile(fakeserver.flood) as flood,
        _hostile(fakeserver.redirect_to(drip)) as redirect,
    ):
        row = {
            name: _node_check(checkout, "--url", url, "--timeout", "5s")
            for name, url in (("drip", drip), ("flood_600mib", flood), ("redirect_to_drip", redirect))
        }
    with _hostile(_good_metrics) as metrics, _hostile(_many_alerts) as prometheus:
        row["prometheus_100k_alerts"] = _node_check(
            checkout, "--url", metrics, "--check", "drift", "--prometheus.url", prometheus.removesuffix("/metrics"),
            "--instance", "node-1:9437", "--timeout", "20s",
        )  # fmt: skip
    return row


def _node_check(checkout: Path, *args: str, limit_s: float = 150) -> dict[str, Any]:
    """``node-check ARGS``: wall time, peak RSS (the kernel's for that child), exit status, its first line of
    output."""
    package = "crossover_monitor" if (checkout / "crossover_monitor").is_dir() else "monitor"
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", package, "node-check", *args],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    outputs: dict[str, bytes] = {}
    readers = [
        threading.Thread(target=lambda n=name, s=stream: outputs.__setitem__(n, s.read()), daemon=True)
        for name, stream in (("stdout", process.stdout), ("stderr", process.stderr))
    ]
    for reader in readers:
        reader.start()
    killer = threading.Timer(limit_s, process.kill)
    killer.start()
    _, status, usage = os.wait4(process.pid, 0)  # the child's own peak RSS, which Popen.wait does not give
    wall = time.monotonic() - began
    killer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)
    for reader in readers:
        reader.join(10)
    line = outputs.get("stdout", b"").split(b"\n", 1)[0].decode(errors="replace")
    return {
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "exit_status": process.returncode,
        "first_line_chars": len(line),
        "first_line": line[:300],
        "stderr_bytes": len(outputs.get("stderr", b"")),
    }


PHASES: dict[str, tuple[Callable[[Service], dict[str, Any]], Callable[[Path], tuple[str, ...]]]] = {
    "signals": (signals, lambda _: ()),
    "passwords": (passwords, lambda scratch: ("--web.config.file", str(_web_config(scratch)))),
    "accept": (accept, lambda _: ()),
    "readers": (readers, lambda _: ()),
    "renewed_readers": (renewed_readers, lambda _: ()),
    "guessers": (guessers, lambda scratch: ("--web.config.file", str(_web_config(scratch)))),
    "flood": (flood, lambda _: ()),
    "smuggle": (smuggle, lambda _: ("--web.enable-lifecycle",)),
    "sweeps": (sweeps, lambda _: ("--web.enable-lifecycle",)),
    "history_lock": (history_lock, lambda _: ()),
}
# Phases that start their own service (or none), given the checkout and a scratch directory.
STANDALONE: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "certbot": certbot,
    "tls_handshakes": tls_handshakes,
    "worker_garbage": worker_garbage,
    "hostile_answers": hostile_answers,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--phases", default=",".join([*PHASES, *STANDALONE]))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "checkout": str(args.checkout),
        "commit": subprocess.run(
            ["git", "-C", str(args.checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }
    for name in args.phases.split(","):
        with scratch_dir() as scratch:
            if name in STANDALONE:
                results[name] = STANDALONE[name](args.checkout, scratch)
            else:
                attack, extra = PHASES[name]
                # One sweep at start, the next an hour later, where sweeps would hide the attack: the /metrics
                # cache is emptied by each sweep, and sweep requests are to meet an idle service.
                interval = "1h" if name in ("sweeps", "accept") else "3s"
                service = Service(
                    args.checkout, scratch, extra=extra(scratch), interval=interval, history=name == "history_lock"
                )
                try:
                    service.wait_ready()
                    results[name] = attack(service)
                    results[name]["tracebacks_in_log"] = service.log.read_text().count("Traceback")
                finally:
                    service.stop()
        results[name]["load_average_after"] = [round(load, 2) for load in os.getloadavg()]
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
