"""A validation library (pydantic v2, msgspec) or the standard library for the settings: measured side by side.

Every figure comes from fresh processes, the variants taken in turn (each round in another order), several
rounds; medians with their spread. What is measured:

1. wall time of ``python -m crossover_monitor check-config`` (the standard-library reader of ``crossover_monitor/config/loader.py``), of
   ``load_settings`` alone, and of the pydantic model of ``settings_library_pydantic.py`` on the same YAML
   (the example file, a bad file with four typical mistakes, a file of 50,000 unknown keys), with the lines
   each prints, and the messages side by side;
2. import cost (``-X importtime``: the module's cumulative time and the sum over every import) and the peak
   RSS of a process that imports and validates each way, alone and beside the daemon's own imports;
3. decoding one recorded sweep's worker messages (``tests/fixtures/h200-2026-12-01``) with
   ``crossover_monitor.protocol.decode`` against msgspec decoding into the same dataclasses;
4. whether both ways agree on a set of small files (valid or not, and which key paths they name).

pydantic and msgspec are not dependencies of the project: give an interpreter that has them (with PyYAML,
prometheus-client and APScheduler, as ``check-config`` needs) as ``--pydantic-python``, e.g. a virtualenv made
with ``python3 -m venv /tmp/pyd && /tmp/pyd/bin/pip install pydantic msgspec pyyaml prometheus-client
'apscheduler<4' h11 bcrypt grpcio nvidia-ml-py`` (the last four for the daemon's imports). By default both ways
run in that interpreter, so only the library differs. ``--source DIR`` measures the ``crossover_monitor/`` of another
tree (``git archive HEAD crossover_monitor deploy | tar -x -C DIR`` while the work tree is being edited).

Usage: ``.venv/bin/python benchmarks/settings_library.py [--runs 20] [--pydantic-python PY] [--source DIR]
[--json FILE]``; prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
PYDANTIC_MODEL = BENCHMARKS / "settings_library_pydantic.py"
FIXTURE = REPO / "tests" / "fixtures" / "h200-2026-12-01" / "tensorflow-idle-1.json"

# Four typical mistakes: a negative interval, a misspelt key, a size listed twice, max_blocks below min_blocks.
BAD = """\
schedule:
  interval: -900
benchmark:
  devise: auto
  sizes: [1, 10, 100, 100, 500]
  timing:
    min_blocks: 10
    max_blocks: 5
"""
UNKNOWN_KEYS = 50_000

STDLIB_CHECK = """\
import sys
from crossover_monitor.config.loader import load_settings
from crossover_monitor.errors import ConfigError
try:
    load_settings(sys.argv[1])
except ConfigError as exc:
    print(f"crossover-monitor: {exc}", file=sys.stderr)
    sys.exit(78)
print(f"{sys.argv[1]}: configuration is valid")
"""
# Peak RSS as VmHWM, the high-water mark of this process image: ru_maxrss survives fork and exec, so a child
# reports at least its parent's peak (a process started from a 200 MiB parent said 216,540 KiB, VmHWM 10,836).
RSS = """
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(line.split()[1])
"""
STDLIB_LOAD = "import sys\nfrom crossover_monitor.config.loader import load_settings\nload_settings(sys.argv[1])\n"
PYDANTIC_LOAD = "import sys\nimport settings_library_pydantic as m\nm.validate(m.read_document(sys.argv[1]))\n"
DAEMON = "import crossover_monitor.service.daemon\n"

# One recorded sweep as the worker streams it, decoded each way (the dataclasses of crossover_monitor.model both times).
DECODE = """\
import json, statistics, sys, time
t0 = time.perf_counter()
import msgspec
import_ms = (time.perf_counter() - t0) * 1e3
from crossover_monitor import codec, model
from crossover_monitor.protocol import _TAGS, Done, Environment, Started, decode, encode

recorded = json.load(open(sys.argv[1]))["snapshot"]
recorded["environment"] = sorted(recorded["environment"].items())  # as `once --json` wrote them
for m in recorded["measurements"]:
    m.pop("flops_per_second")
snap = codec.from_data(model.Snapshot, recorded)
messages = [Environment(values=dict(snap.environment)), *snap.devices]
for m in snap.measurements:
    messages += [Started(key=m.key, role=m.role), m]
