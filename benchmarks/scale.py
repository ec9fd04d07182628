"""Scale check: a synthetic data set of N trips is built, saved, loaded memory-mapped and partitioned
for one epoch of global batches; raw files of N GPS points are converted to a trips store; times and
peak resident memory per stage.

Each stage runs in a fresh process so that its peak RSS (getrusage ru_maxrss) is its own:

    python benchmarks/scale.py --trips 100000 300000 1000000 --out /tmp/scale
    python benchmarks/scale.py --trips --points 1000000 8000000 --jsonl-trips 200000 --plot docs/scale.png

``--points``: a DiDi GAIA file (``gps_*``, sorted by order as DiDi ships it) and a point CSV (ISO
timestamps with offsets, rows shuffled) of N points each are generated; ``stfast.data.convert`` converts
each to a trips store (``convert s``: the conversion in its process, stfast already imported; ``import s``
that import), side by side with a plain ``csv.reader`` loop over the same file (``csv.reader s``);
points/s and peak RSS of each. ``--jsonl-trips``: a DeepTTE JSON-lines file of K synthetic trips, read by
``read_deeptte_jsonl`` and converted to a store, against a ``json.loads`` loop over its lines. ``--plot``:
points/s and peak RSS against size.

``build`` = synthetic_trips(N) (raw GPS of the synthetic city + preprocessing) then Trips.save;
``load+epoch`` = Trips.load(mmap) and one epoch: trainer.epoch_batches (seeded shuffle, length-sorted
chunks) and every global batch split over --world-size ranks by the slicer
(stfast.parallel.slicer.partition, "balanced") when that module is present, else by
data_parallel.equal_shard. Prints one JSON line per stage and a table with memory per trip, the
check for linear growth (peak RSS above the interpreter's baseline, per 1,000 trips, should stay
about constant as N grows).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def stage_baseline() -> dict:
    import importlib

    for m in ("numpy", "stfast.data.synthetic", "stfast.data.trips", "stfast.train.trainer"):
        importlib.import_module(m)
    return {"peak_mib": _peak_mib()}


def stage_build(n: int, path: str) -> dict:
    from stfast.data.synthetic import synthetic_trips

    t0 = time.perf_counter()
    trips = synthetic_trips(n, seed=0)
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    trips.save(path)
    return {"trips": len(trips), "points": trips.n_points, "build_s": t_build,
            "save_s": time.perf_counter() - t0, "peak_mib": _peak_mib()}


def stage_load_epoch(path: str, batch_size: int, world_size: int) -> dict:
    import numpy as np

    from stfast.data.trips import Trips
    from stfast.parallel import data_parallel as dp
    from stfast.train.trainer import epoch_batches

    try:
        from stfast.parallel.slicer import partition
    except ImportError:
        partition = None
    t0 = time.perf_counter()
    trips = Trips.load(path, mmap=True)
    t_load = time.perf_counter() - t0
    rss_loaded = _peak_mib()
    t0 = time.perf_counter()
    lengths = np.asarray(trips.lengths)
    batches = epoch_batches(lengths, batch_size, seed=0, epoch=0)
    t_batches = time.perf_counter() - t0
    t0 = time.perf_counter()
    worst = 0
    for gb in batches:
        if partition is not None:
            asg = partition(lengths[gb], world_size)
            sizes = np.bincount(asg, weights=lengths[gb], minlength=world_size)
        else:
            sizes = [lengths[dp.equal_shard(gb, dp.DistInfo(r, world_size))].sum() for r in range(world_size)]
        worst = max(worst, int(max(sizes)))
    t_part = time.perf_counter() - t0
    return {"trips": len(trips), "load_s": t_load, "peak_after_load_mib": rss_loaded,
            "epoch_batches_s": t_batches, "partition_s": t_part, "global_batches": len(batches),
            "per_global_batch_ms": 1e3 * t_part / max(len(batches), 1),
            "partitioner": "slicer.partition(balanced)" if partition is not None else "equal_shard",
            "world_size": world_size, "peak_mib": _peak_mib()}


def stage_gen(kind: str, n: int, path: str) -> dict:
    """A raw file of ``n`` points: ``didi`` (gps_* rows grouped by order, 60–400 points every 3 s) or ``csv``
    (point CSV, ISO timestamps with +08:00, rows shuffled within each 4 M-point chunk); ``jsonl``: n synthetic
    trips as DeepTTE JSON lines."""
    import numpy as np

    if kind == "jsonl":
        from stfast.data.synthetic import synthetic_trips

        synthetic_trips(n, seed=0).to_jsonl(path)
        return {"bytes": __import__("os").path.getsize(path)}
    from pyarrow import csv as pacsv

    chunk = 4_000_000  # points generated at a time: a 100 M-point file never sits in memory
    with open(path, "wb") as f:
        trip0 = 0
        for c, lo in enumerate(range(0, n, chunk)):
            tab, trip0 = _gen_chunk(kind, min(chunk, n - lo), trip0, np.random.default_rng(c))
            pacsv.write_csv(tab, f, write_options=pacsv.WriteOptions(include_header=kind == "csv" and c == 0,
                                                                      quoting_style="none"))
    return {"bytes": __import__("os").path.getsize(path)}


def _gen_chunk(kind: str, n: int, trip0: int, rng):
    """A pyarrow table of ``n`` points of whole trips numbered from ``trip0`` (see stage_gen), and the next
    trip number. CSV rows are shuffled within the chunk."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lens = rng.integers(60, 400, size=n // 60 + 10)
    lens = lens[:np.searchsorted(np.cumsum(lens), n) + 1]
    lens[-1] -= lens.sum() - n
    lens = lens[lens > 0]
    trip = trip0 + np.arange(len(lens))
    k = np.arange(n) - np.repeat(np.cumsum(lens) - lens, lens)
    t = np.repeat(1477929600 + rng.integers(0, 86000, len(lens)), lens) + 3 * k
    x = np.round(np.repeat(rng.uniform(103.95, 104.15, len(lens)), lens) + k * 2e-4, 5)
    y = np.round(np.repeat(rng.uniform(30.6, 30.75, len(lens)), lens) + k * 1e-4, 5)
    ids = np.repeat(np.char.mod("%032x", trip * 104729 + 99991), lens)
    drv = np.repeat(np.char.mod("%032x", (trip % 5000) * 7919 + 12345), lens)
    if kind == "didi":
        return pa.table({"d": drv, "o": ids, "t": t, "x": x, "y": y}), trip0 + len(lens)
    order = rng.permutation(n)
    iso = pc.strftime(pa.array(t[order] + 8 * 3600, pa.timestamp("s")), "%Y-%m-%dT%H:%M:%S+08:00")
    return (pa.table({"trip_id": ids[order], "timestamp": iso, "lng": x[order], "lat": y[order],
                      "driver_id": drv[order]}), trip0 + len(lens))


