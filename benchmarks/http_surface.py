"""The service's HTTP side under load and abuse, and its restarts: issue 10's figures, on this machine.

Runs the real service (``python -m crossover_monitor run``, the fake ``curve`` backend sweeping every few seconds
so that scrapes meet sweeps) from a checkout, and measures from this process:

1. ``scrapes``: 50 concurrent clients x 100 scrapes of /metrics, a new connection each: errors, p50/p99/max;
2. ``abuse``: 1000 silent connections and 1000 slowloris ones (a header byte every 3 s) held open while
   a normal client scrapes every 0.5 s: its failures, the service's open files and threads (peak), and
   how long the server took to drop the slow clients;
3. ``tls``: with a web config (TLS + basic auth), one client that connects and never handshakes while
   another scrapes over TLS: the scraper's failures and latency;
4. ``kill``: SIGKILL during a sweep and restart, ``--kills`` times: corrupt histories, completed sweeps
   missing from the history, time from restart to /readyz 200 with the last results;
5. ``reload``: 20 bad configurations in a row (SIGHUP each), then a good one: what was served meanwhile
   and what the reload metrics said.

``--checkout DIR`` runs another checkout's service the same way (e.g. the commit before the server was
replaced, in a git worktree), so both are measured side by side. Usage::

    python benchmarks/http_surface.py --out benchmarks/results/http-surface.json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import resource
import signal
import socket
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIG = """
schedule: {{interval: {interval}}}
benchmark:
  backend: "{backend}"
  sizes: [16, 32, 64, 128]
  timeout: 30s
  timing: {{size_budget: 200ms, block_time: 2ms, min_blocks: 3}}