messages += [*snap.failures, *snap.withheld, *snap.hardware, Done()]
lines = [encode(m) for m in messages]

class Tag(msgspec.Struct):
    type: str

def by_msgspec():
    tag = msgspec.json.Decoder(Tag)
    decoders = {name: msgspec.json.Decoder(cls) for name, cls in _TAGS.items()}
    return lambda line: decoders[tag.decode(line).type].decode(line)

def timed(make):
    t = time.perf_counter()
    decode_one = make()
    out = [decode_one(line) for line in lines]
    return (time.perf_counter() - t) * 1e3, out

first_ms, current = timed(lambda: decode)
m_first_ms, fast = timed(by_msgspec)
assert current == messages and fast == messages
warm = statistics.median(timed(lambda: decode)[0] for _ in range(30))
m_decode = by_msgspec()
m_warm = statistics.median(timed(lambda: m_decode)[0] for _ in range(30))
print(json.dumps({"lines": len(lines), "bytes": sum(map(len, lines)), "current_first_ms": first_ms,
                  "current_warm_ms": warm, "msgspec_first_ms": m_first_ms, "msgspec_warm_ms": m_warm,
                  "msgspec_import_ms": import_ms}))
"""

# The agreement check: both ways on small files; the key paths ("[i]" dropped: pydantic names the list), and
# for a valid file the values (field by field; the server as host and port).
AGREE = """\
import dataclasses, json, re, sys
import yaml
from pydantic import ValidationError
from crossover_monitor.config.loader import settings_from_mapping
from crossover_monitor.errors import ConfigError
import settings_library_pydantic as m

def paths(lines):
    return sorted({re.sub(r"\\[\\d+\\]$", "", line.split(": ", 1)[0]) for line in lines})

out = {}
for name, text in json.loads(sys.stdin.read()).items():
    data = yaml.safe_load(text)
    values = []
    try:
        got = dataclasses.asdict(settings_from_mapping(data))
        values.append({**got, "server": tuple(got["server"]["address"]), "source": None})
        stdlib = []
    except ConfigError as exc:
        stdlib = [str(p) for p in exc.problems]
    try:
        made = m.validate(data)
        values.append({**made.model_dump(), "server": (made.server.host, made.server.port), "source": None})
        model = []
    except ValidationError as exc:
        model = m.key_paths(exc)
    same = paths(stdlib) == paths(model) and (len(values) != 2 or values[0] == values[1])
    out[name] = {"stdlib": stdlib, "pydantic": model, "same": same}
