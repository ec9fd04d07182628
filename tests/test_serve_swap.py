"""Hot swap in ``stfast serve`` (issue 63 item 3): the model is replaced while clients keep asking, on SIGHUP, on
``POST /admin/reload`` (with a token only) and with ``--watch``; not one request fails or is reset, every answer
names the model that computed it (its ETA is that model's), and once a swap is done no new request is answered by
the old model. A damaged checkpoint, another area's model and a model of other preprocessing are each refused
with one log line while the running model keeps answering.

The real server runs in a subprocess (``python -m stfast.cli serve``, this checkout first on its PYTHONPATH); two
small checkpoints of the same data (seeds 0 and 1) are alternated by renaming a copy over the served file."""
from __future__ import annotations

import asyncio
import contextlib
import csv
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _eta_run import CENTER, KM_PER_DEG, write_points_csv

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from _serve_run import free_port  # noqa: E402

from stfast.cli import main  # noqa: E402
from stfast.train.trained import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEP = "2016-11-02T08:30:00+08:00"
TOKEN = "swap-" + "t0ken" * 4
LOAD_S = float(os.environ.get("STFAST_SWAP_LOAD_S", "20"))  # seconds of load while swapping (the issue: 60)
CLIENTS = int(os.environ.get("STFAST_SWAP_CLIENTS", "32"))  # concurrent clients (the issue: 64)
RELOAD_EVERY_S = 2.5
QUIET_S = 5.0  # seconds of the same load without swaps before them: the p99 latency to compare with


def _route(k: int) -> list:
    """Route k of 8: 10..17 points 0.25 km apart, northwards from a point near the centre of the training area."""
    dx = (k % 4 - 1.5) * 0.004
    return [[CENTER[0] + dx, CENTER[1] + (i - 6) * 0.25 / KM_PER_DEG] for i in range(10 + k)]


ROUTES = [_route(k) for k in range(8)]


def _train(d: Path, data: Path, seed: int, *extra: str) -> Path:
    rc = main(["train", "--data", str(data), "--preset", "paper", "--epochs", "1", "--max-steps", "3",
               "--batch-size", "32", "--out", str(d), "--no-progress", "--threads", "1", "--seed", str(seed), *extra])
    assert rc == 0
    return d / "checkpoint.pt"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoints: "a" and "b" (same data, seeds 0 and 1), "far" (the same drives 3° further east), "spacing"
    (--min-spacing-km 0.3); and each good one's version and ETAs of :data:`ROUTES`."""
    d = tmp_path_factory.mktemp("swap")
    data = d / "points.csv"
    write_points_csv(data, n_trips=80)
    far = d / "far.csv"
    with open(data, newline="") as f_in, open(far, "w", newline="") as f_out:
        rows = list(csv.reader(f_in))
        w = csv.writer(f_out)
        w.writerow(rows[0])
        w.writerows([r[:2] + [f"{float(r[2]) + 3.0:.6f}"] + r[3:] for r in rows[1:]])
    ck = {"a": _train(d / "a", data, 0), "b": _train(d / "b", data, 1), "far": _train(d / "far", far, 0),
          "spacing": _train(d / "sp", data, 0, "--min-spacing-km", "0.3")}
    info = {}
    for name in ("a", "b"):
        m = load_model(ck[name])
        info[name] = (hashlib.sha256(ck[name].read_bytes()).hexdigest()[:12],
                      np.round(m.eta([np.array(r) for r in ROUTES], [DEP] * len(ROUTES)), 1))
    # the two models must be told apart by their answers
    assert np.abs(info["a"][1] - info["b"][1]).min() > 1.0, (info["a"][1], info["b"][1])
    return ck, info


def _replace(src: Path, dst: Path, data: bytes | None = None) -> None:
    """``dst`` becomes a copy of ``src`` (or ``data``) at once: written beside it, then renamed over it."""
    tmp = dst.with_name(f".{dst.name}.tmp")
    if data is None:
        shutil.copyfile(src, tmp)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, dst)


