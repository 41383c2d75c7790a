"""A real HTTP server on loopback that answers as a test tells it: a hostile or odd service for clients to meet."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def serving(body: str) -> Iterator[str]:
    """A real HTTP server on loopback that answers every GET with ``body`` as a Prometheus text exposition."""

    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        reply(handler, body.encode())

    with server(answer) as base:
        yield f"{base}/metrics"


def reply(handler: http.server.BaseHTTPRequestHandler, data: bytes, content_type: str = "text/plain") -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def server(answer: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A real HTTP server on loopback whose every GET ``answer`` handles; its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with contextlib.suppress(OSError):  # the client gave up (the point of several tests)
                answer(self)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def drip(seconds: int) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """Headers, then a byte a second for ``seconds``: every read is within any per-read timeout."""

    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.end_headers()
        for _ in range(seconds):
            handler.wfile.write(b"#")
            handler.wfile.flush()
            time.sleep(1)

    return answer


def flood(handler: http.server.BaseHTTPRequestHandler) -> None:
    """600 MiB of comment lines, as fast as the client reads."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Content-Length", str(600 << 20))
    handler.end_headers()
    chunk = (b"# " + b"x" * 1021 + b"\n") * 1024
    for _ in range(600):
        handler.wfile.write(chunk)


def redirect_to(target: str) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """A 302 to ``target``."""

    def answer(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(302)
        handler.send_header("Location", target)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer
