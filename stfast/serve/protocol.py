"""The HTTP/1.1 connection: uvicorn's httptools protocol with read and write timeouts, limits per connection and
per client address, backpressure for pipelined requests, and answers at shutdown.

uvicorn (0.55) bounds an idle keep-alive connection (``timeout_keep_alive``) but not one that never sends, nor
one that trickles its headers or body: any byte cancels its keep-alive timer and nothing else is timed, so such
sockets stayed open for as long as their client liked (measured: still open after 75 s). Hypercorn's
``read_timeout`` bounds each read, which a byte every few seconds also defeats; granian is not a dependency.
So the service keeps uvicorn and adds what it lacks here:

* the headers must be complete within ``header_timeout_s`` of the connection's first byte being awaited (a new
  connection) or of a new request's first byte (keep-alive): past it the socket is closed;
* the body within ``body_timeout_s`` of the headers: past it the client gets a JSON 408 and the socket is closed;
* a header block (request line, headers, every byte of it, whitespace included) of at most ``max_header_bytes``
  and at most ``max_headers`` header fields (uvicorn's httptools protocol keeps any amount, and 16,000 empty
  ``X:`` headers cost 16,000 Python calls): past either a JSON 431 and the socket is closed;
* pipelined requests are read only as fast as they are answered: the parser is fed 1 KiB at a time and not at all
  while ``max_pipeline`` requests wait behind the one being answered (uvicorn pauses reading then, but the
  running request's ``receive()`` and every answer resume it, and each read chunk is parsed whole, so a client
  that pipelines without pause grew the queue by a read chunk per answer: 1 GB for 400,000 ``GET /healthz``);
* a malformed request after valid pipelined ones is answered (a JSON 400) after them, not instead of them;
* at most ``max_connections`` connections are open, and ``max_per_client`` from one address (the addresses of
  ``trusted`` proxies aside): one more gets a JSON 503 and is closed at once (uvicorn's ``limit_concurrency``
  answers in plain text, only once the headers are in, and knows no client);
* a client that does not read what it asked for: once the socket's write buffer is full, it has
  ``write_timeout_s`` to take some of it, else the connection is aborted;
* when the drain after SIGTERM ends with requests still in flight, each (and each pipelined request behind it)
  gets a JSON 503 ``{"error": "shutting down"}`` with ``Connection: close``, where uvicorn cancelled them into a
  traceback and a plain-text 500.
"""
from __future__ import annotations

import asyncio
import ipaddress

import httptools
import orjson
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FEED_BYTES = 1024
"""The parser is fed this much at a time, so that it stops within this many bytes of a full pipeline or of the
header-bytes limit."""


def _raw_response(status: str, error: str, close: bool = True) -> bytes:
    body = orjson.dumps({"error": error})
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    return (head + ("connection: close\r\n\r\n" if close else "\r\n")).encode("ascii") + body


def trusted_peers(spec: str | None):
    """``forwarded_allow_ips`` (comma-separated addresses or networks, ``*``: every peer) as a predicate on a peer
    address: the proxies whose connections the per-client cap does not count (they carry many clients)."""
    items = [x.strip() for x in (spec or "").split(",") if x.strip()]
    if "*" in items:
        return lambda addr: True
    nets = []
    for x in items:
        try:
            nets.append(ipaddress.ip_network(x, strict=False))
        except ValueError:
            pass  # a name (uvicorn allows unix socket paths / literals): not an address the cap sees
    literal = set(items)

    def trusted(addr: str) -> bool:
        if addr in literal:
            return True
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            return False
        return any(ip in n for n in nets)

    return trusted


class _Flow(FlowControl):
    """uvicorn's flow control, but reading resumes only while the connection may read (:meth:`TimedHttpTools._may_read`):
    uvicorn resumes it on every ``receive()`` and every answer."""

    def __init__(self, transport, protocol: "TimedHttpTools"):
        super().__init__(transport)
        self.protocol = protocol

    def resume_reading(self) -> None:
        if self.protocol._may_read():
            super().resume_reading()


class TimedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol plus the module docstring's timeouts, limits, backpressure and shutdown answers
    (class attributes, set by :func:`protocol_class`)."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    write_timeout_s = 30.0
    max_connections = 1000
    max_per_client = 250
    max_header_bytes = 16384
    max_headers = 100
    max_pipeline = 8
    trusted = staticmethod(lambda addr: False)
    _timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _header_count = 0
    _backlog = b""  # read but not yet parsed: the pipeline is full
    _fed = 0  # bytes fed to the parser
    _head_from = 0  # _fed before the slice in which the current request's head began
    _in_head = False
    _error: str | None = None  # a malformed request, answered once the requests before it are
    _draining = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.flow = _Flow(transport, self)
        addr = self.client[0] if self.client else None
        if len(self.connections) > self.max_connections:
            return self._refuse_connection(f"the service holds its limit of {self.max_connections} connections; "
                                           "retry later")
        if addr is not None and not self.trusted(addr) and sum(
                1 for c in self.connections if c.client and c.client[0] == addr) > self.max_per_client:
            return self._refuse_connection(f"this address holds its limit of {self.max_per_client} connections; "
                                           "reuse one or retry later")
        self._arm(self.header_timeout_s, self._header_timeout)

    def _refuse_connection(self, error: str) -> None:
        self.transport.write(_raw_response("503 Service Unavailable", error))
        self.transport.close()

    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- reading: backpressure, malformed requests after valid ones --------------------------------------------------

    def _may_read(self) -> bool:
        return not self._backlog and len(self.pipeline) < self.max_pipeline and self._error is None

    def data_received(self, data: bytes) -> None:
        self._backlog = self._backlog + data if self._backlog else data
        self._feed()

    def _feed(self) -> None:
        """Parses the backlog a slice at a time while fewer than ``max_pipeline`` requests wait; keeps the rest
        (reading paused) for when they have been answered."""
        data, self._backlog = self._backlog, b""
        if not data:
            return
        self._unset_keepalive_if_required()
        view, pos = memoryview(data), 0
        while pos < len(data):
            if self.transport.is_closing() or self._error is not None or self.parser is None:
                return
            if len(self.pipeline) >= self.max_pipeline:
                self._backlog = bytes(view[pos:])
                self.flow.pause_reading()
                return
            chunk = view[pos:pos + FEED_BYTES]
            pos += len(chunk)
            try:
                self.parser.feed_data(chunk)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError:
                self._bad_request()
                return
            self._fed += len(chunk)
            # the head began within the slice that started at _head_from: at least this many bytes are its
            if self._in_head and self._fed - self._head_from - FEED_BYTES > self.max_header_bytes:
                self._refuse_head(f"request line and headers over the limit of {self.max_header_bytes} bytes")

    def _bad_request(self) -> None:
        """A malformed request: a JSON 400 and close, after the answers to the valid requests before it."""
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            self._error = "invalid HTTP request"
            self._backlog = b""
            self.flow.pause_reading()
        else:
            self._send_400()

    def _send_400(self) -> None:
        self.transport.write(_raw_response("400 Bad Request", "invalid HTTP request"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:  # uvicorn's, in plain text: ours in JSON
        self._send_400()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next pipelined request
        if self.transport.is_closing():
            return
        self._feed()
        if self._error is not None:
            if not self.pipeline and (self.cycle is None or self.cycle.response_complete):
                self._send_400()
        elif self._may_read():
            self.flow.resume_reading()

    # -- the head: its bytes and fields ------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 16  # the method, the version, spaces and CRLFs: 16 bytes at least
        self._header_count = 0
        self._in_head = True
        self._head_from = self._fed
        if self._timer is None:  # a keep-alive connection's next request: its headers are timed from now
            self._arm(self.header_timeout_s, self._header_timeout)

    def on_url(self, url: bytes) -> None:
        self._count_header(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.max_headers:
            return self._refuse_head(f"more than {self.max_headers} header fields")
        self._count_header(len(name) + len(value) + 4)  # + ": " and CRLF
        super().on_header(name, value)

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.max_header_bytes:
            self._refuse_head(f"request line and headers over the limit of {self.max_header_bytes} bytes")

    def _refuse_head(self, error: str) -> None:
        if not self.transport.is_closing():
            self.transport.write(_raw_response("431 Request Header Fields Too Large", error))
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self.transport.is_closing():
            return
        self._arm(self.body_timeout_s, self._body_timeout)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self.transport.is_closing():
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        if not self.transport.is_closing():
            super().on_message_complete()

    # -- writing: clients that do not read ---------------------------------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._write_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timeout(self) -> None:
        self._write_timer = None
        self.transport.abort()  # close() would wait for the buffer the client does not take

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._backlog = b""
        super().connection_lost(exc)

    # -- timeouts ----------------------------------------------------------------------------------------------------

    def _header_timeout(self) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _body_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_raw_response("408 Request Timeout", f"the request body did not arrive within "
                                                                      f"{self.body_timeout_s:g} s"))
        if self.cycle is not None:  # what the app may still send goes nowhere; its receive() says disconnected
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    # -- shutdown ----------------------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._draining = True
        super().shutdown()

    def _start_asgi_task(self, cycle, app) -> None:
        async def answering_at_shutdown(scope, receive, send):
            try:
                await app(scope, receive, send)
            except asyncio.CancelledError:  # uvicorn cancels what is still running when the drain ends
                if not self._draining:
                    raise
                self._shutting_down(cycle)

        super()._start_asgi_task(cycle, answering_at_shutdown)

    def _shutting_down(self, cycle) -> None:
        """The drain ended with ``cycle`` in flight: a JSON 503 for it and each pipelined request behind it (the
        last with ``Connection: close``), then close."""
        if not self.transport.is_closing() and not cycle.response_started:
            waiting = list(reversed(self.pipeline))
            for k in range(len(waiting) + 1):
                self.transport.write(_raw_response("503 Service Unavailable", "shutting down",
                                                   close=k == len(waiting)))
        self.pipeline.clear()
        cycle.disconnected = True  # uvicorn sends nothing more for it
        self.transport.close()


def protocol_class(header_timeout_s: float, body_timeout_s: float, max_connections: int,
                   max_header_bytes: int = 16384, *, max_per_client: int | None = None, write_timeout_s: float = 30.0,
                   forwarded_allow_ips: str | None = None, max_headers: int = 100, max_pipeline: int = 8) -> type:
    """A :class:`TimedHttpTools` subclass with these limits (uvicorn's ``http=`` takes a class). ``max_per_client``:
    connections per client address (default: a quarter of ``max_connections``), the addresses of
    ``forwarded_allow_ips`` (reverse proxies) not counted."""
    return type("TimedHttpTools", (TimedHttpTools,), {
        "header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, "max_connections": max_connections,
        "max_header_bytes": max_header_bytes, "write_timeout_s": write_timeout_s, "max_headers": max_headers,
        "max_per_client": max_per_client or max(1, max_connections // 4), "max_pipeline": max_pipeline,
        "trusted": staticmethod(trusted_peers(forwarded_allow_ips))})