@contextlib.contextmanager
def service(checkpoint: Path, *flags: str):
    """``stfast serve`` of ``checkpoint`` in a subprocess (this checkout's code); yields (URL, process, its stderr
    lines so far); SIGTERM at the end, and no traceback in its log."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *[p for p in sys.path if p]])}
    proc = subprocess.Popen([sys.executable, "-m", "stfast.cli", "serve", "--checkpoint", str(checkpoint),
                             "--port", str(port), "--threads", "1", "--no-access-log", *flags], env=env,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("ready on" in ln for ln in lines):
            assert proc.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", proc, lines
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in "".join(lines), "".join(lines)[-3000:]


class Load:
    """``clients`` concurrent clients asking for the ETA of :data:`ROUTES` (one route, or two in one request) until
    :meth:`stop`; every outcome recorded: (sent at, answered at, status or exception, model of the body, model of
    the header, [(route, eta_s)])."""

    def __init__(self, url: str, clients: int, headers: dict | None = None):
        self.url, self.clients, self.headers = url, clients, headers or {}
        self.results: list[tuple] = []
        self._stop = asyncio.Event()

    def stop(self):
        self._stop.set()

    async def _one(self, c: httpx.AsyncClient, k: int) -> None:
        while not self._stop.is_set():
            ks = [k % 8, (k + 3) % 8] if k % 5 == 0 else [k % 8]
            body = {"routes": [{"route": ROUTES[j], "departure": DEP} for j in ks]} if len(ks) > 1 else \
                {"route": ROUTES[ks[0]], "departure": DEP}
            t0 = time.monotonic()
            try:
                r = await c.post("/eta", json=body, headers=self.headers)
            except Exception as e:  # noqa: BLE001 - a reset, a refused connection, a timeout: all failures
                self.results.append((t0, time.monotonic(), repr(e), None, None, []))
                k += 1
                continue
            got = r.json() if r.status_code == 200 else {}
            etas = [e["eta_s"] for e in got.get("etas", [got])] if got else []
            self.results.append((t0, time.monotonic(), r.status_code, got.get("model"),
                                 r.headers.get("x-model-version"), list(zip(ks, etas))))
            k += 1

    async def run(self) -> None:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as c:
            await asyncio.gather(*(self._one(c, k) for k in range(self.clients)))

    def check(self, info: dict, versions: set) -> None:
        """No failure; every answer names one of ``versions`` in body and header alike, and its ETAs are that
        model's."""
        failed = [r for r in self.results if r[2] != 200]
        assert not failed, (len(failed), failed[:5])
        by_version = {v: etas for v, etas in info.values()}
        for _, _, _, model, header, etas in self.results:
            assert model in versions and header == model, (model, header, versions)
            for k, eta in etas:  # the model named computed it (batched with others: float32 rounding aside)
                assert abs(eta - by_version[model][k]) <= 0.3, (model, k, eta, by_version[model][k])


async def _healthz(c: httpx.AsyncClient) -> dict:
    r = await c.get("/healthz")
    assert r.status_code == 200
    return r.json()


