"""Load on `stfast serve`, on loopback: dynamic batching against one request per forward pass (--max-batch 1).

One server build, two runs of it: ``--max-batch B --max-wait-ms W`` (batching) and ``--max-batch 1``. For each,
1, 16 and 64 concurrent clients each send a fixed number of requests, one after another, on one keep-alive
connection each; every request is one real route (the points of a held-out trip of the run, its test split;
trips outside the training area left out), sent twice over: as recorded points (``densify: false``) and with the
API's default (densify on, what a planned route needs: the service densifies it to the training spacing),
``--densify``. Reported per densify setting, mode and client count: requests/s (requests / wall time of the whole
round; a round holds at least ``--min-round-requests``, so that one client's rate is not read off a few
requests), the p50 / p99 latency of a request, and the CPU time per request of the server (its event loop, its
other threads) and of the load generator. Both servers run side by side, and each client count gets
``--repeats`` rounds per mode, the modes taking turns, pooled; each round's requests/s and the load average are
kept. Writes ``OUT.json``, ``OUT.md`` (the tables) and ``OUT.png`` (the plot), and prints the tables.

The clients run in this process. By default they are lean (:class:`LeanClient`: asyncio streams, requests
encoded before the clock starts, ~0.1 ms of CPU per request); ``--client httpx`` uses httpx (2–3 ms per request,
which on a 2-core machine takes CPU from the server it measures). ``--pin`` puts the server on CPU 0 and the
load generator on CPU 1.

    python benchmarks/serve_load.py --checkpoint runs/chengdu_eta/checkpoint.pt --threads 1 --out docs/serve_load

Bounded: clients × requests per round, a timeout per round (``--round-timeout``); the servers are stopped at the
end.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: str, max_batch: int, max_wait_ms: float, threads: int | None,
                 cpus: set[int] | None = None):
    """`stfast serve` in a subprocess on a free loopback port (on the CPUs ``cpus``, all its threads, when given);
    (process, base url) once /healthz answers."""
    import httpx

    port = _free_port()
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen([sys.executable, "-m", "stfast.cli", "serve", "--checkpoint", checkpoint, "--port",
                             str(port), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms),
                             "--no-access-log"]  # stderr is a pipe read only on failure: a line per request fills it
                            + (["--threads", str(threads)] if threads else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=pin)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stfast serve exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("stfast serve did not answer within 120 s")


def _cpu_s(pid: int | None = None, thread: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid`` (None: this one), or of its thread ``thread`` alone."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    f = open(path).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def request_bytes(host: str, path: str, body: bytes) -> bytes:
    """One whole HTTP/1.1 keep-alive ``POST path`` with a JSON ``body``, encoded once before the clock starts."""
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("ascii") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response with a Content-Length (what uvicorn sends for JSON); raises
    ValueError on anything else (chunked, a closed connection)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return status, await reader.readexactly(int(value))
    raise ValueError(f"a response without Content-Length: {head[:200]!r}")


class LeanClient:
    """A keep-alive HTTP/1.1 connection that sends pre-encoded requests (:func:`request_bytes`) over asyncio
    streams and reads each response whole: a few tens of microseconds of CPU per request, so that the load
    generator costs the server's cores little (an httpx AsyncClient spends 2–3 ms per request)."""

    def __init__(self, url: str):
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port or 80)
        self.reader = self.writer = None

    async def __aenter__(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc):
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except OSError:
            pass

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        return await read_response(self.reader)


class HttpxClient:
    """The same interface over one httpx AsyncClient (one keep-alive connection): the comparison for the
    load generator's own cost."""

    def __init__(self, url: str):
        import httpx

        self.client = httpx.AsyncClient(base_url=url, timeout=120)

    async def __aenter__(self):
        await self.client.get("/healthz")  # connect before the clock starts
        return self

    async def __aexit__(self, *exc):
        await self.client.aclose()

    async def send(self, request: bytes) -> tuple[int, bytes]:
        head, _, body = request.partition(b"\r\n\r\n")
        path = head.split(b" ", 2)[1].decode()
        import httpx

        try:
            r = await self.client.post(path, content=body, headers={"Content-Type": "application/json"})
        except httpx.TransportError as e:  # as the lean client's: a failed connection is an OSError
            raise OSError(f"{type(e).__name__}: {e}") from None
        return r.status_code, r.content


CLIENTS = {"lean": LeanClient, "httpx": HttpxClient}


