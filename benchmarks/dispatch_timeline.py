"""A light, independent timeline of the host's dispatch speed (issue 32): is a host that slows by itself
(no other process, no steal reported) seen by a peer in its own process at the times the service withholds?

Every ``--every-s`` seconds, in this process (PyTorch, not the service's code), it times ``--ops`` GPU
launches of a 1x1 matmul, each synchronised (the GPU fixed-cost point as CUDA sees it; ``--device cpu``: the
CPU's, for a run beside the service, which rightly withholds its GPU beside any other GPU process), and a pure-Python
loop of 20 000 additions, and writes one JSON line: unix time, the median launch in microseconds, the loop's
time in microseconds. About 1% of one core. Run it beside shared_node.py and set the lines beside each
sweep's ``started_at``/``s``.

Usage (GPU machine with torch): ``python3 benchmarks/dispatch_timeline.py --out FILE.jsonl --for-s 500``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def python_loop_us() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(20_000):
        total += i
    return (time.perf_counter() - started) * 1e6


def launch_us(a: Any, ops: int) -> float:
    import torch  # noqa: PLC0415 - here, so that --help needs no torch

    times = []
    for _ in range(ops):
        started = time.perf_counter()
        torch.mm(a, a)
        if a.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--for-s", type=float, default=600)
    parser.add_argument("--every-s", type=float, default=1.0)
    parser.add_argument("--ops", type=int, default=100)
    # cpu: a CUDA context in this process is a GPU process to NVML, and the service withholds its GPU beside one.
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    a = torch.ones(1, 1, device=args.device)
    launch_us(a, 50)  # warm the context and the kernel
    ends = time.time() + args.for_s
    with Path(args.out).open("w") as out:
        while time.time() < ends:
            line = {"t": time.time(), "launch_us": launch_us(a, args.ops), "loop_us": python_loop_us()}
            out.write(json.dumps(line) + "\n")
            out.flush()
            time.sleep(args.every_s)


if __name__ == "__main__":
    main()