print(json.dumps(out))
"""
CASES = {
    "example defaults": "",
    "cron instead of interval": "schedule: {cron: '*/15 * * * *'}\n",
    "interval and cron": "schedule: {interval: 15m, cron: '*/15 * * * *'}\n",
    "cron of 4 fields": "schedule: {cron: '* * * *'}\n",
    "jitter = interval": "schedule: {interval: 10m, jitter: 10m}\n",
    "interval 1ms": "schedule: {interval: 1ms}\n",
    "interval 1e12": "schedule: {interval: 1e12}\n",
    "interval '15 minutes'": "schedule: {interval: 15 minutes}\n",
    "sizes unsorted": "benchmark: {sizes: [100, 10, 1]}\n",
    "sizes empty": "benchmark: {sizes: []}\n",
    "size 0 and 70000": "benchmark: {sizes: [0, 70000]}\n",
    "size '10' (a string)": "benchmark: {sizes: ['10']}\n",
    "1001 sizes": "benchmark: {sizes: [" + ", ".join(map(str, range(1, 1002))) + "]}\n",
    "device aliases": "benchmark: {devices: ['/GPU:0', 'gpu:0']}\n",
    "devices auto": "benchmark: {devices: auto, cpu_threads: auto}\n",
    "devices 'cpu' (no list)": "benchmark: {devices: cpu}\n",
    "dtype float8": "benchmark: {dtypes: [float8]}\n",
    "mode twice": "benchmark: {modes: [compute, compute]}\n",
    "backend plugin": "benchmark: {backend: 'my.pkg:Backend'}\n",
    "backend unknown": "benchmark: {backend: numpy}\n",
    "tf32 yes (a string)": "benchmark: {tf32: 'yes'}\n",
    "expect_gpus true": "benchmark: {expect_gpus: true}\n",
    "skip speed-up 1": "benchmark: {skip_cpu_above_speedup: 1}\n",
    "max_blocks < min_blocks": "benchmark: {timing: {min_blocks: 10, max_blocks: 5}}\n",
    "target_spread 1": "benchmark: {timing: {target_spread: 1}}\n",
    "refine tolerance": "benchmark: {refine: {tolerance: 0.1}}\n",
    "retry_interval 5s": "guard: {retry_interval: 5s}\n",
    "retry_interval 0": "guard: {retry_interval: 0}\n",
    "utilisation 101": "guard: {gpu_max_utilization: 101}\n",
    "listen [::]:9437": "server: {listen: '[::]:9437'}\n",
    "listen 127.0.0.1 in brackets": "server: {listen: '[127.0.0.1]:9437'}\n",
    "listen port 0": "server: {listen: ':0'}\n",
    "history blank": "history: {directory: ' '}\n",
    "section null": "guard: null\n",
    "section a list": "guard: [1]\n",
    "four mistakes": BAD,
}


@dataclass
class Variant:
    name: str
    python: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    first: subprocess.CompletedProcess[str] | None = None


def run(
    python: str, args: Sequence[str], cwd: Path, env: dict[str, str], stdin: str | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(
        [python, *args], cwd=cwd, env={**os.environ, **env}, input=stdin, capture_output=True, text=True, check=False
    )
    return time.perf_counter() - started, done


def rounds(variants: list[Variant], runs: int, cwd: Path) -> None:
    """Each variant once to warm the caches (bytecode, page cache), then ``runs`` rounds in rotating order."""
    for v in variants:
        _, v.first = run(v.python, v.args, cwd, v.env)
    for i in range(runs):
        for v in variants[i % len(variants) :] + variants[: i % len(variants)]:
            seconds, done = run(v.python, v.args, cwd, v.env)
            if v.first is not None and done.returncode != v.first.returncode:
                raise SystemExit(f"{v.name}: exit {done.returncode}, first run {v.first.returncode}")
            v.seconds.append(seconds)


def spread(values: Sequence[float], scale: float = 1.0, digits: int = 0) -> str:
    """``median (IQR lo–hi, min–max)``."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    f = f"{{:.{digits}f}}"
    lo, hi = min(values), max(values)
    return (
        f"{f.format(q[1] * scale)} ({f.format(q[0] * scale)}–{f.format(q[2] * scale)}, "
        f"{f.format(lo * scale)}–{f.format(hi * scale)})"
    )


def import_times(stderr: str, module: str) -> tuple[float, float]:
    """(the module's cumulative µs, the sum of every import's own µs) from ``-X importtime``."""
    total, own = 0.0, 0.0
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative, name = line.removeprefix("import time:").split("|")
        total += float(self_us)
        if module and name.strip() == module:
            own = max(own, float(cumulative))
    return own, total


def versions(python: str) -> str:
    code = (
        "import sys, importlib.metadata as m\n"
        "names = ['pydantic', 'pydantic-core', 'msgspec', 'PyYAML', 'prometheus-client', 'APScheduler']\n"
        "found = []\n"
        "for n in names:\n"
        "    try: found.append(f'{n} {m.version(n)}')\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(f'Python {sys.version.split()[0]}; ' + ', '.join(found))\n"
    )
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@dataclass(frozen=True)
class Setup:
    """The two interpreters, the tree measured, and the environments the processes run in."""

    std: str  # the standard-library way
    pyd: str  # the pydantic (and msgspec) way
    source: Path  # also the working directory: `-m crossover_monitor` and `-c` take crossover_monitor/ from there first
    runs: int

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.source)}

    @property
    def env_model(self) -> dict[str, str]:
        return {"PYTHONPATH": f"{self.source}{os.pathsep}{BENCHMARKS}"}


