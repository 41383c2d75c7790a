"""Which host-only reference moves with a GPU point's host side when other work slows the host (issue 32).

A GPU point at small n is the host's dispatch path: a co-tenant that slows the host's cores, caches
or memory slows it without any wait for a CPU. This script times candidate host references (a pure
Python loop, an allocator churn, a memory copy) interleaved with PyTorch points (GPU compute and
end_to_end, CPU compute) in a fresh process per phase, idle phases between the loaded ones, beside
each co-tenant shape: a multi-threaded BLAS GEMM at 1, 4 and 8 threads, a memory-bandwidth loop,
busy loops on half the cores, and a CPU quota on the measuring process (a stand-in for steal). It
prints, per phase, every figure's ratio to the median of the idle phases.

Usage on a GPU machine with torch: ``python3 benchmarks/host_probe.py --out results/x.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GPU_SIZES = (1, 64, 256, 512, 1024)
E2E_SIZES = (1, 256)
CPU_SIZES = (1, 64, 256)
BLOCK_S = 0.02


def _blocks(run: Any, sync: Any, blocks: int = 5) -> float:
    """Median per-call time over blocks of about BLOCK_S, as the service's timing loop takes them."""
    run()
    sync()
    calls, elapsed = 1, 0.0
    while elapsed < BLOCK_S:
        calls *= 2
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        elapsed = time.perf_counter() - start
    samples = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


# ``--large``: the end_to_end points whose pageable copies outgrow the caches, and a candidate reference part
# that copies past the last-level cache (issue 32: GPU end_to_end 2048 read 1.19-1.24x beside a 4-thread BLAS
# job while the reference, whose 2 MiB copy stays in the cache, read 1.11x).
LARGE_E2E_SIZES = (1024, 2048)
_LARGE_COPY = (bytearray(64 * 2**20), bytearray(64 * 2**20))


def _large_copy() -> float:
    """The median of three 64 MiB copies, in seconds."""
    source, target = _LARGE_COPY
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        target[:] = source
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def child(rounds: int, threads: int, *, large: bool = False) -> None:
    import torch  # noqa: PLC0415

    from crossover_monitor.measure.guard.hostprobe import part_readings, reading  # noqa: PLC0415

    torch.set_num_threads(threads)
    dev = torch.device("cuda:0")
    sync = torch.cuda.synchronize
    cases: dict[str, Any] = {}
    for n in GPU_SIZES:
        a, b = torch.rand(n, n, device=dev), torch.rand(n, n, device=dev)
        cases[f"gpu compute {n}"] = (lambda a=a, b=b: torch.matmul(a, b), sync)
    for n in E2E_SIZES + (LARGE_E2E_SIZES if large else ()):
        a, b = torch.rand(n, n), torch.rand(n, n)
        cases[f"gpu end_to_end {n}"] = (lambda a=a, b=b: torch.matmul(a.to(dev), b.to(dev)).cpu(), sync)
    for n in CPU_SIZES:
        a, b = torch.rand(n, n), torch.rand(n, n)
        cases[f"cpu compute {n}"] = (lambda a=a, b=b: torch.matmul(a, b), lambda: None)
    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, (run, sync_) in cases.items():
            parts = {**part_readings(), "reference": reading()} | ({"copy 64 MiB": _large_copy()} if large else {})
            for part, seconds in parts.items():
                out.setdefault(f"host {part}", []).append(seconds)
            out.setdefault(name, []).append(_blocks(run, sync_))
    print(json.dumps({k: statistics.median(v) for k, v in out.items()} | {"_samples": out}))


CO_TENANTS = {
    "blas1": "import torch; torch.set_num_threads(1); a=torch.rand(1024,1024)\nwhile True: a@a",
    "blas4": "import torch; torch.set_num_threads(4); a=torch.rand(2048,2048)\nwhile True: a@a",
    "blas8": "import torch; torch.set_num_threads(8); a=torch.rand(2048,2048)\nwhile True: a@a",
    "membw": "import torch; torch.set_num_threads(1); a=torch.empty(2**26); b=torch.empty(2**26)\nwhile True: b.copy_(a)",
    "spin": "while True: pass",
}


@contextlib.contextmanager
def co_tenant(shape: str) -> Iterator[None]:
    if shape == "spin8":
        codes = [CO_TENANTS["spin"]] * max(1, (os.cpu_count() or 2) // 2)
    elif shape == "membw2":
        codes = [CO_TENANTS["membw"]] * 2
    elif shape in CO_TENANTS:
        codes = [CO_TENANTS[shape]]
    else:
        codes = []
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for code in codes]
    time.sleep(2.0 if procs else 0.0)
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def run_child(args: argparse.Namespace, *, quota: float | None) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", "--rounds", str(args.rounds), "--threads", str(args.threads)]
    command += ["--large"] if args.large else []
    if quota is None:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    else:
        group = Path("/sys/fs/cgroup/hostprobe-quota")
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{int(quota * 100000)} 100000\n")
        wrapped = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *command]
        done = subprocess.run(wrapped, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    parser.add_argument("--phases", default="idle,blas1,idle,blas4,idle,blas8,idle,membw2,idle,spin8,idle,quota,idle")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--large", action="store_true", help="also GPU end_to_end 1024/2048 and a 64 MiB copy part")
    args = parser.parse_args()
    if args.child:
        child(args.rounds, args.threads, large=args.large)
        return
    phases: list[tuple[str, dict[str, Any]]] = []
    for shape in args.phases.split(","):
        try:
            if shape == "quota":
                with co_tenant(shape):
                    phases.append((shape, run_child(args, quota=0.9)))
            else:
                with co_tenant(shape):
                    phases.append((shape, run_child(args, quota=None)))
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"{shape}: {exc}", file=sys.stderr)
            continue
        if args.out:
            args.out.write_text(json.dumps({"machine": os.uname().nodename, "phases": phases}, indent=1))
    idle = [p for shape, p in phases if shape == "idle"]
    names = [k for k in idle[0] if not k.startswith("_")] if idle else []
    base = {k: statistics.median(p[k] for p in idle) for k in names}
    spread = {k: (min(p[k] for p in idle) / base[k], max(p[k] for p in idle) / base[k]) for k in names}
    print("figure".ljust(22) + " idle range   " + "  ".join(f"{s:>7}" for s, _ in phases))
    for k in names:
        row = "  ".join(f"{p[k] / base[k]:7.2f}" for _, p in phases)
        print(f"{k:22} {spread[k][0]:.2f}-{spread[k][1]:.2f}    {row}")


if __name__ == "__main__":
    main()
