"""What a sweep costs the node, point by point (issue 54): the real worker's CPU time, wall time and peak memory, and
the floor beside it (a bare process that imports the framework and multiplies the largest size once per device).

Each sweep is the real one (``run_sweep`` with the configuration given, its worker a fresh ``python -m
crossover_monitor.measure.worker``); a thread reads the worker's CPU time from ``/proc/PID/stat`` every 20 ms and
hands each interval to the point the worker said it was timing (its ``Started`` messages): the worker's start (the
framework's import, device discovery) before the first point, then each point's visits, the refinement's included.
Printed per sweep: worker CPU-s, wall s, peak RSS, and the points that cost the most; the results JSON keeps every
point's CPU-s and wall-s per sweep, and the floor.

The sweeps follow one another as the service's would (``--every``, 15 minutes by default): each is planned by the
service's own planner (``plan_sweep``) from a store holding the sweeps before it, on a clock that moves the
schedule's interval between sweeps, so that ``benchmark.full_curve_every`` and the guard's ranges act as in a
service that has run that long (the sweeps themselves run back to back).

    python benchmarks/sweep_cost.py --backend torch --sweeps 3 --out benchmarks/results/sweep-cost-DATE.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crossover_monitor.config.loader import load_settings
from crossover_monitor.model import Snapshot, SweepOutcome
from crossover_monitor.protocol import Message, Plan, Started
from crossover_monitor.service.planning import plan_sweep
from crossover_monitor.service.state import StateStore
from crossover_monitor.service.sweep import SubprocessWorker, run_sweep

TICK_S = os.sysconf("SC_CLK_TCK")
START = "worker start"

FLOOR = """
import resource, sys, time
backend, size, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
began = time.process_time()
if backend == "torch":
    import torch
    for device in ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]:
        if mode == "compute":
            a = torch.ones(size, size, device=device); (a @ a).sum().item()
        else:  # operands in host memory copied in, the product copied back
            host = torch.ones(size, size); (host.to(device) @ host.to(device)).cpu().sum().item()
elif backend == "tensorflow":
    import numpy as np, tensorflow as tf
    for device in ["/CPU:0"] + [d.name.replace("/physical_device:", "/") for d in tf.config.list_physical_devices("GPU")]:
        with tf.device(device):
            if mode == "compute":
                a = tf.ones((size, size)); float(tf.reduce_sum(a @ a))
            else:
                host = np.ones((size, size), dtype=np.float32)
                float((tf.constant(host) @ tf.constant(host)).numpy().sum())
else:
    import jax, jax.numpy as jnp, numpy as np
    for device in jax.devices("cpu") + [d for d in jax.devices() if d.platform == "gpu"]:
        if mode == "compute":
            a = jax.device_put(jnp.ones((size, size)), device); float((a @ a).sum())
        else:
            host = np.ones((size, size), dtype=np.float32)
            float(np.asarray(jax.device_put(host, device) @ jax.device_put(host, device)).sum())
usage = resource.getrusage(resource.RUSAGE_SELF)
print(usage.ru_maxrss * 1024, time.process_time() - began)
"""


def _rss_bytes(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICK_S  # utime stime cu cs


@dataclasses.dataclass
class Meter:
    """The worker's CPU time, read every 20 ms, charged to the point it last said it was timing."""

    pid: int = 0
    current: str = START
    cpu: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    wall: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    rss: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))  # the most read, bytes
    last_cpu: float = 0.0
    last_at: float = 0.0
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def watch(self) -> None:
        self.last_at = time.monotonic()
        while not self.stop.wait(0.02):
            self.read()

    def read(self) -> None:
        now_cpu = _cpu_s(self.pid)
        now = time.monotonic()
        if now_cpu is not None:
            self.cpu[self.current] += max(0.0, now_cpu - self.last_cpu)
            self.last_cpu = now_cpu
        self.wall[self.current] += now - self.last_at
        self.last_at = now
        rss = _rss_bytes(self.pid)
        if rss is not None:
            self.rss[self.current] = max(self.rss[self.current], rss)

    def on_message(self, message: Message) -> None:
        if isinstance(message, Started):
            self.read()
            k = message.key
            self.current = f"{k.device} {k.mode} {k.size}"