def measure_wall(s: Setup, label: str, path: Path) -> list[dict[str, Any]]:
    """Wall time of each way on one file, with its exit code and output."""
    f = str(path)
    check = ["-m", "crossover_monitor", "check-config", "--config", f]
    variants = [
        Variant("interpreter start (-c pass)", s.std, ["-c", "pass"], s.env),
        Variant("stdlib: check-config (CLI)", s.std, check, s.env),
        Variant("stdlib: load_settings alone", s.std, ["-c", STDLIB_CHECK, f], s.env),
        Variant("pydantic: model, its messages", s.pyd, [str(PYDANTIC_MODEL), f], s.env_model),
        Variant(
            "pydantic: model, current messages", s.pyd, [str(PYDANTIC_MODEL), "--messages", "paths", f], s.env_model
        ),
    ]
    if Path(sys.executable).absolute() != Path(s.std).absolute():  # not resolved: a venv's python is a link
        variants.insert(2, Variant("stdlib: check-config (CLI, project .venv)", sys.executable, check, s.env))
    rounds(variants, s.runs, s.source)
    print(f"\n### {label}\n\n| way | wall ms: median (IQR, min–max) | exit | output lines | bytes |")
    print("| --- | ---: | ---: | ---: | ---: |")
    rows = []
    for v in variants:
        assert v.first is not None
        text = v.first.stdout + v.first.stderr
        lines, size = len(text.splitlines()), len(text.encode())
        rows.append(
            {"way": v.name, "seconds": v.seconds, "exit": v.first.returncode, "lines": lines, "bytes": size}
            | {"output": text[:6000]}
        )
        print(f"| {v.name} | {spread(v.seconds, 1e3)} | {v.first.returncode} | {lines} | {size} |", flush=True)
    return rows


def measure_imports(s: Setup) -> dict[str, list[tuple[float, float]]]:
    imports = [  # (what, code, the module whose cumulative time is shown, interpreter, environment)
        (
            "crossover_monitor.config.loader",
            "import crossover_monitor.config.loader",
            "crossover_monitor.config.loader",
            s.std,
            s.env,
        ),
        ("the pydantic model", "import settings_library_pydantic", "settings_library_pydantic", s.pyd, s.env_model),
        ("pydantic (BaseModel)", "from pydantic import BaseModel", "", s.pyd, s.env),  # lazy: no one module
        ("yaml", "import yaml", "yaml", s.std, s.env),
        ("msgspec", "import msgspec", "msgspec", s.pyd, s.env),
    ]
    found: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in imports}
    for i in range(s.runs + 1):
        for name, code, module, python, env in imports[i % len(imports) :] + imports[: i % len(imports)]:
            _, done = run(python, ["-X", "importtime", "-c", code], s.source, env)
            if i:  # the first round warms the caches
                found[name].append(import_times(done.stderr, module))
    print("\n### imports (-X importtime)\n\n| import | module, cumulative ms | every import, summed ms |")
    print("| --- | ---: | ---: |")
    for name, values in found.items():
        own, total = [v[0] for v in values], [v[1] for v in values]
        shown = spread(own, 1e-3, 1) if any(own) else "—"
        print(f"| {name} | {shown} | {spread(total, 1e-3, 1)} |", flush=True)
    return found


def measure_memory(s: Setup, example: Path) -> dict[str, list[float]]:
    f = str(example)
    memory = [
        Variant("interpreter (pass)", s.std, ["-c", RSS], s.env),
        Variant(
            "stdlib: import crossover_monitor.config.loader, load the example",
            s.std,
            ["-c", STDLIB_LOAD + RSS, f],
            s.env,
        ),
        Variant("pydantic: import the model, validate the example", s.pyd, ["-c", PYDANTIC_LOAD + RSS, f], s.env_model),
        Variant("msgspec: import", s.pyd, ["-c", "import msgspec" + RSS], s.env),
        Variant("daemon's imports + stdlib load", s.std, ["-c", DAEMON + STDLIB_LOAD + RSS, f], s.env),
        Variant("daemon's imports + pydantic model", s.pyd, ["-c", DAEMON + PYDANTIC_LOAD + RSS, f], s.env_model),
        Variant(
            "daemon's imports + pydantic model + msgspec",
            s.pyd,
            ["-c", DAEMON + PYDANTIC_LOAD + "import msgspec\n" + RSS, f],
            s.env_model,
        ),
    ]
    rss: dict[str, list[float]] = {v.name: [] for v in memory}
    for i in range(s.runs + 1):
        for v in memory[i % len(memory) :] + memory[: i % len(memory)]:
            _, done = run(v.python, v.args, s.source, v.env)
            if done.returncode:
                raise SystemExit(f"{v.name}: {done.stderr[-2000:]}")
            if i:
                rss[v.name].append(float(done.stdout.split()[-1]))
    print("\n### peak RSS (VmHWM)\n\n| process | MiB: median (IQR, min–max) |\n| --- | ---: |")
    for name, values in rss.items():
        print(f"| {name} | {spread(values, 1 / 1024, 1)} |", flush=True)
    return rss


