"""What the landing page's picture costs: matplotlib in a child process (as the page drew it up to 471a67d) against
svgchart.py in the daemon's own process (issue 55).

One realistic sweep (8 GPUs and a CPU, the default 7 sizes, both modes; crossovers derived by the service's own
code) is drawn ``--runs`` times each way, the two ways alternated so that both see the same load:

- matplotlib: the sweep written as ``once --json`` writes it, then ``python -P -m crossover_monitor plot --from-json
  FILE OUT.svg`` of revision ``--matplotlib-rev`` (its package unpacked by ``git archive``, first on the child's
  path), the SVG read back: what ``page._draw_in_child`` did. Wall time, and the child's peak RSS (``os.wait4``).
- svgchart: ``chart.from_snapshot`` and ``svgchart.render`` in this process, what the page does now. Wall time,
  and in runs of their own (tracing slows them) the tracemalloc peak; and in fresh interpreters that load the
  page's module as the daemon does, the peak RSS before and after one chart.

Also the largest chart the limits allow (64 curves in 8 dtypes) by svgchart, and the installed size of the plot
extra: the distributions matplotlib needs that the service's own dependencies do not, each file's disk usage (its
blocks, as du counts them) from the distribution's RECORD.

    python benchmarks/picture_costs.py --runs 7 --out benchmarks/results/picture-costs-DATE.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from crossover_monitor.analysis.crossover import crossovers
from crossover_monitor.config.settings import BenchmarkSettings
from crossover_monitor.model import (
    MODES,
    DeviceInfo,
    Measurement,
    PointKey,
    Snapshot,
    StopReason,
    SweepOutcome,
    SweepResult,
    Timing,
)
from crossover_monitor.view import svgchart
from crossover_monitor.view.chart import from_snapshot
from crossover_monitor.view.report import render_json

REPO = Path(__file__).resolve().parent.parent
# The last revision whose page drew its picture with matplotlib in a child process.
MATPLOTLIB_REV = "471a67d"
_TIMEOUT_S = 120


def sweep(gpus: int = 8, dtypes: tuple[str, ...] = ("float32",), sizes: tuple[int, ...] | None = None) -> Snapshot:
    """A sweep shaped like a real 8-GPU node's: a CPU of ~1 TFLOP/s, GPUs of ~400 TFLOP/s with 20 µs of launch
    cost (70 µs and PCIe copies end to end), each GPU a few percent off the next."""
    sizes = sizes or BenchmarkSettings().sizes
    cpu = DeviceInfo(backend="torch", device="cpu", kind="cpu", name="AMD EPYC 9654 96-Core Processor")
    devices = [cpu] + [
        DeviceInfo(backend="torch", device=f"cuda:{i}", kind="gpu", name="NVIDIA H200", details=(("uuid", f"GPU-{i}"),))
        for i in range(gpus)
    ]
    measurements = []
    for dtype in dtypes:
        for mode in MODES:
            for index, device in enumerate(devices):
                for size in sizes:
                    flops = 2.0 * size**3
                    if device.kind == "cpu":
                        seconds = 3e-6 + flops / 1e12
                    else:
                        fixed = 2e-5 if mode == "compute" else 7e-5 + 3 * 4 * size**2 / 5e10
                        seconds = (fixed + flops / 4e14) * (1 + 0.03 * index)
                    key = PointKey(backend="torch", device=device.device, dtype=dtype, mode=mode, size=size)
                    timing = Timing(
                        median_s=seconds,
                        iqr_s=seconds / 50,
                        blocks=5,
                        calls_per_block=max(1, int(0.02 / seconds)),
                        stop_reason=StopReason.CONVERGED,
                        noisy=False,
                    )
                    measurements.append(Measurement(key=key, timing=timing))
    environment = (("framework", "torch"), ("framework_version", "2.13.0"))
    return Snapshot(
        started_at=1_796_600_000.0,
        finished_at=1_796_600_090.0,
        devices=tuple(devices),
        measurements=tuple(measurements),
        crossovers=crossovers(devices, measurements),
        environment=environment,
    )


def _old_package(rev: str, into: Path) -> Path:
    """The crossover_monitor package of ``rev``, unpacked under ``into``; its path goes first on the child's."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, "crossover_monitor"],
        capture_output=True,
        check=True,
        timeout=_TIMEOUT_S,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def draw_in_child(snapshot: Snapshot, package_path: Path) -> tuple[float, int, bytes, float]:
    """As page._draw_in_child did: (wall s, the child's peak RSS in bytes, the SVG, the child's CPU s)."""
    started = time.perf_counter()
    outcome = SweepOutcome(
        result=SweepResult.SUCCESS, started_at=snapshot.started_at, finished_at=snapshot.finished_at, snapshot=snapshot
    )
    with tempfile.TemporaryDirectory(prefix="picture-costs-") as scratch:
        source, chart = Path(scratch) / "sweep.json", Path(scratch) / "sweep.svg"
        source.write_text(render_json(outcome), encoding="utf-8")
        command = [sys.executable, "-P", "-m", "crossover_monitor", "plot", "--from-json", str(source), str(chart)]
        environment = {**os.environ, "PYTHONPATH": str(package_path)}
        with (Path(scratch) / "stderr").open("w+") as errors:
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, env=environment)
            _, status, usage = os.wait4(child.pid, 0)  # the child's own rusage, not every child's peak
            child.returncode = os.waitstatus_to_exitcode(status)  # waited for here, not by Popen
            if child.returncode != 0:
                errors.seek(0)
                raise RuntimeError(f"the matplotlib child failed ({child.returncode}): {errors.read()[-500:]}")
        svg = chart.read_bytes()
    return time.perf_counter() - started, usage.ru_maxrss * 1024, svg, usage.ru_utime + usage.ru_stime