def one_sweep(plan: Plan, timeout_s: float, at: float) -> tuple[SweepOutcome, Meter]:
    """The real sweep, its start stamped ``at`` (the simulated schedule's time), and its meter."""
    meter = Meter()

    def launch(p: Plan) -> SubprocessWorker:
        worker = SubprocessWorker(p)
        meter.pid = worker.pid
        threading.Thread(target=meter.watch, daemon=True).start()
        return worker

    began = time.time()
    outcome = run_sweep(
        plan,
        timeout_s=timeout_s,
        cancel=threading.Event(),
        launch=launch,
        on_message=meter.on_message,
        clock=lambda: at + time.time() - began,
    )
    meter.stop.set()
    return outcome, meter


def floor(backend: str, size: int) -> dict[str, float]:
    """A bare process: import the framework, one product of the largest size on each device (compute), and another
    whose operands are copied in and the product copied back (end_to_end: what that mode holds at the least)."""
    found: dict[str, float] = {}
    for mode in ("compute", "end_to_end"):
        command = [sys.executable, "-c", FLOOR, backend, str(size), mode]
        rss, cpu = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
        suffix = "" if mode == "compute" else "_end_to_end"
        found |= {f"peak_rss_bytes{suffix}": float(rss), f"cpu_s{suffix}": float(cpu)}
    return found


PEER = """
import json, sys
sys.path.insert(0, "benchmarks")
from references import torch_reference
curves, _ = torch_reference([int(n) for n in sys.argv[1].split(",")], tf32=False, cpu=True, threads=int(sys.argv[2]))
print(json.dumps(curves))
"""


def peer_check(snapshot: Snapshot, sizes: list[int]) -> dict[str, Any]:
    """The sweep's medians at ``sizes`` against torch's own timing in a separate process, same threads: CUDA events
    on the GPU (the first: a host with several compares each with it), a perf_counter loop on the CPU
    (``references.torch_reference``); service / peer per point."""
    threads = dict(snapshot.environment).get("cpu_threads", "")
    threads = threads if threads.isdigit() and int(threads) > 0 else str(os.cpu_count() or 1)
    done = subprocess.run(
        [sys.executable, "-c", PEER, ",".join(map(str, sizes)), threads], capture_output=True, text=True, check=True
    )
    peer = json.loads(done.stdout.strip().splitlines()[-1])
    kinds = {d.device: d.kind for d in snapshot.devices}
    ratios = {}
    for m in snapshot.measurements:
        reference = peer[kinds[m.key.device]][m.key.mode].get(str(m.key.size))
        if m.role == "sweep" and reference:
            ratios[f"{m.key.device} {m.key.mode} {m.key.size}"] = round(m.timing.median_s / reference, 4)
    return {"threads": threads, "service_over_peer": ratios, "peer_s": peer}


