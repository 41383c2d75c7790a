"""The sharded layout with real servers: two shards and a global Prometheus over 24 simulated 8-GPU nodes.

Each node serves the fleet profile of a state read back from a recorded real scrape (benchmarks/fleet.py's
``recorded_state``: an H100 service's /metrics), its GPU repeated eight times, each GPU's n* varied per node; it
listens on an address of its own (127.0.1.N), so that the shards split the nodes by ``hashmod`` on the address, as
the shipped deploy/prometheus/fleet/shard.yml does. Each shard starts on a day of its own nodes' history (written
with ``promtool tsdb create-blocks-from openmetrics``, the series the rules read over windows and the ones they
record, as a shard that ran for a day holds them) and evaluates the shipped rules.yml; the global tier federates
from both with the shipped global.yml and evaluates fleet-rules.yml. Only the intervals are shortened (scrapes every
2 s, every group every 5 s), so that the test takes a minute, not a day.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import math
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover_monitor.metrics import METRICS, render_state
from crossover_monitor.model import ServiceState
from tests.conftest import REPO
from tests.promql import rule_files_every
from tests.service import stop_process, wait_until

sys.path.insert(0, str(REPO / "benchmarks"))
import fleet as simulated

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None or shutil.which("promtool") is None,
        reason="needs the prometheus server and promtool (Debian's prometheus package; the test command installs it)",
    ),
]

LAYOUT = REPO / "deploy" / "prometheus" / "fleet"
NODES, GPUS, SHARDS = 24, 8, 2
SWEEP_S, HISTORY_S, STEP_S = 900, 26 * 3600, 300  # the default schedule; a day and more; the history's cadence
# Node 0's n* moved x1.3 in its last 2.5 hours (a drift, well under the outlier's 50%: at x1.4 its GPUs' noise took one
# to 1.49 of the peers' median, and the hour's median of its scrapes past 1.5 once); node 1's sits at x2 of its
# peers' throughout (an outlier, but no drift).
PLANTED, OUTLIER = 0, 1
LN_MOVED = math.log(1 + 0.75 * 0.2)  # moved2h's threshold: 3/4 of matmul:crossover_drift_threshold:ratio


def _address(node: int) -> str:
    return f"127.0.1.{node + 1}"


def shard_of(address: str, shards: int) -> int:
    """The shard Prometheus's `hashmod` sends a target to: the last 8 bytes of the MD5 of its address, big-endian."""
    return int.from_bytes(hashlib.md5(address.encode()).digest()[8:], "big") % shards  # noqa: S324 - as Prometheus


@dataclass
class Node:
    """One simulated node: its address, each sweep's end and n* factor (per GPU and mode), and its live state."""

    index: int
    address: str
    port: int
    sweeps: list[float]
    factors: list[dict[tuple[int, str], float]]
    state: ServiceState

    @property
    def instance(self) -> str:
        return self.address  # the shard names a node by its host, as the shipped shard.yml relabels it


def nodes_at(end: float, port: int) -> list[Node]:
    """Every node, each sweeping every 15 minutes at its own phase up to ``end``."""
    base, _ = simulated.recorded_state(simulated.DEFAULT_NODE)
    made = []
    for index in range(NODES):
        rng = random.Random(index)
        last = end - rng.uniform(0, SWEEP_S)
        sweeps = [last - k * SWEEP_S for k in range(int(HISTORY_S / SWEEP_S) + 2)][::-1]
        level = 2.0 if index == OUTLIER else math.exp(rng.gauss(0, 0.05))
        factors = [
            {
                (gpu, mode): level
                * math.exp(rng.gauss(0, 0.03))
                * (1.3 if index == PLANTED and at > end - 2.5 * 3600 else 1.0)
                for gpu in range(GPUS)
                for mode in ("compute", "end_to_end")
            }
            for at in sweeps
        ]
        state = simulated.node_state(
            base, gpus=GPUS, node=index, finished=last, nstar=factors[-1], sweeps=len(sweeps), loaded_at=end - HISTORY_S
        )
        made.append(Node(index, _address(index), port, sweeps, factors, state))
    return made


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def history(node: Node, end: float) -> Iterator[str]:
    """OpenMetrics lines of what the rules read of ``node`` over windows, every 5 minutes over the last day: n*, when
    it was derived, and the series the baselines group records from them (n* as a logarithm, when a sweep found it,
    when it moved), computed as the rules compute them."""
    served = {(c.gpu, c.mode): c for c in node.state.latest.crossovers if c.size} if node.state.latest else {}
    gpus = sorted({gpu for gpu, _ in served})
    base = {"job": "crossover-monitor", "instance": node.instance}
    for t in range(int(end - HISTORY_S), int(end), STEP_S):
        k = max(i for i, at in enumerate(node.sweeps) if at <= t)
        for (gpu, mode), crossover in served.items():
            pair = base | {"backend": crossover.backend, "gpu": gpu, "cpu": crossover.cpu, "dtype": crossover.dtype}
            pair["mode"] = mode
            scale = node.factors[k][gpus.index(gpu), mode] / node.factors[-1][gpus.index(gpu), mode]
            size, at = crossover.size * scale, node.sweeps[k]  # type: ignore[operator]
            lines = {
                "matmul_crossover_size": size,
                "matmul_crossover_timestamp_seconds": at,
                "instance_gpu:matmul_crossover_size:ln": math.log(size),
                "instance_gpu:matmul_crossover_timestamp_seconds:found": at,
            }
            if _moved(node, k, gpus.index(gpu), mode):
                lines["instance_gpu:matmul_crossover_timestamp_seconds:moved2h"] = at
            for name, value in lines.items():
                yield f"{name}{{{_labels(pair)}}} {value!r} {t}"


