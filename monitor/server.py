"""The HTTP endpoints: /metrics, /healthz (alive) and /readyz (has results to serve)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from monitor.httpserver import HttpLimits, HttpServer, Request, Response
from monitor.metrics import Registry, render

log = logging.getLogger(__name__)

# (ok, a one-line explanation) for the health and readiness probes.
Probe = Callable[[], tuple[bool, str]]

_INDEX = b"""<html><head><title>crossover-monitor</title></head><body>
<h1>crossover-monitor</h1>
<p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a> &middot; <a href="/readyz">/readyz</a></p>
</body></html>
"""


class MetricsServer:
    """Serves the registry and the probes (monitor/httpserver.py does the HTTP)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: Registry,
        *,
        healthy: Probe,
        ready: Probe,
        limits: HttpLimits | None = None,
    ) -> None:
        routes: dict[str, Callable[[Request], Response]] = {
            "/metrics": lambda request: _metrics(registry, request),
            "/healthz": lambda _: _probe(healthy),
            "/readyz": lambda _: _probe(ready),
            "/": lambda _: Response(status=200, body=_INDEX, content_type="text/html; charset=utf-8"),
        }

        def handle(request: Request) -> Response:
            route = routes.get(request.path)
            if route is None:
                return Response(status=404, body=b"not found: try /metrics, /healthz or /readyz\n")
            if request.method not in ("GET", "HEAD"):
                return Response(status=405, body=b"only GET and HEAD here\n", headers=(("Allow", "GET, HEAD"),))
            return route(request)

        self._http = HttpServer(host, port, handle, limits=limits)  # raises OSError if the address is taken

    @property
    def address(self) -> tuple[str, int]:
        return self._http.address

    def start(self) -> None:
        self._http.start()

    def stop(self) -> None:
        self._http.stop()


def _metrics(registry: Registry, request: Request) -> Response:
    try:
        body, content_type = render(registry, request.header("accept"))
    except Exception:  # a bug in rendering must answer 500, not drop the connection
        log.exception("rendering /metrics failed")
        return Response(status=500, body=b"internal error rendering metrics; see the service log\n")
    return Response(status=200, body=body, content_type=content_type)


def _probe(probe: Probe) -> Response:
    ok, message = probe()
    return Response(status=200 if ok else 503, body=(message + "\n").encode())