def measure_decode(s: Setup) -> list[dict[str, float]]:
    decoded = []
    for _ in range(s.runs):
        _, done = run(s.pyd, ["-c", DECODE, str(FIXTURE)], s.source, s.env)
        if done.returncode:
            raise SystemExit(f"decode: {done.stderr[-2000:]}")
        decoded.append(json.loads(done.stdout))
    first = decoded[0]
    print(f"\n### one sweep's worker messages ({first['lines']} lines, {first['bytes']} bytes)\n")
    print("| decode | ms: median (IQR, min–max) |\n| --- | ---: |")
    for key in ("current_first_ms", "current_warm_ms", "msgspec_first_ms", "msgspec_warm_ms", "msgspec_import_ms"):
        print(f"| {key} | {spread([d[key] for d in decoded], 1, 2)} |")
    return decoded


def measure_agreement(s: Setup) -> dict[str, Any]:
    _, done = run(s.pyd, ["-c", AGREE], s.source, s.env_model, stdin=json.dumps(CASES))
    if done.returncode:
        raise SystemExit(f"agreement: {done.stderr[-2000:]}")
    agreement: dict[str, Any] = json.loads(done.stdout)
    print("\n### agreement\n\n| file | stdlib | pydantic (current-style messages) | same paths or values |")
    print("| --- | --- | --- | --- |")
    for name, row in agreement.items():
        cells = ["<br>".join(row[k]).replace("|", "\\|") or "valid" for k in ("stdlib", "pydantic")]
        print(f"| {name} | {cells[0]} | {cells[1]} | {'yes' if row['same'] else '**no**'} |")
    return agreement


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pydantic-python", default=os.environ.get("PYDANTIC_PYTHON", "/tmp/pyd/bin/python"))  # noqa: S108
    parser.add_argument("--python", help="for the standard-library way (default: the pydantic interpreter)")
    parser.add_argument("--source", type=Path, default=REPO, help="a tree with the crossover_monitor/ to measure")
    parser.add_argument("--json", type=Path, help="write every figure here too")
    args = parser.parse_args()
    if not Path(args.pydantic_python).exists():
        raise SystemExit(f"no interpreter with pydantic at {args.pydantic_python}: see this script's docstring")
    s = Setup(args.python or args.pydantic_python, args.pydantic_python, args.source.resolve(), args.runs)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "standard library": versions(s.std),
        "pydantic": versions(s.pyd),
        "project python": versions(sys.executable),
        "source": str(s.source),
        "runs": s.runs,
    }
    print(json.dumps(report, indent=1), flush=True)
    example = s.source / "deploy" / "config.example.yaml"
    with tempfile.TemporaryDirectory() as scratch:
        bad, many = Path(scratch) / "bad.yaml", Path(scratch) / "unknown-keys.yaml"
        bad.write_text(BAD)
        many.write_text("".join(f"k{i:05d}: 1\n" for i in range(UNKNOWN_KEYS)))
        report["wall"] = {}
        for label, path in (("example", example), ("bad", bad), (f"{UNKNOWN_KEYS} unknown keys", many)):
            rows = report["wall"][label] = measure_wall(s, label, path)
            if label == "bad":
                for row in rows[1:]:
                    print(f"\n{row['way']}:\n```\n{row['output'].rstrip()}\n```")
    report["imports"] = measure_imports(s)
    report["rss_kib"] = measure_memory(s, example)
    report["decode"] = measure_decode(s)
    report["agreement"] = measure_agreement(s)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
