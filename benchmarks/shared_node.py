"""The service on a shared GPU node (issue 8): idle, one core busy, one GPU busy, against a peer tool.

Everything the service publishes is compared with ``torch.utils.benchmark.Timer.blocked_autorange``
(nobody here wrote it) run in its own process with the same thread count:

1. idle: ``--sweeps`` service sweeps (the path ``crossover-monitor once`` takes), each between two
   runs of the peer (the reference is their geometric mean), so the host's drift hits both alike: CPU n >= 256 within 5%, GPU compute n >= 1024 within
   2%, GPU end_to_end n >= 1024 within 5%, crossovers inside the peer's bracket;
2. one core kept busy by another process: every CPU point within 10% of idle, or withheld;
3. one GPU kept busy by another process (a bf16 GEMM loop): that GPU withheld, the other measured
   within the idle targets, and the busy process's own throughput while the sweep runs;
4. the same job starting on a GPU mid-sweep: that GPU withheld from then on, and what the job lost;
4b. ``crowded``: busy loops in their own sessions on half the cores (the GPU's points stand, their
   timing thread's wait for a CPU near 0), then on twice the cores (the GPU withheld as cpu_contended);
4c. ``crossings``: service sweeps and peer processes alternated ``--sweeps`` times over the sizes
   around both crossovers: how far each one's n* moves from process to process;
5. ``alternate``: service and peer alternated size by size, each point in fresh processes (a one-size
   sweep, then the peer), ``--rounds`` times: on VMs whose fresh processes differ by up to 1.5x, the
   median over several processes per side is what a 5% comparison needs;
6. ``cotenants`` (issue 32): each co-tenant shape of ``--shapes`` (a multi-threaded BLAS GEMM at 1, 4
   and 8 threads, two memory-bandwidth loops, busy loops on half the cores, one busy core, a CPU quota
   on the worker as a stand-in for steal) between idle sweeps of the same hour; every published
   point (CPU and GPU, every size, the fixed-cost points too) of a loaded sweep against the range of
   all idle sweeps for that point widened by 10%, or withheld with its cause. Sweeps get the host
   reference's idle baseline from the sweeps before them, as the service's do.

Usage on a GPU machine with torch: ``python3 benchmarks/shared_node.py --out results/x.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from crossover_monitor.analysis.crossover import find_crossover  # noqa: E402
from crossover_monitor.config.settings import BenchmarkSettings, GuardSettings, RefineSettings  # noqa: E402
from crossover_monitor.measure.guard.hostinfo import default_cpu_threads  # noqa: E402
from crossover_monitor.model import MODES  # noqa: E402
from crossover_monitor.protocol import Plan  # noqa: E402
from crossover_monitor.service.state import StateStore  # noqa: E402
from crossover_monitor.service.sweep import run_sweep  # noqa: E402
from crossover_monitor.view.report import render_json  # noqa: E402

# 96 and 160 beside 128: on the H200 the compute crossover sits near 128, where one noisy size decides
# the peer's bracket.
SIZES = (64, 96, 128, 160, 256, 512, 1024, 2048)
ALTERNATE_SIZES = (256, 512, 1024, 2048)
TARGETS = {"cpu": (256, 0.05), "gpu compute": (1024, 0.02), "gpu end_to_end": (1024, 0.05)}


def peer(sizes: list[int], threads: int, gpu: str, *, e2e_first: bool = False) -> dict[str, dict[int, float]]:
    """The peer tool's medians: {'cpu compute'|'cpu end_to_end'|'gpu compute'|'gpu end_to_end': {n: s}}.

    ``e2e_first`` times the GPU's end_to_end case before its compute case, as the service's worker
    does (its GPU end_to_end point follows the CPU's, with the GPU idle), not right after GPU compute.
    """
    import torch  # noqa: PLC0415
    from torch.utils import benchmark  # noqa: PLC0415

    device = torch.device(gpu)
    found: dict[str, dict[int, float]] = {}
    for n in sizes:
        a, b = torch.rand(n, n), torch.rand(n, n)
        cases: dict[str, tuple[str, dict[str, Any]]] = {  # name -> (statement, its globals)
            "cpu compute": ("torch.matmul(a, b)", {"a": a, "b": b}),
            "cpu end_to_end": ("torch.matmul(a, b)", {"a": a, "b": b}),
        }
        if torch.cuda.is_available():  # the CPU side alone on a machine without a GPU
            ga, gb = a.to(device), b.to(device)
            gpu_cases: dict[str, tuple[str, dict[str, Any]]] = {
                "gpu compute": ("torch.matmul(ga, gb)", {"ga": ga, "gb": gb}),
                "gpu end_to_end": ("torch.matmul(a.to(d), b.to(d)).cpu()", {"a": a, "b": b, "d": device}),
            }
            for name in sorted(gpu_cases, reverse=e2e_first):
                cases[name] = gpu_cases[name]
        for name, (stmt, globals_) in cases.items():
            timer = benchmark.Timer(stmt=stmt, globals={**globals_, "torch": torch}, num_threads=threads)
            # Warm-up, as the service's worker has: a process timing one size only read the GPU ~15 us
            # per call slower at n = 1024 (clocks still ramping), which made the alternate phase's GPU
            # compute ratios 0.56-0.79 while every idle sweep read 1.00.
            timer.blocked_autorange(min_run_time=0.2)
            found.setdefault(name, {})[n] = float(timer.blocked_autorange(min_run_time=0.4).median)
    return found


def run_peer(
    threads: int, gpu: str, sizes: tuple[int, ...] = SIZES, *, e2e_first: bool = False
) -> dict[str, dict[int, float]]:
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--peer",
            "--threads",
            str(threads),
            "--gpu",
            gpu,
            "--sizes",
            ",".join(map(str, sizes)),
            *(["--peer-e2e-first"] if e2e_first else []),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    raw = json.loads(done.stdout.strip().splitlines()[-1])
    return {k: {int(n): t for n, t in v.items()} for k, v in raw.items()}


CPU_NAMES = {"torch": "cpu", "jax": "cpu:0", "tensorflow": "/CPU:0"}  # the CPU device's name in each backend
# What the service keeps between its sweeps (the host reference's figure, each point's calm range), kept here
# by the service's own store.
STORE = StateStore()


def sweep(
    args: argparse.Namespace,
    devices: tuple[str, ...] | None = None,
    sizes: tuple[int, ...] = SIZES,
    *,
    refine: bool = True,
    guarded: bool = True,
) -> dict[str, Any]:
    bench = BenchmarkSettings(
        backend=args.backend,  # the peer is torch's whatever the service's backend is
        devices=devices or (tuple(args.devices.split(",")) if args.devices else None),
        sizes=sizes,
        modes=MODES,
        cpu_threads=args.threads,
        refine=RefineSettings(enabled=refine, budget_s=20),
    )
    started, started_at = time.monotonic(), time.time()
    kept = STORE.read()
    plan = Plan(
        bench=bench,
        guard=GuardSettings(enabled=guarded),
        host_baseline=kept.host_baseline,
        range_tops=kept.range_tops,
        usual_others=kept.usual_others,
    )
    outcome = run_sweep(plan, timeout_s=300, cancel=threading.Event())
    STORE.record(outcome)
    snapshot = outcome.snapshot
    result: dict[str, Any] = {
        "result": outcome.result.value,
        "reason": outcome.reason,
        "s": time.monotonic() - started,
        "started_at": started_at,  # unix time: to set beside dispatch_timeline.py's readings
    }
    # The whole sweep as `once --json` prints it, so that replay.py can draw it (PATH.json:SHAPE).
    result["once"] = json.loads(render_json(outcome))
    if snapshot is None:
        return result
    kinds = {d.device: d.kind for d in snapshot.devices}
    curves: dict[str, dict[str, dict[int, float]]] = {}
    for m in snapshot.measurements:
        if m.role == "sweep":
            name = f"{kinds[m.key.device]} {m.key.mode}"
            curves.setdefault(m.key.device, {}).setdefault(name, {})[m.key.size] = m.timing.median_s
    result["curves"] = curves
    # Every point published (fixed-cost and refined sizes too), by "kind mode n".
    result["published"] = {
        f"{kinds[m.key.device]} {m.key.mode} {m.key.size}": m.timing.median_s for m in snapshot.measurements
    }
    result["crossovers"] = [
        {"gpu": c.gpu, "mode": c.mode, "state": c.state.value, "size": c.size} for c in snapshot.crossovers
    ]
    result["withheld"] = [
        {"device": w.device, "reason": w.reason.value, "detail": w.detail}
        | ({} if w.point is None else {"point": f"{kinds[w.device]} {w.point.mode} {w.point.size}"})
        for w in snapshot.withheld
    ]
    result["hardware"] = [{k: v for k, v in vars(h).items() if v not in (None, ())} for h in snapshot.hardware]
    result["environment"] = dict(snapshot.environment)
    return result


def bracket(reference: dict[str, dict[int, float]], mode: str) -> tuple[str, float | None, int | None, int | None]:
    """The peer's own crossover: state, n* interpolated as the service does, and its bracket ("no_gpu" where the
    machine has none: the idle phase still times the service beside the peer's CPU points)."""
    if f"gpu {mode}" not in reference:
        return "no_gpu", None, None, None
    cpu, gpu = reference[f"cpu {mode}"], reference[f"gpu {mode}"]
    state, size, lower, upper = find_crossover([(n, cpu[n], gpu[n]) for n in sorted(cpu)])
    return state.value, None if size is None else round(size, 1), lower, upper


def ratios(service: dict[str, Any], reference: dict[str, dict[int, float]], gpu: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for device, curves in service.get("curves", {}).items():
        for name, points in curves.items():
            if _index(device) not in ("cpu", _index(gpu)):
                continue
            out[name] = {n: t / reference[name][n] for n, t in points.items() if n in reference.get(name, {})}
    return out


def host_waits(service: dict[str, Any]) -> dict[str, float]:
    """Each GPU's timing thread's wait for a CPU, the most over its points, from a sweep's hardware records."""
    return {h["device"]: h["host_wait_ratio"] for h in service.get("hardware", []) if "host_wait_ratio" in h}


def cpu_curve(service: dict[str, Any], name: str) -> dict[int, float]:
    """The CPU's points of curve ``name`` ('cpu compute', 'cpu end_to_end'), whatever the backend calls the CPU."""
    curves = service.get("curves", {})
    return next((points.get(name, {}) for device, points in curves.items() if _index(device) == "cpu"), {})


def _index(device: str) -> str:
    """'cpu' for a CPU, else the GPU's index: 'cuda:1' (torch) and 'gpu:1' or 'cuda:1' (JAX) are both '1'."""
    return "cpu" if device.lower() in ("cpu", "cpu:0") else device.rsplit(":", 1)[-1]


def gemm_loop(gpu: str, seconds: float, report: Path) -> subprocess.Popen[bytes]:
    """Another program: a bf16 GEMM loop on ``gpu`` writing its iterations per second, one line a second."""
    code = f"""
import time, torch
x = torch.randn(8192, 8192, device={gpu!r}, dtype=torch.bfloat16)
end = time.time() + {seconds}
out = open({str(report)!r}, 'w', buffering=1)
while time.time() < end:
    t, n = time.time(), 0
    while time.time() - t < 1.0:
        x @ x; n += 1
        if n % 20 == 0: torch.cuda.synchronize()
    torch.cuda.synchronize()
    out.write(f"{{time.time():.3f}} {{n / (time.time() - t):.2f}}\\n")
"""
    return subprocess.Popen([sys.executable, "-c", code])


def busy_core() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"])


def job_rates(report: Path) -> list[tuple[float, float]]:
    """(unix time, GEMMs per second) lines the job wrote."""
    return [(t, r) for t, r in (map(float, line.split()) for line in report.read_text().splitlines() if line.strip())]


def rates_around(
    lines: list[tuple[float, float]], started: float, ended: float
) -> tuple[list[float], list[float], float | None]:
    """The job's rates before a sweep that ran from ``started`` to ``ended``, during it, and what it lost meanwhile."""
    alone = [r for t, r in lines if t < started - 1]
    during = [r for t, r in lines if started + 1 < t < ended]
    loss = 1 - statistics.median(during) / statistics.median(alone) if alone and during else None
    return alone, during, loss


def idle_phase(args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None]) -> None:
    if args.no_peer:  # sweeps only: the service's own figures (ranges, usual load) take many, the peer doubles them
        for index in range(args.sweeps):
            results["idle"].append({"service": sweep(args)})
            save()
            service = results["idle"][-1]["service"]
            print(f"idle sweep {index}: {service['result']} {service['s']:.0f}s withheld {service.get('withheld')}")
        return
    reference_before = run_peer(args.threads, args.gpu)
    for index in range(args.sweeps):
        service = sweep(args)
        reference_after = run_peer(args.threads, args.gpu)
        reference = {
            name: {n: (t * reference_after[name][n]) ** 0.5 for n, t in points.items()}
            for name, points in reference_before.items()
        }
        reference_before = reference_after
        row: dict[str, Any] = {
            "service": service,
            "peer": reference,
            "ratios": ratios(service, reference, args.gpu),
            "peer_brackets": {mode: bracket(reference, mode) for mode in MODES},
        }
        results["idle"].append(row)
        save()
        print(f"idle sweep {index}: {service['result']} {service['s']:.0f}s crossovers {service.get('crossovers')}")
        print(f"  peer brackets {row['peer_brackets']} withheld {service.get('withheld')}")
        print(f"  GPU host wait (most over its points) {host_waits(service)}")
        for name, r in row["ratios"].items():
            print(f"  {name}: " + " ".join(f"{n}:{v:.3f}" for n, v in sorted(r.items())))


def core_phase(args: argparse.Namespace, results: dict[str, Any]) -> None:
    idle_cpu: dict[int, list[float]] = {}
    for row in results["idle"]:
        for n, t in cpu_curve(row["service"], "cpu compute").items():
            idle_cpu.setdefault(n, []).append(t)
    spinner = busy_core()
    try:
        time.sleep(1)
        service = sweep(args, devices=(CPU_NAMES[args.backend],))
    finally:
        spinner.kill()
    cpu = cpu_curve(service, "cpu compute")
    versus = {n: t / statistics.median(idle_cpu[n]) for n, t in cpu.items() if n in idle_cpu}
    results["busy_core"] = {"service": service, "versus_idle": versus}
    print(f"busy core: {service['result']} withheld {service.get('withheld')} vs idle {versus}")


CROSSING_SIZES = (64, 96, 128, 160, 192, 256, 384, 512, 768, 1024)


def crossings_phase(args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None]) -> None:
    """Service sweeps and peer processes alternated: how far each one's own crossovers move between processes."""
    rows: list[dict[str, Any]] = []
    results["crossings"] = rows
    for index in range(args.sweeps):
        service = sweep(args, sizes=CROSSING_SIZES)
        reference = run_peer(args.threads, args.gpu, CROSSING_SIZES)
        found = {
            "service": {c["mode"]: (c["state"], c["size"]) for c in service.get("crossovers", [])},
            "peer": {mode: bracket(reference, mode) for mode in MODES},
            "service_result": service["result"],
            "withheld": service.get("withheld"),
        }
        rows.append(found)
        save()
        print(f"crossings {index}: service {found['service']} peer {found['peer']}")


