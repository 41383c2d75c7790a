"""The HTTP server against real sockets: slow, silent and greedy clients, HEAD, gzip, limits, a clean stop."""

from __future__ import annotations

import contextlib
import gc
import gzip
import http.client
import logging
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from crossover_monitor.http.httpserver import Gate, HttpLimits, HttpServer, Request, Response

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
        if request.path == "/render":  # a small answer that costs a millisecond of a handler thread
            time.sleep(0.001)
            return Response(status=200, body=b"m" * 2000)
        return Response(status=200 if request.path in ("/", "/slow", "/healthz") else 404, body=b"ok\n")


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


def _answer_to(sock: socket.socket) -> bytes:
    """Everything the server sends on ``sock`` until it closes (a reset ends it too), within 5 s."""
    sock.settimeout(5)
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def test_head_gzip_and_not_found(server: HttpServer) -> None:
    """HEAD answers headers only, gzip only when asked and worth it, and an unknown path is 404."""
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
    """Silent and trickling clients are closed at the request deadline while other clients are served meanwhile."""
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
    """At max_connections, each new client takes the place of the oldest idle connection."""
    idle = [connect(server) for _ in range(LIMITS.max_connections)]
    time.sleep(0.2)
    for _ in range(5):  # each new client takes the place of the oldest silent one
        assert get(server, "/")[0] == 200
    assert server.connections <= LIMITS.max_connections
    assert closed_within(idle[0], 1)  # the oldest went first
    for sock in idle:
        sock.close()


def test_when_every_connection_is_busy_a_new_one_gets_503(slow: Slow) -> None:
    """With every worker busy answering, a new request gets 503; once they finish, 200 again."""
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
    """A head over max_header_bytes is 431, a body over max_body_bytes 413."""
    status, _, _ = get(server, "/", **{"X-Padding": "a" * (LIMITS.max_header_bytes + 10)})
    assert status == 431
    client = http.client.HTTPConnection(*server.address, timeout=5)
    client.request("POST", "/echo", body=b"x" * (LIMITS.max_body_bytes + 1))
    assert client.getresponse().status == 413
    client.close()


def test_keep_alive_serves_several_requests_then_idles_out(server: HttpServer) -> None:
    """One kept-alive connection serves several requests, then is closed after the idle timeout."""
    client = http.client.HTTPConnection(*server.address, timeout=5)
    for _ in range(3):
        client.request("GET", "/")
        assert client.getresponse().read() == b"ok\n"
    assert client.sock is not None
    assert closed_within(client.sock, LIMITS.idle_timeout_s + 3)
    client.close()


def test_stop_lets_an_answer_in_progress_finish(slow: Slow) -> None:
    """stop() lets an answer in progress finish, then accepts no new connection."""
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
    """A port already taken is an OSError when the server is built, not later."""
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


def _raw(server: HttpServer, data: bytes, *, wait_s: float = 3.0) -> bytes:
    """Everything the server sends back for ``data`` until it closes (or ``wait_s`` of silence)."""
    sock = connect(server)
    sock.sendall(data)
    sock.settimeout(wait_s)
    received = bytearray()
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        pass
    finally:
        sock.close()
    return bytes(received)


def test_content_length_with_transfer_encoding_is_refused_and_the_smuggled_request_never_answered(
    server: HttpServer,
) -> None:
    """Issue 18 #7: h11 took the chunked body, kept the connection and answered the request hidden in it."""
    smuggled = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _raw(
        server,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n%s"
        % (5 + len(smuggled), smuggled),
    )
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert answer.count(b"HTTP/1.1 ") == 1  # closed after the refusal: nothing answered the smuggled GET
    assert b"connection: close" in answer.lower()


def test_expect_100_continue_is_answered_before_the_body() -> None:
    """Issue 18 #11: a client sending ``Expect: 100-continue`` waited a second (curl's default) for nothing."""
    running = HttpServer("127.0.0.1", 0, Slow(), limits=LIMITS)
    running.start()
    try:
        sock = connect(running)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
        sock.settimeout(5)  # the body is sent only once the 100 came: without one, this times out
        assert sock.recv(4096).startswith(b"HTTP/1.1 100 ")
        sock.sendall(b"abc")
        answer = b""
        while not answer.endswith(b"\r\n\r\nabc"):  # the head and the body may come in separate reads
            chunk = sock.recv(4096)
            assert chunk, answer
            answer += chunk
        sock.close()
    finally:
        running.stop()


