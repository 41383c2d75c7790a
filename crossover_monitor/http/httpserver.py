"""An HTTP/1.1 server for a handful of small endpoints that stays up under broken or hostile clients.

asyncio holds the connections (a coroutine each, no thread each), h11 speaks the protocol, and a
small thread pool runs the handlers (rendering /metrics is CPU work). docs/http.md, "HTTP server", says why
not the standard library's ThreadingHTTPServer, uvicorn or cheroot.

What a client cannot do to it (``HttpLimits``):

- hold a connection without finishing a request: the whole request head must arrive within
  ``request_timeout`` of the connection (a kept-alive one: within ``idle_timeout`` of the previous
  response), however slowly it trickles in; a silent or slowloris client is closed at that deadline;
- exhaust file descriptors or threads: at most ``max_connections`` (and 32 more waiting for room); a new one
  beyond that evicts the likeliest abuser (``HttpServer._victim``: a closing connection, a password guesser, a
  connection silent or slow for a second, a fresh guesser, a non-reader, the longest waiting of those that
  waited under a second), never a client whose bytes are here and not yet read; where none may be evicted it waits up
  to a second for room, then gets 503; handlers run on ``workers`` threads, whatever the number of clients;
- stall others with TLS: handshakes run in the event loop after admission, never on the accept path,
  count against ``max_connections`` and are cut off after ``handshake_timeout``; nor grow its memory with
  them: a handshake holds a 32 KiB read buffer (not asyncio's 256 KiB), freed as soon as it ends, not left
  in a reference cycle for the cyclic collector (see ``_TlsProtocol`` and ``_serve_connection``);
- send an oversized head or body: 431 / 413, a chunk declared past the body limit too, when declared;
- speak another HTTP, or frame a request so a proxy in front may read it otherwise: 505 for another version
  than 1.x, 400 for a folded header line or a chunk size of more than 16 hex digits;
- hold a slot by not reading: an answer goes out in pieces of ``_WRITE_PIECE`` (so a stalled reader holds
  no more than a piece or two in memory), and the next request of a connection is read only once its
  client has acknowledged the whole answer before (the kernel's send buffer would otherwise take
  megabytes of pipelined answers that nobody reads); a connection whose answer has not moved, or not
  been acknowledged, for ``stalled_write_s`` (a quarter second if it pipelined requests behind it) may be
  evicted when the server is full, and is closed at ``write_timeout``;
- hold slots by guessing passwords: when the server is full, the connection that failed the most password
  checks is evicted first (its pending check dropped if it has not begun), so guessers cannot keep out
  probes or a client whose first (slow, uncached) check of the right password is still waiting;
- smuggle a second request: one with both Content-Length and Transfer-Encoding is refused (400) and the
  connection closed (RFC 9112 section 6.1);
- change something from a page of another site (a form, a no-cors fetch in an operator's browser): a request
  other than GET, HEAD or OPTIONS whose Sec-Fetch-Site or Origin says another site gets 403 (``_cross_site``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import gzip
import http
import logging
import re
import ssl
import struct
import termios
import threading
import urllib.parse
from asyncio import sslproto
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import SupportsIndex, cast

import h11

log = logging.getLogger(__name__)
# Each status code's reason phrase, for the status line ("200 OK").
_REASONS = {status.value: status.phrase.encode("ascii") for status in http.HTTPStatus}

# Reads and the reader's buffer: small, so a client pipelining requests it never reads the answers to holds
# little here (a request head may span several reads; h11 bounds it at max_header_bytes).
_READ_CHUNK = 16384
# Smaller bodies are not worth compressing (a probe's "ok"): gzip would only add bytes and CPU.
_GZIP_MIN_BYTES = 1024
# An answer is written this much at a time, each piece once the one before has left (see set_write_buffer_limits).
_WRITE_PIECE = 16384
# Bytes written to the socket that its peer has not acknowledged (SIOCOUTQ, Linux's TIOCOUTQ on a TCP socket).
_UNACKNOWLEDGED: int | None = getattr(termios, "TIOCOUTQ", None)
_ACK_POLL_S = (0.002, 0.1)  # the first and the longest wait between two looks at it
# A request head ends at its first empty line; h11 takes a bare LF for CRLF, as RFC 9112 2.2 allows.
_HEAD_END = re.compile(rb"\n\r?\n")
_FOLDED = re.compile(rb"\n[ \t]")  # a line of the head beginning with whitespace: obs-fold
_CHUNK_SIZE_DIGITS = 16  # a chunk size that fits 64 bits, as Go's net/http allows (h11 allows 20)
# When the server is full: a connection waiting this long for a request is no newcomer (a probe that has just
# connected is evicted only when no other may be), and one whose client pipelined requests while not reading
# the answer before counts as stalled after this long (not stalled_write_s), see HttpServer._victim.
_SETTLED_S = 1.0
_PIPELINED_STALL_S = 0.25
# Methods that change nothing, which a page of any site may send (a link, an <img>): not checked for CSRF.
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# A new connection finding no room waits this long for some, polling, before its 503; so many at most at once.
_ADMISSION_WAIT_S = 1.0
_ADMISSION_POLL_S = 0.05
_ADMISSIONS_WAITING = 32


@dataclass(frozen=True, kw_only=True)
class HttpLimits:
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0  # a kept-alive connection's wait for its next request (Prometheus reuses them)
    handshake_timeout_s: float = 10.0
    write_timeout_s: float = 30.0  # for an answer to leave: a client that does not read is dropped after it
    stalled_write_s: float = 2.0  # an answer not moving for this long: its connection may be evicted when full
    max_connections: int = 256
    max_header_bytes: int = 16384
    max_body_bytes: int = 65536
    workers: int = 4
    stop_timeout_s: float = 5.0


@dataclass(frozen=True, kw_only=True)
class Request:
    method: str
    target: str  # path and query, as sent
    headers: tuple[tuple[str, str], ...]  # names lower-case
    body: bytes
    peer: str

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


@dataclass(frozen=True, kw_only=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())


Handler = Callable[[Request], Response]


@dataclass(frozen=True, kw_only=True)
class Gate:
    """A check every request passes before its handler (basic auth).

    ``quick`` answers on the event loop when it can (a cache of checked credentials); when it returns
    None the request waits for ``slow`` (bcrypt, tens of ms by design), which runs on ``threads`` threads
    of its own, taken in turn by client address: a flood of failing logins from one address waits behind
    itself, never takes the handler threads, and delays another client's first check by at most a turn.
    A refused request is answered by ``refused``.
    """

    quick: Callable[[Request], bool | None]
    slow: Callable[[Request], bool]
    refused: Callable[[Request], Response]
    threads: int = 2


class _Reader(asyncio.StreamReader):
    """A StreamReader that counts what it was given: whether a client waiting for its turn has sent anything."""

    received = 0

    def feed_data(self, data: Iterable[SupportsIndex]) -> None:
        self.received += len(cast("bytes", data))  # the transport gives bytes; typeshed says less
        super().feed_data(data)


@dataclass(eq=False)
class _Connection:
    reader: _Reader
    writer: asyncio.StreamWriter
    busy: bool = False
    stalled_since: float | None = None  # when its answer last waited for the client to read; None: not waiting
    task: asyncio.Task[None] | None = None  # the coroutine serving it: cancelled when it is evicted
    ended: bool = False  # aborted (evicted, or the server stopping): nothing more to close
    failed_checks: int = 0  # requests refused by the gate (wrong passwords): the first evicted when full
    heard_mark: int = 0  # bytes received when it began waiting for its next request (0: for its first)
    read: int = 0  # bytes taken from the reader
    pipelined: bool = False  # the client sent more after the request being answered, without waiting for it
    closing: bool = False  # done: waiting for its close to complete

    def heard_from(self) -> bool:
        """Whether the client has sent anything since it began waiting: read, or still in the kernel's buffer.
        (A TLS client's handshake never reaches the reader: it counts as silent until its request comes.)"""
        return self.reader.received > self.heard_mark or self._in_kernel()

    def unread(self) -> bool:
        """Whether the client has sent bytes that the server has not yet read: in the reader or the kernel."""
        return self.reader.received > self.read or self._in_kernel()

    def _in_kernel(self) -> bool:
        transport = self.writer.transport  # None after a failed TLS handshake (CPython 3.11), see _end
        sock = transport.get_extra_info("socket") if transport is not None else None
        return sock is not None and _socket_count(sock.fileno(), termios.FIONREAD) > 0


class HttpServer:
    """Binds at construction (an OSError if it cannot), serves from ``start`` on a thread of its own."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        *,
        limits: HttpLimits | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
        extra_headers: Callable[[], Iterable[tuple[str, str]]] = tuple,
        tick: Callable[[], None] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self._handler = handler
        self._gate = gate
        self._tick = tick
        self._stop_lock = threading.Lock()
        self._stopped = False
        self._last_gzip: tuple[bytes, bytes] | None = None
        self._limits = limits or HttpLimits()
        self._extra_headers = extra_headers
        self._tls = tls
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(max_workers=self._limits.workers, thread_name_prefix="http")
        self._checks = _TakenInTurn(self._loop, gate.threads if gate is not None else 1)
        # Connections waiting for a request head, oldest first: the ones a new connection may evict, after
        # those waiting for a password check (work a guesser makes us do).
        self._waiting: OrderedDict[_Connection, float] = OrderedDict()  # when each began to wait
        self._checking: OrderedDict[_Connection, str] = OrderedDict()  # the client's address of each
        self._connections: set[_Connection] = set()
        self._admissions_waiting = 0  # new connections waiting for room (see _admitted_soon)
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-loop", daemon=True)
        try:
            self._server = self._loop.run_until_complete(
                self._loop.create_server(
                    self._protocol,
                    host,
                    port,
                    # Also how many connections asyncio accepts per loop turn: 128 lets admission evict
                    # between bursts, so a flood of connections cannot take every file descriptor at once.
                    backlog=128,
                )
            )
        except OSError:
            self._loop.close()
            self._pool.shutdown(wait=False)
            raise
        host, port = self._server.sockets[0].getsockname()[:2]
        self._address = (str(host), int(port))

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """What asyncio.start_server makes for each connection, with a reader that counts what it receives."""
        return asyncio.StreamReaderProtocol(_Reader(limit=_READ_CHUNK, loop=self._loop), self._serve, loop=self._loop)

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    @property
    def connections(self) -> int:
        return len(self._connections)

    def start(self) -> None:
        if self._tick is not None:
            self._loop.call_soon(lambda: self._loop.create_task(self._ticking()))
        self._thread.start()

    async def _ticking(self) -> None:
        """``tick`` once a second on a pool thread (it may read files): e.g. certificates that changed."""
        assert self._tick is not None  # noqa: S101 - started only with one
        while self._server.is_serving():
            with contextlib.suppress(Exception):
                await self._loop.run_in_executor(self._pool, self._tick)
            await asyncio.sleep(1.0)

    def stop(self) -> None:
        """Stop accepting, let answers in progress finish (up to stop_timeout), close the rest.

        Safe to call more than once and from several threads at once (a signal's stop and a caller's).
        """
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            self._stop()

    def _stop(self) -> None:
        if self._thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
            with contextlib.suppress(Exception):
                done.result(self._limits.stop_timeout_s + 2)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        else:
            self._server.close()
        if not self._loop.is_running():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._checks.shutdown()

    async def _shutdown(self) -> None:
        self._server.close()
        for connection in [*self._waiting, *self._checking]:  # handshakes too: ended now, not at their timeout
            _end(connection)
        deadline = self._loop.time() + self._limits.stop_timeout_s
        while any(c.busy for c in self._connections) and self._loop.time() < deadline:  # noqa: ASYNC110 - a bounded poll of plain flags
            await asyncio.sleep(0.05)
        for connection in list(self._connections):
            _end(connection)
        # Every other task (the tick, connections winding down) ends here, not as "destroyed but pending".
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def _admit(self, connection: _Connection) -> bool:
        """Room for ``connection``: when full, a connection is evicted for it (see ``_victim``); False when none
        may be, every connection being busy for a client that takes part."""
        if len(self._connections) >= self._limits.max_connections:
            evicted = self._victim()
            if evicted is None:
                return False
            self._waiting.pop(evicted, None)
            self._checking.pop(evicted, None)
            _end(evicted)
            self._connections.discard(evicted)
        self._connections.add(connection)
        return True

    def _victim(self) -> _Connection | None:
        """The connection a new one displaces when the server is full, the likeliest abuser first; None: none.

        0. one whose conversation is over, waiting for its close to complete (its answer has gone out);
        1. the one that failed the most password checks (a guesser, never a scraper);
        2. one that has waited ``_SETTLED_S`` or more for a request (see ``_settled``): the longest waiting of
           those that sent nothing since they began (a silent client, an idle kept-alive one), else of those
           whose partial head has been read (a slow one), never one with bytes here unread;
        3. a fresh guesser waiting for its first password check (see ``_fresh_guesser``);
        4. one whose answer its client has not acknowledged for ``stalled_write_s``, or for ``_PIPELINED_STALL_S``
           where the client pipelined requests behind it (one that pipelines and reads acknowledges within a
           round trip);
        5. one that has waited under ``_SETTLED_S`` (just connected, or a kept-alive one between requests) with
           nothing unread, the longest waiting (see ``_newcomer``): a flood of silent connections, or of one byte
           each, is displaced, newcomers last; never a client whose request is here and not yet read (280
           renewed non-readers reset 0-21 probes of ~500 so, the probes being the only connections waiting).

        A connection waiting for its only password check (a scraper whose password is not cached yet: after a
        start or a reload) is not evicted unless checks hold half the slots, nor is one whose request is being
        answered to a client that reads.
        """
        closing = next((c for c in self._connections if c.closing), None)
        if closing is not None:
            return closing
        guessing = [c for c in (*self._checking, *self._waiting) if c.failed_checks]
        if guessing:
            return max(guessing, key=lambda c: c.failed_checks)
        now = self._loop.time()
        settled = _settled([c for c, since in self._waiting.items() if now - since >= _SETTLED_S])
        if settled is not None:
            return settled
        guesser = _fresh_guesser(self._checking, crowded=2 * len(self._checking) > self._limits.max_connections)
        if guesser is not None:
            return guesser
        stalled = [
            c
            for c in self._connections
            if c.stalled_since is not None
            and now - c.stalled_since >= (_PIPELINED_STALL_S if c.pipelined else self._limits.stalled_write_s)
        ]
        if stalled:
            return min(stalled, key=lambda c: c.stalled_since or 0.0)
        return _newcomer(list(self._waiting))

    async def _admitted_soon(self, connection: _Connection) -> bool:
        """Admit ``connection``, waiting up to ``_ADMISSION_WAIT_S`` for room if none can be made now (at most
        ``_ADMISSIONS_WAITING`` connections wait so): in the moment non-readers renewing their connections have
        every slot, busy and not yet stalled, probes and scrapes otherwise got 503 (8 of ~950 in 45 s, 2-core VM)."""
        if self._admit(connection):
            return True
        if self._admissions_waiting >= _ADMISSIONS_WAITING:
            return False
        self._admissions_waiting += 1
        transport = cast("asyncio.Transport", connection.writer.transport)
        # Nothing read meanwhile: a TLS client's hello would go to the plain reader, not to its handshake.
        transport.pause_reading()
        try:
            deadline = self._loop.time() + _ADMISSION_WAIT_S
            admitted = False
            while not admitted and self._loop.time() < deadline:
                await asyncio.sleep(_ADMISSION_POLL_S)
                if not self._server.is_serving():  # stopping: its slots are freed for no newcomer
                    break
                admitted = self._admit(connection)
        except asyncio.CancelledError:  # the server stopping: not admitted, so nothing else ends it
            transport.abort()
            raise
        else:
            return admitted
        finally:
            self._admissions_waiting -= 1
            if not transport.is_closing():
                transport.resume_reading()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Cancelled only by stop(): the connection ends there, which is no error to report (asyncio would
        # log a traceback for a connection task that ends cancelled).
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve_connection(reader, writer)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(cast("_Reader", reader), writer, task=asyncio.current_task())
        if not await self._admitted_soon(connection):
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.transport.abort()
            return
        # A TLS handshake counts, and may be evicted, like a silent client.
        self._waiting[connection] = self._loop.time()
        try:
            if self._tls is not None:
                # After admission, not on accept: handshakes are counted and bounded like any connection,
                # and each takes the context in force now (renewed certificates, CAs, versions).
                await self._start_tls(connection, self._tls())
            writer.transport.set_write_buffer_limits(high=_WRITE_PIECE)
            await self._conversation(connection)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, h11.LocalProtocolError) as exc:
            # The client went away, failed its handshake or broke the protocol: nothing to tell it. asyncio keeps
            # the exception in futures (the handshake's, the reader's, the close's) that this frame holds through
            # the connection, and its traceback holds this frame: a cycle that kept every failed handshake (its
            # protocol and 256 KiB buffer) until the cyclic collector ran, seldom in full (400 MiB after 12,000).
            exc.__traceback__ = None
        finally:
            self._waiting.pop(connection, None)
            self._checking.pop(connection, None)
            try:
                if not connection.ended:  # an aborted one has nothing left to send, nor to wait for
                    # Counted until closed, and the first evicted: a TLS close waits up to 30 s for the client's
                    # close_notify, which clients that keep the socket open never send (uncounted, 12 such held
                    # 12 descriptors past a limit of 4).
                    connection.closing = True
                    await self._close(writer)
            finally:
                self._connections.discard(connection)

    async def _start_tls(self, connection: _Connection, context: ssl.SSLContext) -> None:
        """``StreamWriter.start_tls`` (as CPython 3.11-3.13 do it), with ``_TlsProtocol``, and nothing kept after a
        failed handshake: it ends the connection at once (aborted; there is nothing to flush or to wait for)."""
        writer = connection.writer
        plain = cast("asyncio.Transport", writer.transport)
        app = cast("asyncio.StreamReaderProtocol", plain.get_protocol())
        waiter: asyncio.Future[None] = self._loop.create_future()
        tls = _TlsProtocol(
            self._loop,
            app,
            context,
            waiter,
            server_side=True,
            call_connection_made=False,
            ssl_handshake_timeout=self._limits.handshake_timeout_s,  # type: ignore[arg-type]  # seconds; typeshed: int
        )
        plain.pause_reading()
        plain.set_protocol(tls)
        began = self._loop.call_soon(tls.connection_made, plain)
        resumed = self._loop.call_soon(plain.resume_reading)
        try:
            await waiter
        except BaseException:
            began.cancel()
            resumed.cancel()
            plain.abort()
            connection.ended = True  # no close to wait for: that waited write_timeout (30 s) for nothing
            raise
        writer._transport = tls._app_transport  # type: ignore[attr-defined]  # noqa: SLF001 - as start_tls does
        if hasattr(app, "_replace_transport"):  # CPython 3.13 on
            app._replace_transport(writer.transport)  # noqa: SLF001 - as start_tls does
        else:  # CPython 3.11 and 3.12
            app._replace_writer(writer)  # type: ignore[attr-defined]  # noqa: SLF001 - as start_tls does

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close after what was written has gone out (abort would drop it); abort if that does not happen soon."""
        if writer.transport is None:  # a failed TLS handshake took the connection with it
            return
        try:
            writer.close()
            await asyncio.wait_for(writer.wait_closed(), self._limits.write_timeout_s)
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - any failure to close ends in the same abort
            exc.__traceback__ = None  # kept by the protocol's futures, it would hold this frame (see _serve_connection)
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def _conversation(self, connection: _Connection) -> None:
        protocol = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes)
        wait = self._limits.request_timeout_s
        writer = connection.writer
        while True:
            self._waiting.setdefault(connection, self._loop.time())  # a TLS one: since it was admitted
            try:
                request = await self._read_request(protocol, connection, self._loop.time() + wait)
            except TimeoutError:
                return  # silent, slow or idle: closed at its deadline
            except h11.RemoteProtocolError as exc:  # malformed, or a head or body over the limits
                self._waiting.pop(connection, None)
                writer.write(_plain_error(exc.error_status_hint, str(exc)))
                await asyncio.wait_for(writer.drain(), self._limits.request_timeout_s)
                return
            if request is None:
                return  # the client closed the connection
            self._waiting.pop(connection, None)
            connection.pipelined = bool(protocol.trailing_data[0]) or connection.reader.received > connection.read
            connection.busy = True
            try:
                response = _cross_site(request)  # before the password check: a forged request costs no bcrypt
                if response is None:
                    response = await self._admitted(request, connection)
                if response is None:
                    response = await self._loop.run_in_executor(self._pool, self._answer, request)
                await self._send(protocol, connection, response, head=request.method == "HEAD")
            finally:
                connection.busy = False
            await self._acknowledged(connection)  # not busy meanwhile: a stop does not wait for this client
            if protocol.our_state is h11.MUST_CLOSE or not self._server.is_serving():
                return
            protocol.start_next_cycle()
            wait = self._limits.idle_timeout_s
            connection.heard_mark = connection.reader.received

    async def _read_request(self, protocol: h11.Connection, connection: _Connection, deadline: float) -> Request | None:
        """The next whole request, or None if the client closed; TimeoutError if it is not all here by ``deadline``."""
        head: h11.Request | None = None
        body = bytearray()
        chunks: _ChunkSizes | None = None
        while True:
            # The head as it came, for what h11 accepts and hides (a folded header line).
            unparsed = protocol.trailing_data[0] if head is None else b""
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                remaining = deadline - self._loop.time()
                if remaining <= 0:
                    raise TimeoutError
                data = await asyncio.wait_for(connection.reader.read(_READ_CHUNK), remaining)
                connection.read += len(data)
                if chunks is not None:
                    chunks.feed(data)
                protocol.receive_data(data)
            elif isinstance(event, h11.Request):
                head = event
                chunks = self._began(protocol, connection, head, unparsed)
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self._limits.max_body_bytes:
                    raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                writer = connection.writer
                return Request(
                    method=head.method.decode("ascii", "replace"),
                    target=_origin_form(head.target.decode("ascii", "replace")),
                    headers=tuple((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in head.headers),
                    body=bytes(body),
                    peer=str(writer.get_extra_info("peername", ("?",))[0]),
                )
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def _began(
        self, protocol: h11.Connection, connection: _Connection, head: h11.Request, unparsed: bytes
    ) -> _ChunkSizes | None:
        """Check a request's head (``unparsed``: the bytes it came in); what follows its chunk sizes if chunked."""
        self._check_head(head, unparsed)
        if protocol.they_are_waiting_for_100_continue:  # curl and others wait a second for this
            continued = h11.InformationalResponse(status_code=100, headers=[])
            connection.writer.write(protocol.send(continued) or b"")
        if not any(name.lower() == b"transfer-encoding" for name, _ in head.headers):  # h11 takes only chunked
            return None
        chunks = _ChunkSizes(self._limits.max_body_bytes)
        chunks.feed(protocol.trailing_data[0])  # what came with the head
        return chunks

    def _check_head(self, head: h11.Request, unparsed: bytes) -> None:
        """Refuse another HTTP than 1.x, a head over the limit, one that a proxy in front may frame differently
        (``unparsed``: the bytes it came in), a body over the limit."""
        if not head.http_version.startswith(b"1."):
            # h11 answers any version as 1.1 (an HTTP/2 client's preface got 200, then 400 for the rest); as Go's
            # net/http does, 505 for all but 1.x, whose higher minor versions are served as 1.1 (RFC 9110 2.5).
            raise h11.RemoteProtocolError("only HTTP versions 1.0 and 1.1 are served", error_status_hint=505)
        end = _HEAD_END.search(unparsed)
        if _FOLDED.search(unparsed, 0, end.start() if end else len(unparsed)):
            # h11 joins a folded line to the one before; a proxy in front may not, and frame the request otherwise
            # (a folded Transfer-Encoding). RFC 9112 5.2 allows either a 400 or the join: the 400 is the safe one.
            raise h11.RemoteProtocolError("obsolete line folding (a header line that begins with a space or tab)")
        # h11 bounds only a head still arriving; one that came whole in a read is measured here.
        size = len(head.target) + sum(len(k) + len(v) + 4 for k, v in head.headers)
        if size > self._limits.max_header_bytes:
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        names = {name.lower() for name, _ in head.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            # RFC 9112 section 6.1: a proxy that honours the other one would see a second request in the body.
            raise h11.RemoteProtocolError("both Content-Length and Transfer-Encoding", error_status_hint=400)
        length = next((value for name, value in head.headers if name.lower() == b"content-length"), b"0")
        if int(length) > self._limits.max_body_bytes:  # h11 has checked that it is a number
            raise h11.RemoteProtocolError("request body too large", error_status_hint=413)

    async def _admitted(self, request: Request, connection: _Connection) -> Response | None:
        """None when the gate lets ``request`` in; else the answer it gets instead."""
        if self._gate is None:
            return None
        verdict = self._gate.quick(request)
        if verdict is None:
            check = functools.partial(self._gate.slow, request)
            self._checking[connection] = request.peer  # evicted before most when the server is full
            try:
                verdict = await asyncio.wait_for(self._checks.run(request.peer, check), self._limits.request_timeout_s)
            except TimeoutError:
                busy = b"too many logins waiting to be checked; try again\n"
                return Response(status=503, body=busy, headers=(("Retry-After", "5"),))
            finally:
                self._checking.pop(connection, None)
        if not verdict:
            connection.failed_checks += 1
            return self._gate.refused(request)
        return None

    async def _acknowledged(self, connection: _Connection) -> None:
        """Wait until the client has acknowledged every byte written to it (TimeoutError at write_timeout):
        the next pipelined request is not read before. The kernel takes a non-reading client's answers
        until its send buffer is full (megabytes), so the transport alone would never show it stalled."""
        writer = connection.writer
        sock = writer.get_extra_info("socket")
        if _UNACKNOWLEDGED is None or sock is None:
            return
        deadline = self._loop.time() + self._limits.write_timeout_s
        pause = _ACK_POLL_S[0]
        try:
            while _socket_count(sock.fileno(), _UNACKNOWLEDGED) > 0:
                if connection.stalled_since is None:
                    connection.stalled_since = self._loop.time()  # evictable once this has lasted (see _admit)
                if self._loop.time() + pause > deadline:
                    raise TimeoutError
                await asyncio.sleep(pause)
                pause = min(pause * 2, _ACK_POLL_S[1])
        finally:
            connection.stalled_since = None

    def _answer(self, request: Request) -> Response:
        """The handler's response, gzipped when the client asks and it pays (on a pool thread)."""
        try:
            response = self._handler(request)
        except Exception:  # a bug in a handler answers 500; it must not take the connection or the server
            log.exception("handling %s %s failed", request.method, request.path)
            return Response(status=500, body=b"internal error; see the service log\n")
        if len(response.body) >= _GZIP_MIN_BYTES and _accepts_gzip(request.header("accept-encoding") or ""):
            compressed = self._gzipped(response.body)
            headers = (*response.headers, ("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding"))
            return Response(
                status=response.status, body=compressed, content_type=response.content_type, headers=headers
            )
        return response

    def _gzipped(self, body: bytes) -> bytes:
        """gzip of ``body``; the latest one is kept, since many scrapers get the same cached body."""
        last = self._last_gzip
        if last is not None and last[0] is body:
            return last[1]
        compressed = gzip.compress(body, compresslevel=5, mtime=0)
        self._last_gzip = (body, compressed)
        return compressed

    async def _send(self, protocol: h11.Connection, connection: _Connection, response: Response, *, head: bool) -> None:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            *response.headers,
            *self._extra_headers(),
        ]
        if not self._server.is_serving():
            headers.append(("Connection", "close"))
        # With its reason phrase ("200 OK"), as other servers write it; h11 leaves it empty unless told.
        reason = _REASONS.get(response.status, b"")
        first = protocol.send(h11.Response(status_code=response.status, headers=headers, reason=reason)) or b""
        pieces: list[bytes | memoryview] = []
        if not head and response.body:
            # The body as it is (often the cached /metrics, shared by every scraper), in pieces: no copy of it
            # but the first piece, which goes out with the head (a small answer stays one write).
            body = memoryview(b"".join(protocol.send_with_data_passthrough(h11.Data(data=response.body)) or []))
            first += body[:_WRITE_PIECE]
            pieces += [body[start : start + _WRITE_PIECE] for start in range(_WRITE_PIECE, len(body), _WRITE_PIECE)]
        pieces.insert(0, first)
        if end := protocol.send(h11.EndOfMessage()):  # chunked framing's last chunk; nothing with Content-Length
            pieces.append(end)
        writer = connection.writer
        deadline = self._loop.time() + self._limits.write_timeout_s
        try:
            for piece in pieces:
                writer.write(piece)
                if writer.transport.get_write_buffer_size() > 0:
                    connection.stalled_since = self._loop.time()  # evictable once this has lasted (see _admit)
                await asyncio.wait_for(writer.drain(), max(0.0, deadline - self._loop.time()))
                connection.stalled_since = None
        finally:
            connection.stalled_since = None


class _TlsProtocol(sslproto.SSLProtocol):
    """asyncio's TLS protocol with a read buffer of 32 KiB, not CPython 3.11's 256 KiB (``max_size``, allocated at
    construction, so for every handshake, stalled or not): a TLS record is at most 16 KiB and requests here are
    small. Rounds of stalled handshakes held 256 of them at once."""

    max_size = 32 * 1024


class _TakenInTurn:
    """Calls run on threads of their own, at most ``threads`` at once, taken in turn by key (client address)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threads: int) -> None:
        self._loop = loop
        self._threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="http-check")
        self._queues: OrderedDict[str, deque[tuple[Callable[[], bool], asyncio.Future[bool]]]] = OrderedDict()
        self._running = 0

    async def run(self, key: str, call: Callable[[], bool]) -> bool:
        """``call``'s result once its turn came and it ran (cancelling the wait drops it if not begun)."""
        future: asyncio.Future[bool] = self._loop.create_future()
        self._queues.setdefault(key, deque()).append((call, future))
        self._next()
        return await future

    def _next(self) -> None:
        while self._running < self._threads and self._queues:
            key, waiting = next(iter(self._queues.items()))
            call, future = waiting.popleft()
            if waiting:
                self._queues.move_to_end(key)  # its next call waits for every other key's turn
            else:
                del self._queues[key]
            if future.cancelled():
                continue
            self._running += 1
            ran = self._loop.run_in_executor(self._pool, call)
            ran.add_done_callback(functools.partial(self._finished, future))

    def _finished(self, future: asyncio.Future[bool], ran: asyncio.Future[bool]) -> None:
        self._running -= 1
        if not future.cancelled():
            if ran.cancelled() or ran.exception() is not None:
                future.set_result(False)  # a check that could not finish lets nobody in
            else:
                future.set_result(ran.result())
        self._next()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _settled(waiting: list[_Connection]) -> _Connection | None:
    """Of connections that have waited a while for a request (longest waiting first), the first that has sent
    nothing since it began to wait, else the first whose partial head has been read (see ``_newcomer``)."""
    readable = [c for c in waiting if not c.unread()]
    return next((c for c in readable if not c.heard_from()), readable[0] if readable else None)


def _newcomer(waiting: list[_Connection]) -> _Connection | None:
    """Of connections that have just begun to wait for a request (longest waiting first), the first that has
    nothing unread; silent or not, since a client is silent from its accept until its request arrives (a TLS
    client for its whole handshake), so silent-first would evict real newcomers before a flood that sent a
    byte each. Never one whose bytes are here and not yet read, which may be a whole request: by age alone, a
    scraper that had just sent its request was evicted by a burst admitted before its request was read."""
    return next((c for c in waiting if not c.unread()), None)


def _fresh_guesser(checking: OrderedDict[_Connection, str], *, crowded: bool) -> _Connection | None:
    """Of connections waiting for their first password check (oldest first, each with its client's address), a
    guesser's: the newest that pipelined requests behind its check, else the newest from the address with the
    most checks pending, if that is more than one. Not the oldest: checks are taken in turn by address, so the
    oldest is the client that waited longest behind the guessers, a scraper whose right password is not yet
    cached, which was evicted again and again. None where each check is its client's only one, unless checks
    hold half the slots (``crowded``: guessers from many addresses, one check each), then the newest."""
    pipelining = [c for c in checking if c.pipelined]
    if pipelining:
        return pipelining[-1]
    if crowded:
        return next(reversed(checking), None)
    crowds = Counter(checking.values())
    most = max(crowds.values(), default=0)
    return next((c for c, peer in reversed(checking.items()) if crowds[peer] == most > 1), None)


def _end(connection: _Connection) -> None:
    """End a connection at once: its socket aborted, its coroutine cancelled (it may be in a TLS handshake or
    waiting for a password check, not on its socket). A failed handshake leaves no transport to abort
    (CPython 3.11): touching it raised an AttributeError in the next client's admission."""
    connection.ended = True
    transport = connection.writer.transport
    if transport is not None:
        transport.abort()
    if connection.task is not None:
        connection.task.cancel()


def _socket_count(fd: int, request: int) -> int:
    """A count the kernel keeps for socket ``fd``: bytes received and unread (FIONREAD), or written and not yet
    acknowledged by the peer (SIOCOUTQ); 0 where that cannot be told."""
    if fd < 0:  # -1: the socket closed meanwhile (the client went away)
        return 0
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, request, b"\0\0\0\0"))[0])
    except OSError:
        return 0


