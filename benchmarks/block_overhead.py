"""What does one timing block cost beyond its calls, by framework and by how it waits for the GPU?

Run on a GPU machine with PyTorch and JAX: python benchmarks/block_overhead.py [--sizes 1024,4096,8192]

The service times a point as blocks of k back-to-back calls followed by one wait for the last
result, and divides by k. Anything a block costs once (the wait's wake-up, the first launch after
an idle GPU) is spread over k calls: with 20 ms blocks a 1 ms fixed cost is a 5% error. For each
size and variant (how the block waits; for JAX also whether each call allocates its result) this fits block time = intercept + k · slope over k = 1, 2, 4, 8, 16
(medians of 10 blocks each) and prints both: the intercept is the per-block cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crossover_monitor.settings import TimingSettings

BLOCKS, WARM = 10, 2
SERVICE_BLOCK_S = TimingSettings().block_s  # benchmark.timing.block_time's default
CALLS = (1, 2, 4, 8, 16)


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares intercept and slope of block time against calls per block."""
    slope, intercept = statistics.linear_regression(list(points), list(points.values()))
    return intercept, slope


def blocks(call: Callable[[], Any], wait: Callable[[Any], None]) -> dict[int, float]:
    medians = {}
    for k in CALLS:
        times = []
        for index in range(BLOCKS + WARM):
            started = time.perf_counter()
            for _ in range(k):
                result = call()
            wait(result)
            if index >= WARM:
                times.append(time.perf_counter() - started)
        medians[k] = statistics.median(times)
    return medians


def spin(array: Any) -> None:
    while not array.is_ready():
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1024,2048,4096,8192")
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"| framework | wait | n | per block (µs) | per call (µs) | per block / {SERVICE_BLOCK_S * 1e3:.0f} ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    with jax.default_matmul_precision("float32"):
        for n in map(int, args.sizes.split(",")):
            for (framework, wait_name), (call, wait) in variants(jax, torch, n).items():
                intercept, slope = fit(blocks(call, wait))
                print(
                    f"| {framework} | {wait_name} | {n} | {intercept * 1e6:.0f} | {slope * 1e6:.1f} | {intercept / SERVICE_BLOCK_S:.3f} |",
                    flush=True,
                )


def variants(jax: Any, torch: Any, n: int) -> dict[tuple[str, str], tuple[Callable[[], Any], Callable[[Any], None]]]:
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    host = np.random.default_rng(n).random((2, n, n), dtype=np.float32)
    a, b = (jax.device_put(x, jax.devices("gpu")[0]) for x in host)
    ta, tb = (torch.from_numpy(x).cuda() for x in host)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    # The product written over one donated buffer: no allocation per call (tried for the service, no difference).
    into = jax.jit(lambda a, b, _out: jnp.matmul(a, b), donate_argnums=2, keep_unused=True)
    product = [jnp.zeros_like(a)]

    def matmul_into() -> Any:
        product[0] = into(a, b, product[0])
        return product[0]

    return {
        ("jax", "block_until_ready"): (lambda: matmul(a, b), lambda c: c.block_until_ready()),
        ("jax", "is_ready spin"): (lambda: matmul(a, b), spin),
        ("jax", "donated output, block_until_ready"): (matmul_into, lambda c: c.block_until_ready()),
        ("torch", "cuda.synchronize"): (lambda: torch.matmul(ta, tb), lambda _: torch.cuda.synchronize()),
    }


if __name__ == "__main__":
    main()