def test_absolute_form_targets_and_gzip_weights_after_other_parameters(server: HttpServer) -> None:
    """Issue 18 #11: ``GET http://host/path`` once 404'd; ``gzip;x=1;q=0`` was still compressed."""
    answer = _raw(
        server, b"GET http://example.invalid/big?x=1 HTTP/1.1\r\nHost: example.invalid\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 200")
    assert answer.endswith(BIG)
    assert get(server, "/big", **{"Accept-Encoding": "gzip;x=1;q=0"})[1].get("content-encoding") is None
    assert get(server, "/big", **{"Accept-Encoding": "gzip;q=0, *"})[1].get("content-encoding") is None
    assert get(server, "/big", **{"Accept-Encoding": "br, *;q=0.5"})[1].get("content-encoding") == "gzip"


def test_stop_with_a_kept_alive_connection_logs_no_traceback(slow: Slow, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18 #11: stopping with a keep-alive connection open logged asyncio's CancelledError traceback."""
    running = HttpServer("127.0.0.1", 0, slow, limits=HttpLimits(idle_timeout_s=30, stop_timeout_s=1))
    running.start()
    client = http.client.HTTPConnection(*running.address, timeout=5)
    client.request("GET", "/")
    assert client.getresponse().read() == b"ok\n"
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        running.stop()
        gc.collect()
    client.close()
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


def test_clients_that_never_read_cannot_keep_others_out(slow: Slow) -> None:
    """Issue 18 #6: connections blocked writing to a client that does not read counted as busy and could
    not be evicted, so every new client got 503 until the write timeout (30 s)."""
    limits = HttpLimits(max_connections=8, workers=2, stalled_write_s=0.5, write_timeout_s=30)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits)
    running.start()
    greedy = [_non_reader(running, "/huge", requests=20) for _ in range(limits.max_connections)]
    try:
        time.sleep(limits.stalled_write_s + 0.5)
        assert running.connections == limits.max_connections
        answers = [get(running, "/")[0] for _ in range(4)]
        assert answers == [200] * 4
        assert running.connections <= limits.max_connections
    finally:
        for sock in greedy:
            sock.close()
        running.stop()


def test_a_malformed_absolute_target_is_a_400_not_a_traceback(
    server: HttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    """``GET http://[/metrics`` passes h11 but not urlsplit: once a dropped connection and a logged traceback."""
    with caplog.at_level(logging.WARNING):
        answer = _raw(server, b"GET http://[/metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text


def test_status_lines_carry_their_reason_phrase(server: HttpServer) -> None:
    """``HTTP/1.1 200 OK`` and ``404 Not Found``, as other servers and clients' logs write them (issue 35)."""
    ok = _raw(server, b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n"), ok[:100]
    missing = _raw(server, b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404 Not Found\r\n"), missing[:100]


def test_pipelining_clients_that_never_read_cannot_hold_slots_the_kernel_buffers_for(slow: Slow) -> None:
    """Issue 34 #1: connections pipelining 1,500 small answers each that they never read (4 KiB receive
    buffer): the kernel took the answers into its send buffer as fast as the handlers made them, so every
    connection stayed busy for seconds, none counted as stalled, and new clients got 503. Now the next request
    is read only once the answer before was acknowledged: such a connection stalls at its first answer, and
    after ``stalled_write_s`` a new client takes its slot."""
    limits = HttpLimits(max_connections=12, workers=2, stalled_write_s=0.3, write_timeout_s=30)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits)
    running.start()
    greedy = [_non_reader(running) for _ in range(limits.max_connections + 4)]  # 3 MB of answers, never read
    try:
        time.sleep(1.0)  # working through them all would take the handlers over 10 s
        answers = []
        for _ in range(10):
            began = time.monotonic()
            answers.append((get(running, "/")[0], time.monotonic() - began < 2))
        assert answers == [(200, True)] * 10
        assert running.connections <= limits.max_connections
    finally:
        for sock in greedy:
            sock.close()
        running.stop()


def test_password_guessers_cannot_take_the_slots_of_probes_or_known_clients(slow: Slow) -> None:
    """Issue 34 #2: connections each waiting for a slow (bcrypt) check of a new wrong password could not be
    evicted: with the server full, probes and the client whose password is cached got 503. Now a connection
    waiting for a check is evicted first (its check dropped if not begun)."""
    checked: list[str] = []

    def quick(request: Request) -> bool | None:
        if request.path == "/healthz" or request.header("authorization") == "Basic known":
            return True
        return None  # a credential never seen: the slow check

    def slow_check(request: Request) -> bool:
        checked.append(request.header("authorization") or "")
        time.sleep(0.05)  # bcrypt's cost
        return request.header("authorization") == "Basic right"  # right, but not yet remembered

    gate = Gate(quick=quick, slow=slow_check, refused=lambda _: Response(status=401), threads=2)
    limits = HttpLimits(max_connections=16, workers=2, request_timeout_s=10)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits, gate=gate)
    running.start()
    guessers = []
    try:
        for guess in range(60):
            sock = socket.create_connection(running.address, timeout=10)
            # Twenty new passwords each, pipelined: a connection goes from one check to the next.
            tries = (f"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic guess{guess}-{n}\r\n\r\n" for n in range(20))
            sock.sendall("".join(tries).encode())
            guessers.append(sock)
        time.sleep(0.2)
        answers = [get(running, "/healthz")[0] for _ in range(5)]
        answers += [get(running, "/", Authorization="Basic known")[0] for _ in range(5)]
        # A scraper whose right password has not been checked yet waits for the slow check among the guessers:
        # the guessers, having failed checks, go first.
        answers += [get(running, "/", Authorization="Basic right")[0] for _ in range(3)]
        assert answers == [200] * 13
        assert len(checked) < 60 * 20  # the evicted guessers' checks were dropped, not all run
    finally:
        for sock in guessers:
            sock.close()
        running.stop()


ODD_REQUESTS = {
    "an HTTP/2.0 request line": (b"GET /big HTTP/2.0\r\nHost: x\r\n\r\n", b"HTTP/1.1 505 "),
    "HTTP/2's prior-knowledge preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"HTTP/1.1 505 "),
    "an HTTP/0.9 request line": (b"GET /big HTTP/0.9\r\nHost: x\r\n\r\n", b"HTTP/1.1 505 "),
    "a folded header line": (b"GET /big HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n", b"HTTP/1.1 400 "),
    "a folded Transfer-Encoding": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 400 ",
    ),
    "a chunk size of 20 hex digits": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 20 + b"\r\nabc",
        b"HTTP/1.1 400 ",
    ),
    "a chunk larger than the body limit": (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\nabc",
        b"HTTP/1.1 413 ",
    ),
}


