"""Independent timings of the service's matmul points, for gpu_reference.py; never imports crossover_monitor.measure.

- torch: CUDA events around back-to-back ``torch.matmul`` calls (compute), CUDA events around copy
  in + matmul + copy out (end_to_end), and a ``perf_counter`` loop on the CPU.
- jax: for compute, the smaller of two timings of back-to-back calls of the jitted matmul: the
  GPU's own kernel timestamps from JAX's profiler (CUPTI; CUDA events cannot bracket work on
  JAX's streams) and a host-timed loop (see ``tighter_bound``); a ``perf_counter`` loop for
  end_to_end and on the CPU (where end_to_end copies the NumPy operands into JAX's buffers, as
  the service does).

Every compute reference runs blocks of at least 25 ms, as the service's are: a GPU's clocks under
a sustained load differ from those in a short burst.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crossover_monitor.model import Mode

ModeCurves = dict[str, dict[int, float]]  # mode -> size -> seconds, for one device
Curves = dict[str, ModeCurves]  # device kind -> mode -> size -> seconds
MODES: tuple[Mode, ...] = ("compute", "end_to_end")
BLOCK_S = 25e-3
MAX_CALLS = 2000


def empty_curves() -> Curves:
    return {"cpu": {m: {} for m in MODES}, "gpu": {m: {} for m in MODES}}


def calls_per_block(seconds_per_call: float) -> int:
    return max(1, min(MAX_CALLS, math.ceil(BLOCK_S / max(seconds_per_call, 1e-7))))


def cpu_repeats(size: int) -> int:
    """Enough calls of an n×n matmul on the CPU for about a second, but at least 5 and at most 500."""
    return max(5, min(500, int(1.0 / max(2 * size**3 / 5e11, 1e-5))))


def median_per_call(run: Callable[[], object], calls: int, *, skip: int = 0) -> float:
    """Median over ``calls`` host-timed calls of ``run`` (which must block until its result is ready)."""
    times = []
    for call in range(calls + skip):
        started = time.perf_counter()
        run()
        if call >= skip:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def median_for(run: Callable[[], object], *, seconds: float = 1.0, min_calls: int = 5, warmup: int = 3) -> float:
    """Median per-call time of ``run`` called for at least ``seconds`` and ``min_calls`` times, after ``warmup`` calls."""
    for _ in range(warmup):
        run()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < min_calls:
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def torch_reference(sizes: Sequence[int], *, tf32: bool, cpu: bool, threads: int) -> tuple[Curves, dict[str, Any]]:
    import torch  # noqa: PLC0415

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.set_num_threads(threads)
    gpu = torch.device("cuda:0")
    curves = empty_curves()
    for n in sizes:
        a_host, b_host = torch.rand(n, n), torch.rand(n, n)
        a, b = a_host.to(gpu), b_host.to(gpu)
        torch.matmul(a, b)
        torch.cuda.synchronize()
        probe = time.perf_counter()
        torch.matmul(a, b)
        torch.cuda.synchronize()
        calls = calls_per_block(time.perf_counter() - probe)
        blocks = []
        for block in range(13):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                torch.matmul(a, b)
            end.record()
            end.synchronize()
            if block >= 3:  # warm-up blocks
                blocks.append(start.elapsed_time(end) / 1e3 / calls)
        curves["gpu"]["compute"][n] = statistics.median(blocks)
        # end_to_end: events around copy in, matmul, copy out (the copy out blocks the host)
        times = []
        for call in range(23):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            torch.matmul(a_host.to(gpu), b_host.to(gpu)).cpu()
            end.record()
            end.synchronize()
            if call >= 3:
                times.append(start.elapsed_time(end) / 1e3)
        curves["gpu"]["end_to_end"][n] = statistics.median(times)
        if cpu:
            # On the CPU the operands already live in host memory: end_to_end copies nothing.
            seconds = median_per_call(functools.partial(torch.matmul, a_host, b_host), cpu_repeats(n), skip=2)
            curves["cpu"]["compute"][n] = curves["cpu"]["end_to_end"][n] = seconds
    return curves, {"gpu_compute": "CUDA events", "gpu_end_to_end": "CUDA events", "cpu": "perf_counter loop"}


def jax_reference(sizes: Sequence[int], *, tf32: bool, cpu: bool) -> tuple[Curves, dict[str, Any]]:
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    gpu, host = jax.devices("gpu")[0], jax.devices("cpu")[0]
    matmul = jax.jit(jnp.matmul)
    curves = empty_curves()
    notes: dict[str, Any] = {
        "host_loop": {},
        "profiled": {},
        "profiler_method": {},
        "kernels": {},
        "profiler_error": None,
    }
    rng = np.random.default_rng(0)

    def measure(n: int) -> None:
        a_host = rng.random((n, n), dtype=np.float32)
        b_host = rng.random((n, n), dtype=np.float32)
        a, b = jax.device_put(a_host, gpu), jax.device_put(b_host, gpu)
        matmul(a, b).block_until_ready()  # compiles
        calls = calls_per_block(median_per_call(lambda: matmul(a, b).block_until_ready(), 3))

        def block() -> None:
            for _ in range(calls):
                c = matmul(a, b)
            c.block_until_ready()

        host_blocks = []
        for index in range(13):
            started = time.perf_counter()
            block()
            if index >= 3:
                host_blocks.append((time.perf_counter() - started) / calls)
        notes["host_loop"][n] = statistics.median(host_blocks)
        if notes["profiler_error"] is None:
            try:
                notes["profiled"][n], notes["profiler_method"][n], notes["kernels"][n] = _profiled_per_call(
                    jax, block, calls, blocks=5
                )
            except Exception as exc:  # noqa: BLE001 - any profiler failure means: keep the host loop
                notes["profiler_error"] = f"n={n}: {type(exc).__name__}: {exc}"

        def end_to_end() -> None:
            np.asarray(matmul(jax.device_put(a_host, gpu), jax.device_put(b_host, gpu)))

        curves["gpu"]["end_to_end"][n] = median_per_call(end_to_end, 20, skip=3)
        if cpu:
            a_cpu, b_cpu = jax.device_put(a_host, host), jax.device_put(b_host, host)
            repeats = cpu_repeats(n)
            compute = median_per_call(lambda: matmul(a_cpu, b_cpu).block_until_ready(), repeats, skip=2)
            curves["cpu"]["compute"][n] = compute

            # Unlike torch's, JAX's CPU takes a NumPy operand only by copying it into a buffer of its own.
            def cpu_end_to_end() -> None:
                np.asarray(matmul(jax.device_put(a_host, host), jax.device_put(b_host, host)))

            curves["cpu"]["end_to_end"][n] = median_per_call(cpu_end_to_end, repeats, skip=2)

    # The precision is part of jit's cache key: tracing and every call stay inside this context.
    with jax.default_matmul_precision("tensorfloat32" if tf32 else "float32"):
        for n in sizes:
            measure(n)
    notes["gpu_end_to_end"] = notes["cpu"] = "perf_counter loop"
    curves["gpu"]["compute"], notes["gpu_compute"] = tighter_bound(notes["profiled"], notes["host_loop"])
    return curves, notes


def tighter_bound(profiled: dict[int, float], host_loop: dict[int, float]) -> tuple[dict[int, float], dict[int, str]]:
    """Per size, the smaller of the two JAX GPU compute timings, and which one it was.

    Both overstate the per-call time of back-to-back calls, each in its own regime: the profiler
    slows dispatch, so where a call is dispatch-bound (small n) its kernels wait on the host; the
    host loop pays each block's end (a wait for the GPU that costs JAX 0.3-0.9 ms: benchmarks/README.md,
    "NVIDIA H200, JAX backend"), which matters where a call is long (large n). The smaller is the tighter.
    """
    seconds, chosen = {}, {}
    for n, loop in host_loop.items():
        device = profiled.get(n)
        seconds[n], chosen[n] = (device, "profiler") if device is not None and device <= loop else (loop, "host loop")
    return seconds, chosen


def _profiled_per_call(jax: Any, block: Callable[[], None], calls: int, *, blocks: int) -> tuple[float, str, list[str]]:
    """Median over ``blocks`` of (last kernel end − first kernel start) / calls, from the GPU's timestamps.

    The span from the first kernel to the last of a block of back-to-back calls is what CUDA events
    around the block would read, less the launch of the first call.
    """
    block()  # warm, outside the trace
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder)
        try:
            for _ in range(blocks):
                block()
        finally:
            jax.profiler.stop_trace()
        traces = sorted(Path(folder).glob("**/*.xplane.pb"))
        if not traces:
            raise RuntimeError("the profiler wrote no .xplane.pb")
        data = jax.profiler.ProfileData.from_serialized_xspace(traces[-1].read_bytes())
    events = []
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU:0"):
            continue
        for line in plane.lines:
            if line.name.startswith("Stream"):
                events += [(event.start_ns, event.start_ns + event.duration_ns, event.name) for event in line.events]
    if not events:
        seen = [(plane.name, [line.name for line in plane.lines][:6]) for plane in data.planes]
        raise RuntimeError(f"no kernel events on /device:GPU:0 stream lines; planes and lines seen: {seen}")
    seconds, method = per_call_from_kernels([(start, end) for start, end, _ in events], blocks=blocks, calls=calls)
    return seconds, method, sorted({name[:80] for _, _, name in events})[:4]


Kernel = tuple[float, float]  # start and end on the GPU's clock, ns


def per_call_from_kernels(kernels: list[Kernel], *, blocks: int, calls: int) -> tuple[float, str]:
    """Median over the blocks of (last kernel end − first kernel start) / calls, and how it was found.

    The blocks are told apart at the largest gaps between kernels: within a block the calls run
    back to back, between two blocks the GPU waits for the host to see the first block end and
    dispatch the next. Every block must then hold the same number of kernels, a whole number per
    call; if not, the whole trace's span counts, gaps between blocks included.
    """
    kernels = sorted(kernels)
    gaps = sorted(range(1, len(kernels)), key=lambda i: kernels[i][0] - kernels[i - 1][1], reverse=True)
    edges = [0, *sorted(gaps[: blocks - 1]), len(kernels)]
    groups = [kernels[first:last] for first, last in itertools.pairwise(edges)]
    per_call, rest = divmod(len(kernels), blocks * calls)
    if per_call == 0 or rest or len({len(group) for group in groups}) != 1:
        return (kernels[-1][1] - kernels[0][0]) / 1e9 / (blocks * calls), "trace span"
    spans = [(max(end for _, end in group) - group[0][0]) / 1e9 / calls for group in groups]
    return statistics.median(spans), f"block spans, {per_call} kernel(s) per call"