async def one_round(url: str, bodies: list[bytes], clients: int, requests: int, server_pid: int | None = None,
                    kind: str = "lean", timeout_s: float = 600.0) -> dict:
    """``clients`` concurrent clients (each one keep-alive connection of ``kind``: ``lean`` or ``httpx``),
    ``requests`` each (client c sends bodies[(c * requests + i) % len]); their latencies (s), the round's wall
    time and the CPU time per request of the server (``server_pid``) and of this load generator. Raises
    TimeoutError past ``timeout_s``."""
    host = url.removeprefix("http://")
    reqs = [request_bytes(host, "/eta", b) for b in bodies]
    lat: list[float] = []
    errors: list[str] = []
    connected = [0]
    ready, all_in = asyncio.Event(), asyncio.Event()

    async def client(k: int):
        async with CLIENTS[kind](url) as c:
            connected[0] += 1
            if connected[0] == clients:
                all_in.set()
            await ready.wait()
            for i in range(requests):
                req = reqs[(k * requests + i) % len(reqs)]
                t0 = time.perf_counter()
                try:
                    status, body = await c.send(req)
                except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                    # counted, not retried: a failed request is part of the result; the connection is gone
                    errors.append(type(e).__name__)
                    break
                lat.append(time.perf_counter() - t0)
                if status != 200:
                    raise RuntimeError(f"{status}: {body[:300]!r}")

    tasks = [asyncio.create_task(client(k)) for k in range(clients)]
    await asyncio.wait_for(all_in.wait(), 120)
    # the server's main thread runs the event loop (HTTP, checks, batching); the rest is the forward passes' thread
    cpu0 = (_cpu_s(server_pid) if server_pid else 0.0, _cpu_s(), _cpu_s(server_pid, server_pid) if server_pid else 0.0)
    load = os.getloadavg()[0]  # other work on the machine, to report beside every number
    t0 = time.perf_counter()
    ready.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout_s)
    wall = time.perf_counter() - t0
    cpu1 = (_cpu_s(server_pid) if server_pid else 0.0, _cpu_s(), _cpu_s(server_pid, server_pid) if server_pid else 0.0)
    a = np.array(lat)
    return {"clients": clients, "requests": len(a), "errors": len(errors), "wall_s": wall, "rps": len(a) / wall,
            "p50_ms": 1000 * float(np.percentile(a, 50)), "p99_ms": 1000 * float(np.percentile(a, 99)),
            "load_avg_1min": load, "latencies_s": lat, "server_cpu_ms_per_req": 1000 * (cpu1[0] - cpu0[0]) / max(len(a), 1),
            "server_loop_cpu_ms_per_req": 1000 * (cpu1[2] - cpu0[2]) / max(len(a), 1),
            "client_cpu_ms_per_req": 1000 * (cpu1[1] - cpu0[1]) / max(len(a), 1)}


def pooled(rounds: list[dict]) -> dict:
    """Repeated rounds of one mode and client count as one result: requests / their summed wall time, p50 / p99
    over all their latencies, CPU per request over all their requests; each round's req/s and load average kept."""
    lat = np.concatenate([r["latencies_s"] for r in rounds])
    n, wall = sum(r["requests"] for r in rounds), sum(r["wall_s"] for r in rounds)
    cpu = {k: sum(r[k] * r["requests"] for r in rounds) / max(n, 1) for k in rounds[0] if k.endswith("_per_req")}
    return {"clients": rounds[0]["clients"], "rounds": len(rounds), "requests": n,
            "errors": sum(r["errors"] for r in rounds), "wall_s": wall, "rps": n / wall,
            "p50_ms": 1000 * float(np.percentile(lat, 50)), "p99_ms": 1000 * float(np.percentile(lat, 99)),
            "round_rps": [r["rps"] for r in rounds], "load_avg_1min": [r["load_avg_1min"] for r in rounds], **cpu}


async def batcher_round(model, reqs: list[dict], max_batch: int, max_wait_ms: float, clients: int,
                        requests: int) -> dict:
    """The same round without HTTP: ``clients`` tasks check and build the parsed request bodies ``reqs``
    (:func:`stfast.serve.request.check_body`, :func:`stfast.serve.app.build_items`, in this thread) and submit them
    to the service's batcher (:func:`stfast.serve.app.route_batcher`), in this process: what the service allows
    without HTTP and JSON."""
    from stfast.serve.app import build_items, route_batcher
    from stfast.serve.request import check_body

    b = route_batcher(model, max_batch, max_wait_ms / 1000.0)
    spacing = model.densify_spacing_km()
    lat: list[float] = []

    async def client(k: int):
        for i in range(requests):
            t0 = time.perf_counter()
            checked, _ = check_body(reqs[(k * requests + i) % len(reqs)], spacing_km=spacing, max_route_points=10_000,
                                    max_request_points=20_000)
            trips, pos = build_items(model, [checked])[0]
            await b.submit((trips, pos), len(checked), int(trips.lengths.sum()), int(trips.lengths.max()))
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    a = np.array(lat)
    return {"clients": clients, "requests": len(a), "wall_s": wall, "rps": len(a) / wall,
            "p50_ms": 1000 * float(np.percentile(a, 50)), "p99_ms": 1000 * float(np.percentile(a, 99)),
            "forward_passes": b.forward_passes, "routes": b.routes}