@pytest.mark.parametrize(("request_bytes", "status"), ODD_REQUESTS.values(), ids=ODD_REQUESTS.keys())
def test_odd_request_lines_and_framing_get_a_clear_4xx_or_505_at_once_and_the_connection_closed(
    slow: Slow, caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: bytes
) -> None:
    """Issue 34: h11 served HTTP/2.0 (and the HTTP/2 preface) as 1.1 on a kept-alive connection, joined folded
    header lines that a proxy in front may read otherwise, and waited out the request deadline (10 s, no answer)
    for a chunk declared 20 hex digits or 4 GiB long. Now 505 or 400/413 at once, then the connection closes."""
    running = HttpServer("127.0.0.1", 0, slow, limits=HttpLimits(request_timeout_s=10))
    running.start()
    try:
        began = time.monotonic()
        with caplog.at_level(logging.WARNING):
            answer = _raw(running, request_bytes, wait_s=5)
        assert answer.startswith(status), answer[:200]
        assert answer.count(b"HTTP/1.1 ") == 1  # nothing else answered: the rest is never read
        assert b"connection: close" in answer.lower()
        assert time.monotonic() - began < 2  # closed at once: _raw returns at the close, not after 5 s of silence
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], caplog.text
    finally:
        running.stop()


def test_bare_lf_line_endings_higher_minor_versions_and_split_chunked_bodies_are_served(server: HttpServer) -> None:
    """What RFC 9112 lets a server accept, and Go's net/http, nginx and h11 do: bare LF for CRLF in a head,
    HTTP/1.2 served as 1.1, a chunked body in several chunks and reads (the chunk sizes followed beside h11)."""
    lf = _raw(server, b"GET /big HTTP/1.1\nHost: x\nConnection: close\n\n")
    assert lf.startswith(b"HTTP/1.1 200 OK\r\n"), lf[:100]
    assert lf.endswith(BIG)
    minor = _raw(server, b"GET / HTTP/1.2\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert minor.startswith(b"HTTP/1.1 200 OK\r\n"), minor[:100]
    sock = connect(server)
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    for piece in (head + b"3;ext=1\r\nab", b"c\r\n0000000000000010\r", b"\n" + b"d" * 16 + b"\r\n0\r\n\r\n"):
        sock.sendall(piece)
        time.sleep(0.05)  # each piece its own read
    sock.settimeout(5)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:100]
    assert answer.endswith(b"abc" + b"d" * 16)


