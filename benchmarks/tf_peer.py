"""A TensorFlow matmul timing loop that shares no code with the service: the peer for issue 17.

Run in its own process. For each size, operands on the GPU (compute) or in host memory
(end_to_end); two warm-up calls; then blocks of back-to-back ``tf.matmul`` calls of at least 25 ms,
each block ended by ``tf.test.experimental.sync_devices()``; the median per-call time over the
blocks. The thread settings are the service's (intra-op = ``--threads``, inter-op = 2).

    python benchmarks/tf_peer.py --sizes 1024,2048 --threads 15   # prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import tensorflow as tf

BLOCK_S = 25e-3
BLOCKS = 15


def _per_call(run: object, calls: int) -> float:
    started = time.perf_counter()
    run(calls)  # type: ignore[operator]
    return (time.perf_counter() - started) / calls


def time_size(size: int, device: str) -> dict[str, float]:
    """Median per-call seconds of one size in both modes."""
    rng = np.random.default_rng(size)
    a_host = rng.random((size, size), dtype=np.float32)
    b_host = rng.random((size, size), dtype=np.float32)
    with tf.device(device):
        a, b = tf.constant(a_host), tf.constant(b_host)

        def compute(calls: int) -> None:
            for _ in range(calls):
                tf.matmul(a, b)
            tf.test.experimental.sync_devices()

        def end_to_end(calls: int) -> None:
            for _ in range(calls):
                tf.matmul(tf.constant(a_host), tf.constant(b_host)).numpy()

        found = {}
        for mode, run in (("compute", compute), ("end_to_end", end_to_end)):
            run(2)
            calls = max(1, round(BLOCK_S / _per_call(run, 1)))
            found[mode] = statistics.median(_per_call(run, calls) for _ in range(BLOCKS))
        return found


def configure(threads: int) -> None:
    """The service's TensorFlow settings: memory growth, intra-op ``threads``, inter-op 2, TF32 off."""
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, enable=True)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.config.experimental.enable_tensor_float_32_execution(enabled=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--device", default="/GPU:0")
    args = parser.parse_args()
    configure(args.threads)
    results: dict[str, dict[int, float]] = {"compute": {}, "end_to_end": {}}
    for size in map(int, args.sizes.split(",")):
        for mode, seconds in time_size(size, args.device).items():
            results[mode][size] = seconds
    print(json.dumps(results))


if __name__ == "__main__":
    main()
