"""`crossover-monitor once` with its embedded defaults beside other programs using some of the cores (issue 32).

The issue's last figure: on a small host whose other programs use 1-1.5 cores, a sweep that measured
nothing must not be called a success - not by its result, not by its reason, not by `once`'s exit code.
Each round starts a load of ``--load`` cores (whole busy loops, and one loop busy for the fraction left,
in slices of 10 ms), runs `once --json` in a fresh process, and records its result, exit code, what it
withheld and why, and how many points it published. Rounds alternate with idle ones (``--idle``) so the
two are of the same hour.

Usage: ``python benchmarks/busy_once.py --rounds 3 --load 1.3 --out benchmarks/results/busy-once.json``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
REPO = Path(__file__).resolve().parent.parent

# A loop busy for ``share`` of every 10 ms: a data loader or a logging service, not a whole core.
DUTY = """
import sys, time
share = float(sys.argv[1])
while True:
    start = time.monotonic()
    while time.monotonic() - start < 0.010 * share:
        pass
    time.sleep(0.010 * (1 - share))
"""


def load(cores: float) -> list[subprocess.Popen[bytes]]:
    whole, part = int(cores), cores - math.floor(cores)
    shares = [1.0] * whole + ([part] if part > 0.01 else [])
    return [subprocess.Popen([sys.executable, "-c", DUTY, str(s)], start_new_session=True) for s in shares]


def once(config: Path | None) -> dict[str, Any]:
    command = [sys.executable, "-m", "crossover_monitor", "once", "--json"]
    if config:
        command += ["--config", str(config)]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired:  # a hung sweep is a finding too; the other rounds go on
        return {"exit_code": None, "s": round(time.monotonic() - started, 1), "result": "timed out"}
    row: dict[str, Any] = {"exit_code": done.returncode, "s": round(time.monotonic() - started, 1)}
    try:
        printed = json.loads(done.stdout)
    except json.JSONDecodeError:
        return row | {"stdout": done.stdout[-2000:], "stderr": done.stderr[-2000:]}
    snapshot = printed.get("snapshot") or {}
    row["result"] = printed.get("result")
    row["reason"] = printed.get("reason")
    row["withheld"] = [
        {"device": w["device"], "reason": w["reason"], "point": w.get("point")} for w in snapshot.get("withheld", [])
    ]
    row["points"] = len(snapshot.get("measurements", []))
    return row


def _commit() -> str:
    """The checkout's commit, so a record says which code it measured."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=float, default=1.3, help="cores the other programs use")
    parser.add_argument("--idle", action=argparse.BooleanOptionalAction, default=True, help="an idle round before each")
    parser.add_argument("--config", type=Path, help="default: the embedded defaults")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in CPUINFO.read_text().splitlines()
                if line.startswith("model name")
            ),
            "?",
        ),
        "code": _commit(),
        "cores": len(os.sched_getaffinity(0)),
        "load": args.load,
        "rounds": [],
    }
    for index in range(args.rounds):
        for loaded in ([False] if args.idle else []) + [True]:
            others = load(args.load) if loaded else []
            try:
                time.sleep(2 if loaded else 0)
                row = {"round": index, "load": args.load if loaded else 0.0} | once(args.config)
            finally:
                for process in others:
                    process.kill()
                    process.wait()
            results["rounds"].append(row)
            print(json.dumps(row), flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
    loaded_rows = [r for r in results["rounds"] if r["load"]]
    # Measured nothing, yet something says success: the result, a zero exit code, or an empty reason.
    called_success = [
        r
        for r in loaded_rows
        if not r.get("points") and (r.get("result") == "success" or r.get("exit_code") == 0 or not r.get("reason"))
    ]
    print(f"loaded rounds: {len(loaded_rows)}, measured nothing yet called success: {len(called_success)}")


if __name__ == "__main__":
    main()