def _row(outcome: SweepOutcome, meter: Meter, plan: Plan) -> dict[str, Any]:
    snapshot = outcome.snapshot
    env = dict(snapshot.environment) if snapshot is not None else {}
    gpus = {d.device for d in snapshot.devices if d.kind == "gpu"} if snapshot is not None else set()
    return {
        "result": outcome.result.value,
        "reason": outcome.reason,
        "wall_s": round(outcome.finished_at - outcome.started_at, 2),
        "worker_cpu_s_reported": float(env.get("worker_cpu_s", "nan")),
        "worker_peak_rss_bytes": float(env.get("worker_peak_rss_bytes", "nan")),
        "worker_cpu_s_metered": round(sum(meter.cpu.values()), 2),
        # The wall time of the GPUs' points: what the sweep held a GPU for (an upper bound of its busy time).
        "gpu_points_wall_s": round(sum(w for k, w in meter.wall.items() if k.split(" ")[0] in gpus), 2),
        "cpu_threads": env.get("cpu_threads"),
        "points": {
            k: {"cpu_s": round(meter.cpu[k], 3), "wall_s": round(meter.wall[k], 3), "rss_bytes": meter.rss[k]}
            for k in meter.cpu
        },
        "crossovers": [
            {"mode": c.mode, "state": c.state.value, "size": c.size, "ci": [c.ci_lower, c.ci_upper]}
            for c in (snapshot.crossovers if snapshot else ())
        ],
        "withheld": [w.subject for w in (snapshot.withheld if snapshot else ())],
        "medians_s": {
            f"{m.key.device} {m.key.mode} {m.key.size}": m.timing.median_s
            for m in (snapshot.measurements if snapshot else ())
            if m.role == "sweep"
        },
        "carried": sorted(f"{m.key.device} {m.key.mode} {m.key.size}" for m in plan.carried),
        "timed_again": sorted(
            f"{m.key.device} {m.key.mode} {m.key.size}"
            for m in (snapshot.measurements if snapshot else ())
            if m.key in {c.key for c in plan.carried} and not m.carried
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow")
    parser.add_argument("--config", help="YAML configuration (default: the embedded defaults)")
    parser.add_argument("--sweeps", type=int, default=3)
    parser.add_argument("--every", type=float, default=900.0, help="the schedule's interval the sweeps stand for, s")
    parser.add_argument("--label", default="", help="what this run is, kept in the results")
    parser.add_argument("--peer-sizes", default="", help="after the sweeps, torch's own timing at these sizes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = load_settings(args.config)
    bench = dataclasses.replace(settings.benchmark, backend=args.backend)
    results: dict[str, Any] = {
        "tool": "benchmarks/sweep_cost.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "backend": args.backend,
        "label": args.label,
        "every_s": args.every,
        "full_curve_every_s": bench.full_curve_every_s,
        "max_blocks": bench.timing.max_blocks,
        "sizes": list(bench.sizes),
        "floor": floor(args.backend, max(bench.sizes)),
        "sweeps": [],
    }
    bare = results["floor"]
    print(
        f"floor: {bare['peak_rss_bytes'] / 2**20:.0f} MiB, {bare['cpu_s']:.1f} CPU-s; end_to_end "
        f"{bare['peak_rss_bytes_end_to_end'] / 2**20:.0f} MiB"
    )

    def save() -> None:  # after every step: a run its time limit stops keeps what it measured
        if args.out:
            args.out.write_text(json.dumps(results, indent=1) + "\n")

    store = StateStore()
    start = time.time()
    store.record_config(dataclasses.replace(settings, benchmark=bench), at=start - 1)
    last_whole: Snapshot | None = None
    for index in range(args.sweeps):
        at = start + index * args.every
        plan = plan_sweep(bench, settings.guard, store.read(), now=at, until_next_s=args.every)
        outcome, meter = one_sweep(plan, bench.timeout_s, at)
        store.record(outcome)
        if not plan.carried and outcome.snapshot is not None:
            last_whole = outcome.snapshot
        row = _row(outcome, meter, plan)
        results["sweeps"].append(row)
        save()
        top = sorted(row["points"].items(), key=lambda kv: -kv[1]["cpu_s"])[:6]
        print(
            f"sweep {index} ({len(plan.carried)} carried): {row['result']}, {row['wall_s']} s, "
            f"worker {row['worker_cpu_s_reported']:.0f} CPU-s (metered {row['worker_cpu_s_metered']:.0f}), "
            f"peak RSS {row['worker_peak_rss_bytes'] / 2**20:.0f} MiB, GPU points {row['gpu_points_wall_s']} s; "
            + ", ".join(f"{k} {v['cpu_s']:.1f}" for k, v in top)
            + "; most RSS at "
            + ", ".join(
                f"{k} {v['rss_bytes'] / 2**20:.0f} MiB"
                for k, v in sorted(row["points"].items(), key=lambda kv: -kv[1]["rss_bytes"])[:3]
            )
            + f"; n* {[(c['mode'], c['state'], c['size'] and round(c['size'])) for c in row['crossovers']]}",
            flush=True,
        )
    if args.peer_sizes and last_whole is not None:
        results["peer"] = peer_check(last_whole, [int(n) for n in args.peer_sizes.split(",")])
        save()
        print("service / peer:", " ".join(f"{k} {v:.3f}" for k, v in results["peer"]["service_over_peer"].items()))
    results["this_process_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    save()


if __name__ == "__main__":
    main()
