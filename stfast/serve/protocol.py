"""The HTTP/1.1 connection: uvicorn's httptools protocol with read timeouts and a connection cap.

uvicorn (0.55) bounds an idle keep-alive connection (``timeout_keep_alive``) but not one that never sends, nor
one that trickles its headers or body: any byte cancels its keep-alive timer and nothing else is timed, so such
sockets stayed open for as long as their client liked (measured: still open after 75 s). Hypercorn's
``read_timeout`` bounds each read, which a byte every few seconds also defeats; granian is not a dependency.
So the service keeps uvicorn and times what it lacks here, per request:

* the headers must be complete within ``header_timeout_s`` of the connection's first byte being awaited (a new
  connection) or of a new request's first byte (keep-alive): past it the socket is closed;
* the body within ``body_timeout_s`` of the headers: past it the client gets a JSON 408 and the socket is closed;
* a request line and headers of at most ``max_header_bytes`` (uvicorn's httptools protocol keeps any amount):
  past it a JSON 431 and the socket is closed;
* at most ``max_connections`` connections are open: one more gets a JSON 503 and is closed at once, before it
  holds a file descriptor for long (uvicorn's ``limit_concurrency`` answers in plain text, and only once the
  headers are in).
"""
from __future__ import annotations

import asyncio

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _raw_response(status: str, error: str) -> bytes:
    body = orjson.dumps({"error": error})
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode("ascii") + body


class TimedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol plus the module docstring's timeouts and connection cap (class attributes, set
    by :func:`protocol_class`)."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_connections = 1000
    max_header_bytes = 16384
    _timer: asyncio.TimerHandle | None = None
    _header_bytes = 0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(_raw_response("503 Service Unavailable",
                                          f"the service holds its limit of {self.max_connections} connections; "
                                          "retry later"))
            transport.close()
            return
        self._arm(self.header_timeout_s, self._header_timeout)

    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        if self._timer is None:  # a keep-alive connection's next request: its headers are timed from now
            self._arm(self.header_timeout_s, self._header_timeout)

    def on_url(self, url: bytes) -> None:
        self._count_header(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header(len(name) + len(value))
        super().on_header(name, value)

    def _count_header(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            self.transport.write(_raw_response("431 Request Header Fields Too Large",
                                               f"request line and headers over the limit of {self.max_header_bytes} "
                                               "bytes"))
            self.transport.close()

    def on_headers_complete(self) -> None:
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

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

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


def protocol_class(header_timeout_s: float, body_timeout_s: float, max_connections: int,
                   max_header_bytes: int = 16384) -> type:
    """A :class:`TimedHttpTools` subclass with these limits (uvicorn's ``http=`` takes a class)."""
    return type("TimedHttpTools", (TimedHttpTools,), {"header_timeout_s": header_timeout_s,
                                                      "body_timeout_s": body_timeout_s,
                                                      "max_connections": max_connections,
                                                      "max_header_bytes": max_header_bytes})