def route_bodies(checkpoint: str, n: int, departure: str, densify: bool = False) -> list[bytes]:
    """``n`` request bodies: the points of the run's held-out (test split) trips, as recorded (``densify`` False:
    sent with ``"densify": false``) or as a planned route (True: no ``densify`` key, the API's default).
    Trips the service would refuse (outside the training area) are left out."""
    from stfast.train.trained import load_model

    from stfast.data.routes import RouteError

    m = load_model(checkpoint)
    test = m.split(m.load_trips(), "test")
    out = []
    for i in range(len(test)):
        s = test.points(i)
        route = np.stack([test.lng[s], test.lat[s]], 1)
        try:
            m.route_trips([route], [departure], densify=densify)
        except RouteError:  # outside the training area: the service would refuse it (422)
            continue
        body = {"route": route.tolist(), "departure": departure, **({} if densify else {"densify": False})}
        out.append(json.dumps(body).encode())
        if len(out) == n:
            break
    return out


def table(rows: list[dict]) -> str:
    """Markdown: one row per client count, per mode req/s, p50, p99 (and, measured over HTTP, the CPU ms per request
    of the server's event loop, of its other threads (the forward passes) and of the load generator), then the
    ratio of the first mode's req/s to the last's."""
    by = {(r["mode"], r["clients"]): r for r in rows}
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cpu = "server_cpu_ms_per_req" in rows[0]
    head = "req/s | p50 ms | p99 ms" + (" | CPU ms/req: loop + forward + client" if cpu else "")
    lines = ["| clients | " + " | ".join(f"{m}: {head}" for m in modes) + " | req/s ratio |",
             "|---:|" + ("---:|" * (4 if cpu else 3)) * len(modes) + "---:|"]
    for c in sorted({r["clients"] for r in rows}):
        cells = []
        for m in modes:
            r = by[(m, c)]
            cells += [f"{r['rps']:.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}"]
            if cpu:
                loop = r["server_loop_cpu_ms_per_req"]
                cells.append(f"{loop:.2f} + {r['server_cpu_ms_per_req'] - loop:.2f} + {r['client_cpu_ms_per_req']:.2f}")
        ratio = by[(modes[0], c)]["rps"] / by[(modes[-1], c)]["rps"]
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for d in dict.fromkeys(r.get("densify", "off") for r in rows):
        for m in dict.fromkeys(r["mode"] for r in rows):
            rs = [r for r in rows if r["mode"] == m and r.get("densify", "off") == d]
            cs = [r["clients"] for r in rs]
            style = "-" if d == "on" else ":"
            a.plot(cs, [r["rps"] for r in rs], "o" + style, label=f"{m}, densify {d}")
            b.plot(cs, [r["p99_ms"] for r in rs], "o" + style, label=f"{m}, densify {d}: p99")
    for ax, yl in ((a, "requests / s"), (b, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    b.set_yscale("log")
    fig.suptitle("stfast serve on loopback: dynamic batching vs one request per forward pass")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--requests", type=int, default=40, help="requests per client per round")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=None, help="the server's --threads (default: torch's)")
    ap.add_argument("--departure", default="2014-08-20T08:30:00")
    ap.add_argument("--client", choices=sorted(CLIENTS), default="lean",
                    help="the load generator: lean (raw asyncio streams, pre-encoded requests; default) or httpx")
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds per mode and client count, the modes taking turns; pooled in the table")
    ap.add_argument("--round-timeout", type=float, default=600.0, help="seconds a round may take")
    ap.add_argument("--pin", action="store_true",
                    help="the server on CPU 0, this load generator on CPU 1 (Linux; needs 2 CPUs)")
    ap.add_argument("--in-process", action="store_true", help="also measure the service's batcher without HTTP")
    ap.add_argument("--densify", choices=["on", "off", "both"], default="both",
                    help="send the routes densified by the service (on: the API's default), as recorded (off), or both")
    ap.add_argument("--min-round-requests", type=int, default=400,
                    help="requests per round at least (each client sends max(--requests, this / clients))")
    ap.add_argument("--out", default=None, help="write OUT.json, OUT.md, OUT.png")
    a = ap.parse_args(argv)
    load_before = os.getloadavg()
    import httpx

    settings = {"on": ["on"], "off": ["off"], "both": ["off", "on"]}[a.densify]
    bodies = {d: route_bodies(a.checkpoint, 256, a.departure, d == "on") for d in settings}
    cpus = os.sched_getaffinity(0)
    if a.pin:
        if not {0, 1} <= cpus:
            ap.error(f"--pin needs CPUs 0 and 1, this process may run on {sorted(cpus)}")
        os.sched_setaffinity(0, {1})
    rows = []
    servers = {}
    try:
        for mode, mb in ((f"batching (max-batch {a.max_batch})", a.max_batch), ("max-batch 1", 1)):
            servers[mode] = start_server(a.checkpoint, mb, a.max_wait_ms, a.threads, {0} if a.pin else None)
            for d in settings:
                asyncio.run(one_round(servers[mode][1], bodies[d], 4, 10, kind=a.client))  # warm-up: first passes
        for d in settings:
            for c in a.clients:
                per_client = max(a.requests, -(-a.min_round_requests // c))
                # the modes take turns (A B, B A, ...): a change in the machine's other load falls on both alike
                got: dict[str, list] = {mode: [] for mode in servers}
                passes0 = {mode: httpx.get(url + "/healthz").json()["batching"] for mode, (_, url) in servers.items()}
                for rep in range(a.repeats):
                    for mode in (list(servers) if rep % 2 == 0 else list(servers)[::-1]):
                        proc, url = servers[mode]
                        got[mode].append(asyncio.run(one_round(url, bodies[d], c, per_client, proc.pid, a.client,
                                                               a.round_timeout)))
                for mode, (proc, url) in servers.items():
                    r = pooled(got[mode])
                    h = httpx.get(url + "/healthz").json()["batching"]
                    rows.append({"mode": mode, "densify": d, **r,
                                 "forward_passes": h["forward_passes"] - passes0[mode]["forward_passes"],
                                 "routes": h["routes"] - passes0[mode]["routes"],
                                 **{k: h[k] - passes0[mode][k] for k in ("forward_busy_s", "forward_cpu_s", "batch_wait_s",
                                                                         "build_busy_s")}})
                    print(f"densify {d:3s} {mode:24s} {c:3d} clients: {r['rps']:7.1f} req/s (rounds: "
                          f"{', '.join(f'{x:.0f}' for x in r['round_rps'])})  p50 {r['p50_ms']:7.1f} ms  "
                          f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}  CPU ms/request: server "
                          f"{r['server_cpu_ms_per_req']:.2f} (event loop {r['server_loop_cpu_ms_per_req']:.2f}), load "
                          f"generator {r['client_cpu_ms_per_req']:.2f}; load average "
                          f"{', '.join(f'{x:.1f}' for x in r['load_avg_1min'])}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    if a.pin:
        os.sched_setaffinity(0, cpus)
    what = {"on": "the API's default: the service densifies each route", "off": "recorded points, densify: false"}
    md = "\n\n".join(f"Densify {d} ({what[d]}):\n\n" + table([r for r in rows if r["densify"] == d]) for d in settings)
    print(md)
    inproc = []
    if a.in_process:  # the forward passes alone, no HTTP (one thread, as the server's worker)
        import torch

        from stfast.train.trained import load_model

        if a.threads:
            torch.set_num_threads(a.threads)
        model = load_model(a.checkpoint)
        reqs = [json.loads(b) for b in bodies[settings[0]]]
        for mode, mb in ((f"batching (max-batch {a.max_batch})", a.max_batch), ("max-batch 1", 1)):
            asyncio.run(batcher_round(model, reqs, mb, a.max_wait_ms, 4, 5))
            for c in a.clients:
                r = asyncio.run(batcher_round(model, reqs, mb, a.max_wait_ms, c, a.requests))
                inproc.append({"mode": mode, **r})
                print(f"in-process {mode:24s} {c:3d} clients: {r['rps']:7.1f} routes/s  p50 {r['p50_ms']:7.1f} ms  "
                      f"p99 {r['p99_ms']:7.1f} ms", flush=True)
        md += "\n\nWithout HTTP (the service's batcher: routes built per batch, forward passes; one process):\n\n" + table(inproc)
        print(table(inproc))
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"load_avg_before": load_before, "load_avg_after": os.getloadavg(), "cpus": os.cpu_count(),
                "requests_per_client": a.requests, "min_round_requests": a.min_round_requests, "repeats": a.repeats, "max_wait_ms": a.max_wait_ms, "threads": a.threads,
                "client": a.client, "pinned": a.pin, "rows": rows, "in_process_rows": inproc}
        out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
        out.with_suffix(".md").write_text(md + "\n")
        plot(rows, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
