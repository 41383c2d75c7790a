"""The HTTP endpoints on a real socket, with probes and registry passed in."""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crossover_monitor.http.httpserver import Request
from crossover_monitor.http.server import Lifecycle, _MetricsCache
from crossover_monitor.metrics import Profile, render_state
from crossover_monitor.model import ServiceState, SweepOutcome, SweepResult
from crossover_monitor.service.state import StateStore
from tests.browser import browse
from tests.guardfakes import IDLE, sweep_with
from tests.service import RunningService, fake_config, http_get, parse, started_server


def _broken_state() -> ServiceState:
    raise RuntimeError("boom")


@pytest.fixture
def broken_server() -> Iterator[str]:
    server = started_server(_broken_state, backend="tensorflow", ready=lambda: (False, "not yet"))
    host, port = server.address
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_a_rendering_error_answers_500_and_the_server_keeps_serving(broken_server: str) -> None:
    """A bug while rendering /metrics gives HTTP 500 (not a dropped connection); the probes still answer."""
    status, _, body = http_get(broken_server + "/metrics")
    assert status == 500
    assert "internal error" in body
    status, _, body = http_get(broken_server + "/healthz")
    assert (status, body) == (200, "ok\n")
    status, _, body = http_get(broken_server + "/readyz")
    assert (status, body) == (503, "not yet\n")
    assert http_get(broken_server + "/metrics")[0] == 500


def test_the_probes_answer_at_prometheus_paths_too(broken_server: str) -> None:
    """/-/healthy and /-/ready, as Prometheus and its exporters spell them, answer as /healthz and /readyz do."""
    assert http_get(broken_server + "/-/healthy")[:3:2] == (200, "ok\n")
    assert http_get(broken_server + "/-/ready")[:3:2] == (503, "not yet\n")
    status, _, body = http_get(broken_server + "/nowhere")
    assert status == 404
    assert "/-/healthy" in body


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/-/healthy", "/-/ready", "/"])
def test_head_answers_like_get_without_a_body(path: str) -> None:
    """HEAD gets GET's status, type and length (it was 501), and no body."""
    import http.client  # noqa: PLC0415

    server = started_server(ServiceState, backend="tensorflow", ready=lambda: (False, "not yet"))
    host, port = server.address
    try:
        connection = http.client.HTTPConnection(host, port, timeout=5)
        connection.request("GET", path)
        got = connection.getresponse()
        body = got.read()
        connection.request("HEAD", path)
        head = connection.getresponse()
        assert head.read() == b""
        assert head.status == got.status
        assert head.getheader("Content-Type") == got.getheader("Content-Type")
        assert int(head.getheader("Content-Length") or -1) == len(body) > 0
        connection.close()
    finally:
        server.stop()


class _CountedRendering:
    """The real rendering, counting the states it rendered (the server's input, as the service passes one)."""

    def __init__(self) -> None:
        self.rendered: list[ServiceState] = []

    def __call__(self, state: ServiceState, exposition: str, *, profile: Profile) -> tuple[bytes, str]:
        self.rendered.append(state)
        return render_state(state, exposition, backend="torch", profile=profile)


def test_metrics_are_rendered_once_per_state_not_once_per_scrape() -> None:
    """Scrapes of an unchanged state share one rendering; a new state (or next-sweep time) renders again."""
    reads: list[int] = []
    current = [ServiceState()]

    def read_state() -> ServiceState:
        reads.append(1)
        return current[0]

    rendering = _CountedRendering()
    server = started_server(read_state, render_metrics=rendering)
    try:
        host, port = server.address
        bodies = {http_get(f"http://{host}:{port}/metrics")[2] for _ in range(5)}
        assert (len(bodies), len(rendering.rendered)) == (1, 1)
        # Any number of Accept variants share the few exposition formats: no body per header.
        for index in range(20):
            http_get(f"http://{host}:{port}/metrics", {"Accept": f"text/plain;x={index}"})
        assert len(rendering.rendered) == 1
        current[0] = ServiceState(next_sweep_at=123.0)
        changed = http_get(f"http://{host}:{port}/metrics")[2]
        assert len(rendering.rendered) == 2
        assert "matmul_sweep_next_timestamp_seconds 123.0" in changed
        assert len(reads) == 5 + 20 + 1  # each scrape read the state once: the rendering was handed that one
        assert all(state is current[0] for state in rendering.rendered[1:])
    finally:
        server.stop()


