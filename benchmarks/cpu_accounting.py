"""Where the CPU guard's "other processes" load comes from on an idle machine.

The guard (crossover_monitor/bench/guard.py) calls a CPU point disturbed when the cores' busy time in
/proc/stat, less the worker's own CPU time (``time.process_time()``), exceeds what the worker's
threads leave free. On an idle H200 VM it withheld a third of TensorFlow's sweeps that way. This
script splits that "others" figure, window by window, into /proc/stat's fields (user, system,
irq, softirq, steal), the other processes that used CPU (from /proc/<pid>/stat, kernel threads
included), the interrupts counted meanwhile (/proc/interrupts), and the gap between the kernel's
tick-sampled busy time and the precise time of this process.

    probe: time matrix products in this process (TensorFlow and/or PyTorch, CPU and GPU) in
           windows of about a second each, with the breakdown of each window;
    watch: sample the whole machine once a second while another program (a sweep) runs.

    python benchmarks/cpu_accounting.py probe --backends tensorflow,torch --threads 15 --out probe.json
    python benchmarks/cpu_accounting.py watch --seconds 120 --out watch.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def proc_stat(cores: set[int]) -> dict[str, float]:
    """Seconds per /proc/stat field, summed over ``cores``."""
    total = dict.fromkeys(FIELDS, 0.0)
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            for field, value in zip(FIELDS, values, strict=False):
                total[field] += int(value) * TICK_S
    return total


def processes() -> dict[int, tuple[str, float]]:
    """Every process's (name, utime + stime in seconds), from /proc/<pid>/stat (its threads summed)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        found[int(entry.name)] = (name, (int(fields[11]) + int(fields[12])) * TICK_S)
    return found


def interrupts() -> dict[str, int]:
    """Interrupt counts per /proc/interrupts line, summed over all CPUs."""
    counts = {}
    lines = Path("/proc/interrupts").read_text().splitlines()
    width = len(lines[0].split())
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        values = rest.split()[:width]
        counts[label.strip()] = sum(int(v) for v in values if v.isdigit())
    return counts