def test_a_just_connected_scraper_is_not_evicted_by_a_flood_of_silent_connections(slow: Slow) -> None:
    """Issue 34: with the slots full of silent connections, a scraper that connected and sent its request just
    before a burst of new connections was evicted as soon as it became the oldest waiting one, before the
    server had read its request (1 of 89 in a flood of 5,000). Now silent connections go first, the longest
    waiting of them first. The burst is made to arrive at once by holding the event loop for a moment."""
    held = threading.Event()

    def quick(request: Request) -> bool | None:
        if request.path == "/hold":  # runs on the event loop: nothing is accepted meanwhile
            held.set()
            time.sleep(0.5)
        return True

    gate = Gate(quick=quick, slow=lambda _: True, refused=lambda _: Response(status=401))
    limits = HttpLimits(max_connections=16, workers=2, request_timeout_s=10)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits, gate=gate)
    running.start()
    silent = [connect(running) for _ in range(limits.max_connections - 1)]
    try:
        time.sleep(0.2)
        holder = connect(running)
        silent.append(holder)
        holder.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        assert held.wait(5)
        scraper = connect(running)  # accepted once the loop is free, ahead of the burst behind it
        silent.append(scraper)
        scraper.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        silent += [connect(running) for _ in range(2 * limits.max_connections)]
        answer = _answer_to(scraper)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:100]
        assert running.connections <= limits.max_connections
    finally:
        for sock in silent:
            sock.close()
        running.stop()