def test_a_scrape_after_a_new_outcome_shows_its_values_not_the_kept_body() -> None:
    """The served state, a sweep and the next sweep's time recorded between scrapes: each scrape shows the state now."""
    store = StateStore()
    server = started_server(store.read)
    url = "http://{}:{}/metrics".format(*server.address)

    def scraped() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        status, _, body = http_get(url)
        assert status == 200
        return parse(body)

    try:
        before = scraped()
        assert before[("matmul_sweeps_total", frozenset({("result", "success")}))] == 0
        assert not any(name == "matmul_duration_seconds" for name, _ in before)
        _, outcome = sweep_with(lambda _: IDLE)
        store.record(outcome)
        after = scraped()
        assert after[("matmul_sweeps_total", frozenset({("result", "success")}))] == 1
        assert any(name == "matmul_duration_seconds" for name, _ in after)
        store.record_next_sweep(4102444800.0)
        assert scraped()[("matmul_sweep_next_timestamp_seconds", frozenset())] == 4102444800.0
        store.record(SweepOutcome(result=SweepResult.FAILED, started_at=1.0, finished_at=2.0, reason="crashed"))
        assert scraped()[("matmul_sweeps_total", frozenset({("result", "failed")}))] == 1
    finally:
        server.stop()


def test_accept_headers_with_endless_versions_share_two_renderings() -> None:
    """Issue 18 #3: each new ``version=`` once made a body of its own in the cache (RSS grew ~10 KB a scrape)."""
    state = ServiceState()
    rendering = _CountedRendering()
    server = started_server(lambda: state, render_metrics=rendering)
    try:
        host, port = server.address
        kinds = set()
        for index in range(60):
            accept = f"application/openmetrics-text; version=1.{index}.{index % 7}"
            status, content_type, _ = http_get(f"http://{host}:{port}/metrics", {"Accept": accept})
            kinds.add(content_type)
            http_get(f"http://{host}:{port}/metrics", {"Accept": f"text/plain; version=0.0.{index}"})
        assert status == 200
        assert kinds == {"application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=underscores"}
        assert len(rendering.rendered) == 2  # one rendering per exposition, whatever the headers
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("accept", "openmetrics"),
    [
        ("application/openmetrics-text; version=abc", False),  # once a 500 and a logged traceback
        ("application/openmetrics-text; version=1.1.\xff", True),  # once a dropped connection
        ("application/openmetrics-text;q=0, text/plain;q=0.5", False),  # q=0 refuses it
        ("application/openmetrics-text; version=1.0.0; q=0.5, text/plain; version=0.0.4; q=0.2", True),
        ("text/plain;q=0.9, application/openmetrics-text;q=0.5", False),
        ("application/json", False),  # nothing we speak: the text format, as exporters answer
        ("application/openmetrics-text; version=2.0.0", False),  # a version not spoken here
    ],
)
def test_odd_accept_headers_get_a_normal_answer(accept: str, openmetrics: bool) -> None:
    """Odd Accept headers get a 200 (never a 500 or a dropped connection): OpenMetrics only where it is acceptable."""
    server = started_server(ServiceState)
    try:
        host, port = server.address
        status, content_type, body = http_get(f"http://{host}:{port}/metrics", {"Accept": accept})
        assert status == 200
        assert content_type.startswith("application/openmetrics-text" if openmetrics else "text/plain")
        assert body.endswith("# EOF\n") == openmetrics
    finally:
        server.stop()


def test_the_process_series_are_served_fresh_beside_the_kept_state_body(tmp_path: Path) -> None:
    """Issue 35: process_cpu_seconds_total, process_resident_memory_bytes, process_start_time_seconds (and
    client_python's other process and platform series) in both expositions of the real service, OpenMetrics'
    # EOF last and once; the state's body is kept per state, the process's series at most 1 s old."""
    service = RunningService(tmp_path, fake_config())
    try:
        service.wait_for_sweeps("success", 1)
        samples = service.scrape()
        started = samples[("process_start_time_seconds", frozenset())]
        assert time.time() - 120 < started <= time.time()
        assert samples[("process_resident_memory_bytes", frozenset())] > 10e6
        assert ("process_cpu_seconds_total", frozenset()) in samples
        assert any(name == "python_info" for name, _ in samples)
        openmetrics = service.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})[2]
        assert openmetrics.endswith("# EOF\n")
        assert openmetrics.count("# EOF") == 1
        assert "process_cpu_seconds_total " in openmetrics
    finally:
        service.stop()
    now = [0.0]
    renders: list[int] = []

    def render(state: ServiceState, kind: str, *, profile: Profile) -> tuple[bytes, str]:
        renders.append(1)
        return b"state 1\n", "text/plain"

    cache = _MetricsCache(
        lambda: SAME, render, add_process=lambda body, _: body + f"cpu {now[0]}\n".encode(), clock=lambda: now[0]
    )
    request = Request(method="GET", target="/metrics", headers=(), body=b"", peer="x")
    first = cache.response(request)
    now[0] = 0.5
    assert cache.response(request) is first  # scrapers arriving together share one answer
    now[0] = 1.5
    later = cache.response(request)
    assert later.body == b"state 1\ncpu 1.5\n"
    assert len(renders) == 1  # the state's body kept, the process's series new


