"""What the JAX backend does beyond the shared contract."""

from __future__ import annotations

from typing import Any, cast

from monitor.bench.contract import BackendOptions
from monitor.bench.registry import load_backend


def test_compute_blocks_write_every_product_over_one_buffer() -> None:
    """No allocation per call: each call's result overwrites the donated buffer of the one before.

    jit drops an unused argument unless told to keep it, and then there is nothing to donate: a
    fresh buffer per call, whose allocation and free land in the timed block.
    """
    backend = load_backend("jax", BackendOptions(tf32=False, cpu_threads=1))
    cpu = next(d for d in backend.discover() if d.kind == "cpu")
    run = backend.prepare(cpu, 64, "float32", "compute")
    # Read at once: a product is donated, and so deleted, by the next call.
    buffers = {cast("Any", run(calls)).unsafe_buffer_pointer() for calls in (1, 3, 2)}
    assert len(buffers) == 1
