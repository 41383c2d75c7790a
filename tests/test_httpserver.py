"""The HTTP server against real sockets: slow, silent and greedy clients, HEAD, gzip, limits, a clean stop."""

from __future__ import annotations

import gc
import gzip
import http.client
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from monitor.httpserver import HttpLimits, HttpServer, Request, Response

BIG = b"matmul_duration_seconds 1.0\n" * 200
LIMITS = HttpLimits(request_timeout_s=1.0, idle_timeout_s=1.0, max_connections=16, workers=2, stop_timeout_s=2.0)


class Slow:
    """A handler whose /slow answer waits until released: a connection busy being answered."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def __call__(self, request: Request) -> Response:
        if request.path == "/slow":
            self.entered.release()
            self.release.wait(10)
        if request.path == "/big":
            return Response(status=200, body=BIG)
        if request.path == "/huge":
            return Response(status=200, body=b"x" * (4 << 20))
        if request.path == "/echo":
            return Response(status=200, body=request.body)
        return Response(status=200 if request.path in ("/", "/slow") else 404, body=b"ok\n")


@pytest.fixture
def slow() -> Slow:
    return Slow()


@pytest.fixture
def server(slow: Slow) -> Iterator[HttpServer]:
    running = HttpServer("127.0.0.1", 0, slow, limits=LIMITS)
    running.start()
    yield running
    slow.release.set()
    running.stop()


def get(server: HttpServer, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    client = http.client.HTTPConnection(*server.address, timeout=5)
    try:
        client.request(method, path, headers=headers)
        response = client.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        client.close()


def connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(server.address, timeout=10)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``sock`` within ``seconds`` (reads return EOF or reset)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_head_gzip_and_not_found(server: HttpServer) -> None:
    status, headers, body = get(server, "/big", "HEAD")
    assert (status, headers["content-length"], body) == (200, str(len(BIG)), b"")
    status, headers, body = get(server, "/big", **{"Accept-Encoding": "gzip"})
    assert headers["content-encoding"] == "gzip"
    assert gzip.decompress(body) == BIG
    assert get(server, "/big")[2] == BIG  # not asked: not compressed
    assert get(server, "/big", **{"Accept-Encoding": "gzip;q=0, identity"})[2] == BIG  # refused: not compressed
    assert get(server, "/")[1].get("content-encoding") is None  # too small to be worth it
    assert get(server, "/nowhere")[0] == 404


def test_silent_and_slowloris_clients_are_closed_at_the_deadline_while_others_are_served(server: HttpServer) -> None:
    silent = [connect(server) for _ in range(5)]
    trickling = connect(server)
    trickling.sendall(b"GET / HTTP/1.1\r\n")
    began = time.monotonic()
    for _ in range(3):  # a byte now and then: the deadline is for the whole head, not between bytes
        assert get(server, "/")[0] == 200
        trickling.sendall(b"X")
        time.sleep(0.3)
    assert closed_within(trickling, LIMITS.request_timeout_s + 3)
    assert all(closed_within(sock, LIMITS.request_timeout_s + 3) for sock in silent)
    assert time.monotonic() - began < LIMITS.request_timeout_s + 4
    for sock in (*silent, trickling):
        sock.close()


def test_a_full_server_evicts_waiting_connections_for_new_ones(server: HttpServer) -> None:
    idle = [connect(server) for _ in range(LIMITS.max_connections)]
    time.sleep(0.2)
    for _ in range(5):  # each new client takes the place of the oldest silent one
        assert get(server, "/")[0] == 200
    assert server.connections <= LIMITS.max_connections
    assert closed_within(idle[0], 1)  # the oldest went first
    for sock in idle:
        sock.close()


def test_when_every_connection_is_busy_a_new_one_gets_503(slow: Slow) -> None:
    limits = HttpLimits(max_connections=2, workers=2, request_timeout_s=5)
    server = HttpServer("127.0.0.1", 0, slow, limits=limits)
    server.start()
    try:
        busy = [threading.Thread(target=get, args=(server, "/slow")) for _ in range(2)]
        for thread in busy:
            thread.start()
        for _ in busy:
            assert slow.entered.acquire(timeout=5)
        assert get(server, "/")[0] == 503
        slow.release.set()
        for thread in busy:
            thread.join(5)
        assert get(server, "/")[0] == 200
    finally:
        slow.release.set()
        server.stop()


def test_oversized_head_and_body_are_refused(server: HttpServer) -> None:
    status, _, _ = get(server, "/", **{"X-Padding": "a" * (LIMITS.max_header_bytes + 10)})
    assert status == 431
    client = http.client.HTTPConnection(*server.address, timeout=5)
    client.request("POST", "/echo", body=b"x" * (LIMITS.max_body_bytes + 1))
    assert client.getresponse().status == 413
    client.close()


def test_keep_alive_serves_several_requests_then_idles_out(server: HttpServer) -> None:
    client = http.client.HTTPConnection(*server.address, timeout=5)
    for _ in range(3):
        client.request("GET", "/")
        assert client.getresponse().read() == b"ok\n"
    assert client.sock is not None
    assert closed_within(client.sock, LIMITS.idle_timeout_s + 3)
    client.close()


def test_stop_lets_an_answer_in_progress_finish(slow: Slow) -> None:
    server = HttpServer("127.0.0.1", 0, slow, limits=LIMITS)
    server.start()
    answered: list[int] = []
    waiter = threading.Thread(target=lambda: answered.append(get(server, "/slow")[0]))
    waiter.start()
    assert slow.entered.acquire(timeout=5)
    threading.Timer(0.3, slow.release.set).start()
    server.stop()
    waiter.join(5)
    assert answered == [200]
    with pytest.raises(OSError):
        connect(server).recv(1)


def test_a_taken_port_is_an_oserror_at_construction(server: HttpServer, slow: Slow) -> None:
    with pytest.raises(OSError):
        HttpServer("127.0.0.1", server.address[1], slow)


def test_stop_leaves_no_task_behind(slow: Slow, caplog: pytest.LogCaptureFixture) -> None:
    """A started server with a periodic tick stops without asyncio's "Task was destroyed but it is pending"."""
    ticks: list[float] = []
    server = HttpServer("127.0.0.1", 0, slow, limits=LIMITS, tick=lambda: ticks.append(time.monotonic()))
    server.start()
    time.sleep(1.5)
    with caplog.at_level(logging.WARNING):
        server.stop()
        del server
        gc.collect()  # asyncio reports a task left pending when the task is collected
    assert ticks, "the tick never ran"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_stop_from_two_threads_at_once_is_safe(slow: Slow) -> None:
    """The service's signal path and its caller may both stop the server: neither raises."""
    server = HttpServer("127.0.0.1", 0, slow, limits=LIMITS)
    server.start()
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            server.stop()
        except BaseException as exc:  # any exception is the failure this test looks for
            errors.append(exc)

    stoppers = [threading.Thread(target=stop) for _ in range(4)]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(10)
    assert errors == []


@pytest.mark.slow  # about 50 s: a small receive window on loopback is slow, and the old bug needed one
def test_a_large_answer_arrives_whole_before_the_connection_closes(server: HttpServer) -> None:
    """Connection: close (HTTP/1.0 clients, urllib) gets every byte, not what fitted the buffer before close."""
    sock = connect(server)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    sock.sendall(b"GET /huge HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    sock.close()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    assert b"content-length: 4194304" in head.lower()
    assert len(body) == 4 << 20
