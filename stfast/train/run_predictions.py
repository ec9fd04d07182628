"""``test_predictions.csv`` of a run folder: every test trip with its true travel time, the model's and both
baselines' predictions, its length and departure time; written at the end of a run (rank 0), read by the
report (stfast.train.report: predicted against actual, error by trip length and by hour of day).

Columns: trip_id, segment, driver, n_points, dist_km, weekday (0 = Monday), departure_min (minute of the
day, local time as the model's calendar features), true_time_s, pred_time_s (the scored checkpoint.pt),
const_speed_s and mean_time_s (the baselines fitted on the training split, stfast.train.metrics); the first
seven are those of ``stfast predict``'s rows.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

FILE = "test_predictions.csv"
COLUMNS = ("trip_id", "segment", "driver", "n_points", "dist_km", "weekday", "departure_min", "true_time_s",
           "pred_time_s", "const_speed_s", "mean_time_s")
NUMERIC = COLUMNS[3:]


def write(run_dir: str | Path, trips, pred: np.ndarray, baselines: dict[str, np.ndarray]) -> Path:
    """Write ``run_dir/test_predictions.csv`` atomically. ``trips``: the test split (Trips or a view, T trips);
    ``pred``: [T] s; ``baselines``: {"const_speed": [T] s, "mean_time": [T] s}. Returns the path."""
    path = Path(run_dir) / FILE
    tmp = path.with_name(f".{FILE}.tmp")
    cols = (trips.trip_id, trips.segment, trips.driver, trips.lengths, trips.dist, trips.week_id, trips.time_id,
            trips.time, pred, baselines["const_speed"], baselines["mean_time"])
    fmt = (str, int, str, int, "{:.4f}".format, int, int, "{:.1f}".format, "{:.1f}".format, "{:.1f}".format,
           "{:.1f}".format)
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows([fn(v) for fn, v in zip(fmt, row)] for row in zip(*cols))
    os.replace(tmp, path)
    return path


def read(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """The numeric columns of ``run_dir/test_predictions.csv`` as float64 arrays ({column: [T]}); None when the
    run has none (a run from before it was written). Raises ValueError naming the file on a missing column
    or a value that is not a number."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and (missing := [c for c in NUMERIC if c not in rows[0]]):
        raise ValueError(f"{path}: no column {', '.join(missing)} (columns: {', '.join(rows[0])})")
    try:
        return {c: np.array([float(r[c]) for r in rows], dtype=np.float64) for c in NUMERIC}
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: a value that is not a number ({e})") from None