async def _wait_health(c: httpx.AsyncClient, cond, seconds: float = 30.0) -> tuple[dict, float]:
    """(the first /healthz that meets ``cond``, when it was answered) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        h = await _healthz(c)
        if cond(h):
            return h, time.monotonic()
        assert time.monotonic() < deadline, h
        await asyncio.sleep(0.05)


def _warnings(lines: list[str]) -> list[str]:
    return [ln for ln in lines if " WARNING " in ln]


def test_swaps_under_load_lose_no_request_and_bad_models_are_refused(models, tmp_path):
    """32 clients for 20 s while the served file alternates between two models every 2.5 s (SIGHUP; once POST
    /admin/reload): 0 failed or reset requests, every answer names one of the two models and is its ETA, after each
    swap no new request names the old model. Then a truncated file, another area's model and a model of another
    --min-spacing-km are each refused with one warning line while the running model keeps answering."""
    ck, info = models
    (va, _), (vb, _) = info["a"], info["b"]
    served = tmp_path / "served" / "model.pt"
    served.parent.mkdir()
    shutil.copyfile(ck["a"], served)
    (tmp_path / "token").write_text(TOKEN + "\n")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with service(served, "--token-file", str(tmp_path / "token")) as (url, proc, lines):
        async def scenario():
            load = Load(url, CLIENTS, auth)
            running = asyncio.ensure_future(load.run())
            swaps = []  # (triggered at, done at, version now served)
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                h = await _healthz(c)
                assert h["model"]["version"] == va and h["reload"]["swaps"] == 0 and h["model"]["parent"] is None
                assert (await c.post("/admin/reload")).status_code == 401  # the token, as on every other path
                await asyncio.sleep(QUIET_S)  # latency without swaps first
                t_quiet = time.monotonic()
                t_end, n = time.monotonic() + LOAD_S, 0
                await asyncio.sleep(RELOAD_EVERY_S / 2)
                while time.monotonic() < t_end - RELOAD_EVERY_S / 2:
                    n += 1
                    src, want = (ck["b"], vb) if n % 2 else (ck["a"], va)
                    await asyncio.to_thread(_replace, src, served)
                    t0 = time.monotonic()
                    if n == 3:
                        r = await c.post("/admin/reload", headers=auth)
                        assert r.status_code == 200 and r.json()["outcome"] == "swapped", r.text
                        assert r.json()["model"] == want and r.headers["x-model-version"] == want
                    else:
                        proc.send_signal(signal.SIGHUP)
                    h, t_done = await _wait_health(c, lambda h, n=n: h["reload"]["swaps"] >= n)
                    assert h["reload"]["swaps"] == n and h["model"]["version"] == want, h
                    swaps.append((t0, t_done, want))
                    await asyncio.sleep(max(0.0, t0 + RELOAD_EVERY_S - time.monotonic()))
                load.stop()
                await running
            return load, swaps, t_quiet

        load, swaps, t_quiet = asyncio.run(scenario())
        quiet = [r[1] - r[0] for r in load.results if r[1] < t_quiet]
        busy = [r[1] - r[0] for r in load.results if r[0] > t_quiet]
        p99 = (np.percentile(quiet, 99), np.percentile(busy, 99))
        print(f"{CLIENTS} clients: {len(quiet)} answers in {QUIET_S:g} s without swaps, p99 {1000 * p99[0]:.0f} ms; "
              f"{len(busy)} answers in {LOAD_S:g} s with {len(swaps)} swaps, p99 {1000 * p99[1]:.0f} ms")
        if os.environ.get("STFAST_SWAP_P99_RATIO"):  # the issue's ≤ 2×, on a quiet machine only
            assert p99[1] <= float(os.environ["STFAST_SWAP_P99_RATIO"]) * p99[0], p99
        load.check(info, {va, vb})
        assert len(swaps) >= 5 and len(load.results) > 20 * len(swaps), (len(swaps), len(load.results))
        assert {r[3] for r in load.results} == {va, vb}
        for (_, done, version), nxt in zip(swaps, [s[0] for s in swaps[1:]] + [float("inf")]):
            # sent after the swap was seen done, answered before the next one began: the new model's (one answered
            # later may name the next model: the two alternate, so which is old is told by time alone)
            late = [r for r in load.results if done < r[0] and r[1] < nxt]
            assert late and all(r[3] == version for r in late), (version, [r for r in late if r[3] != version][:5])
        assert _warnings(lines) == [], _warnings(lines)

        # -- refusals: the running model keeps answering -----------------------------------------------------------
        blob = ck["a"].read_bytes()
        bad = [("truncated", None, blob[:len(blob) // 2], "SIGHUP", ("unreadable",)),
               ("far", ck["far"], None, "admin", ("another area", "%")),
               ("spacing", ck["spacing"], None, "SIGHUP", ("other preprocessing", "--min-spacing-km 0.3", "0.2"))]

        async def refusals():
            load = Load(url, 8, auth)
            running = asyncio.ensure_future(load.run())
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                before = await _healthz(c)
                for k, (name, src, data, how, words) in enumerate(bad, 1):
                    await asyncio.to_thread(_replace, src, served, data)
                    if how == "admin":
                        r = await c.post("/admin/reload", headers=auth)
                        assert r.status_code == 409 and r.json()["outcome"] == "refused", r.text
                        assert r.json()["model"] == before["model"]["version"]
                    else:
                        proc.send_signal(signal.SIGHUP)
                    h, _ = await _wait_health(c, lambda h, k=k: h["reload"]["refusals"] >= k)
                    assert h["model"]["version"] == before["model"]["version"], (name, h["model"])
                    assert h["reload"]["swaps"] == before["reload"]["swaps"], name
                    reason = h["reload"]["last_refusal"]["reason"]
                    assert all(w in reason for w in words), (name, reason)
                    await asyncio.sleep(0.5)  # answers keep coming meanwhile
                load.stop()
                await running
            return load, h

        load, h = asyncio.run(refusals())
        load.check(info, {h["model"]["version"]})
        assert len(load.results) > 20
        warned = _warnings(lines)
        assert len(warned) == 3, warned
        for ln, (name, *_rest, words) in zip(warned, bad):
            assert "refused" in ln and all(w in ln for w in words) and "keeps answering" in ln, (name, ln)
        with httpx.Client(base_url=url) as c:
            text = c.get("/healthz").text
        for path in (str(tmp_path), str(served), served.name, str(ck["far"].parent)):
            assert path not in text and path not in "".join(lines), path


def test_watch_reloads_when_the_file_changes_and_admin_reload_needs_a_token(models, tmp_path):
    """``--watch``: a new file renamed over the served one is picked up within seconds while 8 clients keep asking
    (0 failures; after the swap only the new model answers); the same bytes again change nothing. Without
    ``--token-file``, POST /admin/reload is refused (403)."""
    ck, info = models
    (va, _), (vb, _) = info["a"], info["b"]
    served = tmp_path / "model.pt"
    shutil.copyfile(ck["a"], served)
    with service(served, "--watch") as (url, proc, lines):
        async def scenario():
            load = Load(url, 8)
            running = asyncio.ensure_future(load.run())
            async with httpx.AsyncClient(base_url=url, timeout=60) as c:
                r = await c.post("/admin/reload")
                assert r.status_code == 403 and "--token-file" in r.json()["error"], r.text
                await asyncio.sleep(1.0)
                await asyncio.to_thread(_replace, ck["b"], served)
                h, done = await _wait_health(c, lambda h: h["reload"]["swaps"] >= 1, 15)
                assert h["model"]["version"] == vb and h["reload"]["watch_s"] > 0, h
                await asyncio.to_thread(_replace, ck["b"], served)  # another inode, the same model
                await asyncio.sleep(2.5)
                h = await _healthz(c)
                assert h["reload"]["swaps"] == 1 and h["reload"]["last_refusal"] is None, h["reload"]
                load.stop()
                await running
            return load, done

        load, done = asyncio.run(scenario())
        load.check(info, {va, vb})
        late = [r for r in load.results if r[0] > done]
        assert late and all(r[3] == vb for r in late)
    assert any("reload (watch): now serving model " + vb in ln for ln in lines), lines
    assert _warnings(lines) == [], _warnings(lines)


def test_a_batch_of_two_models_items_is_predicted_each_by_its_own(models):
    """The forward pass groups the items of one batch by the model that built them: each answer is its model's."""
    from stfast.serve.app import build_served, route_batcher
    from stfast.serve.request import check_body
    from stfast.serve.swap import ServedModel

    ck, info = models
    sa, sb = ServedModel.of(load_model(ck["a"])), ServedModel.of(load_model(ck["b"]))
    assert (sa.version, sb.version) == (info["a"][0], info["b"][0])
    reqs = [check_body({"route": r, "departure": DEP}, spacing_km=0.2, max_route_points=10_000,
                       max_request_points=20_000)[0] for r in ROUTES]
    served = [sa if k % 2 else sb for k in range(len(ROUTES))]
    built = build_served(list(zip(served, reqs)))
    rows = route_batcher(None, 64, 0.0).forward([(s, t, p) for s, (t, p) in zip(served, built)])
    for k, (s, r) in enumerate(zip(served, rows)):
        want = info["a" if s is sa else "b"][1][k]
        assert abs(round(float(r[0, 0]), 1) - want) <= 0.3, (k, r[0, 0], want)


