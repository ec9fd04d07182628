"""stfast serve and its clients (issue 54; issue 52 item 4): a client that leaves costs nothing, the service says
where it listens and logs one line per request, one Host and a case-blind bearer scheme, shutdown that answers,
admission before work, and limits per connection and per client.

Every test runs uvicorn on loopback with the service's own configuration (:func:`stfast.serve.app.server_config`)
in a thread; loops are bounded in count and time, and nothing asserts a speed."""
from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
import time

import pytest
from _eta_run import CENTER, KM_PER_DEG, train_run

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from _serve_run import serving  # noqa: E402

from stfast.serve.app import create_app  # noqa: E402
from stfast.train.trained import load_model  # noqa: E402

DEP = "2016-11-02T08:30:00+08:00"


def _route(n=12, km=0.25):
    return [[CENTER[0], CENTER[1] + i * km / KM_PER_DEG] for i in range(n)]


def _good(k=0):
    return {"route": _route(10 + k % 7), "departure": DEP}


def _post(body: dict | bytes, host: str = "127.0.0.1", extra: bytes = b"") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (b"POST /eta HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    _, ck = train_run(tmp_path_factory.mktemp("serve_clients"))
    return ck


@pytest.fixture(scope="module")
def model(trained):
    return load_model(trained)


class Records(logging.Handler):
    """Every record of the service's and uvicorn's loggers while attached."""

    NAMES = ("stfast.serve", "uvicorn.error", "uvicorn")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def attach(self):
        for n in self.NAMES:
            logging.getLogger(n).addHandler(self)
        return self

    def detach(self):
        for n in self.NAMES:
            logging.getLogger(n).removeHandler(self)

    def bad(self) -> list[str]:
        """Warnings, errors and tracebacks."""
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.levelno >= logging.WARNING or r.exc_info]


@contextlib.contextmanager
def running(app, **limits):
    """:func:`serving` ``app``; yields (URL, port, server, records of the loggers while it ran)."""
    rec = Records()
    try:
        with serving(app, **limits) as (url, port, server):
            rec.attach()  # after the Config: its logging setup resets uvicorn's loggers
            yield url, port, server, rec
    finally:
        rec.detach()


def _gate(batcher) -> threading.Event:
    """Holds ``batcher``'s passes until the returned event is set."""
    gate, forward = threading.Event(), batcher.forward
    batcher.forward = lambda items: (gate.wait(20), forward(items))[1]
    return gate