def draw_here(snapshot: Snapshot) -> tuple[float, bytes]:
    """As the page draws now: (wall s, the SVG)."""
    started = time.perf_counter()
    svg = svgchart.render(from_snapshot(snapshot, "node-1"))
    return time.perf_counter() - started, svg


def traced_peak(snapshot: Snapshot) -> int:
    """The most memory Python allocated at once while the page's chart was drawn, in bytes."""
    tracemalloc.start()
    try:
        svgchart.render(from_snapshot(snapshot, "node-1"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# In a fresh interpreter: the page's module loaded (as the daemon has it), its peak RSS; then one chart drawn.
_GROWTH = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from crossover_monitor.http import page
import picture_costs
snapshot = picture_costs.sweep()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
page.draw(snapshot)
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "matplotlib" in sys.modules)
"""


def daemon_growth() -> tuple[int, int, bool]:
    """(peak RSS before, after one chart drawn in bytes, whether matplotlib got loaded) of a fresh interpreter that
    has the page's module loaded, as the daemon has."""
    done = subprocess.run(
        [sys.executable, "-c", _GROWTH, str(Path(__file__).parent)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=_TIMEOUT_S,
    )
    before, after, loaded = done.stdout.split()
    return int(before) * 1024, int(after) * 1024, loaded == "True"


def _requirements(name: str, extras: frozenset[str] = frozenset()) -> list[Requirement]:
    found = []
    for text in importlib.metadata.requires(name) or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras or {""}):
            found.append(requirement)
    return found


def _closure(roots: list[Requirement]) -> set[str]:
    """Every installed distribution ``roots`` bring, by canonical name."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        requirement = todo.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        seen.add(name)
        todo += _requirements(name, frozenset(requirement.extras))
    return seen


def _disk_bytes(name: str) -> tuple[int, int]:
    """(bytes on disk as du counts them, files) of an installed distribution, from its RECORD."""
    distribution = importlib.metadata.distribution(name)
    blocks, count = 0, 0
    for file in distribution.files or []:
        path = Path(str(distribution.locate_file(file)))
        if path.is_file():
            blocks += path.stat().st_blocks * 512
            count += 1
    return blocks, count


def install_size() -> dict[str, Any]:
    """The plot extra's distributions that the service's own dependencies do not bring, and their size."""
    project = importlib.metadata.metadata("crossover-monitor")
    core = [
        Requirement(text)
        for text in project.get_all("Requires-Dist") or []
        if Requirement(text).marker is None  # the runtime dependencies, not an extra's
    ]
    needed = _closure(core)
    plot = _closure([Requirement("matplotlib")])
    extra = sorted(plot - needed)
    sizes = {name: _disk_bytes(name) for name in extra}
    return {
        "core_closure": len(needed),
        "plot_closure": sorted(plot),
        "already_needed_by_core": sorted(plot & needed),
        "only_for_plot": {
            name: {"version": importlib.metadata.version(name), "disk_bytes": size, "files": files}
            for name, (size, files) in sizes.items()
        },
        "only_for_plot_disk_bytes": sum(size for size, _ in sizes.values()),
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=7, help="draws each way, alternated (default: %(default)s)")
    parser.add_argument(
        "--matplotlib-rev", default=MATPLOTLIB_REV, help="the revision whose `plot` the child runs (%(default)s)"
    )
    parser.add_argument("--out", type=Path, help="the JSON to write (default: standard output)")
    args = parser.parse_args()

    snapshot = sweep()
    largest = sweep(gpus=3, dtypes=tuple(f"type{i}" for i in range(8)))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="picture-costs-old-") as old:
        package = _old_package(args.matplotlib_rev, Path(old))
        first_child = draw_in_child(snapshot, package)  # matplotlib's font cache and the page cache warmed
        first_here = draw_here(snapshot)
        child: list[tuple[float, int, bytes, float]] = []
        here: list[tuple[float, bytes]] = []
        for _ in range(args.runs):
            child.append(draw_in_child(snapshot, package))
            here.append(draw_here(snapshot))
    peaks = [traced_peak(snapshot) for _ in range(args.runs)]
    growth = [daemon_growth() for _ in range(args.runs)]
    largest_times = [draw_here(largest) for _ in range(args.runs)]
    points = sum(1 for m in snapshot.measurements if m.role == "sweep")
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "load_average_before_after": [load_before[0], os.getloadavg()[0]],
        "python": platform.python_version(),
        "matplotlib": importlib.metadata.version("matplotlib"),
        "matplotlib_rev": args.matplotlib_rev,
        "runs": args.runs,
        "sweep": {
            "devices": len(snapshot.devices),
            "points": points,
            "curves": len({(m.key.device, m.key.dtype, m.key.mode) for m in snapshot.measurements}),
            "found_crossovers": sum(1 for c in snapshot.crossovers if c.size is not None),
        },
        "matplotlib_child": {
            "first_wall_ms": first_child[0] * 1000,
            "wall_ms": _summary([wall * 1000 for wall, _, _, _ in child]),
            "cpu_ms": _summary([cpu * 1000 for _, _, _, cpu in child]),
            "peak_rss_mib": _summary([rss / 2**20 for _, rss, _, _ in child]),
            "svg_bytes": len(child[-1][2]),
        },
        "svgchart_in_process": {
            "first_wall_ms": first_here[0] * 1000,
            "wall_ms": _summary([wall * 1000 for wall, _ in here]),
            "tracemalloc_peak_kib": _summary([peak / 1024 for peak in peaks]),
            "svg_bytes": len(here[-1][1]),
            "fresh_process_peak_rss_mib_before_after": [
                _summary([before / 2**20 for before, _, _ in growth]),
                _summary([after / 2**20 for _, after, _ in growth]),
            ],
            "matplotlib_loaded": any(loaded for _, _, loaded in growth),
        },
        "svgchart_largest_chart": {
            "curves": len({(m.key.device, m.key.dtype, m.key.mode) for m in largest.measurements}),
            "panels": len({m.key.dtype for m in largest.measurements}),
            "wall_ms": _summary([wall * 1000 for wall, _ in largest_times]),
            "svg_bytes": len(largest_times[-1][1]),
        },
        "install": install_size(),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