def _non_reader(server: HttpServer, path: str = "/render", requests: int = 1500) -> socket.socket:
    """A client that pipelines ``requests`` of ``path`` and never reads an answer (a 4 KiB receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(server.address)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode() * requests)
    return sock


def test_a_probe_that_just_connected_outlasts_non_readers_renewing_their_connections(slow: Slow) -> None:
    """Issue 34 #1: with the slots full of pipelining non-readers renewed every 15 s, a /healthz probe that had
    just connected was the only connection waiting for a request, so the renewed non-readers evicted it (0-21
    of ~500 probes reset); and until their answers had stalled for ``stalled_write_s`` a new probe got 503.
    Now a client that pipelines without reading counts as stalled at once, and is evicted before a newcomer."""
    limits = HttpLimits(max_connections=8, workers=2, stalled_write_s=30, write_timeout_s=60, request_timeout_s=10)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits)
    running.start()
    greedy = [_non_reader(running) for _ in range(limits.max_connections)]
    try:
        time.sleep(0.6)  # every answer stalled, none for stalled_write_s
        probe = connect(running)  # displaces a non-reader, not refused
        time.sleep(0.1)
        greedy += [_non_reader(running) for _ in range(4)]  # renewed: each displaces a non-reader, not the probe
        time.sleep(0.1)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _answer_to(probe)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:100]
        assert running.connections <= limits.max_connections
    finally:
        for sock in greedy:
            sock.close()
        running.stop()


def test_a_probe_that_just_connected_goes_after_guessers_awaiting_their_first_check(slow: Slow) -> None:
    """Issue 34 #2: connections waiting for their first (slow) password check were evicted only after every
    connection waiting for a request, so a fresh guesser displaced a probe that had just connected and not yet
    sent its request. Now a connection waiting less than a second for a request goes last."""
    release = threading.Event()

    def slow_check(request: Request) -> bool:
        release.wait(10)  # bcrypt, under a flood of guesses
        return False

    gate = Gate(
        quick=lambda r: True if r.path == "/healthz" else None, slow=slow_check, refused=lambda _: Response(status=401)
    )
    limits = HttpLimits(max_connections=8, workers=2, request_timeout_s=10)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits, gate=gate)
    running.start()
    guess = b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic Z3Vlc3M6MQ==\r\n\r\n"
    guessers = [connect(running) for _ in range(limits.max_connections - 1)]
    try:
        for sock in guessers:
            sock.sendall(guess)
        time.sleep(0.3)  # every one waiting for its check, none failed yet
        probe = connect(running)
        time.sleep(0.1)
        for _ in range(3):
            guessers.append(connect(running))
            guessers[-1].sendall(guess)
        time.sleep(0.1)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = _answer_to(probe)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:100]
    finally:
        release.set()
        for sock in guessers:
            sock.close()
        running.stop()


def test_a_newcomer_finding_every_slot_busy_waits_a_moment_for_room_instead_of_a_503(slow: Slow) -> None:
    """Issue 34 #1: in the moment clients that do not read have every slot, their answers written but not yet
    stalled for ``stalled_write_s``, a probe got 503 at once. Now it waits up to a second for a slot to free
    or become evictable."""
    limits = HttpLimits(max_connections=8, workers=2, stalled_write_s=0.4, write_timeout_s=30)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits)
    running.start()
    greedy = [_non_reader(running, "/huge", requests=1) for _ in range(limits.max_connections)]
    try:
        time.sleep(0.1)  # every answer stalled, none for stalled_write_s yet
        began = time.monotonic()
        status = get(running, "/healthz")[0]
        waited = time.monotonic() - began
        assert status == 200
        assert waited < 1.5  # let in once a non-reader had stalled for stalled_write_s, not at write_timeout
        assert running.connections <= limits.max_connections
    finally:
        for sock in greedy:
            sock.close()
        running.stop()


@contextlib.contextmanager
def _flood(server: HttpServer, payload: bytes, per_second: float) -> Iterator[None]:
    """New connections at ``per_second``, each sending ``payload`` (or nothing) and then nothing more."""
    stop = threading.Event()
    opened: list[socket.socket] = []

    def open_them() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                sock = socket.create_connection(server.address, timeout=2)
                if payload:
                    sock.sendall(payload)
                opened.append(sock)
            time.sleep(1 / per_second)

    thread = threading.Thread(target=open_them, daemon=True)
    thread.start()
    try:
        time.sleep(1.5)  # every slot taken by the flood, each under a second old
        yield
    finally:
        stop.set()
        thread.join(5)
        for sock in opened:
            sock.close()


@pytest.mark.parametrize(("payload", "who"), [(b"G", "a probe"), (b"", "a scraper whose password is not cached yet")])
def test_floods_of_newcomers_do_not_keep_out_probes_or_a_scraper_on_its_first_check(
    slow: Slow, payload: bytes, who: str
) -> None:
    """Review of issue 34's eviction order: connections that each sent one byte (a partial head), opened faster
    than the limit, were never evictable in their first second, so every probe got 503; and a scraper waiting
    for its only (slow, uncached) password check was evicted before brand-new silent connections. Now a partial
    head that has been read is evicted like a silent connection, and a client's only pending check is not."""

    def check(request: Request) -> bool:
        time.sleep(0.15)  # bcrypt
        return True

    gate = Gate(
        quick=lambda r: True if r.path == "/healthz" else None, slow=check, refused=lambda _: Response(status=401)
    )
    limits = HttpLimits(max_connections=8, workers=2, request_timeout_s=10)
    running = HttpServer("127.0.0.1", 0, slow, limits=limits, gate=gate)
    running.start()
    try:
        with _flood(running, payload, per_second=60):
            if payload:
                answers = [get(running, "/healthz")[0] for _ in range(8)]
            else:
                answers = [get(running, "/", Authorization="Basic dTpw")[0] for _ in range(8)]
        assert answers == [200] * 8, who
    finally:
        running.stop()


def test_a_cross_site_request_that_would_change_something_is_refused_before_the_password_check(slow: Slow) -> None:
    """Issue 51 N5: a POST whose Sec-Fetch-Site or Origin says another site reached the handler (a page in an
    operator's browser could drive the lifecycle API); it now gets 403 before the gate runs a password check,
    while GET from anywhere and a POST without those headers or from the server's own origin are served."""
    asked: list[str] = []

    def quick(request: Request) -> bool | None:
        asked.append(request.method)
        return None

    def check(request: Request) -> bool:
        asked.append(request.method)
        return True

    gate = Gate(quick=quick, slow=check, refused=lambda _: Response(status=401))
    running = HttpServer("127.0.0.1", 0, slow, limits=LIMITS, gate=gate)
    running.start()
    try:
        own = "http://{}:{}".format(*running.address)
        assert get(running, "/", "POST", Origin="http://evil")[0] == 403
        assert get(running, "/", "DELETE", **{"Sec-Fetch-Site": "cross-site"})[0] == 403
        assert get(running, "/", "POST", Origin="http://[bad")[0] == 403  # an Origin that does not parse
        assert asked == []  # no bcrypt for a forged request
        assert get(running, "/", "GET", Origin="http://evil", **{"Sec-Fetch-Site": "cross-site"})[0] == 200
        assert get(running, "/", "POST")[0] == 200
        assert get(running, "/", "POST", Origin=own)[0] == 200
    finally:
        running.stop()
