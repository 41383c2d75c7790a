"""A new user's first minutes (issue 55): the real service with its embedded defaults (TensorFlow) started beside a
process that keeps one core busy for ``--busy`` seconds; /metrics polled every 2 s and each change of the sweeps, the
retries, the workers' CPU time, the withheld devices and the crossover states printed with its time since the start,
until a crossover state is served after the busy core ended (or ``--limit`` seconds).

    python benchmarks/first_minutes.py --out benchmarks/results/first-minutes-DATE.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

WATCHED = (
    "matmul_sweeps_total",
    "matmul_busy_retries_total",
    "matmul_worker_cpu_seconds_total",
    "matmul_device_withheld",
    "matmul_crossover_state{",
)


def _watched(port: int) -> dict[str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            body = response.read().decode()
    except OSError:
        return {}
    samples = (line.split(" ") for line in body.splitlines() if line and not line.startswith("#"))
    return {name: value for name, value, *_ in samples if name.startswith(WATCHED) and value != "0.0"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=19437)
    parser.add_argument("--busy", type=float, default=180.0, help="seconds the busy core lasts")
    parser.add_argument("--limit", type=float, default=480.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    log = args.out.with_suffix(".log").open("w")
    command = [sys.executable, "-m", "crossover_monitor", "run", "--listen", f"127.0.0.1:{args.port}"]
    service = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    started = time.monotonic()
    events: list[tuple[float, dict[str, str]]] = []
    busy_ended: float | None = None
    try:
        while time.monotonic() - started < args.limit:
            now = round(time.monotonic() - started, 1)
            state = _watched(args.port)
            if not events or state != events[-1][1]:
                events.append((now, state))
                print(now, state, flush=True)
            if busy_ended is None and now > args.busy:
                spinner.kill()
                busy_ended = now
            if busy_ended is not None and any('state="found"' in k or 'state="no_gpu"' in k for k in state):
                break
            time.sleep(2)
    finally:
        spinner.kill()
        service.terminate()
        service.wait(30)
    result: dict[str, Any] = {"events": events, "busy_ended_s": busy_ended, "command": command}
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
