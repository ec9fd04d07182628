"""Scale check: a synthetic data set of N trips is built, saved, loaded memory-mapped and partitioned
for one epoch of global batches; raw files of N GPS points are converted to a trips store; times and
peak resident memory per stage.

Each stage runs in a fresh process so that its peak RSS (getrusage ru_maxrss) is its own:

    python benchmarks/scale.py --trips 100000 300000 1000000 --out /tmp/scale
    python benchmarks/scale.py --trips --points 1000000 8000000 --jsonl-trips 200000 --plot docs/scale.png
    python benchmarks/scale.py --trips --real-jsonl-trips 196000 --didi-short-points 8000000 --out /tmp/scale
    python benchmarks/scale.py --trips --train-trips 200000 1000000 10000000 --out /tmp/scale10m
    python benchmarks/scale.py --trips --setup-trips 10000 1000000 --out /tmp/scale  # [--setup-nproc 2 --setup-steps 1]

``--points``: a DiDi GAIA file (``gps_*``, sorted by order as DiDi ships it) and a point CSV (ISO
timestamps with offsets, rows shuffled) of N points each are generated; ``stfast.data.convert`` converts
each to a trips store (``convert s``: the conversion in its process, stfast already imported; ``import s``
that import), side by side with a plain ``csv.reader`` loop over the same file (``csv.reader s``);
points/s and peak RSS of each. ``--jsonl-trips``: a DeepTTE JSON-lines file of K synthetic trips, read by
``read_deeptte_jsonl`` and converted to a store, against a ``json.loads`` loop over its lines. ``--plot``:
points/s and peak RSS against size.

``--train-trips``: a trips store of K synthetic trips (written by StoreWriter in chunks of 50,000, so any K
fits in memory; kept under ``--out`` and reused), then ``stfast train --data STORE --nproc 2 --max-steps S``
(validation and test splits of ``--test-trips`` each) with each rank's memory polled from /proc (peak RSS,
private vs file-backed pages: the ranks share the store's pages), the data-side share of a step (the step rows'
``data_s``: the slicer's cut and collation, plus the epoch's sampling per step) and ``stfast predict --split
test`` on the run (its MAPE must be the run's test MAPE). One table row per K.

``--setup-trips``: seconds from the start of ``stfast train --data STORE --max-steps 5 --threads 1`` (the default
run's settings; ``--setup-subtrips S`` adds ``--subtrips S``) to the end of its last step, on a store of K trips:
uncached (the store's derived values removed first: what the first run paid before convert derived them), the first
run after the derive step ``stfast data convert`` runs (its seconds: ``setup_s``), and the next: :func:`setup_row`.

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


REAL_SAMPLE = str(__import__("pathlib").Path(__import__("os").environ.get("STFAST_DATA_DIR") or __import__("pathlib")
                  .Path(__file__).resolve().parents[1].parent / "shared" / "data") / "chengdu_deeptte_sample" / "test")
"""The real records (``$STFAST_DATA_DIR``, else ../shared/data beside the repository)."""


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


def stage_store(n: int, path: str, chunk: int = 50_000) -> dict:
    """A trips store of ``n`` synthetic trips written by StoreWriter in chunks of ``chunk`` trips (seed = chunk
    number; trip ids ``0 .. n-1``), so memory stays that of one chunk whatever ``n``; then the derive step that
    ``stfast data convert`` runs (``setup_s``: :func:`stfast.data.setup.derive_default`)."""
    from stfast.data.setup import derive_default
    import numpy as np

    from stfast.data.store import StoreWriter
    from stfast.data.synthetic import synthetic_trips

    t0 = time.perf_counter()
    with StoreWriter(path, {"data": f"synthetic city, {n} trips in chunks of {chunk}"}) as w:
        for i, s in enumerate(range(0, n, chunk)):
            part = synthetic_trips(min(chunk, n - s), seed=i)
            part.trip_id = np.arange(s, s + len(part)).astype(str).astype(object)
            w.append(part)
        t_write = time.perf_counter() - t0
        store = w.finish()
    t_finish = time.perf_counter() - t0 - t_write
    return {"trips": len(store), "points": store.n_points, "write_s": t_write, "finish_s": t_finish,
            "setup_s": derive_default(store), "peak_mib": _peak_mib()}


def stage_setup(path: str) -> dict:
    """The derive step of ``stfast data convert`` alone, on the store at ``path`` (``setup_s``; None: too small to
    split), in its own process as convert runs it after writing."""
    from stfast.data.setup import derive_default
    from stfast.data.store import open_store

    return {"setup_s": derive_default(open_store(path)), "peak_mib": _peak_mib()}


def stage_gen(kind: str, n: int, path: str) -> dict:
    """A raw file of ``n`` points: ``didi`` (gps_* rows grouped by order, 60–400 points every 3 s) or ``csv``
    (point CSV, ISO timestamps with +08:00, rows shuffled within each 4 M-point chunk); ``jsonl``: n synthetic
    trips as DeepTTE JSON lines."""
    import numpy as np

    if kind == "real":  # the real sample's records (DeepTTE JSON lines) repeated to n lines
        with open(REAL_SAMPLE, "rb") as f:
            lines = [ln if ln.endswith(b"\n") else ln + b"\n" for ln in f if ln.strip()]
        with open(path, "wb") as f:
            for i in range(n):
                f.write(lines[i % len(lines)])
        return {"bytes": __import__("os").path.getsize(path)}
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
    short = kind == "didishort"  # ids of a few digits, not DiDi's 32-character hashes
    ids = np.repeat(np.char.mod("%d" if short else "%032x", trip * (1 if short else 104729) + (0 if short else 99991)),
                    lens)
    drv = np.repeat(np.char.mod("%d" if short else "%032x", (trip % 5000) * (1 if short else 7919)
                                + (0 if short else 12345)), lens)
    if kind in ("didi", "didishort"):
        return pa.table({"d": drv, "o": ids, "t": t, "x": x, "y": y}), trip0 + len(lens)
    order = rng.permutation(n)
    iso = pc.strftime(pa.array(t[order] + 8 * 3600, pa.timestamp("s")), "%Y-%m-%dT%H:%M:%S+08:00")
    return (pa.table({"trip_id": ids[order], "timestamp": iso, "lng": x[order], "lat": y[order],
                      "driver_id": drv[order]}), trip0 + len(lens))


LOOP_OF_FORMAT = {"didi": "csv", "csv": "csv", "deeptte": "json"}
"""The plain loop each input format is measured against (by format, not by how the file was made: the real
sample's DeepTTE records are JSON lines too)."""


def stage_loop(kind: str, path: str) -> dict:
    """The plain-Python reference: ``kind`` "json": json.loads per line, "csv": csv.reader merely iterating over
    the file (:data:`LOOP_OF_FORMAT`)."""
    t0, c0 = time.perf_counter(), time.process_time()
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
    return {"loop": kind, "rows": n, "loop_s": time.perf_counter() - t0, "loop_cpu_s": time.process_time() - c0,
            "peak_mib": _peak_mib()}


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


def _ranks(pid: int) -> dict[int, int]:
    """{rank: pid} of the processes under ``pid`` that torchrun started as ranks (LOCAL_RANK in their environment)."""
    import os

    parent = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                parent[int(p)] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = {}, [pid]
    while todo:
        q = todo.pop()
        for c in [c for c, pp in parent.items() if pp == q]:
            todo.append(c)
            try:
                env = dict(kv.split("=", 1) for kv in open(f"/proc/{c}/environ").read().split("\0") if "=" in kv)
            except OSError:
                continue
            if "LOCAL_RANK" in env and "TORCHELASTIC_RUN_ID" in env:
                out[int(env["LOCAL_RANK"])] = c
    return out


def _memory(pid: int) -> dict[str, float]:
    """MiB: VmHWM (peak RSS), VmRSS, RssAnon (the process's own pages), RssFile (mapped files: the store's pages
    it touched, shared with the other ranks through the page cache) and Pss_File (RssFile divided among the
    processes that share each page), from /proc."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) / 1024
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            k, _, v = line.partition(":")
            if k == "Pss_File":
                out[k] = int(v.split()[0]) / 1024
    except OSError:
        pass
    return out


def train_row(n: int, out: str, steps: int, batch_size: int, test_trips: int) -> dict:
    """``stfast train --data STORE --nproc 2`` on a store of ``n`` synthetic trips (built when missing), ``steps``
    optimizer steps, the split's validation and test parts ``test_trips`` trips each; the ranks' memory polled
    from /proc every 0.2 s; then ``stfast predict --split test`` on the run. Data-side share of a step: the
    step rows' ``data_s`` (cutting the shards, collating the batches) plus the epoch's sampling
    (``epoch_batches``, timed here on the same lengths) per step, over ``step_s``."""
    import os
    import shutil

    import numpy as np

    store, run = f"{out}/store_{n}", f"{out}/run_{n}"
    if not os.path.exists(f"{store}/manifest.json"):
        print(json.dumps({"stage": "store", "n": n, **_run("store", n, store)}), flush=True)
    shutil.rmtree(run, ignore_errors=True)
    f = test_trips / n
    cmd = [sys.executable, "-m", "stfast.cli", "train", "--data", store, "--nproc", "2", "--threads", "1",
           "--max-steps", str(steps), "--batch-size", str(batch_size), "--subtrips", "0",
           "--split", f"{1 - 2 * f:.6f}/{f:.6f}/{f:.6f}", "--no-progress", "--out", run]
    load0, t0 = _load(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak: dict[int, dict] = {}
    while proc.poll() is None:
        for r, pid in _ranks(proc.pid).items():
            try:
                m = _memory(pid)
            except OSError:
                continue
            if "VmHWM" not in m:  # a rank that has exited (a zombie's status has no memory lines)
                continue
            peak[r] = {k: max(v, peak.get(r, {}).get(k, 0.0)) for k, v in m.items()}
        time.sleep(0.2)
    log = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{log}")
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in open(f"{run}/metrics.jsonl")]
    st = [r for r in rows if r.get("type") == "step"][2:]  # the first steps warm up
    data_s = np.mean([r["data_s"] for r in st])
    step_s = np.mean([r["step_s"] for r in st])
    from stfast.data.store import open_store
    from stfast.train.run_data import epoch_batches

    lengths = np.asarray(open_store(store).lengths)[: int(n * (1 - 2 * f))]
    t = time.perf_counter()
    batches = epoch_batches(lengths, batch_size, 0, 0)
    sample_s = (time.perf_counter() - t) / len(batches)
    summary = json.loads(open(f"{run}/summary.json").read())
    t = time.perf_counter()
    pred = subprocess.run([sys.executable, "-m", "stfast.cli", "predict", "--checkpoint", f"{run}/checkpoint.pt",
                           "--split", "test", "--out", f"{run}/test.csv"], capture_output=True, text=True)
    if pred.returncode:
        raise SystemExit(f"predict failed:\n{pred.stdout}{pred.stderr}")
    pred_s = time.perf_counter() - t
    got = np.loadtxt(f"{run}/test.csv", delimiter=",", skiprows=1, usecols=(5, 6), ndmin=2)
    return {"stage": "train", "n": n, "points": open_store(store).n_points, "steps": len(st) + 2,
            "batch_size": batch_size, "wall_s": wall, "step_s": step_s, "data_s": data_s, "sample_s": sample_s,
            "data_share": (data_s + sample_s) / step_s, "ranks": peak, "test_mape": summary["test_mape"],
            "predict_s": pred_s, "predict_mape": float(np.mean(np.abs(got[:, 1] - got[:, 0]) / got[:, 0])),
            "n_test": summary["n_test"], "load_before": load0, "load_after": _load()}


def train_table(sizes: list[int], out: str, steps: int, batch_size: int, test_trips: int) -> list[dict]:
    """:func:`train_row` at each size; one JSON line each, then the table."""
    rows = []
    for n in sizes:
        rows.append(train_row(n, out, steps, batch_size, test_trips))
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'trips':>11} {'points':>12} {'step ms':>8} {'data ms':>8} {'sample ms':>9} {'data %':>7}"
          f" {'rank peak RSS MiB':>18} {'RssAnon':>8} {'RssFile':>8} {'Pss_File':>8} {'test MAPE':>9}"
          f" {'predict':>8} {'load':>5}")
    for r in rows:
        ranks = r["ranks"].values()
        mx = {k: max(x.get(k, 0.0) for x in ranks) for k in ("VmHWM", "RssAnon", "RssFile", "Pss_File")}
        print(f"{r['n']:>11,} {r['points']:>12,} {1e3 * r['step_s']:8.1f} {1e3 * r['data_s']:8.2f}"
              f" {1e3 * r['sample_s']:9.3f} {100 * r['data_share']:6.2f}% {mx['VmHWM']:18.0f} {mx['RssAnon']:8.0f}"
              f" {mx['RssFile']:8.0f} {mx['Pss_File']:8.0f} {100 * r['test_mape']:8.2f}%"
              f" {100 * r['predict_mape']:7.2f}% {r['load_before']:5.1f}")
    print("(per rank, the larger of the 2 ranks; step/data ms: mean over the steps after the first 2; data: cutting the"
          " shards + collating, sample: the epoch's shuffle/batching per step; data % = (data + sample) / step;"
          " RssAnon: the rank's own memory, RssFile: mapped files (store pages touched, shared), Pss_File: its share"
          " of them; predict: MAPE of `stfast predict --split test`, = test MAPE; load: 1-min load average before)")
    return rows


def setup_row(n: int, out: str, nproc: int, steps: int, subtrips: int | None = None) -> list[dict]:
    """Seconds from the start of ``stfast train --data STORE --max-steps STEPS --threads 1`` (``--subtrips S`` when
    ``subtrips`` is given, else the default run's; ``--nproc`` when > 1) to its "stopped after STEPS steps" line, on a
    store of ``n`` synthetic trips (built when missing), three runs: ``uncached``, with the store's derived folder
    removed first (the run derives the split, drivers, normalization, sub-trip spans and route profile: what the
    first run paid before convert derived them), ``first``, after the derive step ``stfast data convert`` runs
    (:func:`stage_setup`, its seconds ``setup_s``: the price moved into convert), and ``next``. The run is ended at
    that line (the final test evaluation, which grows with the test split, is not part of the setup)."""
    import os
    import shutil
    import signal

    store, run = f"{out}/store_{n}", f"{out}/setup_run_{n}"
    if not os.path.exists(f"{store}/manifest.json"):
        print(json.dumps({"stage": "store", "n": n, **_run("store", n, store)}), flush=True)
    rows = []
    for kind in ("uncached", "first", "next"):
        setup_s = None
        if kind != "next":
            shutil.rmtree(f"{store}/derived", ignore_errors=True)
        if kind == "first":
            setup_s = _run("setup", store)["setup_s"]
        shutil.rmtree(run, ignore_errors=True)
        cmd = [sys.executable, "-m", "stfast.cli", "train", "--data", store, "--max-steps", str(steps), "--threads",
               "1", "--no-progress", "--out", run] + (["--subtrips", str(subtrips)] if subtrips is not None else []) \
            + (["--nproc", str(nproc)] if nproc > 1 else [])
        load0, t0 = _load(), time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        got, log = None, []
        for line in proc.stdout:
            log.append(line)
            if "stopped after" in line:
                got = time.perf_counter() - t0
                os.killpg(proc.pid, signal.SIGTERM)
                break
        proc.wait()
        if got is None:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{''.join(log)}")
        rows.append({"stage": "setup", "n": n, "nproc": nproc, "steps": steps, "subtrips": subtrips, "cache": kind,
                     "to_last_step_s": got, "setup_s": setup_s, "load_before": load0})
        print(json.dumps(rows[-1]), flush=True)
    shutil.rmtree(run, ignore_errors=True)
    return rows


def _load() -> float:
    return __import__("os").getloadavg()[0]


def convert_table(points: list[int], jsonl: list[int], out: str, plot: str | None, real: list[int] = (),
                  short: list[int] = ()) -> list[dict]:
    """Generate, convert and loop over raw files (module docstring); one JSON line per measurement, a table,
    and the plot. ``real``: the real sample's records repeated to that many trips; ``short``: DiDi files with
    short ids; for these two, ``cmd_s`` is the whole ``stfast data convert`` command (process start included)."""
    import os
    import shutil

    rows = []
    for kind, fmt, sizes in (("didi", "didi", points), ("csv", "csv", points), ("jsonl", "deeptte", jsonl),
                             ("real", "deeptte", real), ("didishort", "didi", short)):
        for n in sizes:
            raw = (f"{out}/gps_{kind}_{n}" if kind.startswith("didi") else
                   f"{out}/{kind}_{n}.{'csv' if kind == 'csv' else 'jsonl'}")
            if not os.path.exists(raw):
                _run("gen", kind, n, raw)
            store = f"{out}/store_{kind}_{n}"
            shutil.rmtree(store, ignore_errors=True)
            load0 = _load()
            loop = _run("loop", LOOP_OF_FORMAT[fmt], raw)
            conv = _run("convert", raw, fmt, store)
            read = _run("convert", raw, fmt, store, "read") if kind == "jsonl" else None
            cmd = cmd_cpu = None
            if kind in ("real", "didishort"):
                shutil.rmtree(store, ignore_errors=True)
                import resource

                used = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "stfast.cli", "data", "convert", "--data", raw, "--format", fmt,
                                "--out", store], check=True, capture_output=True)
                cmd = time.perf_counter() - t
                now = resource.getrusage(resource.RUSAGE_CHILDREN)
                # CPU seconds of the command (user + system, all its threads): on a loaded machine, beside the loop's
                cmd_cpu = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
            n_pts = n if kind not in ("jsonl", "real") else conv["points_out"]
            row = {"stage": "convert", "format": fmt, "input": kind, "cmd_s": cmd,
                   "cmd_ratio_vs_loop": None if cmd is None else cmd / loop["loop_s"], "cmd_cpu_s": cmd_cpu,
                   "cmd_cpu_ratio": None if cmd is None else cmd_cpu / loop["loop_cpu_s"], "loop": loop["loop"],
                   "n": n, "raw_points": n_pts, "bytes": os.path.getsize(raw),
                   "loop_s": loop["loop_s"], "loop_peak_mib": loop["peak_mib"], **conv,
                   "read_s": read["convert_s"] if read else None, "ratio_vs_loop": conv["convert_s"] / loop["loop_s"],
                   "points_per_s": n_pts / conv["convert_s"], "load_before": load0, "load_after": _load()}
            print(json.dumps(row), flush=True)
            rows.append(row)
            shutil.rmtree(store, ignore_errors=True)
    print(f"\n{'input':>9} {'loop':>5} {'n':>11} {'MB':>6} {'loop s':>7} {'convert s':>9} {'ratio':>6}"
          f" {'cmd ratio':>9} {'cpu ratio':>9} {'M pts/s':>8} {'read s':>7} {'import s':>8} {'peak MiB':>9} {'above import':>12} {'load':>5}")
    for r in rows:
        read = f"{r['read_s']:7.2f}" if r["read_s"] is not None else f"{'':>7}"
        cmd = (f"{r['cmd_ratio_vs_loop']:9.2f} {r['cmd_cpu_ratio']:9.2f}" if r["cmd_s"] is not None
               else f"{'':>9} {'':>9}")
        print(f"{r['input']:>9} {r['loop']:>5} {r['n']:>11,} {r['bytes'] / 1e6:6.0f} {r['loop_s']:7.2f}"
              f" {r['convert_s']:9.2f} {r['ratio_vs_loop']:6.2f} {cmd} {r['points_per_s'] / 1e6:8.2f} {read} {r['import_s']:8.2f}"
              f" {r['peak_mib']:9.0f} {r['peak_mib'] - r['peak_after_import_mib']:12.0f} {r['load_before']:5.1f}")
    print("(n: raw points, or trips for JSON; input: didi / csv / jsonl generated, real = the Chengdu sample's"
          " records repeated, didishort = DiDi lines with short ids; loop: csv.reader (csv) or json.loads per line"
          " (json) over the same file;"
          " ratio = convert / loop; cmd ratio = the whole `stfast data convert` command, process start included, /"
          " loop; cpu ratio: the command's CPU seconds (all threads) / the loop's, a guide on a loaded machine;"
          " peak MiB: the converting process, above import: peak − peak after importing stfast; load: 1-min"
          " load average before)")
    if plot:
        _plot(rows, plot)
    return rows


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for fmt in sorted({r.get("input", r["format"]) for r in rows}):
        rs = [r for r in rows if r.get("input", r["format"]) == fmt]
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
    ap.add_argument("--real-jsonl-trips", type=int, nargs="*", default=[],
                    help="the real sample's DeepTTE records (--real-sample) repeated to these many trips")
    ap.add_argument("--didi-short-points", type=int, nargs="*", default=[], help="DiDi files with short ids")
    ap.add_argument("--plot", default=None, help="PNG of points/s and peak RSS against size (with --points)")
    ap.add_argument("--out", default="/tmp/stfast-scale", help="folder for the saved data sets")
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (trips)")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--train-trips", type=int, nargs="*", default=[],
                    help="train from stores of these many synthetic trips (stfast train --nproc 2; built when missing)")
    ap.add_argument("--train-steps", type=int, default=30, help="optimizer steps of each training run")
    ap.add_argument("--train-batch-size", type=int, default=256, help="global batch of the training runs")
    ap.add_argument("--test-trips", type=int, default=10_000, help="trips of the validation and test splits")
    ap.add_argument("--setup-trips", type=int, nargs="*", default=[],
                    help="time to the last of --setup-steps steps of `stfast train` on stores of these many trips")
    ap.add_argument("--setup-steps", type=int, default=5)
    ap.add_argument("--setup-nproc", type=int, default=1)
    ap.add_argument("--setup-subtrips", type=int, default=None,
                    help="--subtrips of the --setup-trips runs (default: not given, the default run's)")
    ap.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)  # internal: one stage in this process
    a = ap.parse_args(argv)
    if a.stage:
        name, *rest = a.stage
        fn = {"baseline": stage_baseline, "build": stage_build, "load_epoch": stage_load_epoch, "gen": stage_gen,
              "loop": stage_loop, "convert": stage_convert,
              "store": stage_store, "setup": stage_setup}[name]
        args = [int(x) if x.isdigit() else x for x in rest]
        print(json.dumps(fn(*args)))
        return
    __import__("os").makedirs(a.out, exist_ok=True)
    if a.points or a.jsonl_trips or a.real_jsonl_trips or a.didi_short_points:
        convert_table(a.points, a.jsonl_trips, a.out, a.plot, a.real_jsonl_trips, a.didi_short_points)
    if a.setup_trips:
        for n in a.setup_trips:
            setup_row(n, a.out, a.setup_nproc, a.setup_steps, a.setup_subtrips)
    if a.train_trips:
        train_table(a.train_trips, a.out, a.train_steps, a.train_batch_size, a.test_trips)
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