def _moved(node: Node, k: int, gpu: int, mode: str) -> bool:
    """moved2h as its rule records it after sweep ``k``: its log n* beyond 3/4 of the threshold from the day before
    the last 2 hours, the way the 2 hours' mean moved."""

    def ln(j: int) -> float:
        return math.log(node.factors[j][gpu, mode])

    now = node.sweeps[k]
    window = [j for j in range(k + 1) if now - node.sweeps[j] < 2 * 3600]
    before = [j for j in range(k + 1) if 2 * 3600 <= now - node.sweeps[j] < 26 * 3600]
    if not before:
        return False
    baseline = sum(map(ln, before)) / len(before)
    move = sum(map(ln, window)) / len(window) - baseline
    return move != 0 and (ln(k) - baseline) * math.copysign(1, move) > LN_MOVED


def write_blocks(nodes: list[Node], end: float, data: Path, work: Path) -> None:
    text = work / f"{data.name}.om"
    with text.open("w", encoding="utf-8") as out:
        for node in nodes:
            out.writelines(line + "\n" for line in history(node, end))
        out.write("# EOF\n")
    # promtool wants the samples of a series in time order, series after series: sort each series' lines.
    lines = text.read_text(encoding="utf-8").splitlines()[:-1]
    lines.sort(key=lambda line: (line.rsplit(" ", 2)[0], float(line.rsplit(" ", 1)[1])))
    text.write_text("\n".join([*lines, "# EOF"]) + "\n", encoding="utf-8")
    done = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(text), str(data)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@contextlib.contextmanager
def serving(nodes: list[Node]) -> Iterator[None]:
    """Each node's fleet profile (and, without the parameter, its whole curve) on its own address."""
    servers = []

    def handler(node: Node) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                profile = query.get("profile", ["node"])[0]
                body, content_type = render_state(node.state, "", backend="torch", profile=profile)  # type: ignore[arg-type]
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                del format, args

        return Handler

    try:
        for node in nodes:
            server = http.server.ThreadingHTTPServer((node.address, node.port), handler(node))
            servers.append(server)
            threading.Thread(target=server.serve_forever, daemon=True).start()
        yield
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


