"""The synthetic city (:mod:`stfast.data.synthetic`) written in formats users hold, to try a reader and a run on
files of that shape without the real data: the Kaggle ECML/PKDD 2015 Porto file and T-Drive per-taxi files.

The city is drawn around the format's city (Porto: -8.61, 41.16 in Europe/Lisbon, July 2013; T-Drive: Beijing
116.40, 39.91 in Asia/Shanghai, February 2008) with the format's fix interval, and each trip written as the
format lays it out (:mod:`stfast.data.readers.porto`, :mod:`stfast.data.readers.tdrive`). Same arguments, same
bytes.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from .readers.porto import PORTO_STEP_S, PORTO_TZ
from .readers.tdrive import TDRIVE_TZ
from .synthetic import SyntheticCityConfig, generate_city

PORTO_CITY = SyntheticCityConfig(center_lng=-8.61, center_lat=41.16, sample_interval_s=(15, 15), tz=PORTO_TZ,
                                 start_date="2013-07-01")
TDRIVE_CITY = SyntheticCityConfig(center_lng=116.40, center_lat=39.91, sample_interval_s=(60, 600), tz=TDRIVE_TZ,
                                  start_date="2008-02-02", n_days=7, n_drivers=100)


def write_porto(path: str | os.PathLike, n_trips: int, seed: int = 0, missing_every: int = 0) -> dict:
    """Write ``n_trips`` synthetic trips as a Kaggle Porto ``train.csv`` (every field quoted, as published):
    TRIP_ID ``<TIMESTAMP><TAXI_ID>``, CALL_TYPE ``C``, TAXI_ID ``20000NNN``, TIMESTAMP the departure (Unix s),
    DAY_TYPE ``A``, POLYLINE the fixes on the 15 s grid from the departure (the last fix, at arrival off the
    grid, is left out), rounded to 6 decimals as in the published file. ``missing_every`` > 0: every such
    row has MISSING_DATA True (and a shortened polyline). Returns counts (``rows``, ``missing``, ``fixes``)."""
    traj = generate_city(n_trips, seed=seed, config=PORTO_CITY)
    off, t = traj.offsets, traj.t
    rows, missing, fixes = 0, 0, 0
    with open(path, "w", newline="") as f:
        f.write('"TRIP_ID","CALL_TYPE","ORIGIN_CALL","ORIGIN_STAND","TAXI_ID","TIMESTAMP","DAY_TYPE",'
                '"MISSING_DATA","POLYLINE"\n')
        for i in range(len(off) - 1):
            lo, hi = off[i], off[i + 1]
            t0 = int(t[lo])
            keep = np.flatnonzero((t[lo:hi] - t0) % PORTO_STEP_S == 0) + lo
            miss = missing_every > 0 and i % missing_every == missing_every - 1
            if miss:
                keep = keep[::2]
            taxi = f"20000{int(traj.driver[i]):03d}"  # the city's drivers are 0 .. n_drivers - 1 (< 1000)
            poly = ",".join(f"[{x:.6f},{y:.6f}]" for x, y in zip(traj.lng[keep], traj.lat[keep]))
            f.write(f'"{t0}{taxi}","C","","","{taxi}","{t0}","A","{miss}","[{poly}]"\n')
            rows, missing, fixes = rows + 1, missing + miss, fixes + len(keep)
    return {"rows": rows, "missing": missing, "fixes": fixes}


def write_tdrive(folder: str | os.PathLike, n_trips: int, seed: int = 0) -> dict:
    """Write ``n_trips`` synthetic trips as T-Drive per-taxi files ``<folder>/<taxi>.txt`` (lines
    ``taxi,yyyy-mm-dd HH:MM:SS,lng,lat``, Beijing time, 5 decimals), each taxi's trips in time order. Returns
    counts (``taxis``, ``fixes``)."""
    import datetime as dt
    from zoneinfo import ZoneInfo

    traj = generate_city(n_trips, seed=seed, config=dataclasses.replace(TDRIVE_CITY))
    os.makedirs(folder, exist_ok=True)
    taxi = np.repeat(np.array([str(d) for d in traj.driver]), np.diff(traj.offsets))
    zone = ZoneInfo(TDRIVE_TZ)
    lines: dict[str, list] = {}
    order = np.lexsort((traj.t, taxi))
    for k in order:
        when = dt.datetime.fromtimestamp(float(traj.t[k]), zone).strftime("%Y-%m-%d %H:%M:%S")
        lines.setdefault(taxi[k], []).append((traj.t[k], f"{taxi[k]},{when},{traj.lng[k]:.5f},{traj.lat[k]:.5f}\n"))
    for name, rows in lines.items():
        with open(os.path.join(folder, f"{name}.txt"), "w") as f:
            f.writelines(r for _, r in rows)
    return {"taxis": len(lines), "fixes": int(len(order))}
