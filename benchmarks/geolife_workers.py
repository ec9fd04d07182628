"""GeoLife at full layout: ``read_geolife`` in one process against its worker processes, side by side.

Only a 103-file sample of GeoLife 1.3 is on disk, so a synthetic layout of the full data set's shape is
written first: 182 users, 17,621 ``.plt`` files (97 or 96 per user), the number of points per file drawn
from a log-normal with GeoLife's mean (24,876,978 points / 17,621 files ≈ 1,412), lines formatted as the real
files are (CRLF, 6 header lines, 7 fields). Then each mode reads the whole layout in a fresh process (its own
peak RSS), modes interleaved round by round, the load average noted before each read::

    python benchmarks/geolife_workers.py --root /tmp/geolife_full --workers 1 2 --rounds 1
    python benchmarks/geolife_workers.py --root /tmp/geolife_full --workers 1 2 --rounds 3 --users 24

``--parse fast line`` (the default: both): the vectorized parse, and the line-by-line read it replaces.

Prints one JSON line per read and a Markdown table (points/s, time, CPU time of the reader and its workers,
peak RSS of the reading process and of its largest worker, the 1-minute load average before the read).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

USERS, FILES, MEAN_POINTS = 182, 17_621, 24_876_978 / 17_621
HEADER = "Geolife trajectory\r\nWGS 84\r\nAltitude is in Feet\r\nReserved 3\r\n0,2,255,My Track,0,0,2,8421376\r\n0\r\n"


def make_layout(root: Path, seed: int = 0) -> int:
    """Write the synthetic layout under ``root/Data`` (skipped when its marker file exists); its point count."""
    marker = root / "points.txt"
    if marker.exists():
        return int(marker.read_text())
    rng = np.random.default_rng(seed)
    sigma = 1.0  # log-normal spread: GeoLife's files range from a few points to tens of thousands
    n = np.maximum(2, rng.lognormal(np.log(MEAN_POINTS) - sigma ** 2 / 2, sigma, FILES).astype(np.int64))
    per_user = np.full(USERS, FILES // USERS)
    per_user[: FILES % USERS] += 1
    k = 0
    for u in range(USERS):
        traj = root / "Data" / f"{u:03d}" / "Trajectory"
        traj.mkdir(parents=True, exist_ok=True)
        t0 = 1.2e9 + u * 3e7
        for _ in range(per_user[u]):
            m = int(n[k])
            t = t0 + np.cumsum(rng.integers(1, 6, m))
            lat = 39.9 + np.cumsum(rng.normal(0, 1e-4, m))
            lng = 116.3 + np.cumsum(rng.normal(0, 1e-4, m))
            days = t / 86400.0 + 25569.0  # Unix days → days since 1899-12-30
            stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(t[0]))
            lines = [f"{a:.6f},{b:.6f},0,{int(h)},{d:.10f},{time.strftime('%Y-%m-%d,%H:%M:%S', time.gmtime(s))}"
                     for a, b, h, d, s in zip(lat, lng, rng.integers(0, 900, m), days, t)]
            (traj / f"{stamp}.plt").write_bytes((HEADER + "\r\n".join(lines) + "\r\n").encode())
            t0 = t[-1] + 3600
            k += 1
    marker.write_text(str(int(n.sum())))
    return int(n.sum())


def read_once(root: str, workers: int, users: int | None, parse: str) -> dict:
    """One read of ``root`` (its first ``users`` users; None: all) in a fresh process, ``parse`` "fast" (pyarrow,
    numpy) or "line" (line by line, as every file with anything unusual is read): seconds, CPU seconds (this
    process and its workers), points, peak RSS of this process and of its largest worker (MiB)."""
    from stfast.data.readers import geolife
    from stfast.data.readers.geolife import read_geolife

    if parse == "line":
        geolife._fast_plt = lambda path: None

    t, c = time.perf_counter(), os.times()
    tr = read_geolife(root, workers=workers, users=None if users is None else [f"{u:03d}" for u in range(users)])
    dt, c2 = time.perf_counter() - t, os.times()
    cpu = sum(getattr(c2, k) - getattr(c, k) for k in ("user", "system", "children_user", "children_system"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"workers": workers, "parse": parse, "s": dt, "cpu_s": cpu, "points": int(tr.n_points), "files": len(tr),
            "points_per_s": tr.n_points / dt, "peak_rss_mib": peak, "worker_peak_rss_mib": child}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/geolife_full")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--users", type=int, default=None, help="read only the first N users (default: all 182)")
    ap.add_argument("--parse", nargs="+", default=["fast", "line"], choices=("fast", "line"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: the read of one fresh process
    a = ap.parse_args()
    if a.one is not None:
        print(json.dumps(read_once(a.root, a.one, a.users, a.parse[0])))
        return
    root = Path(a.root)
    t = time.perf_counter()
    points = make_layout(root)
    print(f"layout: {points} points in {FILES} files of {USERS} users ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    rows = []
    for _ in range(a.rounds):
        for parse, w in [(p, w) for p in a.parse for w in a.workers]:
            load = os.getloadavg()[0]
            extra = ["--parse", parse] + ([] if a.users is None else ["--users", str(a.users)])
            out = subprocess.run([sys.executable, __file__, "--root", a.root, "--one", str(w), *extra], check=True,
                                 capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1]) | {"load_before": load}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| parse | workers | points | read s | CPU s | M points/s | peak RSS MiB (reader / largest worker) | load before |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['parse']} | {r['workers']} | {r['points']:,} | {r['s']:.1f} | {r['cpu_s']:.1f} | {r['points_per_s'] / 1e6:.3f} | "
              f"{r['peak_rss_mib']:.0f} / {r['worker_peak_rss_mib']:.0f} | {r['load_before']:.2f} |")


if __name__ == "__main__":
    main()