class Prometheus:
    """A real Prometheus on a free loopback port with ``config``; stopped by ``stop``."""

    def __init__(self, name: str, config: dict[str, Any], data: Path, work: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        path = work / f"{name}.yml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log = work / f"{name}.log"
        self.process = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={path}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as answer:
            return list(json.loads(answer.read())["data"]["result"])

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        wait_until(condition, timeout, what, process=self.process, logs=self.log.read_text)

    def stop(self) -> None:
        stop_process(self.process)


def shard_config(index: int, nodes: list[Node], work: Path) -> dict[str, Any]:
    """deploy/prometheus/fleet/shard.yml for shard ``index``, every node as a target, 2 s scrapes."""
    config = yaml.safe_load((LAYOUT / "shard.yml").read_text(encoding="utf-8"))
    config["global"] = {"scrape_interval": "2s", "evaluation_interval": "5s", "external_labels": {"shard": str(index)}}
    config["rule_files"] = [str(rule_files_every(work, "5s")[0])]  # rules.yml, every group every 5 s
    (job,) = config["scrape_configs"]
    job.update(scrape_interval="2s", scrape_timeout="2s")
    job["static_configs"] = [{"targets": [f"{node.address}:{node.port}" for node in nodes]}]
    hashmod, keep = job["relabel_configs"][:2]
    hashmod["modulus"] = SHARDS
    keep["regex"] = str(index)
    return config


def global_config(shards: list[Prometheus], work: Path) -> dict[str, Any]:
    """deploy/prometheus/fleet/global.yml over ``shards``, 2 s federation."""
    config = yaml.safe_load((LAYOUT / "global.yml").read_text(encoding="utf-8"))
    config["global"] = {"scrape_interval": "2s", "evaluation_interval": "5s"}
    config["rule_files"] = [str(rule_files_every(work, "5s")[1])]  # fleet-rules.yml, every group every 5 s
    (job,) = config["scrape_configs"]
    job.update(scrape_interval="2s", scrape_timeout="2s")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{shard.port}" for shard in shards]}]
    return config


def _firing(prometheus: Prometheus, alert: str) -> set[str]:
    found = prometheus.query(f'ALERTS{{alertname="{alert}",alertstate="firing"}}')
    return {sample["metric"]["instance"] for sample in found}


def test_two_shards_and_a_global_tier_fire_each_alert_where_it_belongs_and_keep_the_curve_off_the_global(
    tmp_path: Path,
) -> None:
    """Issue 52: a drift planted on one node fires on the shard that scrapes it (and not on the other), a fleet
    outlier fires on the global tier, no per-point series reaches the global tier (nor the shards: they scrape the
    fleet profile), and a shard's nodes cost at most 30 series a GPU plus 40 a node, counted by the shard itself."""
    with socket.socket() as probe:  # a port free on the first node's address: the others are as unused
        probe.bind((_address(0), 0))
        port = probe.getsockname()[1]
    end = time.time()
    nodes = nodes_at(end, port)
    owner = [shard_of(f"{node.address}:{node.port}", SHARDS) for node in nodes]
    assert set(owner) == set(range(SHARDS)), "every shard must get nodes for the test to say anything"
    started: list[Prometheus] = []
    with serving(nodes):
        try:
            shards = []
            for index in range(SHARDS):
                data = tmp_path / f"shard-{index}"
                write_blocks([n for n, o in zip(nodes, owner, strict=True) if o == index], end, data, tmp_path)
                shards.append(Prometheus(f"shard-{index}", shard_config(index, nodes, tmp_path), data, tmp_path))
                started.append(shards[-1])
            top = Prometheus("global", global_config(shards, tmp_path), tmp_path / "global", tmp_path)
            started.append(top)

            planted = nodes[PLANTED].instance
            home = shards[owner[PLANTED]]
            home.wait_for(lambda: planted in _firing(home, "MatmulCrossoverDrift"), "the planted drift on its shard")
            outlier = nodes[OUTLIER].instance
            top.wait_for(lambda: outlier in _firing(top, "MatmulCrossoverFleetOutlier"), "the fleet outlier")

            for index, shard in enumerate(shards):
                firing = _firing(shard, "MatmulCrossoverDrift")
                assert firing <= {n.instance for n, o in zip(nodes, owner, strict=True) if o == index}
                assert (planted in firing) == (index == owner[PLANTED])
                scraped = shard.query("scrape_samples_post_metric_relabeling")
                assert len(scraped) == owner.count(index)  # its share of the targets, no more
                assert max(float(s["value"][1]) for s in scraped) <= 30 * GPUS + 40
                assert shard.query('count({__name__="matmul_duration_seconds"})') == []
            assert _firing(top, "MatmulCrossoverFleetOutlier") == {outlier}
            # Every series of a node on the global tier (its own alerts aside) is federated: the peer series alone.
            kept = top.query('{__name__!~"ALERTS.*", job="crossover-monitor", instance!=""}')
            names = {sample["metric"]["__name__"] for sample in kept}
            assert names == {"instance_gpu:matmul_crossover_size:peer"}
            per_point = {spec.exposed_name for spec in METRICS.values() if not spec.fleet}
            assert names & per_point == set()
            federated = top.query('count by (instance) ({__name__="instance_gpu:matmul_crossover_size:peer"})')
            assert max(float(s["value"][1]) for s in federated) <= 2 * GPUS  # the global tier: 2 series a GPU
        finally:
            for prometheus in started:
                prometheus.stop()
