"""Why the service's CPU (and end_to_end) timings differ from a peer tool's: one variant per fresh process.

Each variant times the same torch float32 point in its own fresh interpreter, and the driver
alternates variants point by point, so the host's drift hits them alike:

- ``peer``: ``torch.utils.benchmark.Timer(...).blocked_autorange`` (nobody here wrote it);
- ``peer-after-cuda``: the same, after CUDA was initialised and used in that process;
- ``service``: the service's own timing loop over the torch backend's block, as the worker runs it
  (in the recorded 2026-12-01 run, the block as it was then, which kept the previous product alive;
  since the fix it is the same as ``service-discard``);
- ``service-nocuda``: the same with no GPU visible (``CUDA_VISIBLE_DEVICES=``);
- ``service-discard``: the service's timing loop over a block that drops each product before the next
  call (the service's block keeps the previous product alive while the next one is allocated);
- ``service-200ms``: the service's loop with 200 ms timing blocks instead of 20 ms (the peer's blocks
  are longer than the service's: on a VM whose vCPUs are descheduled now and then, a longer block
  takes in more of those pauses, and the median of block means moves up);
- ``worker``: the real worker process (``python -m crossover_monitor.bench.worker``) timing CPU and GPU;
- ``peer-numpy``: the peer on operands in NumPy's memory (``torch.from_numpy``), as the service's are;
- ``service-clone``: ``service-discard`` on operands copied into torch's own memory first;
- ``worker-warm``: ``worker`` with 100 warm-up calls per point instead of 2 (is the short warm-up
  what leaves end_to_end a few percent slow after the CPU points?);
- ``worker-gpu``: ``worker`` timing the GPU alone, no CPU point before it (do the CPU points, or the
  idle GPU while they run, slow the GPU's end_to_end point after them?);

Each can run with one core kept busy by another process (``--busy-core``). Usage on a GPU machine:

    python3 benchmarks/cpu_gap.py --out results/cpu-gap.json
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

REPO = Path(__file__).resolve().parent.parent
VARIANTS = (
    "peer",
    "peer-after-cuda",
    "peer-numpy",
    "service",
    "service-nocuda",
    "service-discard",
    "service-clone",
    "worker",
    "worker-warm",
    "worker-gpu",
    "service-200ms",
)


def _peer(n: int, mode: str, where: str, threads: int, *, after_cuda: bool, numpy_memory: bool = False) -> float:
    import torch  # noqa: PLC0415
    from torch.utils import benchmark  # noqa: PLC0415

    if after_cuda:  # a CUDA context and some GPU work in this process first, as in the service's worker
        x = torch.rand(1024, 1024, device="cuda")
        for _ in range(20):
            x @ x
        torch.cuda.synchronize()
    if numpy_memory:
        from crossover_monitor.bench.common import host_operands  # noqa: PLC0415

        a, b = (torch.from_numpy(x) for x in host_operands(n))
    else:
        a, b = torch.rand(n, n), torch.rand(n, n)
    if where != "cpu":
        device = torch.device(where)
        if mode == "compute":
            a, b = a.to(device), b.to(device)
            stmt = "torch.matmul(a, b); torch.cuda.synchronize()"
        else:
            stmt = "torch.matmul(a.to(device), b.to(device)).cpu()"
        globals_ = {"a": a, "b": b, "torch": torch, "device": device}
    else:
        stmt = "torch.matmul(a, b)"
        globals_ = {"a": a, "b": b, "torch": torch}
    timer = benchmark.Timer(stmt=stmt, globals=globals_, num_threads=threads)
    return float(timer.blocked_autorange(min_run_time=1.0).median)


def _service(n: int, mode: str, where: str, threads: int, block_s: float = 0.02) -> float:
    from crossover_monitor.bench.contract import BackendOptions  # noqa: PLC0415
    from crossover_monitor.bench.timing import measure  # noqa: PLC0415
    from crossover_monitor.bench.torch_backend import TorchBackend  # noqa: PLC0415
    from crossover_monitor.settings import TimingSettings  # noqa: PLC0415

    backend = TorchBackend(BackendOptions(tf32=False, cpu_threads=threads))
    device = next(d for d in backend.discover() if d.device == where)
    run = backend.prepare(device, n, "float32", mode)  # type: ignore[arg-type]
    return measure(run, TimingSettings(block_s=block_s), time.perf_counter).median_s


def _service_discard(n: int, mode: str, where: str, threads: int, *, clone: bool = False) -> float:
    import torch  # noqa: PLC0415

    from crossover_monitor.bench.common import host_operands  # noqa: PLC0415
    from crossover_monitor.bench.timing import measure  # noqa: PLC0415
    from crossover_monitor.settings import TimingSettings  # noqa: PLC0415

    torch.set_num_threads(threads)
    device = torch.device(where)
    a_host, b_host = (torch.from_numpy(x) for x in host_operands(n))
    if clone:
        a_host, b_host = a_host.clone(), b_host.clone()
    if mode == "compute":
        a, b = a_host.to(device), b_host.to(device)

        def run(calls: int) -> None:
            for _ in range(calls):
                torch.matmul(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    else:

        def run(calls: int) -> None:
            for _ in range(calls):
                torch.matmul(a_host.to(device), b_host.to(device)).cpu()

    return measure(run, TimingSettings(), time.perf_counter).median_s


def _worker(n: int, mode: str, where: str, threads: int, warmup_calls: int | None = None, *, cpu: bool = True) -> float:
    plan = {
        "backend": "torch",
        "devices": ["cpu", where] if cpu else [where],
        "sizes": [n],
        "dtypes": ["float32"],
        "modes": [mode],
        "tf32": False,
        "cpu_threads": threads,
        "timing": {},
        "refine": {"enabled": False},
        "given_up": [],
    }
    from crossover_monitor.settings import TimingSettings  # noqa: PLC0415

    timing = TimingSettings() if warmup_calls is None else TimingSettings(warmup_calls=warmup_calls)
    plan["timing"] = timing.__dict__
    done = subprocess.run(
        [sys.executable, "-m", "crossover_monitor.bench.worker"],
        input=json.dumps(plan) + "\n",
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    for line in done.stdout.splitlines():
        message = json.loads(line)
        if message.get("type") == "measurement" and message["key"]["device"] == where and message["key"]["size"] == n:
            return float(message["timing"]["median_s"])
    raise RuntimeError(f"worker gave no {where} point: {done.stdout[-500:]} {done.stderr[-500:]}")


def one(variant: str, n: int, mode: str, where: str, threads: int) -> float:
    if variant in ("peer", "peer-after-cuda", "peer-numpy"):
        return _peer(
            n, mode, where, threads, after_cuda=variant == "peer-after-cuda", numpy_memory=variant == "peer-numpy"
        )
    if variant in ("service", "service-nocuda"):
        return _service(n, mode, where, threads)
    if variant in ("service-discard", "service-clone"):
        return _service_discard(n, mode, where, threads, clone=variant == "service-clone")
    if variant == "service-200ms":
        return _service(n, mode, where, threads, block_s=0.2)
    return _worker(
        n, mode, where, threads, warmup_calls=100 if variant == "worker-warm" else None, cpu=variant != "worker-gpu"
    )


def spawn(variant: str, n: int, mode: str, where: str, threads: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if variant == "service-nocuda":
        env["CUDA_VISIBLE_DEVICES"] = ""
    args = ["--one", variant, "--n", str(n), "--mode", mode, "--where", where, "--threads", str(threads)]
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False, cwd=REPO
    )
    if done.returncode != 0:
        print(f"  {variant} n={n} failed: {done.stderr[-400:]}", file=sys.stderr)
        return float("nan")
    return float(done.stdout.strip().splitlines()[-1])


def busy_core() -> subprocess.Popen[bytes]:
    """Another process spinning on core 0 (a data loader, say)."""
    return subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])


def run_matrix(
    *, sizes: list[int], variants: list[str], mode: str, where: str, threads: int, rounds: int, busy: bool
) -> list[dict[str, object]]:
    spinner = busy_core() if busy else None
    rows = []
    try:
        for n in sizes:
            times: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(rounds):
                for variant in variants:
                    times[variant].append(spawn(variant, n, mode, where, threads))
            row = {
                "n": n,
                "mode": mode,
                "where": where,
                "threads": threads,
                "busy_core": busy,
                **{v: statistics.median(t) for v, t in times.items()},
                "all": times,
            }
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "all"}), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", choices=VARIANTS)
    parser.add_argument("--n", type=int)
    parser.add_argument("--mode", default="compute")
    parser.add_argument("--where", default="cpu")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--phases", default="idle,busy,e2e")
    parser.add_argument("--variants", help="comma-separated variants for the idle phase (default: all)")
    parser.add_argument("--sizes", help="comma-separated sizes for the idle phase (default: 256,512,1024)")
    parser.add_argument("--e2e-variants", default="peer,service,service-discard,worker")
    parser.add_argument("--e2e-sizes", default="1024,2048")
    args = parser.parse_args()
    if args.one:
        print(one(args.one, args.n, args.mode, args.where, args.threads))
        return
    cores = len(os.sched_getaffinity(0))
    rows: list[dict[str, object]] = []
    phases = args.phases.split(",")
    cpu_sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else [256, 512, 1024]

    def save() -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"cores": cores, "rows": rows}, indent=1))

    if "idle" in phases:
        rows += run_matrix(
            sizes=cpu_sizes,
            variants=args.variants.split(",") if args.variants else list(VARIANTS),
            mode="compute",
            where="cpu",
            threads=args.threads,
            rounds=args.rounds,
            busy=False,
        )
        save()
    if "busy" in phases:
        for threads in (cores, cores - 1):
            rows += run_matrix(
                sizes=[64, 256, 1024],
                variants=["peer", "service-nocuda"],
                mode="compute",
                where="cpu",
                threads=threads,
                rounds=1,
                busy=True,
            )
        save()
    if "e2e" in phases:
        rows += run_matrix(
            sizes=[int(n) for n in args.e2e_sizes.split(",")],
            variants=args.e2e_variants.split(","),
            mode="end_to_end",
            where="cuda:0",
            threads=args.threads,
            rounds=args.rounds,
            busy=False,
        )
    save()


if __name__ == "__main__":
    main()
