"""A service on loopback for the serve tests: uvicorn with the service's own configuration in a thread."""
from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

from stfast.serve.app import server_config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(app, **limits):
    """``app`` served by uvicorn with :func:`server_config` (``limits`` its keywords) in a thread, until the block
    ends (then a graceful shutdown); yields (URL, port, the ``uvicorn.Server``)."""
    port = free_port()
    server = uvicorn.Server(server_config(app, "127.0.0.1", port, **limits))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", port, server
    finally:
        server.should_exit = True
        th.join(30)
