"""The HTTP endpoints: /metrics, /-/healthy (alive), /-/ready (has results to serve), and the lifecycle API.

/healthz and /readyz answer the same as /-/healthy and /-/ready (Kubernetes' spelling, and this service's first).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from crossover_monitor.http.httpserver import Gate, HttpLimits, HttpServer, Request, Response
from crossover_monitor.http.page import Picture, PictureState
from crossover_monitor.http.webconfig import WebGate
from crossover_monitor.metrics import PROFILES, Profile, exposition_type
from crossover_monitor.model import ServiceState

log = logging.getLogger(__name__)

# (ok, a one-line explanation) for the health and readiness probes.
Probe = Callable[[], tuple[bool, str]]


class RenderMetrics(Protocol):
    """/metrics of one state in one exposition and profile (``crossover_monitor.metrics.render_state``): body and
    content type."""

    def __call__(self, state: ServiceState, exposition: str, /, *, profile: Profile) -> tuple[bytes, str]: ...


PROCESS_FRESH_S = 1.0  # the process's own series in a /metrics answer are at most this old


@dataclass(frozen=True)
class Lifecycle:
    """What POST /-/reload and POST /-/sweep do (only with --web.enable-lifecycle): (done, a line to answer)."""

    reload: Callable[[], tuple[bool, str]]
    sweep: Callable[[], tuple[bool, str]]


# The probes answer without credentials: Kubernetes probes and the image's HEALTHCHECK cannot send them,
# and they tell only whether the service is alive and ready (and why not).
_OPEN_PATHS = ("/-/healthy", "/-/ready", "/healthz", "/readyz")


class MetricsServer:
    """The endpoints: /metrics, the probes, the landing page and the lifecycle API; httpserver.py does HTTP."""

    def __init__(
        self,
        host: str,
        port: int,
        read_state: Callable[[], ServiceState],
        *,
        render_metrics: RenderMetrics,
        healthy: Probe,
        ready: Probe,
        landing: Callable[[], str],
        web: WebGate | None = None,
        lifecycle: Lifecycle | None = None,
        picture: Callable[[], Picture] | None = None,
        limits: HttpLimits | None = None,
        add_process: Callable[[bytes, str], bytes] | None = None,
    ) -> None:
        """``add_process``: the process's own series added to a body (``metrics.with_process_metrics``)."""
        gate = web or WebGate(None)
        metrics = _MetricsCache(read_state, render_metrics, add_process=add_process)
        gets: dict[str, Callable[[Request], Response]] = {
            "/metrics": metrics.response,
            "/-/healthy": lambda _: _probe(healthy),
            "/-/ready": lambda _: _probe(ready),
            "/healthz": lambda _: _probe(healthy),
            "/readyz": lambda _: _probe(ready),
            "/": lambda _: Response(status=200, body=landing().encode(), content_type="text/html; charset=utf-8"),
            "/sweep.svg": lambda _: _svg(picture() if picture else Picture(PictureState.NONE)),
        }
        posts: dict[str, Callable[[], tuple[bool, str]]] = (
            {"/-/reload": lifecycle.reload, "/-/sweep": lifecycle.sweep} if lifecycle is not None else {}
        )

        def handle(request: Request) -> Response:
            path = request.path
            if path in ("/-/reload", "/-/sweep"):
                done, refused = (202, 409) if path == "/-/sweep" else (200, 400)
                return _lifecycle(request, posts.get(path), done=done, refused=refused)
            route = gets.get(path)
            if route is None:
                return Response(status=404, body=b"not found: try /metrics, /-/healthy or /-/ready\n")
            if request.method not in ("GET", "HEAD"):
                return Response(status=405, body=b"only GET and HEAD here\n", headers=(("Allow", "GET, HEAD"),))
            return route(request)

        # Raises OSError if the address is taken.
        self._http = HttpServer(
            host,
            port,
            handle,
            limits=limits,
            tls=gate.tls_context if gate.tls else None,
            extra_headers=gate.headers,
            tick=gate.refresh,
            gate=_auth_gate(gate),
        )
        self._web = gate

    @property
    def address(self) -> tuple[str, int]:
        return self._http.address

    def start(self) -> None:
        self._http.start()

    def stop(self) -> None:
        self._http.stop()
        self._web.close()