guard: {{require_nvml: false}}
{history}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Service:
    def __init__(
        self,
        checkout: Path,
        scratch: Path,
        *,
        history: bool = False,
        extra: tuple[str, ...] = (),
        interval: str = "3s",
        backend: str = "tests.fakes:curve",
        pythonpath: tuple[Path, ...] = (),
    ) -> None:
        """``backend``: the plugin the worker loads (a benchmark's own from a directory in ``pythonpath``)."""
        self.port = free_port()
        self.config = scratch / "config.yaml"
        state = f"history: {{directory: {scratch / 'state'}}}" if history else ""
        self.config.write_text(CONFIG.format(history=state, interval=interval, backend=backend))
        self.log = scratch / f"service-{time.monotonic_ns()}.log"
        # Checkouts before the rename of 2026-12-06 (6e23130) named the package "monitor".
        package = "crossover_monitor" if (checkout / "crossover_monitor").is_dir() else "monitor"
        self.command = [
            sys.executable, "-m", package, "run", "--config", str(self.config),
            "--listen", f"127.0.0.1:{self.port}", *extra,
        ]  # fmt: skip
        self.checkout = checkout
        self.pythonpath = os.pathsep.join(map(str, (checkout, *pythonpath)))
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": self.pythonpath}
        with self.log.open("ab") as log:
            return subprocess.Popen(
                self.command,
                cwd=self.checkout,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_usual_file_limit,  # noqa: PLW1509 - only setrlimit, before exec
            )

    def restart(self) -> None:
        self.process = self._start()

    def get(self, path: str, timeout: float = 10) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def wait_ready(self, timeout: float = 60) -> float:
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            with contextlib.suppress(OSError):
                if self.get("/readyz", timeout=2)[0] == 200:
                    return time.monotonic() - began
            time.sleep(0.02)
        raise RuntimeError(f"not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def resources(self) -> tuple[int, int]:
        """(open files, threads) of the service process."""
        pid = self.process.pid
        files = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        threads = int(next(line.split()[1] for line in status if line.startswith("Threads:")))
        return files, threads

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _usual_file_limit() -> None:
    """The service gets the usual soft limit of 1024 open files, not this process's raised one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def scrapes(service: Service, clients: int = 50, each: int = 100) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client() -> None:
        for _ in range(each):
            began = time.monotonic()
            try:
                status, _ = service.get("/metrics", timeout=10)
                error = "" if status == 200 else str(status)
            except OSError as exc:
                error = type(exc).__name__
            with lock:
                latencies.append(time.monotonic() - began)
                if error:
                    errors.append(error)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
        "wall_s": time.monotonic() - began,
    }


Held = list[tuple[socket.socket, float, bool]]  # (socket, opened at, slowloris?)


def open_clients(service: Service, silent: int, slow: int) -> tuple[Held, int]:
    """``silent`` connections that send nothing and ``slow`` ones that start a request; and how many failed."""
    held: Held = []
    refused = 0
    for index in range(silent + slow):
        if refused >= 20:  # the server stopped accepting: the kernel's queue is full (a 1 s timeout each)
            return held, refused + silent + slow - index
        try:
            sock = socket.create_connection(("127.0.0.1", service.port), timeout=1)
            sock.settimeout(0.0)  # non-blocking
            trickles = index >= silent
            if trickles:
                sock.send(b"GET /metrics HTTP/1.1\r\n")
            held.append((sock, time.monotonic(), trickles))
        except OSError:
            refused += 1
    return held, refused


def abuse(service: Service, silent: int = 1000, slow: int = 1000, seconds: float = 30) -> dict[str, Any]:
    held, refused = open_clients(service, silent, slow)
    closed_after: list[float] = []
    failures, scraped, peak_files, peak_threads = 0, 0, 0, 0
    sweeps_before = service.log.read_text().count("sweep finished result=success")
    began = time.monotonic()
    next_byte = began + 3
    while time.monotonic() - began < seconds:
        try:
            status, _ = service.get("/metrics", timeout=5)
            scraped += 1
            failures += status != 200
        except OSError:
            failures += 1
        files, threads = service.resources()
        peak_files, peak_threads = max(peak_files, files), max(peak_threads, threads)
        now = time.monotonic()
        trickle = now >= next_byte
        if trickle:
            next_byte = now + 3
        still: list[tuple[socket.socket, float, bool]] = []
        for sock, opened, trickles in held:
            try:
                if sock.recv(1) == b"":
                    raise ConnectionResetError
                still.append((sock, opened, trickles))  # an answer (e.g. 503), not closed yet
            except BlockingIOError:
                if trickle and trickles:
                    with contextlib.suppress(OSError):
                        sock.send(b"X")
                still.append((sock, opened, trickles))
            except OSError:
                closed_after.append(now - opened)
                sock.close()
        held = still
        time.sleep(0.5)
    for sock, _, _ in held:
        sock.close()
    logged = service.log.read_text()
    return {
        "sweeps_succeeded_meanwhile": logged.count("sweep finished result=success") - sweeps_before,
        "too_many_open_files_in_log": logged.count("Too many open files"),
        "connections_opened": silent + slow - refused,
        "connect_failed": refused,
        "normal_scrapes": scraped,
        "normal_failures": failures,
        "peak_open_files": peak_files,
        "peak_threads": peak_threads,
        "slow_clients_closed_by_server": len(closed_after),
        "slow_clients_open_at_end": len(held),
        "watched_s": seconds,
        "closed_after_s_median": statistics.median(closed_after) if closed_after else None,
        "closed_after_s_max": max(closed_after) if closed_after else None,
    }


def tls(checkout: Path, scratch: Path) -> dict[str, Any]:
    for args in (
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.crt", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
    ):  # fmt: skip
        subprocess.run(["openssl", *args], cwd=scratch, check=True, capture_output=True)
    import bcrypt  # noqa: PLC0415 - only this phase needs it

    hashed = bcrypt.hashpw(b"bench", bcrypt.gensalt(rounds=10)).decode()
    web = scratch / "web.yml"
    web.write_text(
        f"tls_server_config: {{cert_file: server.crt, key_file: server.key}}\nbasic_auth_users: {{bench: '{hashed}'}}\n"
    )
    service = Service(checkout, scratch, extra=("--web.config.file", str(web)))
    try:
        time.sleep(3)
        stuck = socket.create_connection(("127.0.0.1", service.port))
        stuck.send(b"\x16\x03\x01\x00\xff")  # the start of a ClientHello, then nothing
        context = ssl.create_default_context(cafile=str(scratch / "server.crt"))
        auth = {"Authorization": "Basic " + base64.b64encode(b"bench:bench").decode()}
        latencies, failures = [], 0
        for _ in range(40):
            began = time.monotonic()
            try:
                connection = http.client.HTTPSConnection("127.0.0.1", service.port, context=context, timeout=10)
                connection.request("GET", "/metrics", headers=auth)
                failures += connection.getresponse().status != 200
                connection.close()
            except OSError:
                failures += 1
            latencies.append(time.monotonic() - began)
            time.sleep(0.1)
        stuck.close()
        return {
            "scrapes": len(latencies),
            "failures": failures,
            "p50_ms": statistics.median(latencies) * 1000,
            "max_ms": max(latencies) * 1000,
        }
    finally:
        service.stop()


def kills(checkout: Path, scratch: Path, count: int) -> dict[str, Any]:
    service = Service(checkout, scratch, history=True)
    ready_after: list[float] = []
    completed = 0
    try:
        service.wait_ready()
        for _ in range(count):
            time.sleep(3.5)  # into a sweep
            service.process.send_signal(signal.SIGKILL)
            service.process.wait()
            completed = service.log.read_text().count("sweep finished result=success")
            service.restart()
            ready_after.append(service.wait_ready())
    finally:
        service.stop()
    database = scratch / "state" / "history.sqlite3"
    with contextlib.closing(sqlite3.connect(database)) as db:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        recorded = db.execute("SELECT count(*) FROM runs WHERE result = 'success'").fetchone()[0]
    completed = service.log.read_text().count("sweep finished result=success")
    return {
        "kills": count,
        "integrity": integrity,
        "completed_sweeps_logged": completed,
        "completed_sweeps_in_history": recorded,
        "ready_after_restart_s_median": statistics.median(ready_after),
        "ready_after_restart_s_max": max(ready_after),
    }


def reloads(checkout: Path, scratch: Path) -> dict[str, Any]:
    service = Service(checkout, scratch)
    try:
        service.wait_ready()
        good = service.config.read_text()
        served_failures = 0
        for index in range(20):
            service.config.write_text(f"benchmark: {{sizes: [{-index}]}}\n")
            service.process.send_signal(signal.SIGHUP)
            time.sleep(1.2)  # the service takes a reload request on its 1 s tick: one at a time
            status, body = service.get("/metrics")
            served_failures += status != 200 or b"matmul_crossover_size" not in body
        after_bad = service.get("/metrics")[1].decode()
        service.config.write_text(good.replace("[16, 32, 64, 128]", "[16, 32, 64]"))
        service.process.send_signal(signal.SIGHUP)
        time.sleep(5)  # the reload, and a sweep that began on the old plan ending meanwhile
        after_good = service.get("/metrics")[1].decode()

        def value(text: str, name: str) -> str:
            return next((line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")), "absent")

        return {
            "bad_reloads": 20,
            "scrapes_without_results_meanwhile": served_failures,
            "successful_after_bad": value(after_bad, "matmul_config_last_reload_successful"),
            "successful_after_good": value(after_good, "matmul_config_last_reload_successful"),
            "size_128_served_after_good": 'size="128"' in after_good,
            "refusals_logged": service.log.read_text().count("reload refused"),
        }
    finally:
        service.stop()


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as path:
        yield Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--phases", default="scrapes,abuse,tls,kill,reload")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard)
    )  # the clients' side, not the service's
    results: dict[str, Any] = {
        "checkout": str(args.checkout),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    phases = args.phases.split(",")
    for name in ("scrapes", "abuse"):
        if name in phases:
            with scratch_dir() as scratch:
                service = Service(args.checkout, scratch)
                try:
                    service.wait_ready()
                    results[name] = scrapes(service) if name == "scrapes" else abuse(service)
                finally:
                    service.stop()
            print(name, json.dumps(results[name]), flush=True)
    for name in ("tls", "kill", "reload"):
        if name in phases:
            with scratch_dir() as scratch:
                if name == "tls":
                    results[name] = tls(args.checkout, scratch)
                elif name == "kill":
                    results[name] = kills(args.checkout, scratch, args.kills)
                else:
                    results[name] = reloads(args.checkout, scratch)
            print(name, json.dumps(results[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
