"""TensorFlow's CPU matmul with an intra-op pool of cores - 1 against cores - 2, idle and beside one busy core.

The service sets TensorFlow's pool to ``cpu_threads - 1`` (its calling thread computes beside the pool,
crossover_monitor/measure/backends/tensorflow_backend.py). This probe times the CPU matmul with each pool size in
fresh processes, alternated ``--rounds`` times, so the two are compared on one host in one hour: what the
change costs the idle figure, and what one busy core (pinned to CPU 0) costs each.

Usage (a machine with TensorFlow): ``python3 benchmarks/tf_pool_probe.py --out results/x.json``.
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

BUSY_CORE = "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"


def child(pool: int, sizes: list[int], seconds: float) -> dict[str, float]:
    """Median seconds per matmul at each size with an intra-op pool of ``pool`` threads."""
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(pool)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    found = {}
    with tf.device("/CPU:0"):
        for n in sizes:
            a, b = tf.random.uniform((n, n)), tf.random.uniform((n, n))
            tf.matmul(a, b).numpy()  # warm
            calls, ended = 1, time.perf_counter() + seconds
            samples: list[float] = []
            while time.perf_counter() < ended or len(samples) < 5:
                start = time.perf_counter()
                for _ in range(calls):
                    result = tf.matmul(a, b)
                result.numpy()
                took = time.perf_counter() - start
                if took < 0.01:  # blocks of at least 10 ms
                    calls *= 2
                    continue
                samples.append(took / calls)
            found[str(n)] = statistics.median(samples)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=int, help="(internal) time with this pool size")
    parser.add_argument("--sizes", default="256,512,1024,2048")
    parser.add_argument("--seconds", type=float, default=1.0, help="per size and process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    if args.child is not None:
        print(json.dumps(child(args.child, sizes, args.seconds)))
        return
    cores = len(os.sched_getaffinity(0))
    pools = (cores - 1, cores - 2)
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for busy in (False, True):
            for pool in pools:
                tenant = subprocess.Popen([sys.executable, "-c", BUSY_CORE]) if busy else None
                try:
                    if tenant:
                        time.sleep(1)
                    command = [sys.executable, __file__, "--child", str(pool), "--sizes", args.sizes]
                    done = subprocess.run(
                        [*command, "--seconds", str(args.seconds)], capture_output=True, text=True, check=True
                    )
                finally:
                    if tenant:
                        tenant.kill()
                        tenant.wait()
                times = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append({"round": round_, "busy_core": busy, "pool": pool, "seconds": times})
                print(round_, "busy" if busy else "idle", pool, {n: f"{t * 1e3:.3f} ms" for n, t in times.items()})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cores": cores, "runs": runs}, indent=1))
    base = {
        n: statistics.median(r["seconds"][n] for r in runs if r["pool"] == pools[0] and not r["busy_core"])
        for n in map(str, sizes)
    }
    for busy in (False, True):
        for pool in pools:
            mine = [r for r in runs if r["pool"] == pool and r["busy_core"] == busy]
            ratios = {n: statistics.median(r["seconds"][n] for r in mine) / base[n] for n in base}
            label = "one busy core" if busy else "idle"
            print(f"pool {pool}, {label}: " + ", ".join(f"n={n} {v:.3f}x" for n, v in ratios.items()))


if __name__ == "__main__":
    main()
