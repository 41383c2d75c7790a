"""How long `crossover-monitor check-config` takes on each hostile file of issue 9 (target: under a second).

Runs the real command in a fresh process per case, several times, and writes the median wall time
(process start included) beside the exit code. Usage: ``python3 benchmarks/config_cases.py --out FILE.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from crossover_monitor.measure.guard.hostinfo import cpu_model  # noqa: E402
from tests.test_config_robustness import CASES  # noqa: E402


def timed(path: Path) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "check-config", str(path)],
        capture_output=True,
        check=False,
        cwd=REPO,
    )
    return time.perf_counter() - started, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        baseline = Path(scratch) / "empty.yaml"
        baseline.write_text("{}\n")
        cases = [("empty file (baseline: process start)", baseline), ("/dev/zero", Path("/dev/zero"))]
        for name, content, _, _ in CASES:
            path = Path(scratch) / f"{name}.yaml"
            path.write_bytes(content)
            cases.append((name, path))
        for name, path in cases:
            runs = [timed(path) for _ in range(args.repeats)]
            rows.append((name, statistics.median(t for t, _ in runs), {rc for _, rc in runs}))
            print(f"{name:40} {rows[-1][1]:.3f} s  exit {rows[-1][2]}", flush=True)
    if args.out:
        lines = [
            f"# check-config on hostile files — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            "",
            (
                f"Machine: {cpu_model()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}; median of "
                f"{args.repeats} fresh processes each, process start included."
            ),
            "",
            "| case | wall time | exit code |",
            "| --- | ---: | ---: |",
            *(f"| {name} | {seconds:.3f} s | {', '.join(map(str, sorted(codes)))} |" for name, seconds, codes in rows),
        ]
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