def _wait(cond, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _read_all(sock: socket.socket, seconds: float) -> bytes:
    """What the server sends until it closes ``sock`` or ``seconds`` pass."""
    sock.settimeout(seconds)
    got = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            got += chunk
    return got


# -- 1. a client that leaves costs nothing -------------------------------------------------------------------------

def test_clients_that_leave_while_waiting_cost_nothing(model):
    """30 clients send a valid POST /eta and leave while it waits behind a held pass: no InvalidStateError, no
    traceback, no 500, no warning; their work never reaches a pass; /healthz counts 30 abandoned. (Before:
    ``answer()`` cancelled the job and then read its result: one "error answering POST /eta" traceback each.)"""
    app = create_app(model, max_batch=64, max_wait_ms=0)
    b = app.state.batcher
    gate = _gate(b)
    with running(app) as (url, port, _, rec):
        first = socket.create_connection(("127.0.0.1", port))
        first.sendall(_post(_good()))
        assert _wait(lambda: b._task is not None and not b.queued_points and b.forward_passes == 0)
        leaving = [socket.create_connection(("127.0.0.1", port)) for _ in range(30)]
        for k, s in enumerate(leaving):
            s.sendall(_post(_good(k)))
        assert _wait(lambda: len(b._pending) == 30), len(b._pending)  # all 30 wait behind the held pass
        for s in leaving:
            s.close()
        with httpx.Client(base_url=url, timeout=30) as c:
            assert _wait(lambda: c.get("/healthz").json().get("requests", {}).get("abandoned") == 30)
            gate.set()
            first.settimeout(20)
            assert first.recv(65536).startswith(b"HTTP/1.1 200")
            assert c.post("/eta", json=_good()).status_code == 200
        first.close()
        assert b.routes == 2  # the first request's and the last one's: the 30 left the queue before any pass
    assert rec.bad() == [], rec.bad()[:3]


# -- issue 52 item 4: a ready line, --log-level, an access log -----------------------------------------------------

def test_serve_says_where_it_listens_and_logs_one_line_per_request(trained, tmp_path):
    """``stfast serve`` prints a ready line on stderr with its URL and the model, then one access-log line per request
    (status, latency, batch size) that never holds the route, the token, the query or a file system path."""
    import os
    import signal
    import subprocess
    import sys

    from _serve_run import free_port

    token = "tok-" + "s3cr3t" * 4
    (tmp_path / "token").write_text(token + "\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", "stfast.cli", "serve", "--checkpoint", str(trained), "--port",
                             str(port), "--token-file", str(tmp_path / "token")], env=env, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    try:
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        assert _wait(lambda: any("ready on" in ln for ln in lines) or proc.poll() is not None, 120), lines
        ready = next(ln for ln in lines if "ready on" in ln)
        assert f"http://127.0.0.1:{port}" in ready and "DeepTTE" in ready and "hidden" in ready
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            assert c.post("/eta", json=_good(), headers=auth).status_code == 200
            assert c.post("/eta", json={"routes": [_good(1), _good(2)]}, headers=auth).status_code == 200
            assert c.get("/healthz").status_code == 200
            assert c.get(f"/nowhere/{trained.parent}?token={token}", headers=auth).status_code == 404
            assert c.post("/eta", json=_good()).status_code == 401
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logged = [ln for ln in lines if " batch " in ln]
    assert len(logged) == 5, lines
    for ln, want in zip(logged, (" POST /eta 200 ", " POST /eta 200 ", " GET /healthz 200 ", " GET ? 404 ",
                                 " POST /eta 401 ")):
        assert want in ln and " ms batch " in ln, (want, ln)
    assert logged[0].rstrip().endswith("batch 1") and logged[1].rstrip().endswith("batch 2")
    text = "".join(lines)
    for secret in (token, str(trained), trained.parent.name, str(tmp_path), f"{CENTER[0]}"):
        assert secret not in text, secret
    assert "Traceback" not in text


def test_no_access_log_and_log_level(model):
    from stfast.cli import build_parser

    a = build_parser().parse_args(["serve", "--checkpoint", "c.pt"])
    assert (a.log_level, a.access_log) == ("info", True)
    a = build_parser().parse_args(["serve", "--checkpoint", "c.pt", "--no-access-log", "--log-level", "warning"])
    assert (a.log_level, a.access_log) == ("warning", False)
    from stfast.serve.app import setup_logging

    root = logging.getLogger("stfast.serve")
    saved = root.handlers, root.level, root.propagate
    try:
        setup_logging("warning")  # --log-level warning: no ready line, no access log
        assert not logging.getLogger("stfast.serve.access").isEnabledFor(logging.INFO)
        setup_logging("info")
        assert logging.getLogger("stfast.serve.access").isEnabledFor(logging.INFO) and len(root.handlers) == 1
        with pytest.raises(ValueError, match="debug, info, warning, error"):
            setup_logging("loud")
    finally:
        root.handlers, root.propagate = saved[0], saved[2]
        root.setLevel(saved[1])
    for access_log, want in ((True, 2), (False, 0)):
        logging.getLogger("stfast.serve").setLevel(logging.INFO)
        with running(create_app(model, access_log=access_log)) as (url, _, _, rec):
            with httpx.Client(base_url=url, timeout=30) as c:
                assert c.get("/healthz").status_code == 200 and c.post("/eta", json=_good()).status_code == 200
        assert sum(r.name == "stfast.serve.access" for r in rec.records) == want


# -- 5. one Host, one meaning; the bearer scheme without case -----------------------------------------------------

def _one_answer(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        s.settimeout(20)
        got = b""
        while b"\r\n\r\n" not in got and (chunk := s.recv(65536)):
            got += chunk
        return got


def test_two_host_headers_or_a_malformed_host_get_a_400_and_the_bearer_scheme_is_case_blind(model):
    token = "s3cret-token-0123456789"
    app = create_app(model, token=token, allowed_hosts=("localhost", "127.0.0.1", "::1"))
    auth = b"Authorization: Bearer " + token.encode() + b"\r\n"
    with running(app) as (_, port, _, rec):
        def status(host_lines: bytes, extra: bytes = auth) -> bytes:
            head = b"GET /coverage HTTP/1.1\r\n" + host_lines + extra + b"\r\n"
            return _one_answer(port, head)[:12]

        assert status(b"Host: 127.0.0.1\r\n") == b"HTTP/1.1 200"
        assert status(b"Host: [::1]:8000\r\n") == b"HTTP/1.1 200"
        assert status(b"Host: evil.example\r\nHost: 127.0.0.1\r\n") == b"HTTP/1.1 400"  # before: the last counted
        assert status(b"Host: 127.0.0.1\r\nHost: 127.0.0.1\r\n") == b"HTTP/1.1 400"
        for bad in (b"[localhost]evil.example", b"[::1]evil.example", b"[localhost]", b"127.0.0.1:80:80",
                    b"local host", b"127.0.0.1/x"):
            assert status(b"Host: " + bad + b"\r\n") == b"HTTP/1.1 400", bad
        assert status(b"Host: evil.example\r\n") == b"HTTP/1.1 421"
        for scheme in (b"bearer", b"BEARER", b"BeArEr"):  # RFC 9110: the scheme is case-insensitive
            assert status(b"Host: 127.0.0.1\r\n", b"Authorization: " + scheme + b" " + token.encode() + b"\r\n") \
                == b"HTTP/1.1 200", scheme
        for wrong in (b"Basic " + token.encode(), b"Bearer " + token.encode()[:-1], b"Bearer" + token.encode(),
                      token.encode(), b""):
            assert status(b"Host: 127.0.0.1\r\n", b"Authorization: " + wrong + b"\r\n") == b"HTTP/1.1 401", wrong
        assert status(b"Host: 127.0.0.1\r\n", auth + auth) == b"HTTP/1.1 400"  # two Authorization headers
        r = _one_answer(port, b"GET /coverage HTTP/1.1\r\nHost: [localhost]evil.example\r\n" + auth + b"\r\n")
        assert b"application/json" in r
    assert rec.bad() == []


# -- 4. shutdown that answers; a pipeline answered before its malformed request -----------------------------------

def _statuses(raw: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)


def test_requests_in_flight_when_the_drain_ends_get_a_json_503(model):
    """The drain (1 s) ends with requests waiting behind a held pass, one mid-upload and a pipeline of three: each
    gets a JSON 503 "shutting down" with Connection: close (before: a plain-text 500 and a CancelledError
    traceback each, and nothing for the pipelined ones), and nothing is logged with a traceback."""
    app = create_app(model, max_batch=64, max_wait_ms=0)
    b = app.state.batcher
    gate = _gate(b)
    try:
        with running(app, drain_s=1.0) as (url, port, server, rec):
            waiting = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
            for k, s in enumerate(waiting):
                s.sendall(_post(_good(k)))
            piped = socket.create_connection(("127.0.0.1", port))
            piped.sendall(_post(_good(7)) * 3)
            assert _wait(lambda: len(b._pending) >= 6)
            upload = socket.create_connection(("127.0.0.1", port))
            body = json.dumps(_good()).encode()
            upload.sendall(_post(body)[:-10])  # headers and most of the body
            # in flight: the 6, the upload and the pipeline's first (its other two wait behind it)
            assert _wait(lambda: len(server.server_state.tasks) == 8), len(server.server_state.tasks)
            server.should_exit = True
            answers = [_read_all(s, 20.0) for s in (*waiting, upload, piped)]
            for raw in answers:
                assert raw.startswith(b"HTTP/1.1 503"), raw[:200]
                assert b'{"error":"shutting down"}' in raw and b"connection: close" in raw.lower(), raw
            assert _statuses(answers[-1]) == [b"503"] * 3, answers[-1]
            for s in (*waiting, upload, piped):
                s.close()
    finally:
        gate.set()
    assert not [r for r in rec.records if r.exc_info], [r.getMessage() for r in rec.records if r.exc_info][:2]
    assert not any("Internal Server Error" in a.decode("latin-1") for a in answers)


def test_the_valid_requests_of_a_pipeline_are_answered_before_its_malformed_one(model):
    """10 valid POSTs, a malformed line and 10 more POSTs in one write: the 10 are answered, then a JSON 400, then
    the connection closes (before: only the 400 came back)."""
    app = create_app(model)
    with running(app) as (_, port, _, rec):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"".join(_post(_good(k)) for k in range(10)) + b"NOT HTTP AT ALL\r\n\r\n"
                      + b"".join(_post(_good(k)) for k in range(10)))
            raw = _read_all(s, 30.0)
        assert _statuses(raw) == [b"200"] * 10 + [b"400"], _statuses(raw)
        assert raw.endswith(b'{"error":"invalid HTTP request"}')
        # a malformed request alone: its JSON 400 at once
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert _statuses(_read_all(s, 10.0)) == [b"400"]
    assert not [r for r in rec.records if r.exc_info]


# -- 2. bounded per connection and per client ----------------------------------------------------------------------

def test_pipelined_requests_are_read_only_as_fast_as_they_are_answered(model):
    """3,000 pipelined GET /healthz sent while the client reads nothing: at most a few requests are parsed and
    queued at any time (before: every read chunk was parsed whole, a thousand and more requests queued per
    chunk, and memory grew with what the client sent); all 3,000 are answered once it reads."""
    app = create_app(model)
    req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    n = 3000
    with running(app) as (_, port, server, rec):
        s = socket.create_connection(("127.0.0.1", port))
        sender = threading.Thread(target=lambda: s.sendall(req * n), daemon=True)
        sender.start()
        conns = server.server_state.connections
        assert _wait(lambda: server.server_state.total_requests > 0)  # answering has begun
        queued = []
        for _ in range(20):  # the client reads nothing for 1 s: the queue stays small
            queued.append(max((len(c.pipeline) for c in conns), default=0))
            time.sleep(0.05)
        assert max(queued) <= 8 + 1024 // len(req) + 1, queued  # 8 waiting, and what one 1 KiB slice holds
        got, count = b"", 0
        s.settimeout(30)
        deadline = time.monotonic() + 60
        while count < n and time.monotonic() < deadline:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
            count += got.count(b"HTTP/1.1 200")
            got = got[got.rfind(b"HTTP/1.1 200") + 1:] if b"HTTP/1.1 200" in got else got
        sender.join(10)
        s.close()
        assert count == n
    assert rec.bad() == []


@pytest.mark.parametrize("head, words", [
    (b"X:\r\n" * 2000, b"more than 100 header fields"),  # 8 KB: under 16 KiB of names and values
    (b"X-A:" + b" " * 20000 + b"a\r\n", b"over the limit of 16384 bytes"),  # whitespace is bytes too
])
def test_header_floods_get_a_431(model, head, words):
    """Before, the 16 KiB cap counted only names and values, and any number of fields passed: 16,000 empty ones
    per request made 4 connections slow every other client 100-fold."""
    app = create_app(model)
    with running(app) as (url, port, _, _):
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + head + b"\r\n")
            got = _read_all(s, 10.0)
        assert got.startswith(b"HTTP/1.1 431") and words in got, got[:300]
        ok = _one_answer(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-B: b\r\n" * 90 + b"\r\n")
        assert ok.startswith(b"HTTP/1.1 200")  # 90 fields pass


def test_connections_per_client_address_are_capped_but_not_a_trusted_proxys(model):
    app = create_app(model)
    for allow, cap in ((None, 5), ("127.0.0.1", None)):
        with running(app, max_connections=50, max_connections_per_client=5, forwarded_allow_ips=allow) as \
                (url, port, server, _):
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
            extra = socket.create_connection(("127.0.0.1", port))
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            got = _read_all(extra, 5.0) if cap else _one_answer(port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            if cap:
                assert got.startswith(b"HTTP/1.1 503") and b"this address holds its limit of 5 connections" in got
            else:  # a reverse proxy carries many clients: only the global cap counts its connections
                assert got.startswith(b"HTTP/1.1 200"), got[:200]
            for s in (*held, extra):
                s.close()


def test_a_client_that_does_not_read_is_dropped_after_the_write_timeout(model):
    """A client pipelines 6,000 GET /healthz (about 9 MB of answers) through a 4 KiB receive window and reads
    nothing: once the server's write buffer is full it has write_timeout_s (1 s) to read, then the connection is
    aborted (before: it stayed open as long as the client liked)."""
    app = create_app(model)
    req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with running(app, write_timeout_s=1.0, idle_timeout_s=120.0) as (_, port, server, _):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        def send():
            with contextlib.suppress(OSError):
                s.sendall(req * 6000)

        threading.Thread(target=send, daemon=True).start()
        assert _wait(lambda: len(server.server_state.connections) == 1)
        assert _wait(lambda: len(server.server_state.connections) == 0, 40.0)
        s.close()


# -- 3. admission before work ------------------------------------------------------------------------------------

def test_every_path_is_metered_and_a_body_is_charged_before_it_is_parsed(model, monkeypatch):
    """--rate-limit 2: /healthz costs a tenth of a unit (before: nothing, 3,883 requests/s from 4 connections), and
    a 200 KB body is charged ~6 units from its Content-Length before it is read: after one such request the next
    ones are refused unparsed (before: each was parsed, then charged by its points)."""
    import stfast.serve.app as app_mod

    parsed = []
    check_body = app_mod.check_body
    monkeypatch.setattr(app_mod, "check_body", lambda *a, **k: (parsed.append(1), check_body(*a, **k))[1])
    app = create_app(model, rate_limit=2.0)
    big = json.dumps(_good()).encode()[:-1] + b" " * 200_000 + b"}"  # valid JSON, 200 KB of it whitespace
    with running(app) as (url, port, _, rec):
        with httpx.Client(base_url=url, timeout=30) as c:
            codes = [c.post("/eta", content=big, headers={"Content-Type": "application/json"}).status_code
                     for _ in range(3)]
            assert codes == [200, 429, 429] and len(parsed) == 1, (codes, parsed)
        app2 = create_app(model, rate_limit=1.0)
        with running(app2) as (url2, _, _, _), httpx.Client(base_url=url2, timeout=30) as c:
            health = [c.get("/healthz") for _ in range(30)]
            codes = [r.status_code for r in health]
            assert 5 <= codes.count(200) <= 15 and codes.count(429) >= 15, codes  # a burst of 1 unit: ~10 pass
            refused = next(r for r in health if r.status_code == 429)
            assert "rate limit" in refused.json()["error"] and int(refused.headers["Retry-After"]) >= 1


def test_admission_units():
    from stfast.serve.app import admission_units

    def units(path, method="POST", size=None):
        return admission_units({"path": path, "method": method},
                               {} if size is None else {b"content-length": str(size).encode()}, 1 << 20)

    assert units("/eta", size=100) == 1.0 and units("/eta") == 1.0  # at least a unit; chunked: a unit
    assert units("/eta", size=320 * 1024) == 10.0
    assert units("/eta", size=50 << 20) == 32.0  # a body over the limit is refused unread: charged up to it
    assert units("/healthz", "GET") == 0.1 and units("/nowhere", "GET") == 0.1 and units("/coverage", "GET") == 1.0


def test_a_port_in_use_is_one_line_naming_the_flag(trained, capsys):
    """Issue 62: ``stfast serve --port P`` with P taken by another program: one ``stfast: error:`` line naming
    --port, exit 2, before the model is read (before: uvicorn's raw ``[Errno 98] error while attempting to bind``
    log line and exit 3)."""
    import socket

    from conftest import one_line_error

    from stfast.cli import main

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        err = one_line_error(capsys, main(["serve", "--checkpoint", str(trained), "--port", str(port)]))
    finally:
        busy.close()
    assert f"--port {port}" in err and "in use" in err, err
