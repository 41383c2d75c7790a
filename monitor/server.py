"""The HTTP endpoints: /metrics, /healthz (alive) and /readyz (has results to serve)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import AF_INET6

from monitor.metrics import Registry, render

log = logging.getLogger(__name__)

# (ok, a one-line explanation) for the health and readiness probes.
Probe = Callable[[], tuple[bool, str]]

_INDEX = b"""<html><head><title>crossover-monitor</title></head><body>
<h1>crossover-monitor</h1>
<p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a> &middot; <a href="/readyz">/readyz</a></p>
</body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The standard library's listen backlog is 5: fifty scrapers at once waited for SYN retransmits (1, 3,
    # 7, 15 s). The kernel caps this at net.core.somaxconn.
    request_queue_size = 128


class MetricsServer:
    """Serves the registry and the probes on a background thread."""

    def __init__(self, host: str, port: int, registry: Registry, *, healthy: Probe, ready: Probe) -> None:
        handler = _handler(registry, healthy, ready)
        server_class = type("_Server6", (_Server,), {"address_family": AF_INET6}) if ":" in host else _Server
        self._httpd = server_class((host, port), handler)  # raises OSError if the address is taken
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never ran if not started
            self._httpd.shutdown()
        self._httpd.server_close()


def _handler(registry: Registry, healthy: Probe, ready: Probe) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "crossover-monitor"

        def do_HEAD(self) -> None:
            """What GET would answer, headers only (load balancers and uptime checks ask this way)."""
            self._head_only = True
            try:
                self.do_GET()
            finally:
                self._head_only = False  # a kept-alive connection's next GET gets its body

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body, content_type = render(registry, self.headers.get("Accept"))
                except Exception:  # a bug in rendering must answer 500, not drop the connection
                    log.exception("rendering /metrics failed")
                    self._send(500, b"internal error rendering metrics; see the service log\n", "text/plain")
                    return
                self._send(200, body, content_type)
            elif path in ("/healthz", "/readyz"):
                ok, message = (healthy if path == "/healthz" else ready)()
                self._send(200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8")
            elif path == "/":
                self._send(200, _INDEX, "text/html; charset=utf-8")
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not getattr(self, "_head_only", False):
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            log.debug("http: %s", format % args)

    return Handler
