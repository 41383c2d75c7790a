"""Why does the CPU's fixed-cost point (n = 1) slow beside one busy core when the host reference does not?

Issue 32's H100 runs (benchmarks/README.md "Blocks set aside") published CPU n = 1 at 1.36-2.27x its idle
range beside one busy core, with no thread waiting for a CPU and the host reference moving less. This probe
times, in one fresh process per condition (as the worker is), blocks of CPU matmul at a few sizes with the
worker's thread count, and beside each block: a host reference reading, the run-queue wait of all of the
process's threads, the CPU the timing thread ran on, and its involuntary context switches. Conditions:
idle, one core busy (pinned to CPU 0, as shared_node's ``core1``), one busy loop free to move, a 1-thread
BLAS job, idle again.

Usage (GPU machine with torch): ``python3 benchmarks/fixed_cost_probe.py --out results/x.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CO_TENANTS = {
    "idle": None,
    "core1": "import os; os.sched_setaffinity(0, {0})\nwhile True: pass",
    "spin1": "while True: pass",
    "blas1": "import torch; torch.set_num_threads(1); a = torch.rand(1024, 1024)\nwhile True: a @ a",
}


_WARMUP_ROUNDS = 3  # the first blocks of a fresh process run cold (5x at n = 1 on the 2-core VM)


def _threads_wait_ns() -> int:
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _own_switches() -> tuple[int, int, int]:
    """This thread's CPU now, voluntary and involuntary context switches."""
    stat = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()
    status = Path("/proc/thread-self/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(stat[36]), int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def child(sizes: list[int], threads: int, blocks: int, block_s: float, gpu: bool) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    from crossover_monitor.measure.guard import hostprobe  # noqa: PLC0415

    torch.set_num_threads(threads)
    found: dict[str, Any] = {}
    cases = [("cpu", n) for n in sizes] + ([("gpu", 1)] if gpu and torch.cuda.is_available() else [])
    operands = {}
    for device, n in cases:
        where = "cuda" if device == "gpu" else "cpu"
        a, b = torch.rand(n, n, device=where), torch.rand(n, n, device=where)
        operands[(device, n)] = (a, b)
        # Calibrate: calls per block of about block_s.
        calls = 1
        while True:
            start = time.perf_counter()
            for _ in range(calls):
                torch.matmul(a, b)
            if device == "gpu":
                torch.cuda.synchronize()
            if time.perf_counter() - start > block_s / 4 or calls > 1 << 22:
                break
            calls *= 2
        found[f"{device} {n}"] = {"calls": calls * 4, "blocks": []}
    for round_ in range(blocks + _WARMUP_ROUNDS):  # interleaved: every case's block, then the next round
        for device, n in cases:
            a, b = operands[(device, n)]
            record = found[f"{device} {n}"]
            reference = hostprobe.reading(runs=1)
            cpu0, vol0, invol0 = _own_switches()
            wait0 = _threads_wait_ns()
            start = time.perf_counter()
            for _ in range(record["calls"]):
                torch.matmul(a, b)
            if device == "gpu":
                torch.cuda.synchronize()
            took = time.perf_counter() - start
            wait = _threads_wait_ns() - wait0
            cpu1, vol1, invol1 = _own_switches()
            if round_ < _WARMUP_ROUNDS:
                continue
            record["blocks"].append(
                {
                    "per_call_s": took / record["calls"],
                    "reference_s": reference,
                    "threads_wait_cores": wait / 1e9 / took,
                    "cpus": [cpu0, cpu1],
                    "voluntary": vol1 - vol0,
                    "involuntary": invol1 - invol0,
                }
            )
    return found


def summary(found: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for case, record in found.items():
        blocks = record["blocks"]
        out[case] = {
            "per_call_median_s": statistics.median(b["per_call_s"] for b in blocks),
            "reference_median_s": statistics.median(b["reference_s"] for b in blocks),
            "wait_cores_median": statistics.median(b["threads_wait_cores"] for b in blocks),
            "wait_cores_max": max(b["threads_wait_cores"] for b in blocks),
            "involuntary_median": statistics.median(b["involuntary"] for b in blocks),
            "cpus": sorted({c for b in blocks for c in b["cpus"]}),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--sizes", default="1,16,64,256")
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    parser.add_argument("--blocks", type=int, default=25)
    parser.add_argument("--block-s", type=float, default=0.02)
    parser.add_argument("--conditions", default="idle,core1,spin1,blas1,idle")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.child:
        print(json.dumps(child(sizes, args.threads, args.blocks, args.block_s, gpu=True)))
        return
    topology = subprocess.run(["lscpu", "-e=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, check=False)
    results: dict[str, Any] = {"topology": topology.stdout, "threads": args.threads, "runs": []}
    print(topology.stdout)
    command = [sys.executable, __file__, "--child", "--sizes", args.sizes, "--threads", str(args.threads)]
    command += ["--blocks", str(args.blocks), "--block-s", str(args.block_s)]
    for round_ in range(args.rounds):
        for condition in args.conditions.split(","):
            code = CO_TENANTS[condition]
            tenant = subprocess.Popen([sys.executable, "-c", code], start_new_session=True) if code else None
            if tenant:
                time.sleep(2)
            try:
                done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
            finally:
                if tenant:
                    tenant.kill()
                    tenant.wait()
            found = json.loads(done.stdout.strip().splitlines()[-1])
            results["runs"].append({"round": round_, "condition": condition, "found": found})
            brief = summary(found)
            print(condition, round_, json.dumps(brief))
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results))
    idle = [summary(r["found"]) for r in results["runs"] if r["condition"] == "idle"]
    for run in results["runs"]:
        brief = summary(run["found"])
        line = []
        for case, s in brief.items():
            base = statistics.median(i[case]["per_call_median_s"] for i in idle)
            ref = statistics.median(i[case]["reference_median_s"] for i in idle)
            line.append(
                f"{case}: {s['per_call_median_s'] / base:.2f}x (ref {s['reference_median_s'] / ref:.2f}x, "
                f"wait {s['wait_cores_median']:.3f}/{s['wait_cores_max']:.2f}, inv {s['involuntary_median']:.0f})"
            )
        print(f"{run['condition']:6} r{run['round']}: " + "; ".join(line))


if __name__ == "__main__":
    main()