def _auth_gate(web: WebGate) -> Gate:
    """Basic auth for every path but the probes."""

    def refused(request: Request) -> Response:
        web.refused(request.header("authorization"), request.peer, request.path)
        challenge = ("WWW-Authenticate", 'Basic realm="crossover-monitor", charset="UTF-8"')
        return Response(status=401, body=b"unauthorized\n", headers=(challenge,))

    return Gate(
        quick=lambda r: True if r.path in _OPEN_PATHS else web.quick(r.header("authorization")),
        slow=lambda r: web.check(r.header("authorization")),
        refused=refused,
    )


def _lifecycle(request: Request, action: Callable[[], tuple[bool, str]] | None, *, done: int, refused: int) -> Response:
    if action is None:
        return Response(status=403, body=b"the lifecycle API is off; start the service with --web.enable-lifecycle\n")
    if request.method != "POST":
        return Response(status=405, body=b"POST only\n", headers=(("Allow", "POST"),))
    ok, message = action()
    return Response(status=done if ok else refused, body=(message + "\n").encode())


# What /sweep.svg answers while there is no picture to send: status and body.
_NO_PICTURE: dict[PictureState, tuple[int, bytes]] = {
    PictureState.FAILED: (500, b"the chart of the latest sweep could not be drawn; the service's log says why\n"),
    PictureState.NONE: (404, b"no picture: no sweep has completed yet\n"),
}


def _svg(picture: Picture) -> Response:
    if picture.state is PictureState.DRAWN and picture.svg is not None:
        return Response(status=200, body=picture.svg, content_type="image/svg+xml")
    status, body = _NO_PICTURE.get(picture.state, _NO_PICTURE[PictureState.FAILED])
    return Response(status=status, body=body)


class _MetricsCache:
    """/metrics rendered once per state, not once per scrape: fifty scrapers at once cost one rendering.

    Each scrape reads the state once and is answered from that object alone. The body is kept with
    the state it shows and given again only for that very object (``is``): the service replaces
    the state whole on every change, the next sweep's time included, so a kept body is never stale.
    """

    def __init__(
        self,
        read_state: Callable[[], ServiceState],
        render_metrics: RenderMetrics,
        *,
        add_process: Callable[[bytes, str], bytes] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_state = read_state
        self._render = render_metrics
        self._add_process = add_process
        self._clock = clock
        self._lock = threading.Lock()
        self._state: ServiceState | None = None
        # By profile and exposition: four at most, whatever clients send.
        self._bodies: dict[tuple[Profile, str], Response] = {}
        # The whole answer (state and process series) by profile and exposition, and when it was made: scrapers
        # arriving together share it, and the process's series are never older than PROCESS_FRESH_S.
        self._answers: dict[tuple[Profile, str], tuple[Response, float]] = {}

    def response(self, request: Request) -> Response:
        profile = _profile(request)
        if isinstance(profile, Response):
            return profile
        kind = (profile, exposition_type(request.header("accept")))
        try:
            state = self._read_state()
            with self._lock:
                cached = self._bodies.get(kind) if state is self._state else None
                answer = self._answers.get(kind) if state is self._state else None
            now = self._clock()
            if answer is not None and now - answer[1] < PROCESS_FRESH_S:
                return answer[0]
            if cached is None:
                body, content_type = self._render(state, kind[1], profile=profile)
                cached = Response(status=200, body=body, content_type=content_type)
            full = cached
            if self._add_process is not None:
                full = dataclasses.replace(cached, body=self._add_process(cached.body, kind[1]))
        except Exception:  # a bug in rendering must answer 500, not drop the connection
            log.exception("rendering /metrics failed")
            return Response(status=500, body=b"internal error rendering metrics; see the service log\n")
        with self._lock:
            if state is not self._state:
                self._state, self._bodies, self._answers = state, {}, {}
            self._bodies[kind] = cached
            self._answers[kind] = (full, now)
        return full


def _profile(request: Request) -> Profile | Response:
    """The profile a scrape asks for (`?profile=fleet`; `node`, every series, without one), or the 400 answering a
    query that names none of them."""
    _, _, query = request.target.partition("?")
    asked = urllib.parse.parse_qs(query).get("profile", ["node"])
    if len(asked) == 1 and asked[0] in PROFILES:
        return asked[0]
    shown = ", ".join(repr(name) for name in asked)
    known = " or ".join(PROFILES)
    return Response(
        status=400, body=f"unknown profile {shown}: ask for {known} (node, every series, without one)\n".encode()
    )


def _probe(probe: Probe) -> Response:
    ok, message = probe()
    return Response(status=200 if ok else 503, body=(message + "\n").encode())
