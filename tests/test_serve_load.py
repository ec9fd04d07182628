"""benchmarks/serve_load.py's load generator: the lean client's pre-encoded requests are valid HTTP/1.1 that a
standard parser (h11) reads back whole, its response reader reads what uvicorn sends (and refuses what it cannot
read), and against a real `stfast serve` app under uvicorn it gets the same answers as an httpx client."""
from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import pytest
from _eta_run import train_run

pytest.importorskip("fastapi")
h11 = pytest.importorskip("h11")
import uvicorn  # noqa: E402

from stfast.serve.app import create_app  # noqa: E402
from stfast.train.trained import load_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import serve_load  # noqa: E402


def test_request_bytes_parse_as_http11():
    body = json.dumps({"route": [[104.06, 30.66], [104.07, 30.67]], "departure": "2016-11-02T08:30:00"}).encode()
    raw = serve_load.request_bytes("127.0.0.1:8123", "/eta", body)
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(raw + raw)  # two requests back to back on one keep-alive connection
    for _ in range(2):
        req = conn.next_event()
        assert isinstance(req, h11.Request) and req.method == b"POST" and req.target == b"/eta"
        assert req.http_version == b"1.1"
        headers = dict(req.headers)
        assert headers[b"host"] == b"127.0.0.1:8123" and headers[b"content-type"] == b"application/json"
        data = conn.next_event()
        assert isinstance(data, h11.Data) and bytes(data.data) == body
        assert isinstance(conn.next_event(), h11.EndOfMessage)
        conn.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
        conn.send(h11.EndOfMessage())
        conn.start_next_cycle()


def _reader(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    return r


def test_read_response():
    async def go():
        ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 13\r\n\r\n{\"eta_s\": 1.}"
        r = _reader(ok + ok.replace(b"200 OK", b"422 Unprocessable Entity"))
        assert [await serve_load.read_response(r) for _ in range(2)] == [(200, b'{"eta_s": 1.}'),
                                                                        (422, b'{"eta_s": 1.}')]
        with pytest.raises(ValueError, match="without Content-Length"):
            await serve_load.read_response(_reader(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
        with pytest.raises(asyncio.IncompleteReadError):  # a connection closed mid-body
            await serve_load.read_response(_reader(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{}"))

    asyncio.run(go())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A small run's checkpoint, served by uvicorn (httptools, as `stfast serve`) in a thread on a free port."""
    _, ck = train_run(tmp_path_factory.mktemp("serve_load"))
    port = serve_load._free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(load_model(ck), max_batch=8, max_wait_ms=2), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield ck, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_lean_client_against_the_service(served):
    ck, url = served
    bodies = serve_load.route_bodies(ck, 6, "2016-11-02T08:30:00+08:00")
    assert len(bodies) == 6 and all(json.loads(b)["densify"] is False for b in bodies)
    planned = serve_load.route_bodies(ck, 6, "2016-11-02T08:30:00+08:00", densify=True)
    assert all("densify" not in json.loads(b) for b in planned)

    async def answers(kind):
        out = []
        for b in bodies:
            async with serve_load.CLIENTS[kind](url) as c:
                out.append(await c.send(serve_load.request_bytes(url.removeprefix("http://"), "/eta", b)))
        return out

    lean, ref = asyncio.run(answers("lean")), asyncio.run(answers("httpx"))
    assert [s for s, _ in lean] == [200] * 6
    assert [json.loads(b) for _, b in lean] == [json.loads(b) for _, b in ref]
    for kind in ("lean", "httpx"):
        r = asyncio.run(serve_load.one_round(url, bodies, 3, 4, kind=kind))
        assert (r["requests"], r["errors"]) == (12, 0) and r["rps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]


def test_pooled_rounds():
    rounds = [{"clients": 4, "requests": 8, "errors": 0, "wall_s": 1.0, "rps": 8.0, "load_avg_1min": 0.5,
               "latencies_s": [0.01] * 8, "server_cpu_ms_per_req": 2.0},
              {"clients": 4, "requests": 2, "errors": 1, "wall_s": 1.0, "rps": 2.0, "load_avg_1min": 0.7,
               "latencies_s": [1.0] * 2, "server_cpu_ms_per_req": 7.0}]
    r = serve_load.pooled(rounds)
    assert (r["requests"], r["errors"], r["rps"], r["round_rps"]) == (10, 1, 5.0, [8.0, 2.0])
    assert r["p50_ms"] == pytest.approx(10.0) and r["p99_ms"] == pytest.approx(1000.0)
    assert r["server_cpu_ms_per_req"] == pytest.approx(3.0) and r["load_avg_1min"] == [0.5, 0.7]


def test_the_command_writes_its_table_and_plot(served, tmp_path):
    """The one command end to end, small: both servers, 2 client counts, 2 rounds each, the files written."""
    ck, _ = served
    out = tmp_path / "load"
    assert serve_load.main(["--checkpoint", str(ck), "--clients", "1", "3", "--requests", "3", "--repeats", "2",
                            "--threads", "1", "--departure", "2016-11-02T08:30:00+08:00", "--min-round-requests", "0",
                            "--out", str(out)]) == 0
    rep = json.loads(out.with_suffix(".json").read_text())
    assert [(r["densify"], r["mode"], r["clients"], r["rounds"], r["requests"]) for r in rep["rows"]] == [
        (d, m, c, 2, 6 * c) for d in ("off", "on") for c in (1, 3) for m in ("batching (max-batch 64)", "max-batch 1")]
    assert all(r["errors"] == 0 and r["forward_passes"] > 0 for r in rep["rows"])
    md = out.with_suffix(".md").read_text()
    assert "Densify on" in md and "Densify off" in md and "| 3 |" in md and "x |" in md
    assert out.with_suffix(".png").stat().st_size > 1000


def test_a_refused_request_fails_the_round(served):
    """The load must not count error answers as served requests: a 422 stops the round."""
    _, url = served
    bad = [json.dumps({"route": [[104.06, 30.66], [104.07, 30.67]], "departure": "never"}).encode()]
    with pytest.raises(RuntimeError, match="422"):
        asyncio.run(serve_load.one_round(url, bad, 2, 2))
