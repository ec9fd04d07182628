"""A small run trained on a point CSV, shared by the ETA tests (tests/test_eta.py, test_serve*.py): random
drives around Chengdu, one GPS point every ~12 s, ISO timestamps with their +08:00 offset."""
from __future__ import annotations

import csv
import datetime as dt
import math
from pathlib import Path

import numpy as np

from stfast.cli import main

CENTER = (104.06, 30.66)
KM_PER_DEG = 6371.0 * math.pi / 180.0
CST = dt.timezone(dt.timedelta(hours=8))


def write_points_csv(path: Path, n_trips: int = 120, seed: int = 3) -> None:
    """``n_trips`` drives of 40..60 points, ~0.1 km and ~12 s apart, no stays or gaps (preprocessing keeps each
    whole, its first point included), drivers d0..d5, states mostly 1."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n_trips):
        n = int(rng.integers(40, 61))
        heading = rng.uniform(0, 2 * math.pi) + np.cumsum(rng.normal(0, 0.15, n))
        step = rng.uniform(0.08, 0.12, n)
        dy, dx = step * np.cos(heading) / KM_PER_DEG, step * np.sin(heading) / KM_PER_DEG / math.cos(math.radians(30.66))
        lng = CENTER[0] + rng.uniform(-0.03, 0.03) + np.concatenate([[0], np.cumsum(dx[1:])])
        lat = CENTER[1] + rng.uniform(-0.03, 0.03) + np.concatenate([[0], np.cumsum(dy[1:])])
        t0 = dt.datetime(2016, 11, 1, tzinfo=CST) + dt.timedelta(days=int(rng.integers(0, 7)),
                                                                  minutes=int(rng.integers(0, 1440)))
        secs = np.concatenate([[0], np.cumsum(rng.uniform(9, 15, n - 1))])
        state = int(rng.random() < 0.8)
        for i in range(n):
            t = (t0 + dt.timedelta(seconds=round(float(secs[i])))).isoformat()
            rows.append([f"trip{k}", t, f"{lng[i]:.6f}", f"{lat[i]:.6f}", f"d{k % 6}", state])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["trip_id", "timestamp", "lng", "lat", "driver_id", "state"])
        w.writerows(rows)


def train_run(d: Path) -> tuple[Path, Path]:
    """(the point CSV, the run's checkpoint.pt): DeepTTE as the paper has it (a driver embedding, departure per
    minute), 2 epochs, in ``d``."""
    data = d / "points.csv"
    write_points_csv(data)
    rc = main(["train", "--data", str(data), "--preset", "paper", "--epochs", "2", "--batch-size", "32",
               "--out", str(d / "run"), "--no-progress", "--threads", "1"])
    assert rc == 0
    return data, d / "run" / "checkpoint.pt"


def raw_departures(data: Path) -> dict[str, str]:
    """trip_id → the timestamp text of its first row, read with the stdlib csv module."""
    first: dict[str, str] = {}
    with open(data, newline="") as f:
        for row in csv.DictReader(f):
            first.setdefault(row["trip_id"], row["timestamp"])
    return first
