"""Does what runs beside a TensorFlow GPU timing slow it at a dispatch-bound size? (issue 17, n = 1024)

A separate TensorFlow loop, not the service's code: GPU compute blocks (``tf.matmul`` back to back for
at least 25 ms, ended by ``sync_devices``) at one size, in rounds of three conditions taken in turn:

- ``alone``: nothing else;
- ``after_cpu``: each GPU block right after a CPU matmul block of the same size on the intra-op pool
  (what the service's paired visits do: Eigen's threads spin for a while after their work);
- ``nvml``: an NVML thread listing the GPU's processes once a second meanwhile (gpu_proof.py's sampler).

Prints one JSON line: the median per-call time of each condition, and of each round.

    python benchmarks/tf_interleave.py --size 1024 --threads 15 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np
import tensorflow as tf
from tf_peer import configure

BLOCK_S = 25e-3


class NvmlPoller:
    """While active, the GPU's process list read once a second on a thread of its own."""

    def __init__(self, *, active: bool) -> None:
        self._active = active
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import pynvml  # noqa: PLC0415 - on the GPU machine only

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self._stop.is_set():
            pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            self._stop.wait(1.0)

    def __enter__(self) -> None:
        if self._active:
            self._thread.start()

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._active:
            self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args()
    configure(args.threads)
    rng = np.random.default_rng(args.size)
    host = [rng.random((args.size, args.size), dtype=np.float32) for _ in range(2)]
    with tf.device("/GPU:0"):
        ga, gb = (tf.constant(x) for x in host)
    with tf.device("/CPU:0"):
        ca, cb = (tf.constant(x) for x in host)

    def gpu_block(calls: int, *, cpu_first: bool = False) -> float:
        if cpu_first:
            cpu_block()
        started = time.perf_counter()
        with tf.device("/GPU:0"):
            for _ in range(calls):
                tf.matmul(ga, gb)
        tf.test.experimental.sync_devices()
        return (time.perf_counter() - started) / calls

    def cpu_block() -> None:
        started = time.perf_counter()
        with tf.device("/CPU:0"):
            while time.perf_counter() - started < BLOCK_S:
                tf.matmul(ca, cb).numpy()

    gpu_block(5)
    cpu_block()
    calls = max(1, round(BLOCK_S / gpu_block(20)))
    rounds: dict[str, list[float]] = {"alone": [], "after_cpu": [], "nvml": []}
    every: dict[str, list[float]] = {name: [] for name in rounds}
    for _ in range(args.rounds):
        for name, medians in rounds.items():
            with NvmlPoller(active=name == "nvml"):
                blocks = [gpu_block(calls, cpu_first=name == "after_cpu") for _ in range(args.blocks)]
            medians.append(statistics.median(blocks))
            every[name] += blocks
    print(
        json.dumps(
            {
                "size": args.size,
                "calls_per_block": calls,
                "median_us": {k: round(statistics.median(v) * 1e6, 2) for k, v in every.items()},
                "rounds_us": {k: [round(x * 1e6, 2) for x in v] for k, v in rounds.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
