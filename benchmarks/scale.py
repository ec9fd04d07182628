"""Scale check: a synthetic data set of N trips is built, saved, loaded memory-mapped and partitioned
for one epoch of global batches; times and peak resident memory per stage.

Each stage runs in a fresh process so that its peak RSS (getrusage ru_maxrss) is its own:

    python benchmarks/scale.py --trips 100000 300000 1000000 --out /tmp/scale

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


def _run(stage: str, *args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--stage", stage, *map(str, args)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trips", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    ap.add_argument("--out", default="/tmp/stfast-scale", help="folder for the saved data sets")
    ap.add_argument("--batch-size", type=int, default=64, help="global batch (trips)")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--stage", nargs="+", help=argparse.SUPPRESS)  # internal: one stage in this process
    a = ap.parse_args(argv)
    if a.stage:
        name, *rest = a.stage
        fn = {"baseline": stage_baseline, "build": stage_build, "load_epoch": stage_load_epoch}[name]
        args = [int(x) if x.isdigit() else x for x in rest]
        print(json.dumps(fn(*args)))
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
