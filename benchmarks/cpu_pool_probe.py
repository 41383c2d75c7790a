"""How one busy core costs each framework's CPU matmul: a fork-join pool waits for its slowest thread, a
work-stealing pool hands that thread's share to the others (issue 32).

The guard sets aside CPU blocks whose threads waited for a CPU only where the pool is fork-join
(``thread_pool`` of the CPU device) or has one thread. TensorFlow's Eigen pool measured work-stealing
(tf_pool_probe.py); PyTorch (OpenMP) fork-join; JAX (XLA's CPU client) was assumed fork-join. This probe times each framework's CPU matmul
with the service's thread count (cores - 1; JAX confined to that many CPUs, as the service confines it) in fresh
processes, idle and beside one busy core pinned to CPU 0, alternated ``--rounds`` times, and prints each one's
loaded median over its idle median per size.

Usage (a machine with the frameworks): ``python3 benchmarks/cpu_pool_probe.py --out results/x.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BUSY_CORE = "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"


def _timed(run: Callable[[], object], seconds: float) -> float:
    """Median seconds per call over blocks of about 20 ms, for ``seconds``."""
    run()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            run()
        if time.perf_counter() - start >= 0.02:
            break
        calls *= 2
    samples: list[float] = []
    ended = time.perf_counter() + seconds
    while time.perf_counter() < ended or len(samples) < 5:
        start = time.perf_counter()
        for _ in range(calls):
            run()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def _jax_matmul(jnp: Any, a: Any, b: Any) -> object:
    return jnp.matmul(a, b).block_until_ready()


def child(framework: str, threads: int, sizes: list[int], seconds: float) -> dict[str, float]:
    """Median seconds per CPU matmul at each size, ``threads`` threads."""
    found = {}
    if framework == "jax":
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])  # XLA sizes its pool from these
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415

        cpu = jax.devices("cpu")[0]
        for n in sizes:
            a = jax.device_put(jnp.ones((n, n), jnp.float32), cpu)
            b = jax.device_put(jnp.ones((n, n), jnp.float32), cpu)
            found[str(n)] = _timed(functools.partial(_jax_matmul, jnp, a, b), seconds)
    else:
        import torch  # noqa: PLC0415

        torch.set_num_threads(threads)
        for n in sizes:
            a, b = torch.rand(n, n), torch.rand(n, n)
            found[str(n)] = _timed(functools.partial(torch.matmul, a, b), seconds)
    return found


def run_child(args: argparse.Namespace, framework: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", framework, "--threads", str(args.threads)]
    command += ["--sizes", args.sizes, "--seconds", str(args.seconds)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("jax", "torch"))
    parser.add_argument("--frameworks", default="jax,torch")
    parser.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    parser.add_argument("--sizes", default="256,1024,2048")
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.threads, [int(n) for n in args.sizes.split(",")], args.seconds)))
        return
    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for framework in args.frameworks.split(","):
            for condition in ("idle", "busy_core"):
                spinner = None
                if condition == "busy_core":
                    spinner = subprocess.Popen([sys.executable, "-c", BUSY_CORE], start_new_session=True)
                    time.sleep(1.0)
                try:
                    times = run_child(args, framework)
                finally:
                    if spinner is not None:
                        spinner.kill()
                        spinner.wait()
                rows.append({"round": round_, "framework": framework, "condition": condition, "times": times})
                print(json.dumps(rows[-1]), flush=True)
                if args.out:
                    args.out.write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    for framework in args.frameworks.split(","):
        for n in args.sizes.split(","):
            idle = [r["times"][n] for r in rows if r["framework"] == framework and r["condition"] == "idle"]
            busy = [r["times"][n] for r in rows if r["framework"] == framework and r["condition"] == "busy_core"]
            if idle and busy:
                ratio = statistics.median(busy) / statistics.median(idle)
                print(f"{framework} n={n}: busy core / idle {ratio:.3f} (idle median {statistics.median(idle):.3g} s)")


if __name__ == "__main__":
    main()