def stage_loop(kind: str, path: str) -> dict:
    """The plain-Python reference: csv.reader (or json.loads per line) merely iterating over the file."""
    t0 = time.perf_counter()
    n = 0
    if kind == "json":
        import json as js

        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    js.loads(line)
                    n += 1
    else:
        import csv

        with open(path, newline="") as f:
            for _ in csv.reader(f):
                n += 1
    return {"rows": n, "loop_s": time.perf_counter() - t0, "peak_mib": _peak_mib()}


def stage_convert(path: str, fmt: str, out: str, read_only: str = "") -> dict:
    """stfast's conversion of ``path`` to a store at ``out`` (or with ``read_only``: the reader alone)."""
    t0 = time.perf_counter()
    from stfast.data.convert import convert_to_store
    from stfast.data.readers import read_any
    import pyarrow.compute  # noqa: F401 (a one-time import cost, ~0.3 s: counted with the imports)

    t_import = time.perf_counter() - t0
    base = _peak_mib()
    t0 = time.perf_counter()
    if read_only:
        trips = read_any(path, fmt)
    else:
        trips = convert_to_store(path, out, fmt)
    return {"import_s": t_import, "convert_s": time.perf_counter() - t0, "trips": len(trips),
            "points_out": trips.n_points, "peak_after_import_mib": base, "peak_mib": _peak_mib()}


def _load() -> float:
    return __import__("os").getloadavg()[0]


