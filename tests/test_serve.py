"""stfast serve: POST /eta (one route, many), GET /healthz, JSON errors with their statuses, the body and rate
limits, and dynamic batching (concurrent requests share forward passes; --max-batch 1 is one per request)."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from _eta_run import CENTER, KM_PER_DEG, train_run

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from stfast.cli import build_parser  # noqa: E402
from stfast.serve.app import create_app, parse_json  # noqa: E402
from stfast.serve.batcher import DynamicBatcher  # noqa: E402
from stfast.serve.ratelimit import RateLimit  # noqa: E402
from stfast.train.trained import load_model  # noqa: E402

DEP = "2016-11-02T08:30:00+08:00"


def _route(n=12, km=0.25, dx=0.0):
    return [[CENTER[0] + dx, CENTER[1] + i * km / KM_PER_DEG] for i in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    _, ck = train_run(d)
    return load_model(ck)


@pytest.fixture(scope="module")
def client(model):
    return TestClient(create_app(model, max_batch=8, max_wait_ms=2, max_body_bytes=200_000))


def test_one_route_and_many(client, model):
    r = client.post("/eta", json={"route": _route(), "departure": DEP, "driver": "d2"})
    assert r.status_code == 200, r.text
    body = r.json()
    # rounded to 0.1 s and 1 m (issue 62: float32 noise such as 711.2550048828125 is not data)
    assert body["eta_s"] == round(float(model.eta([np.array(_route())], [DEP], ["d2"])[0]), 1)
    assert body["km"] == round(body["km"], 3) and len(str(body["eta_s"]).split(".")[-1]) <= 1
    assert body["km"] == pytest.approx(11 * 0.25, rel=1e-3) and body["points"] >= 11
    routes = [{"route": _route(8 + k), "departure": DEP} for k in range(3)]
    r = client.post("/eta", json={"routes": routes})
    assert r.status_code == 200, r.text
    got = [e["eta_s"] for e in r.json()["etas"]]
    want = model.eta([np.array(x["route"]) for x in routes], [DEP] * 3)
    np.testing.assert_array_equal(got, np.round(want, 1))
    r = client.post("/eta", json={"route": _route(), "departure": DEP, "densify": False, "states": [0] * 12})
    assert r.json()["points"] == 12


def test_healthz_summarises_without_paths(client, model):
    r = client.get("/healthz")
    assert r.status_code == 200
    h = r.json()
    assert h["status"] == "ok" and h["model"]["kernel_size"] == 3 and h["data"]["densify_spacing_km"] == 0.2
    assert h["model"]["precision"] == model.precision  # the checkpoint's, unless serve --precision says otherwise
    assert h["data"]["format"] == "csv"  # detected from the trained-on file (issue 62: it said "auto")
    assert h["coverage"]["cells"] > 10 and len(h["coverage"]["bbox"]) == 4
    text = r.text
    assert str(model.path.parent) not in text and "/" not in json.dumps(h["data"]) and ".pt" not in text
    assert "points.csv" not in text and str(model.config.data) not in text
    cov = client.get("/coverage").json()
    assert len(cov["cells"]) == h["coverage"]["cells"]


@pytest.mark.parametrize("body, status, field, words", [
    (b"{not json", 400, None, "not JSON"),
    (json.dumps({"route": _route(), "departure": "tomorrow"}), 422, "departure", "ISO-8601"),
    (json.dumps({"route": _route(dx=0.5), "departure": DEP}), 422, "route", "outside the training area"),
    (json.dumps({"route": _route(2), "departure": DEP, "densify": False}), 422, "route", "kernel_size"),
    (json.dumps({"route": [[104.06, 95.0]] * 3, "departure": DEP}), 422, "route", "lat must lie"),
    (json.dumps({"route": _route()}), 422, "departure", "missing"),
    (json.dumps({"route": _route(), "departure": DEP, "checkpoint": "/etc/passwd"}), 422, "checkpoint", "unknown key"),
    (json.dumps({"routes": [{"route": _route(), "departure": DEP}, {"route": _route(), "departure": "x"}]}), 422,
     "departure", "ISO-8601"),
    (json.dumps([1, 2]), 422, None, "JSON object"),
    (json.dumps({"route": [[104.06, 30.66]] * 10_001, "departure": DEP}), 413, "route", "limit of 10000"),
])
def test_errors_are_json_with_the_status_a_client_expects(client, body, status, field, words):
    r = client.post("/eta", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    e = r.json()
    assert words in e["error"] and e.get("field") == field
    if b"routes" in (body if isinstance(body, bytes) else body.encode()):
        assert e["route"] == 1  # the second route of the request


@pytest.mark.parametrize("body, status, field, words", [
    # JSON that only the stdlib reads still reaches the route checks (orjson refuses NaN; the answer must not change)
    (b'{"route": [[104.06, 30.66], [NaN, 30.66], [104.07, 30.67]], "departure": "%s"}' % DEP.encode(), 422, "route",
     "point 1 is not finite"),
    (b'{"route": [[104.06, 30.66], [Infinity, 30.66], [104.07, 30.67]], "departure": "%s"}' % DEP.encode(), 422,
     "route", "not finite"),
    (json.dumps({"route": _route(), "departure": DEP}).encode("utf-16"), 200, None, None),
    (b'{"route": [[1, 2]], "departure": "x"', 400, None, "not JSON"),
    (b"\xff\xfe\x00", 400, None, "not JSON"),
    (json.dumps({"route": _route(), "departure": DEP, "driver": 2 ** 63 - 1}).encode(), 200, None, None),
    (json.dumps({"route": _route(), "departure": DEP, "driver": 2 ** 70}).encode(), 422, "driver",
     "[-2^63, 2^63)"),
    (json.dumps({"route": _route(), "departure": DEP, "driver": 1.5}).encode(), 422, "driver", "text of 1 to 256"),
    (json.dumps({"route": _route(), "departure": DEP, "densify": 1}).encode(), 422, "densify", "true or false"),
    (json.dumps({"routes": []}).encode(), 422, "routes", "non-empty"),
    (json.dumps({"routes": [{"route": [[1, 2]], "departure": "x"}] * 1001}).encode(), 413, "routes",
     "1000 routes per request"),
])
def test_lean_path_keeps_the_error_contract(client, body, status, field, words):
    """POST /eta skips FastAPI's routing and parses with orjson: every answer keeps its status and JSON body."""
    r = client.post("/eta", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    if status != 200:
        assert words in r.json()["error"] and r.json().get("field") == field
    else:
        assert r.json()["eta_s"] > 0


def test_lean_path_parses_as_the_stdlib_does():
    for body in [b'{"a": [1.5, -2e-3, 104.0623456789012], "b": "\\u00e9", "c": null, "d": true}', b"[1, 2]",
                 b'{"x": NaN, "y": -Infinity, "z": 1e400}', b'{"n": 9223372036854775807}']:
        got, want = parse_json(body), json.loads(body)
        assert json.dumps(got) == json.dumps(want)  # NaN != NaN: compare the text
    with pytest.raises(Exception, match="not JSON"):
        parse_json(b"{")


def test_other_routes_and_methods_still_reach_fastapi(client):
    assert client.get("/eta").status_code == 405
    assert client.post("/eta/x", json={}).status_code == 404
    assert client.get("/").status_code == 200 and "<svg" in client.get("/").text


def test_body_limit(client):
    r = client.post("/eta", content=b"[" + b"0," * 150_000 + b"0]", headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "limit of 200000" in r.json()["error"]


def test_rate_limit_per_client(model):
    c = TestClient(create_app(model, rate_limit=2.0))
    codes = [c.post("/eta", json={"route": _route(), "departure": DEP}).status_code for _ in range(4)]
    assert codes[:2] == [200, 200] and codes[2:] == [429, 429]
    r = c.post("/eta", json={"route": _route(), "departure": DEP})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1 and "rate limit" in r.json()["error"]
    t = [0.0]
    rl = RateLimit(1.0, clock=lambda: t[0])
    assert [rl.allow("a"), rl.allow("b")] == [0.0, 0.0] and rl.allow("a") == pytest.approx(1.0)
    t[0] = 1.0
    assert rl.allow("a") == 0.0


async def _concurrent(app, n):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        rs = await asyncio.gather(*(c.post("/eta", json={"route": _route(10 + k % 5), "departure": DEP})
                                    for k in range(n)))
    return [r.json()["eta_s"] for r in rs]


@pytest.mark.parametrize("max_batch", [1, 8])
def test_concurrent_requests_share_forward_passes(model, max_batch):
    app = create_app(model, max_batch=max_batch, max_wait_ms=50)
    got = asyncio.run(_concurrent(app, 16))
    want = model.eta([np.array(_route(10 + k % 5)) for k in range(16)], [DEP] * 16)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0.05 + 1e-9)  # answers rounded to 0.1 s
    b = app.state.batcher
    assert b.routes == 16
    assert b.forward_passes == 16 if max_batch == 1 else 2 <= b.forward_passes <= 4


def test_one_batch_of_good_and_bad_requests(model):
    """Routes are built once per batch: in one batch, each bad request still gets its own error (its route index,
    its field) and the good ones, densified or not, the numbers of TrainedModel.eta."""
    good = [{"route": _route(10 + k), "departure": DEP, "densify": k % 2 == 0} for k in range(4)]
    bad = [{"route": _route(dx=0.5), "departure": DEP},
           {"routes": [good[0], {"route": _route(), "departure": "x"}]},
           {"routes": [good[1], good[2], {"route": _route(2), "departure": DEP, "densify": False}]},
           {"route": _route(), "departure": DEP, "states": [0, 1]}]
    app = create_app(model, max_batch=16, max_wait_ms=200)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            return await asyncio.gather(*(c.post("/eta", json=b) for b in [*good, *bad, {"routes": good}]))

    rs = asyncio.run(go())
    want = [model.eta([np.array(g["route"])], [DEP], densify=g["densify"])[0] for g in good]
    assert [r.status_code for r in rs] == [200] * 4 + [422] * 4 + [200]
    np.testing.assert_allclose([r.json()["eta_s"] for r in rs[:4]], want, rtol=1e-6, atol=0.05 + 1e-9)  # float32, other batch-mates
    np.testing.assert_allclose([e["eta_s"] for e in rs[-1].json()["etas"]], want, rtol=1e-6, atol=0.05 + 1e-9)
    errs = [r.json() for r in rs[4:8]]
    assert [(e["route"], e["field"]) for e in errs] == [(0, "route"), (1, "departure"), (2, "route"), (0, "states")]
    assert "outside the training area" in errs[0]["error"] and "kernel_size" in errs[2]["error"]
    assert app.state.batcher.forward_passes == 1 and app.state.batcher.routes == 4 + 4  # the bad ones left it


def test_batcher_isolates_a_failing_item():
    """forward raising on a batch: the items run alone, only the one at fault gets the error, the rest their result."""
    def fwd(items):
        if any(x < 0 for x in items):
            raise ValueError(f"negative in {items}")
        return [x + 1 for x in items]

    async def go():
        b = DynamicBatcher(fwd, max_batch=8, max_wait_s=0.05)
        return await asyncio.gather(*(b.submit(x, 1) for x in [1, -1, 2]), return_exceptions=True), b

    (got, b) = asyncio.run(go())
    assert got[0] == 2 and got[2] == 3 and isinstance(got[1], ValueError) and str(got[1]) == "negative in [-1]"


def test_batcher_waits_at_most_max_wait_and_caps_the_batch():
    calls = []

    def fwd(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    async def go():
        b = DynamicBatcher(fwd, max_batch=3, max_wait_s=0.05)
        first = await b.submit(1, 1)  # alone: its wait ends at max_wait
        rest = await asyncio.gather(*(b.submit(k, 1) for k in range(2, 9)))
        return first, rest

    first, rest = asyncio.run(go())
    assert first == 10 and rest == [20, 30, 40, 50, 60, 70, 80]
    assert calls[0] == [1] and all(len(c) <= 3 for c in calls) and sum(map(len, calls)) == 8
    with pytest.raises(ValueError):
        DynamicBatcher(fwd, 0, 0.0)


def test_cli_parses_serve():
    a = build_parser().parse_args(["serve", "--checkpoint", "run/checkpoint.pt", "--max-batch", "1",
                                   "--max-wait-ms", "2"])
    assert (a.host, a.port, a.max_batch, a.max_wait_ms, a.rate_limit) == ("127.0.0.1", 8000, 1, 2.0, 0.0)
    assert (a.forwarded_allow_ips, a.token_file, a.cors_origin) == (None, None, [])  # trust nothing by default
    assert (a.max_route_points, a.max_request_points, a.max_batch_points) == (10_000, 20_000, 20_000)
    a = build_parser().parse_args(["serve", "--checkpoint", "c.pt", "--cors-origin", "https://a.example",
                                   "--cors-origin", "https://b.example", "--forwarded-allow-ips", "10.0.0.1",
                                   "--token-file", "t", "--body-timeout-s", "5", "--max-connections", "50"])
    assert a.cors_origin == ["https://a.example", "https://b.example"] and a.forwarded_allow_ips == "10.0.0.1"
    assert (a.token_file, a.body_timeout_s, a.max_connections) == ("t", 5.0, 50)


def test_cli_refuses_bad_serve_options(tmp_path, capsys):
    from conftest import one_line_error

    from stfast.cli import main

    err = one_line_error(capsys, main(["serve", "--checkpoint", str(tmp_path / "c.pt"), "--max-batch", "0"]))
    assert "--max-batch" in err
    err = one_line_error(capsys, main(["serve", "--checkpoint", str(tmp_path / "missing.pt")]))
    assert "missing.pt" in err
    (tmp_path / "t").write_text("short\n")
    err = one_line_error(capsys, main(["serve", "--checkpoint", str(tmp_path / "c.pt"), "--token-file",
                                       str(tmp_path / "t")]))
    assert "at least 16 characters" in err
    err = one_line_error(capsys, main(["serve", "--checkpoint", str(tmp_path / "c.pt"), "--body-timeout-s", "0"]))
    assert "timeouts" in err


def test_batcher_waits_only_for_requests_on_their_way():
    """A lone client's request starts its pass at once; while other requests are being read and checked
    (``arriving``), the oldest waits for them (up to max_wait) and they share its pass."""
    calls = []

    def fwd(items):
        calls.append(list(items))
        return items

    async def go():
        b = DynamicBatcher(fwd, max_batch=8, max_wait_s=0.3)
        waits = []
        for k in range(4):  # one client, back to back: nobody on the way, no waiting
            t0 = time.monotonic()
            await b.submit(k, 1)
            waits.append(time.monotonic() - t0)

        on_its_way = b.arriving()
        on_its_way.__enter__()  # a second request is being read and checked

        async def late(k):
            await asyncio.sleep(0.05)
            on_its_way.__exit__(None, None, None)
            return await b.submit(k, 1)

        t0 = time.monotonic()
        both = await asyncio.gather(b.submit(10, 1), late(11))
        return waits, both, time.monotonic() - t0

    waits, both, t = asyncio.run(go())
    assert max(waits) < 0.1, waits
    assert both == [10, 11] and calls[-1] == [10, 11] and t < 0.25


def test_serve_precision_override(model, monkeypatch):
    """`stfast serve --precision bf16-mixed` loads the model in that precision (issue 44): /healthz names it and
    the ETAs are what TrainedModel.eta gives in it."""
    import stfast.serve.app as app_mod

    seen = {}

    class _Server:  # stands in for the uvicorn server: capture the app instead of listening
        def __init__(self, config, model_line):
            seen["app"] = config.app

        def run(self, sockets=None):
            pass

    monkeypatch.setattr(app_mod, "ReadyServer", _Server)
    argv = ["serve", "--checkpoint", str(model.path), "--precision", "bf16-mixed"]
    a = build_parser().parse_args(argv)
    assert a.precision == "bf16-mixed"
    app_mod.serve(a.checkpoint, precision=a.precision)
    c = TestClient(seen["app"], base_url="http://127.0.0.1")  # serve() on loopback answers loopback names only
    assert c.get("/healthz").json()["model"]["precision"] == "bf16-mixed"
    r = c.post("/eta", json={"route": _route(), "departure": DEP})
    assert r.status_code == 200, r.text
    bf16 = load_model(model.path, precision="bf16-mixed")
    assert r.json()["eta_s"] == pytest.approx(bf16.eta([np.array(_route())], [DEP])[0], abs=0.05 + 1e-9)
    assert r.json()["eta_s"] == pytest.approx(model.eta([np.array(_route())], [DEP])[0], rel=0.05)
