"""Load on `stfast serve`, on loopback: dynamic batching against one request per forward pass (--max-batch 1).

One server build, two runs of it: ``--max-batch B --max-wait-ms W`` (batching) and ``--max-batch 1``. For each,
1, 16 and 64 concurrent clients (httpx async clients in this process) each send a fixed number of requests, one
after another; every request is one real route (the points of a held-out trip of the run, its test split, as
``POST /eta`` with ``densify: false``; trips outside the training area left out). Reported per mode and client count: requests/s (requests / wall time of
the whole round) and the p50 / p99 latency of a request. Writes ``OUT.json``, ``OUT.md`` (the table) and
``OUT.png`` (the plot), and prints the table.

    python benchmarks/serve_load.py --checkpoint runs/chengdu/checkpoint.pt --out docs/serve_load

Bounded: clients × requests per round, a timeout per request; the servers are stopped at the end.
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


def start_server(checkpoint: str, max_batch: int, max_wait_ms: float, threads: int | None):
    """`stfast serve` in a subprocess on a free loopback port; (process, base url) once /healthz answers."""
    import httpx

    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "stfast.cli", "serve", "--checkpoint", checkpoint, "--port",
                             str(port), "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms)]
                            + (["--threads", str(threads)] if threads else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) of process ``pid`` (None: this one)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(url: str, bodies: list[bytes], clients: int, requests: int, server_pid: int | None = None) -> dict:
    """``clients`` concurrent clients, ``requests`` each (client c sends bodies[(c * requests + i) % len]); their
    latencies (s), the round's wall time and the CPU time per request of the server (``server_pid``) and of this
    load generator."""
    import httpx

    lat: list[float] = []
    errors: list[str] = []
    connected = [0]
    ready, all_in = asyncio.Event(), asyncio.Event()

    async def client(k: int):
        # one AsyncClient (one keep-alive connection) per simulated client: a shared pool of 64 connections
        # costs the load generator itself more CPU per request than the server spends
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            await c.get("/healthz")  # connect before the clock starts
            connected[0] += 1
            if connected[0] == clients:
                all_in.set()
            await ready.wait()
            for i in range(requests):
                body = bodies[(k * requests + i) % len(bodies)]
                t0 = time.perf_counter()
                try:
                    r = await c.post("/eta", content=body, headers={"Content-Type": "application/json"})
                except httpx.TransportError as e:  # counted, not retried: a failed request is part of the result
                    errors.append(type(e).__name__)
                    continue
                lat.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:300]}")

    tasks = [asyncio.create_task(client(k)) for k in range(clients)]
    await asyncio.wait_for(all_in.wait(), 120)
    cpu0 = (_cpu_s(server_pid) if server_pid else 0.0, _cpu_s())
    t0 = time.perf_counter()
    ready.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    cpu1 = (_cpu_s(server_pid) if server_pid else 0.0, _cpu_s())
    a = np.array(lat)
    return {"clients": clients, "requests": len(a), "errors": len(errors), "wall_s": wall, "rps": len(a) / wall,
            "p50_ms": 1000 * float(np.percentile(a, 50)), "p99_ms": 1000 * float(np.percentile(a, 99)),
            "server_cpu_ms_per_req": 1000 * (cpu1[0] - cpu0[0]) / max(len(a), 1),
            "client_cpu_ms_per_req": 1000 * (cpu1[1] - cpu0[1]) / max(len(a), 1)}


async def batcher_round(model, trips: list, max_batch: int, max_wait_ms: float, clients: int, requests: int) -> dict:
    """The same round without HTTP: ``clients`` tasks submit prepared routes (Trips) straight to a DynamicBatcher
    over the model's forward, in this process: what the forward passes alone allow."""
    from stfast.serve.app import _forward
    from stfast.serve.batcher import DynamicBatcher

    b = DynamicBatcher(_forward(model, max_batch), max_batch, max_wait_ms / 1000.0)
    lat: list[float] = []

    async def client(k: int):
        for i in range(requests):
            t0 = time.perf_counter()
            await b.submit(trips[(k * requests + i) % len(trips)], 1)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.perf_counter() - t0
    a = np.array(lat)
    return {"clients": clients, "requests": len(a), "wall_s": wall, "rps": len(a) / wall,
            "p50_ms": 1000 * float(np.percentile(a, 50)), "p99_ms": 1000 * float(np.percentile(a, 99)),
            "forward_passes": b.forward_passes, "routes": b.routes}


def route_bodies(checkpoint: str, n: int, departure: str) -> list[bytes]:
    """``n`` request bodies: the points of the run's held-out (test split) trips, as recorded (densify off)."""
    from stfast.train.trained import load_model

    from stfast.data.routes import RouteError

    m = load_model(checkpoint)
    test = m.split(m.load_trips(), "test")
    out = []
    for i in range(len(test)):
        s = test.points(i)
        route = np.stack([test.lng[s], test.lat[s]], 1)
        try:
            m.route_trips([route], [departure], densify=False)
        except RouteError:  # outside the training area: the service would refuse it (422)
            continue
        out.append(json.dumps({"route": route.tolist(), "departure": departure, "densify": False}).encode())
        if len(out) == n:
            break
    return out