class _ChunkSizes:
    """The chunk sizes a chunked body declares, read beside h11 (which does not tell them) from the bytes that
    follow the head: a chunk larger than the body limit is refused when it is declared, not waited for until
    the request deadline. h11 checks the framing itself; this only follows it."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._total = 0
        self._left = 0  # bytes of the current chunk still to come, its closing CRLF included
        self._line = bytearray()  # a chunk-size line not yet whole
        self._done = False  # the last chunk came: what follows (trailers, the next request) is not ours

    def feed(self, data: bytes) -> None:
        at = 0
        while at < len(data) and not self._done:
            if self._left:
                taken = min(self._left, len(data) - at)
                self._left -= taken
                at += taken
                continue
            end = data.find(b"\n", at)
            if end < 0:
                self._line += data[at : at + _READ_CHUNK]  # h11 refuses a line longer than the head limit
                return
            self._line += data[at:end]
            at = end + 1
            self._declared(bytes(self._line.split(b";", 1)[0].strip()))
            self._line.clear()

    def _declared(self, digits: bytes) -> None:
        if len(digits) > _CHUNK_SIZE_DIGITS:
            raise h11.RemoteProtocolError(f"chunk size of {len(digits)} hex digits", error_status_hint=400)
        try:
            size = int(digits, 16)
        except ValueError:
            return  # h11 refuses it
        if size == 0:
            self._done = True
        self._total += size
        if self._total > self._limit:
            raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
        self._left = size + 2 if size else 0


def _plain_error(status: int, message: str) -> bytes:
    """A whole error response, written without h11 (whose state is spent after a protocol error)."""
    # RFC 9110's name for 413; Python 3.11 still has "Request Entity Too Large".
    reason = {413: "Content Too Large"}.get(status) or _REASONS.get(status, b"Error").decode("ascii")
    body = f"{message}\n".encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _origin_form(target: str) -> str:
    """A request target as path and query; the absolute form (``GET http://host/metrics``) too (RFC 9112 3.2.2)."""
    if target.startswith(("http://", "https://")):
        try:
            parts = urllib.parse.urlsplit(target)
        except ValueError as exc:  # e.g. "http://[/metrics": h11 lets any visible characters through
            raise h11.RemoteProtocolError(f"bad request target: {exc}", error_status_hint=400) from None
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return target


def _cross_site(request: Request) -> Response | None:
    """403 for a request that would change something and that a page of another site sent (CSRF); else None.

    A page of any site may send a form or a no-cors fetch without CORS' consent, so an operator's open tab
    could start sweeps and reloads. The rule of Go's ``http.CrossOriginProtection`` (Prometheus has none):
    a browser's Sec-Fetch-Site decides where sent (current browsers send it); else an Origin must name the
    Host asked for, by host and port, not scheme (behind a proxy that ends TLS the page is https, this http);
    a request with neither is no browser's (curl, a config-reloader sidecar) and passes.
    """
    if request.method in _SAFE_METHODS:
        return None
    site = request.header("sec-fetch-site") or ""
    origin = request.header("origin") or ""
    host = (request.header("host") or "").lower()
    if site:
        if site in ("same-origin", "none"):  # "none": the user's own doing (typed, bookmarked)
            return None
        said = f"Sec-Fetch-Site: {site}"
    elif not origin or (host and _host_of(origin) == host):
        return None
    else:
        said = f"Origin: {origin}"
    body = (
        f"refused: a request from another site ({said}) may not change anything here; send it from this "
        "server's own pages or without Origin and Sec-Fetch-Site, as curl does\n"
    )
    return Response(status=403, body=body.encode())


def _host_of(origin: str) -> str:
    """The host and port of an Origin header (``http://host:port``); empty for ``null`` or one that does not parse."""
    try:
        return urllib.parse.urlsplit(origin).netloc.lower()
    except ValueError:
        return ""


def _accepts_gzip(header: str) -> bool:
    """Whether Accept-Encoding allows gzip: named, or through ``*``, with a weight above 0 (``gzip;q=0`` refuses)."""
    weights: dict[str, float] = {}
    for item in header.lower().split(","):
        name, *params = (part.strip() for part in item.split(";"))
        quality = next((p.partition("=")[2] for p in params if p.partition("=")[0].strip() == "q"), "1")
        try:
            weights.setdefault(name, float(quality))
        except ValueError:
            weights.setdefault(name, 0.0)
    return weights.get("gzip", weights.get("*", 0.0)) > 0