def test_admin_reload_in_process_names_the_parent_and_refuses_a_missing_file(models, tmp_path):
    """POST /admin/reload on the ASGI app: a checkpoint that records its parent swaps in and /healthz names the
    parent, version and load time (no path); the same file again is "unchanged"; a missing file is refused (409)
    with the old model still answering; the answers carry the model in body and header."""
    from fastapi.testclient import TestClient

    from stfast.serve.app import create_app
    from stfast.train import checkpoint as ckpt

    ck, info = models
    (va, etas_a), _ = info["a"], info["b"]
    served = tmp_path / "model.pt"
    shutil.copyfile(ck["a"], served)
    child = tmp_path / "child.pt"
    state = ckpt.load(ck["b"])
    state["parent"] = {"version": va}
    ckpt.save_atomic(state, child)
    vc = hashlib.sha256(child.read_bytes()).hexdigest()[:12]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    c = TestClient(create_app(load_model(served), token=TOKEN), base_url="http://127.0.0.1")
    r = c.post("/eta", json={"route": ROUTES[0], "departure": DEP}, headers=auth)
    assert r.json()["model"] == va == r.headers["x-model-version"] and r.json()["eta_s"] == etas_a[0]
    assert c.post("/admin/reload", headers=auth).json()["outcome"] == "unchanged"
    _replace(child, served)
    r = c.post("/admin/reload", headers=auth)
    assert r.status_code == 200 and r.json() == {"outcome": "swapped", "model": vc, "was": va, "swaps": 1}, r.text
    h = c.get("/healthz").json()
    assert h["model"]["version"] == vc and h["model"]["parent"] == va and h["model"]["loaded_at"].endswith("+00:00")
    r = c.post("/eta", json={"routes": [{"route": ROUTES[1], "departure": DEP}]}, headers=auth)
    assert r.json()["model"] == vc and abs(r.json()["etas"][0]["eta_s"] - info["b"][1][1]) <= 0.3
    served.unlink()
    r = c.post("/admin/reload", headers=auth)
    assert r.status_code == 409 and r.json()["outcome"] == "refused" and r.json()["model"] == vc, r.text
    h = c.get("/healthz")
    assert h.json()["reload"]["refusals"] == 1 and str(tmp_path) not in h.text and "model.pt" not in h.text
    assert c.post("/eta", json={"route": ROUTES[2], "departure": DEP}, headers=auth).json()["model"] == vc