def table(rows: list[dict]) -> str:
    """Markdown: one row per client count, per mode req/s, p50, p99 (and, measured over HTTP, the server's and the
    load generator's CPU ms per request), then the ratio of the first mode's req/s to the last's."""
    by = {(r["mode"], r["clients"]): r for r in rows}
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cpu = "server_cpu_ms_per_req" in rows[0]
    head = "req/s | p50 ms | p99 ms" + (" | CPU ms/req server + client" if cpu else "")
    lines = ["| clients | " + " | ".join(f"{m}: {head}" for m in modes) + " | req/s ratio |",
             "|---:|" + ("---:|" * (4 if cpu else 3)) * len(modes) + "---:|"]
    for c in sorted({r["clients"] for r in rows}):
        cells = []
        for m in modes:
            r = by[(m, c)]
            cells += [f"{r['rps']:.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}"]
            if cpu:
                cells.append(f"{r['server_cpu_ms_per_req']:.1f} + {r['client_cpu_ms_per_req']:.1f}")
        ratio = by[(modes[0], c)]["rps"] / by[(modes[-1], c)]["rps"]
        lines.append(f"| {c} | " + " | ".join(cells) + f" | {ratio:.2f}x |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for m in dict.fromkeys(r["mode"] for r in rows):
        rs = [r for r in rows if r["mode"] == m]
        cs = [r["clients"] for r in rs]
        a.plot(cs, [r["rps"] for r in rs], "o-", label=m)
        b.plot(cs, [r["p99_ms"] for r in rs], "o-", label=f"{m} p99")
        b.plot(cs, [r["p50_ms"] for r in rs], "o--", label=f"{m} p50", alpha=0.6)
    for ax, yl in ((a, "requests / s"), (b, "latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend()
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
    ap.add_argument("--in-process", action="store_true", help="also measure the batcher without HTTP")
    ap.add_argument("--out", default=None, help="write OUT.json, OUT.md, OUT.png")
    a = ap.parse_args(argv)
    load_before = os.getloadavg()
    import httpx

    bodies = route_bodies(a.checkpoint, 256, a.departure)
    rows = []
    for mode, mb in ((f"batching (max-batch {a.max_batch})", a.max_batch), ("max-batch 1", 1)):
        proc, url = start_server(a.checkpoint, mb, a.max_wait_ms, a.threads)
        try:
            asyncio.run(one_round(url, bodies, 4, 10))  # warm-up (first passes, connection setup)
            for c in a.clients:
                r = asyncio.run(one_round(url, bodies, c, a.requests, proc.pid))
                h = httpx.get(url + "/healthz").json()["batching"]
                rows.append({"mode": mode, **r, "forward_passes": h["forward_passes"], "routes": h["routes"]})
                print(f"{mode:24s} {c:3d} clients: {r['rps']:7.1f} req/s  p50 {r['p50_ms']:7.1f} ms  "
                      f"p99 {r['p99_ms']:7.1f} ms  errors {r['errors']}  CPU ms/request: server "
                      f"{r['server_cpu_ms_per_req']:.1f}, load generator {r['client_cpu_ms_per_req']:.1f}", flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    md = table(rows)
    print(md)
    inproc = []
    if a.in_process:  # the forward passes alone, no HTTP (one thread, as the server's worker)
        import torch

        from stfast.train.trained import load_model

        if a.threads:
            torch.set_num_threads(a.threads)
        model = load_model(a.checkpoint)
        trips = [model.route_trips([json.loads(b)["route"]], [a.departure], densify=False) for b in bodies]
        for mode, mb in ((f"batching (max-batch {a.max_batch})", a.max_batch), ("max-batch 1", 1)):
            asyncio.run(batcher_round(model, trips, mb, a.max_wait_ms, 4, 5))
            for c in a.clients:
                r = asyncio.run(batcher_round(model, trips, mb, a.max_wait_ms, c, a.requests))
                inproc.append({"mode": mode, **r})
                print(f"in-process {mode:24s} {c:3d} clients: {r['rps']:7.1f} routes/s  p50 {r['p50_ms']:7.1f} ms  "
                      f"p99 {r['p99_ms']:7.1f} ms", flush=True)
        md += "\n\nWithout HTTP (the batcher and the forward passes alone, in one process):\n\n" + table(inproc)
        print(table(inproc))
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"load_avg_before": load_before, "load_avg_after": os.getloadavg(), "cpus": os.cpu_count(), "requests_per_client": a.requests,
                "max_wait_ms": a.max_wait_ms, "threads": a.threads, "rows": rows,
                "in_process_rows": inproc}
        out.with_suffix(".json").write_text(json.dumps(meta, indent=1))
        out.with_suffix(".md").write_text(md + "\n")
        plot(rows, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