def own_threads_runtime() -> float:
    """This process's precise run time, summed over its threads' schedstat (ns)."""
    total = 0
    for task in os.scandir("/proc/self/task"):
        try:
            total += int(Path(task.path, "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


class Window:
    """The machine's accounting at one moment; ``minus`` gives a window's breakdown."""

    def __init__(self, cores: set[int]) -> None:
        self.cores = cores
        self.wall = time.monotonic()
        self.stat = proc_stat(cores)
        self.procs = processes()
        self.irqs = interrupts()
        self.own_precise = time.process_time()
        self.own_schedstat = own_threads_runtime()

    def since(self, earlier: Window) -> dict[str, object]:
        wall = self.wall - earlier.wall
        fields = {f: round((self.stat[f] - earlier.stat[f]) / wall, 3) for f in FIELDS}
        busy = sum(v for f, v in fields.items() if f not in ("idle", "iowait"))
        own = (self.own_precise - earlier.own_precise) / wall
        me = os.getpid()
        own_ticks = (self.procs.get(me, ("", 0.0))[1] - earlier.procs.get(me, ("", 0.0))[1]) / wall
        others = []
        for pid, (name, cpu) in self.procs.items():
            if pid == me:
                continue
            used = (cpu - earlier.procs.get(pid, (name, 0.0))[1]) / wall
            if used > 0:
                others.append((round(used, 3), pid, name))
        others.sort(reverse=True)
        irqs = {k: round((v - earlier.irqs.get(k, 0)) / wall) for k, v in self.irqs.items()}
        return {
            "wall_s": round(wall, 3),
            "cores_per_field": fields,
            "busy_cores": round(busy, 3),
            "own_process_time_cores": round(own, 3),
            "own_schedstat_cores": round((self.own_schedstat - earlier.own_schedstat) / wall, 3),
            "own_proc_pid_stat_cores": round(own_ticks, 3),
            "guard_other_cores": round(busy - own, 3),  # the busy fields' tick samples, less this process
            # The meter since 2026-12-03: wall time not idle, less this process
            "idle_based_other_cores": round(len(self.cores) - fields["idle"] - fields["iowait"] - own, 3),
            "other_processes_cores": round(sum(o[0] for o in others), 3),
            "top_other_processes": [f"{o[2]}({o[1]}) {o[0]}" for o in others[:8]],
            "interrupts_per_s": {k: v for k, v in sorted(irqs.items(), key=lambda kv: -kv[1])[:8] if v},
        }


def windowed(cores: set[int], label: str, step: Callable[[], None], seconds: float) -> dict[str, object]:
    step()  # warm
    start = Window(cores)
    calls = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        step()
        calls += 1
    result = Window(cores).since(start)
    result["label"] = label
    result["calls"] = calls
    print(
        f"{label:32s} busy {result['busy_cores']:.2f} own {result['own_process_time_cores']:.2f} "
        f"tick-other {result['guard_other_cores']:.2f} idle-other {result['idle_based_other_cores']:.2f} procs-other {result['other_processes_cores']:.2f} "
        f"irq {result['cores_per_field']['irq']:.2f} softirq {result['cores_per_field']['softirq']:.2f} "  # type: ignore[index]
        f"system {result['cores_per_field']['system']:.2f}",  # type: ignore[index]
        file=sys.stderr,
        flush=True,
    )
    return result


def tensorflow_steps(threads: int, sizes: list[int]) -> list[tuple[str, Callable[[], None]]]:
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
    steps: list[tuple[str, Callable[[], None]]] = []
    devices = ["/CPU:0"] + [d.name.replace("/physical_device:", "/") for d in tf.config.list_physical_devices("GPU")]
    for device in devices:
        for n in sizes:
            with tf.device(device):
                a = tf.random.normal((n, n))
                b = tf.random.normal((n, n))

            def step(a: object = a, b: object = b, device: str = device) -> None:
                with tf.device(device):
                    for _ in range(20):
                        c = tf.matmul(a, b)
                    c.numpy()

            steps.append((f"tensorflow {device} n={n}", step))
    return steps


def torch_steps(threads: int, sizes: list[int]) -> list[tuple[str, Callable[[], None]]]:
    import torch  # noqa: PLC0415

    torch.set_num_threads(threads)
    steps: list[tuple[str, Callable[[], None]]] = []
    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    for device in devices:
        for n in sizes:
            a = torch.randn(n, n, device=device)
            b = torch.randn(n, n, device=device)

            def step(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
                for _ in range(20):
                    c = a @ b
                c.cpu()

            steps.append((f"torch {device} n={n}", step))
    return steps


def probe(args: argparse.Namespace) -> dict[str, object]:
    cores = set(os.sched_getaffinity(0))
    sizes = [int(n) for n in args.sizes.split(",")]
    results = [windowed(cores, "idle (sleep)", lambda: time.sleep(0.05), args.seconds)]
    makers = {"tensorflow": tensorflow_steps, "torch": torch_steps}
    for backend in args.backends.split(","):
        steps = makers[backend](args.threads, sizes)
        # Right after the framework has opened the GPUs: what the machine does meanwhile, and for how long.
        pause = lambda: time.sleep(0.05)  # noqa: E731
        results.extend(windowed(cores, f"idle {0.4 * k:.1f}s after {backend} init", pause, 0.4) for k in range(8))
        for label, step in steps:
            results.append(windowed(cores, label, step, args.seconds))
        results.append(windowed(cores, f"idle after {backend}", lambda: time.sleep(0.05), args.seconds))
    return {"threads": args.threads, "cores": len(cores), "windows": results}


def watch(args: argparse.Namespace) -> dict[str, object]:
    cores = set(os.sched_getaffinity(0))
    samples = []
    previous = Window(cores)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = Window(cores)
        samples.append({"t": round(now.wall - deadline + args.seconds, 1), **now.since(previous)})
        previous = now
    return {"cores": len(cores), "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--backends", default="tensorflow,torch")
    p.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) - 1))
    p.add_argument("--sizes", default="1,16,64,128,256,512,1024")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--out", type=Path, required=True)
    w = sub.add_parser("watch")
    w.add_argument("--seconds", type=float, default=120.0)
    w.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = probe(args) if args.command == "probe" else watch(args)
    result.update(date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), host=os.uname().nodename)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
