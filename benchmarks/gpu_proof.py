"""Issue 17's proof on a GPU machine: idle and planted-change sweeps, a TensorFlow peer, a busy GPU.

Every sweep is ``python -m crossover_monitor once --json`` in a fresh process, as a user runs it, while a
thread samples NVML for the GPU memory the sweep's worker holds (its peak is recorded). One JSON
line per sweep or phase is appended to ``--out``; a summary line is printed for each.

    python benchmarks/gpu_proof.py sweeps --config benchmarks/h200_tensorflow.yaml --count 8 --out r.jsonl
    python benchmarks/gpu_proof.py sweeps --config benchmarks/h200_torch.yaml --count 3 \\
        --env CUDA_LAUNCH_BLOCKING=1 --label planted --out r.jsonl
    python benchmarks/gpu_proof.py peer --sizes 128,512,1024,2048 --threads 15 --out r.jsonl
    python benchmarks/gpu_proof.py busy --config benchmarks/h200_tensorflow.yaml --out r.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from shared_node import gemm_loop, job_rates, rates_around  # noqa: E402


class MemorySampler(threading.Thread):
    """The most GPU memory any process other than ``exclude`` held, sampled through NVML every ``every_s``.

    Not free: the 2026-12-01 run sampled every 0.1 s, and TensorFlow's GPU compute at n = 1024 (bound
    by its dispatch there) read up to 1.30x the peer in that run, against 1.00-1.02 in sweeps without
    a sampler. Hence once a second, and a peak that may miss a shorter one.
    """

    def __init__(self, exclude: set[int], every_s: float) -> None:
        super().__init__(daemon=True)
        self._every_s = every_s
        import pynvml  # noqa: PLC0415 - only on the GPU machine

        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError:  # no driver here: nothing to sample
            self._handles = []
        self._exclude = exclude
        self.peak_bytes = 0
        self._done = threading.Event()

    def run(self) -> None:
        if self._every_s <= 0:  # sampling off: the sweep runs with nothing polling the driver beside it
            return
        while not self._done.is_set():
            for handle in self._handles:
                for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid not in self._exclude and process.usedGpuMemory:
                        self.peak_bytes = max(self.peak_bytes, int(process.usedGpuMemory))
            self._done.wait(self._every_s)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak_bytes


def once(config: str, env: dict[str, str], exclude: set[int], sample_every_s: float = 1.0) -> dict[str, Any]:
    sampler = MemorySampler(exclude, sample_every_s)
    sampler.start()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "crossover_monitor", "once", "--json", "--config", config],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
        cwd=REPO,
    )
    row: dict[str, Any] = {
        "wall_s": time.monotonic() - started,
        "peak_gpu_bytes": sampler.stop() if sample_every_s > 0 else None,
        "exit": done.returncode,
    }
    try:
        row["once"] = json.loads(done.stdout)
    except json.JSONDecodeError:
        row["stderr"] = done.stderr[-3000:]
    return row


def summary(row: dict[str, Any]) -> str:
    snapshot = (row.get("once") or {}).get("snapshot") or {}
    parts = []
    for c in snapshot.get("crossovers", []):
        size = f"{c['size']:.0f}" if c.get("size") else "-"
        interval = f" [{c['ci_lower']:.0f}-{c['ci_upper']:.0f}]" if c.get("ci_lower") else ""
        parts.append(f"{c['mode']} {c['state']} {size}{interval}")
    withheld = [f"{w['device']} {w['reason']}" for w in snapshot.get("withheld", [])]
    memory = "not sampled" if row["peak_gpu_bytes"] is None else f"{row['peak_gpu_bytes'] / 2**20:.0f} MiB"
    return (
        f"{row.get('label', '')} exit {row['exit']} {row['wall_s']:.0f}s mem {memory}: "
        + "; ".join(parts)
        + (f" withheld {withheld}" if withheld else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("sweeps", "peer", "busy"))
    parser.add_argument("--config", default="benchmarks/h200_tensorflow.yaml")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service's environment")
    parser.add_argument("--label", default="idle")
    parser.add_argument("--sizes", default="128,512,1024,2048")
    parser.add_argument("--threads", type=int, default=15)
    parser.add_argument(
        "--sample-every",
        type=float,
        default=1.0,
        help="seconds between NVML memory samples beside each sweep; 0 samples nothing (peak not recorded)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)

    def write(row: dict[str, Any]) -> None:
        with args.out.open("a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")

    if args.phase == "sweeps":
        for index in range(args.count):
            row = {"phase": "sweep", "label": args.label, "config": args.config, "env": env, "index": index}
            row.update(once(args.config, env, exclude=set(), sample_every_s=args.sample_every))
            row["sample_every_s"] = args.sample_every
            write(row)
            print(summary(row), flush=True)
    elif args.phase == "peer":
        peer = REPO / "benchmarks" / "tf_peer.py"
        command = [sys.executable, str(peer), "--sizes", args.sizes, "--threads", str(args.threads)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        row = {"phase": "peer", "exit": done.returncode, "stderr": done.stderr[-2000:] if done.returncode else ""}
        if done.returncode == 0:
            row["peer"] = json.loads(done.stdout.strip().splitlines()[-1])
        write(row)
        print("peer", row.get("peer") or row["stderr"], flush=True)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "gemm.txt"
            job = gemm_loop("cuda:0", 120.0, report)
            time.sleep(12)  # the job warms up; its rate before the sweep
            before = time.time()
            row = {"phase": "busy", "label": "busy", "config": args.config}
            row.update(once(args.config, env, exclude={job.pid}))
            after = time.time()
            time.sleep(6)
            job.kill()
            lines = job_rates(report)
        alone, during, row["job_throughput_loss"] = rates_around(lines, before, after)
        row["job_rate_alone"], row["job_rate_during_sweep"] = alone, during
        write(row)
        print(summary(row), f"job GEMM/s alone {alone} during {during}", flush=True)


if __name__ == "__main__":
    main()
