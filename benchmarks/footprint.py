"""What the service costs a node: the daemon's memory and CPU between sweeps, and a sweep's worker at its peak.

Starts ``python -m crossover_monitor run`` with ``--config`` on a free local port and reads /proc every
``--every`` seconds for the daemon and every process under it (the sweep's worker), until
``--sweeps`` sweeps have ended (the first starts at once; later ones are asked for with SIGUSR1 after
``--idle`` seconds of nothing). Written as one JSON object: per phase (idle between sweeps, each
sweep) the most resident memory (RSS, and PSS where the kernel gives it) of the daemon and of the
worker, and the CPU time each used, in cores over the phase. These figures set the DaemonSet's
requests and limits (docs/deploy.md).

    python benchmarks/footprint.py --sweeps 3 --out r.json            # the embedded defaults (TensorFlow)
    python benchmarks/footprint.py --config benchmarks/h200_torch.yaml --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (the worker and anything it started), from each process's parent in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        kids = [child for child, its_parent in parents.items() if its_parent == parent]
        found += kids
        todo += kids
    return found


def _read(pid: int) -> tuple[int, int, float] | None:
    """(RSS bytes, PSS bytes or 0, CPU seconds) of one process, or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss, cpu


class Phase:
    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        self.daemon_rss = self.daemon_pss = self.worker_rss = self.worker_pss = 0
        self.daemon_cpu0: float | None = None
        self.daemon_cpu1 = 0.0
        self.worker_cpu: dict[int, float] = {}  # per worker pid, its last CPU seconds

    def sample(self, daemon: int) -> None:
        own = _read(daemon)
        if own is not None:
            self.daemon_rss, self.daemon_pss = max(self.daemon_rss, own[0]), max(self.daemon_pss, own[1])
            self.daemon_cpu0 = own[2] if self.daemon_cpu0 is None else self.daemon_cpu0
            self.daemon_cpu1 = own[2]
        rss = pss = 0
        for child in _children(daemon):
            got = _read(child)
            if got is not None:
                rss, pss = rss + got[0], pss + got[1]
                self.worker_cpu[child] = got[2]
        self.worker_rss, self.worker_pss = max(self.worker_rss, rss), max(self.worker_pss, pss)

    def report(self) -> dict[str, Any]:
        wall = time.monotonic() - self.started
        daemon_cpu = self.daemon_cpu1 - (self.daemon_cpu0 or 0.0)
        worker_cpu = sum(self.worker_cpu.values())
        mib = 1 << 20
        return {
            "phase": self.name,
            "wall_s": round(wall, 2),
            "daemon_rss_mib": round(self.daemon_rss / mib, 1),
            "daemon_pss_mib": round(self.daemon_pss / mib, 1),
            "daemon_cpu_s": round(daemon_cpu, 2),
            "daemon_cores": round(daemon_cpu / wall, 4) if wall else None,
            "worker_peak_rss_mib": round(self.worker_rss / mib, 1),
            "worker_peak_pss_mib": round(self.worker_pss / mib, 1),
            "worker_cpu_s": round(worker_cpu, 2),
            "worker_cores": round(worker_cpu / wall, 2) if wall else None,
        }


def _sweeps_ended(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return 0
    return int(
        sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("matmul_sweeps_total{"))
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", help="the service's configuration (default: its embedded defaults)")
    parser.add_argument("--sweeps", type=int, default=2)
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of nothing before each later sweep")
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    port = _free_port()
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "crossover_monitor",
            "run",
            *(["--config", args.config] if args.config else []),
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    phases: list[dict[str, Any]] = []
    try:
        ended = 0
        phase = Phase("first-sweep")
        while ended < args.sweeps:
            while _sweeps_ended(port) == ended:
                if daemon.poll() is not None:
                    said = daemon.stderr.read() if daemon.stderr else ""
                    raise SystemExit(f"the service exited {daemon.returncode}: {said[-2000:]}")
                phase.sample(daemon.pid)
                time.sleep(args.every)
            ended += 1
            phases.append(phase.report())
            print(json.dumps(phases[-1]), flush=True)
            if ended < args.sweeps:
                phase = Phase("idle")
                deadline = time.monotonic() + args.idle
                while time.monotonic() < deadline:
                    phase.sample(daemon.pid)
                    time.sleep(args.every)
                phases.append(phase.report())
                print(json.dumps(phases[-1]), flush=True)
                daemon.send_signal(signal.SIGUSR1)
                phase = Phase("sweep")
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    result = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": args.config or "the embedded defaults",
        "phases": phases,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