SAME = ServiceState()


class _Calls:
    """A lifecycle that records what it was asked to do and always does it."""

    def __init__(self) -> None:
        self.made: list[str] = []
        self.lifecycle = Lifecycle(reload=lambda: self._do("reload"), sweep=lambda: self._do("sweep"))

    def _do(self, what: str) -> tuple[bool, str]:
        self.made.append(what)
        return True, f"{what} started"


def _post(address: tuple[str, int], path: str, headers: dict[str, str], body: str = "") -> tuple[int, str]:
    connection = http.client.HTTPConnection(*address, timeout=5)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_lifecycle_posts_from_another_site_get_403_and_those_without_browser_headers_or_same_origin_pass() -> None:
    """Issue 51 N5: with --web.enable-lifecycle a page of another site could start sweeps and reloads from an
    operator's browser (202); a request whose Origin or Sec-Fetch-Site says another site now gets 403, while
    curl and config-reloader sidecars (neither header) and the server's own origin still pass."""
    calls = _Calls()
    server = started_server(ServiceState, lifecycle=calls.lifecycle)
    host, port = server.address
    own = f"http://{host}:{port}"
    form = "application/x-www-form-urlencoded"
    cases: list[tuple[dict[str, str], bool]] = [
        ({"Origin": "http://evil"}, False),
        ({"Origin": "null"}, False),
        ({"Origin": "http://evil", "Content-Type": "text/plain"}, False),
        ({"Origin": "http://evil", "Content-Type": form, "Sec-Fetch-Site": "cross-site"}, False),
        ({"Origin": f"http://{host}:{port + 1}"}, False),  # another port is another origin
        ({"Origin": f"http://localhost:{port}", "Sec-Fetch-Site": "same-site"}, False),
        ({"Origin": own, "Sec-Fetch-Site": "cross-site"}, False),  # a browser's own word on the site decides
        ({}, True),  # curl, a config-reloader sidecar
        ({"Content-Type": form}, True),
        ({"Origin": own}, True),
        ({"Origin": "https://proxy.example", "Sec-Fetch-Site": "same-origin"}, True),  # behind a proxy
        ({"Sec-Fetch-Site": "none"}, True),  # typed or bookmarked by the user
    ]
    try:
        for path, done in (("/-/sweep", 202), ("/-/reload", 200)):
            calls.made.clear()
            got = [_post(server.address, path, headers, body="a=b")[0] for headers, _ in cases]
            assert got == [done if passes else 403 for _, passes in cases], path
            assert len(calls.made) == sum(passes for _, passes in cases)
        body = _post(server.address, "/-/sweep", {"Origin": "http://evil"})[1]
        assert "another site" in body
        assert "Origin: http://evil" in body
        # Reading is not changing: a cross-site GET is answered as before (a dashboard's link, an <img>).
        assert http_get(own + "/healthz", {"Origin": "http://evil", "Sec-Fetch-Site": "cross-site"})[0] == 200
    finally:
        server.stop()


class _AttackPage(http.server.BaseHTTPRequestHandler):
    """Another site's page that, once opened, posts to the monitor's lifecycle API as a page can: a no-cors
    fetch to /-/reload, then a plain-text form to /-/sweep (neither needs CORS' consent)."""

    target = ""

    def do_GET(self) -> None:
        page = f"""<!doctype html><html><body>
<form id="f" method="post" enctype="text/plain" action="{self.target}/-/sweep"><input name="a" value="b"></form>
<script>
fetch("{self.target}/-/reload", {{method: "POST", mode: "no-cors", body: "a=b"}})
  .catch(() => {{}}).finally(() => document.getElementById("f").submit());
</script></body></html>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.mark.slow
def test_a_page_of_another_site_in_a_real_browser_cannot_start_a_sweep_or_a_reload(tmp_path: Path) -> None:
    """Issue 51 N5: a page of another site opened in Chromium started a sweep with a plain-text form and a
    reload with a no-cors fetch (202, 200); both are now refused (403) and nothing runs."""
    calls = _Calls()
    server = started_server(ServiceState, lifecycle=calls.lifecycle)
    host, port = server.address
    _AttackPage.target = f"http://{host}:{port}"
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AttackPage)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    try:
        page = browse(
            f"http://evil.test:{attacker.server_address[1]}/",
            tmp_path / "profile",
            "--host-resolver-rules=MAP evil.test 127.0.0.1",  # the other site, by a name of its own
        )
    finally:
        attacker.shutdown()
        attacker.server_close()
        server.stop()
    assert "refused: a request from another site" in page, page  # the form's answer, shown
    assert calls.made == []