def spinners(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` busy loops, each in its own session, free to run on any core: a node's data loaders."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(count)]


def sweep_beside(
    args: argparse.Namespace, busy: list[subprocess.Popen[bytes]], *, settle_s: float, guarded: bool = True
) -> dict[str, Any]:
    """A sweep while ``busy`` run (given ``settle_s`` to get going), which are killed after it."""
    try:
        time.sleep(settle_s)
        return sweep(args, guarded=guarded)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()


def crowded_phase(args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None]) -> None:
    """Other processes on half the cores (the GPU should stand), then on twice the cores (withheld)."""
    cores = len(os.sched_getaffinity(0))
    idle_peer = results["idle"][-1]["peer"] if results["idle"] else None
    results["crowded"] = []
    for count in (cores // 2, 2 * cores):
        service = sweep_beside(args, spinners(count), settle_s=1)
        row: dict[str, Any] = {"spinners": count, "cores": cores, "service": service}
        if idle_peer is not None:
            row["ratios_to_idle_peer"] = ratios(service, idle_peer, args.gpu)
        results["crowded"].append(row)
        save()
        print(f"{count} spinners on {cores} cores: {service['result']} withheld {service.get('withheld')}")
        print(f"  GPU host wait (most over its points) {host_waits(service)} crossovers {service.get('crossovers')}")
        for name, r in row.get("ratios_to_idle_peer", {}).items():
            print(f"  {name}: " + " ".join(f"{n}:{v:.3f}" for n, v in sorted(r.items())))


def gpu_phase(args: argparse.Namespace, results: dict[str, Any], scratch: Path) -> None:
    import torch  # noqa: PLC0415

    if torch.cuda.device_count() < 2:
        print("busy GPU phase skipped: needs two GPUs")
        return
    report = scratch / "gemm.txt"
    job = gemm_loop("cuda:1", 60.0, report)
    try:
        time.sleep(12)  # the job warms up; its rate before the sweep
        before_sweep = time.time()
        service = sweep(args)
        after_sweep = time.time()
        time.sleep(6)
    finally:
        job.kill()
    lines = job_rates(report)
    alone, during, loss = rates_around(lines, before_sweep, after_sweep)
    results["busy_gpu"] = {
        "service": service,
        "job_rate_alone": alone,
        "job_rate_during_sweep": during,
        "job_rate_after": [r for t, r in lines if t > after_sweep + 1],
        "job_throughput_loss": loss,
        "ratios_cuda0": ratios(service, results["idle"][-1]["peer"], "cuda:0") if results["idle"] else {},
    }
    print(f"busy gpu: {service['result']} withheld {service.get('withheld')} crossovers {service.get('crossovers')}")
    print(f"  job GEMM/s alone {alone} during {during} -> loss {loss}")
    for name, r in results["busy_gpu"]["ratios_cuda0"].items():
        print(f"  cuda:0 {name}: " + " ".join(f"{n}:{v:.3f}" for n, v in sorted(r.items())))


def late_phase(args: argparse.Namespace, results: dict[str, Any], scratch: Path) -> None:
    report = scratch / "gemm-late.txt"
    jobs: list[subprocess.Popen[bytes]] = []
    starter = threading.Timer(8.0, lambda: jobs.append(gemm_loop("cuda:0", 40.0, report)))
    started = time.time()
    starter.start()
    try:
        service = sweep(args)
        ended = time.time()
        starter.join()
        time.sleep(8)
    finally:
        starter.cancel()  # cut off before it fired: no job starts after the run was told to stop
        for job in jobs:
            job.kill()
    lines = job_rates(report)
    during = [r for t, r in lines if t < ended]
    after = [r for t, r in lines if t > ended + 1]
    loss = 1 - statistics.median(during) / statistics.median(after) if during and after else None
    results["late_job"] = {
        "service": service,
        "job_started_after_s": 8.0,
        "sweep_s": ended - started,
        "job_rate_during_sweep": during,
        "job_rate_after": after,
        "job_throughput_loss": loss,
    }
    print(f"late job: {service['result']} withheld {service.get('withheld')}")
    print(f"  job GEMM/s during sweep {during} after {after} -> loss {loss}")


CO_TENANTS = {  # programs that share the node: (code, processes)
    "blas1": ("import torch; torch.set_num_threads(1); a = torch.rand(1024, 1024)\nwhile True: a @ a", 1),
    "blas4": ("import torch; torch.set_num_threads(4); a = torch.rand(2048, 2048)\nwhile True: a @ a", 1),
    "blas8": ("import torch; torch.set_num_threads(8); a = torch.rand(2048, 2048)\nwhile True: a @ a", 1),
    # Two streams of 512 MiB copies: memory bandwidth and the last-level cache, little CPU.
    "membw": (
        "import torch; torch.set_num_threads(1); a, b = torch.empty(2**27), torch.empty(2**27)\nwhile True: b.copy_(a)",
        2,
    ),
    "spin8": ("while True: pass", 0),  # 0: half the cores
    "core1": ("import os; os.sched_setaffinity(0, {0})\nwhile True: pass", 1),
}
QUOTA_GROUP = Path("/sys/fs/cgroup/crossover-monitor-quota")
CGROUP_CPU_MAX_LEAST_US = 1000  # cpu.max refuses a quota or a period below this


class _Quota:
    """This process (and so the worker it spawns) under a cgroup v2 CPU quota of ``cores`` per period of
    ``period_ms``: time taken from the worker's threads that no other process of the guest uses (a stand-in
    for steal). Below one core with a short period it slows even a lone thread (the GPU's dispatch) in
    slices of a few milliseconds, as a hypervisor that takes a vCPU does."""

    def __init__(self, shape: str) -> None:  # "quota<cores>[@<period ms>]", e.g. quota8, quota0.7@10
        cores, _, period_ms = shape.removeprefix("quota").partition("@")
        self.period_us = int(float(period_ms or 100) * 1000)
        self.quota_us = int(float(cores or 8) * self.period_us)
        if min(self.period_us, self.quota_us) < CGROUP_CPU_MAX_LEAST_US:
            sys.exit(
                f"{shape}: cgroup v2 takes a quota and a period of at least 1 ms each (got {self.quota_us} us per {self.period_us} us)"
            )

    def __enter__(self) -> None:
        QUOTA_GROUP.mkdir(exist_ok=True)
        (QUOTA_GROUP / "cpu.max").write_text(f"{self.quota_us} {self.period_us}\n")
        (QUOTA_GROUP / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def __exit__(self, *exc: object) -> None:
        Path("/sys/fs/cgroup/cgroup.procs").write_text(f"{os.getpid()}\n")


def co_tenant(shape: str) -> list[subprocess.Popen[bytes]]:
    code, count = CO_TENANTS[shape]
    count = count or len(os.sched_getaffinity(0)) // 2
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(count)]


def cotenant_phase(args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None]) -> None:
    """Each co-tenant shape between idle sweeps; every published point against the idle range."""
    rows: list[dict[str, Any]] = []
    results["cotenants"] = rows
    shapes = args.shapes.split(",")
    for shape in [*shapes, "idle"]:
        rows.append({"shape": "idle", "service": sweep(args)})
        save()
        print(f"idle: {rows[-1]['service']['result']} withheld {rows[-1]['service'].get('withheld')}")
        if shape == "idle":
            break
        # "<shape>-unguarded": the same co-tenant with the guard off, to see what the guard withheld beside it.
        base, guarded = shape.removesuffix("-unguarded"), not shape.endswith("-unguarded")
        if base.startswith("quota"):
            with _Quota(base):
                service = sweep(args, guarded=guarded)
        else:  # the co-tenant at full speed first
            service = sweep_beside(args, co_tenant(base), settle_s=2, guarded=guarded)
        rows.append({"shape": shape, "service": service})
        save()
    results["cotenant_report"] = cotenant_report(
        rows + [{"shape": "idle", "service": r["service"]} for r in results["idle"]]
    )
    print_cotenant_report(results["cotenant_report"])


def cotenant_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each loaded sweep's published points against the idle sweeps' range for that point, widened by 10%."""
    idle = [r["service"] for r in rows if r["shape"] == "idle"]
    by_point: dict[str, list[float]] = {}
    for service in idle:
        for point, seconds in service.get("published", {}).items():
            by_point.setdefault(point, []).append(seconds)
    ranges = {p: (min(t) / 1.1, max(t) * 1.1, statistics.median(t)) for p, t in by_point.items() if len(t) >= 2}
    report: dict[str, Any] = {
        "idle_sweeps": len(idle),
        "idle_with_anything_withheld": sum(1 for s in idle if s.get("withheld")),
        "idle_with_a_device_withheld": sum(1 for s in idle if any("point" not in w for w in s.get("withheld", []))),
        # Points withheld alone (issue 32): how many per idle sweep, and which.
        "idle_points_withheld": [[w["point"] for w in s.get("withheld", []) if "point" in w] for s in idle],
        # What the host did in each sweep, in order: a host that slows itself (steal) shows here, not as a shape.
        "host": [{"shape": r["shape"], **host_readings(r["service"])} for r in rows],
        "shapes": [],
    }
    for row in rows:
        if row["shape"] == "idle":
            continue
        service = row["service"]
        points = {}
        for point, seconds in service.get("published", {}).items():
            if point in ranges:
                low, high, median = ranges[point]
                points[point] = {"ratio": seconds / median, "inside": low <= seconds <= high}
        report["shapes"].append(
            {
                "shape": row["shape"],
                "result": service["result"],
                "withheld": service.get("withheld", []),
                "outside": {p: round(v["ratio"], 3) for p, v in points.items() if not v["inside"]},
                "published": len(points),
                "ratios": {p: round(v["ratio"], 3) for p, v in points.items()},
                "crossovers": service.get("crossovers"),
                "hardware": service.get("hardware"),
            }
        )
    return report


def host_readings(service: dict[str, Any]) -> dict[str, float | None]:
    """A sweep's host reference (its median, ms) and, where its CPU was timed, the other work and steal on the
    host's cores meanwhile (the CPU's hardware context; none where the CPU was withheld whole)."""
    reference = service.get("environment", {}).get("host_reference_s")
    hardware = service.get("hardware") or []
    cpu: dict[str, Any] = next((h for h in hardware if "cpu" in str(h.get("device", "")).lower()), {})
    return {
        "reference_ms": round(float(reference) * 1e3, 3) if reference else None,
        "other_cores": cpu.get("other_cpu_cores"),
        "steal_cores": cpu.get("cpu_steal_cores"),
    }


def print_cotenant_report(report: dict[str, Any]) -> None:
    print(
        f"idle sweeps: {report['idle_sweeps']}, with anything withheld: {report['idle_with_anything_withheld']}, "
        f"with a device withheld: {report.get('idle_with_a_device_withheld')}"
    )
    for points in report.get("idle_points_withheld", []):
        print(f"  idle sweep's points withheld alone: {points or 'none'}")
    for sweep_ in report.get("host", []):
        cores = [
            f"{sweep_[k]:.2f} {k.removesuffix('_cores')}"
            for k in ("other_cores", "steal_cores")
            if sweep_[k] is not None
        ]
        print(f"  host in the {sweep_['shape']} sweep: reference {sweep_['reference_ms']} ms {', '.join(cores)}")
    for shape in report["shapes"]:
        withheld = (
            "; ".join(f"{w.get('point', w['device'])} {w['reason']}: {w['detail']}" for w in shape["withheld"])
            or "nothing"
        )
        print(f"{shape['shape']}: {shape['result']}, {shape['published']} points published, withheld {withheld}")
        print(f"  outside the idle range +-10%: {shape['outside'] or 'none'}")


def alternate_phase(args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None]) -> None:
    """Service and peer alternated size by size, each in fresh processes, ``--rounds`` times."""
    sizes = [int(n) for n in args.alternate_sizes.split(",")]
    rows: dict[str, dict[int, dict[str, list[float]]]] = {}
    results["alternate"] = {"rounds": args.rounds, "times": rows}
    for n in sizes:
        for round_ in range(args.rounds):
            sides = [
                ("service", sweep(args, sizes=(n,), refine=False).get("curves", {})),
                ("peer", {args.gpu: run_peer(args.threads, args.gpu, (n,))}),
            ]
            if args.peer_e2e_first:  # the peer once more, its GPU end_to_end case before its compute case
                sides.append(("peer-e2e-first", {args.gpu: run_peer(args.threads, args.gpu, (n,), e2e_first=True)}))
            if args.peer_again:  # the same peer in another fresh process: how far the peer is from itself
                sides.append(("peer-again", {args.gpu: run_peer(args.threads, args.gpu, (n,))}))
            for side, by_device in sides:
                for device, curves in by_device.items():
                    for name, points in curves.items():
                        if _index(device) in ("cpu", _index(args.gpu)) and n in points:
                            row = rows.setdefault(name, {}).setdefault(n, {})
                            row.setdefault(side, []).append(points[n])
            gpu_e2e = rows.get("gpu end_to_end", {}).get(n, {})
            print(
                f"alternate n={n} round {round_}: gpu end_to_end " + json.dumps({k: v[-1] for k, v in gpu_e2e.items()})
            )
            save()
    summary = {
        name: {
            n: {
                side: statistics.median(times) / statistics.median(by_side["peer"])
                for side, times in by_side.items()
                if side != "peer" and times and by_side.get("peer")
            }
            for n, by_side in by_size.items()
        }
        for name, by_size in rows.items()
    }
    results["alternate"]["median_ratios"] = summary
    for name, by_size in summary.items():
        print(
            f"alternate {name}: " + json.dumps({n: {k: round(v, 3) for k, v in r.items()} for n, r in by_size.items()})
        )


def spread(path: Path) -> None:
    """Per round and as medians: each side of a recorded alternate phase against the peer (peer-again: itself)."""
    rows = json.loads(path.read_text())["alternate"]["times"]
    for name, by_size in rows.items():
        for n, by_side in sorted(by_size.items(), key=lambda item: int(item[0])):
            peer_times = by_side.get("peer", [])
            for side, times in by_side.items():
                if side == "peer" or not times or not peer_times:
                    continue
                rounds = " ".join(f"{t / p:.2f}" for t, p in zip(times, peer_times, strict=False))
                median = statistics.median(times) / statistics.median(peer_times)
                print(f"{name} n={n} {side}/peer: median {median:.3f}, rounds {rounds}")


def _exit_once(signum: int, _frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", action="store_true")
    parser.add_argument("--threads", type=int, default=default_cpu_threads())
    parser.add_argument("--gpu", default="cuda:0")
    parser.add_argument("--sweeps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=False)
    parser.add_argument("--phases", default="idle,core,crowded,gpu,late")
    parser.add_argument("--backend", default="torch", choices=sorted(CPU_NAMES), help="the service's backend")
    parser.add_argument("--rounds", type=int, default=5, help="processes per side and size in the alternate phase")
    parser.add_argument("--sizes", help="sizes for --peer (default: every size of the idle sweeps)")
    parser.add_argument("--alternate-sizes", default=",".join(map(str, ALTERNATE_SIZES)))
    parser.add_argument(
        "--peer-e2e-first", action="store_true", help="the peer times GPU end_to_end before GPU compute"
    )
    parser.add_argument(
        "--peer-again", action="store_true", help="alternate: the peer a second time, in its own process"
    )
    parser.add_argument(
        "--shapes",
        default="blas1,blas4,blas8,membw,spin8,core1,quota8",
        help="cotenants: the co-tenant shapes (quotaN[@MS]: the worker under a quota of N cores per MS ms, 100 "
        "by default; a -unguarded suffix "
        "sweeps beside that shape with the guard off, to show what it withheld)",
    )
    parser.add_argument("--devices", help="the service's devices, comma-separated (default: every device)")
    parser.add_argument("--no-peer", action="store_true", help="idle: the service's sweeps without the peer's")
    parser.add_argument(
        "--usual-load",
        type=int,
        default=0,
        help="busy loops (free to run on any core) kept running through every phase: a node whose data loaders "
        "always use that many cores, the service's usual load (its idle sweeps are then sweeps beside them)",
    )
    parser.add_argument("--report", type=Path, help="print a recorded cotenants phase's report, and stop")
    parser.add_argument("--spread", type=Path, help="print a recorded alternate phase's ratios per round, and stop")
    args = parser.parse_args()
    # Killed by `timeout` (SIGTERM) mid-phase, unwind as on an error: the co-tenants, each in a session of its own,
    # are killed by the phases' `finally` (a run cut off on an H100, 2026-12-07, left its BLAS-4 job running
    # under the next run's idle sweeps). Once: `timeout` signals the child and then its group, and a second
    # SystemExit inside that cleanup would cut it short.
    signal.signal(signal.SIGTERM, _exit_once)
    if args.spread:
        spread(args.spread)
        return
    if args.report:
        recorded = json.loads(args.report.read_text())
        rows = recorded["cotenants"] + [{"shape": "idle", "service": r["service"]} for r in recorded["idle"]]
        print_cotenant_report(cotenant_report(rows))
        return
    if args.peer:
        sizes = [int(n) for n in args.sizes.split(",")] if args.sizes else list(SIZES)
        print(json.dumps(peer(sizes, args.threads, args.gpu, e2e_first=args.peer_e2e_first)))
        return
    results: dict[str, Any] = {
        "backend": args.backend,
        "threads": args.threads,
        "cores": len(os.sched_getaffinity(0)),
        "usual_load": args.usual_load,
        "idle": [],
    }
    phases = args.phases.split(",")
    if args.no_peer and {"crowded", "gpu"} & set(phases):
        sys.exit("--no-peer: the crowded and gpu phases compare against the idle sweeps' peer; leave it out for them")

    def save() -> None:  # after every phase: a run cut off at its limit keeps what it measured
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1, default=str))

    usual = spinners(args.usual_load)
    try:
        run_phases(args, results, save, phases)
    finally:
        for process in usual:
            process.kill()
        for process in usual:
            process.wait()


def run_phases(args: argparse.Namespace, results: dict[str, Any], save: Callable[[], None], phases: list[str]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        for name, phase in (
            ("idle", lambda: idle_phase(args, results, save)),
            ("core", lambda: core_phase(args, results)),
            ("crowded", lambda: crowded_phase(args, results, save)),
            ("crossings", lambda: crossings_phase(args, results, save)),
            ("gpu", lambda: gpu_phase(args, results, Path(scratch))),
            ("late", lambda: late_phase(args, results, Path(scratch))),
            ("alternate", lambda: alternate_phase(args, results, save)),
            ("cotenants", lambda: cotenant_phase(args, results, save)),
        ):
            if name in phases:
                phase()
                save()


if __name__ == "__main__":
    main()