def convert_table(points: list[int], jsonl: list[int], out: str, plot: str | None) -> list[dict]:
    """Generate, convert and loop over raw files (module docstring); one JSON line per measurement, a table,
    and the plot."""
    import os
    import shutil

    rows = []
    for kind, fmt, sizes in (("didi", "didi", points), ("csv", "csv", points), ("jsonl", "deeptte", jsonl)):
        for n in sizes:
            raw = f"{out}/gps_{n}" if kind == "didi" else f"{out}/{kind}_{n}.{'csv' if kind == 'csv' else 'jsonl'}"
            if not os.path.exists(raw):
                _run("gen", kind, n, raw)
            store = f"{out}/store_{kind}_{n}"
            shutil.rmtree(store, ignore_errors=True)
            load0 = _load()
            loop = _run("loop", "json" if kind == "jsonl" else "csv", raw)
            conv = _run("convert", raw, fmt, store)
            read = _run("convert", raw, fmt, store, "read") if kind == "jsonl" else None
            n_pts = n if kind != "jsonl" else conv["points_out"]
            row = {"stage": "convert", "format": fmt, "n": n, "raw_points": n_pts, "bytes": os.path.getsize(raw),
                   "loop_s": loop["loop_s"], "loop_peak_mib": loop["peak_mib"], **conv,
                   "read_s": read["convert_s"] if read else None, "ratio_vs_loop": conv["convert_s"] / loop["loop_s"],
                   "points_per_s": n_pts / conv["convert_s"], "load_before": load0, "load_after": _load()}
            print(json.dumps(row), flush=True)
            rows.append(row)
            shutil.rmtree(store, ignore_errors=True)
    print(f"\n{'format':>8} {'n':>11} {'MB':>6} {'loop s':>7} {'convert s':>9} {'ratio':>6} {'M pts/s':>8}"
          f" {'read s':>7} {'import s':>8} {'peak MiB':>9} {'above import':>12} {'load':>5}")
    for r in rows:
        read = f"{r['read_s']:7.2f}" if r["read_s"] is not None else f"{'':>7}"
        print(f"{r['format']:>8} {r['n']:>11,} {r['bytes'] / 1e6:6.0f} {r['loop_s']:7.2f} {r['convert_s']:9.2f}"
              f" {r['ratio_vs_loop']:6.2f} {r['points_per_s'] / 1e6:8.2f} {read} {r['import_s']:8.2f}"
              f" {r['peak_mib']:9.0f} {r['peak_mib'] - r['peak_after_import_mib']:12.0f} {r['load_before']:5.1f}")
    print("(n: raw points, or trips for deeptte; loop: csv.reader / json.loads over the same file; ratio = convert /"
          " loop; peak MiB: the converting process, above import: peak − peak after importing stfast; load: 1-min"
          " load average before)")
    if plot:
        _plot(rows, plot)
    return rows


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for fmt in sorted({r["format"] for r in rows}):
        rs = [r for r in rows if r["format"] == fmt]
        x = [r["raw_points"] for r in rs]
        a.plot(x, [r["points_per_s"] / 1e6 for r in rs], "o-", label=f"{fmt}: convert to store")
        a.plot(x, [r["raw_points"] / r["loop_s"] / 1e6 for r in rs], "x--", label=f"{fmt}: plain Python loop")
        b.plot(x, [r["peak_mib"] for r in rs], "o-", label=fmt)
    for ax, title in ((a, "raw points per second (millions)"), (b, "peak RSS of the conversion (MiB)")):
        ax.set_xscale("log")
        ax.set_xlabel("raw points in the file")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def _run(stage: str, *args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--stage", stage, *map(str, args)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trips", type=int, nargs="*", default=[100_000, 300_000, 1_000_000],
                    help="synthetic data sets to build (none: skip)")
    ap.add_argument("--points", type=int, nargs="*", default=[], help="raw points of the DiDi / CSV files to convert")
    ap.add_argument("--jsonl-trips", type=int, nargs="*", default=[], help="trips of the DeepTTE JSON-lines files")
    ap.add_argument("--plot", default=None, help="PNG of points/s and peak RSS against size (with --points)")
    ap.add_argument("--out", default="/tmp/stfast-scale", help="folder for the saved data sets")
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (trips)")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)  # internal: one stage in this process
    a = ap.parse_args(argv)
    if a.stage:
        name, *rest = a.stage
        fn = {"baseline": stage_baseline, "build": stage_build, "load_epoch": stage_load_epoch, "gen": stage_gen,
              "loop": stage_loop, "convert": stage_convert}[name]
        args = [int(x) if x.isdigit() else x for x in rest]
        print(json.dumps(fn(*args)))
        return
    __import__("os").makedirs(a.out, exist_ok=True)
    if a.points or a.jsonl_trips:
        convert_table(a.points, a.jsonl_trips, a.out, a.plot)
    if not a.trips:
        return
    base = _run("baseline")["peak_mib"]
    print(json.dumps({"stage": "baseline", "peak_mib": base}), flush=True)
    rows = []
    for n in a.trips:
        path = f"{a.out}/trips_{n}"
        b = _run("build", n, path)
        print(json.dumps({"stage": "build", "n": n, **b}), flush=True)
        e = _run("load_epoch", path, a.batch_size, a.world_size)
        print(json.dumps({"stage": "load+epoch", "n": n, **e}), flush=True)
        rows.append((n, b, e))
    print(f"\n{'trips':>9} {'points':>11} {'build s':>8} {'save s':>7} {'build peak MiB':>15} {'KiB/trip':>9}"
          f" {'load s':>7} {'epoch s':>8} {'load+epoch peak MiB':>20} {'KiB/trip':>9}")
    for n, b, e in rows:
        epoch_s = e["epoch_batches_s"] + e["partition_s"]
        print(f"{n:>9,} {b['points']:>11,} {b['build_s']:>8.1f} {b['save_s']:>7.1f} {b['peak_mib']:>15.0f}"
              f" {1024 * (b['peak_mib'] - base) / n:>9.2f} {e['load_s']:>7.3f} {epoch_s:>8.2f}"
              f" {e['peak_mib']:>20.0f} {1024 * (e['peak_mib'] - base) / n:>9.2f}")
    print(f"(baseline interpreter + imports: {base:.0f} MiB; KiB/trip = (peak − baseline) / trips; "
          f"partitioner: {rows[0][2]['partitioner']}, world size {a.world_size}, global batch {a.batch_size})")


if __name__ == "__main__":
    main()
