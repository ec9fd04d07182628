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

from ..data.durable import atomic_file, os_error_line

FILE = "test_predictions.csv"
COLUMNS = ("trip_id", "segment", "driver", "n_points", "dist_km", "weekday", "departure_min", "true_time_s",
           "pred_time_s", "const_speed_s", "mean_time_s")
NUMERIC = COLUMNS[3:]


CHUNK_ROWS = 65_536  # rows formatted at a time: memory stays that of one chunk, whatever the split's size


def _text(values: np.ndarray, fmt: str | None) -> list:
    """[n] values as the CSV shows them: ``fmt`` (e.g. ``"{:.1f}"``) applied to floats; ints and strings as is."""
    values = values.tolist()
    return values if fmt is None else [fmt.format(v) for v in values]


def write_columns(path: str | Path, columns: dict) -> Path:
    """Write a CSV of T rows atomically (a temporary file beside ``path``, fsynced, then renamed; removed on
    failure), ``columns`` mapping each header to ``(values, fmt)``: [T] array-likes (numpy, memory-mapped or a
    view's column; read :data:`CHUNK_ROWS` rows at a time, so a split of millions of trips is written in bounded
    memory and linear time) and a format for floats (None: written as is). A symbolic link ``path`` is followed.
    Returns the path.

    Raises:
        ValueError: an OS error (full disk, read-only, permissions), in one line naming ``path``; nothing is left
            at ``path`` but what was there.
    """
    path = Path(path)
    path = Path(os.path.realpath(path)) if path.is_symlink() else path  # the link's file replaced, the link kept
    n = len(next(iter(columns.values()))[0]) if columns else 0
    try:
        with atomic_file(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(list(columns))
            for s in range(0, n, CHUNK_ROWS):
                w.writerows(zip(*(_text(np.asarray(v[s:s + CHUNK_ROWS]), fmt) for v, fmt in columns.values())))
    except OSError as e:
        raise ValueError(os_error_line(e, f"cannot write {path}")) from None
    return path


def trip_columns(trips, pred: np.ndarray) -> dict:
    """The columns that open every predictions CSV (``stfast predict``'s and :data:`FILE`): trip_id, segment,
    driver, n_points, dist_km, true_time_s, pred_time_s, for :func:`write_columns`; ``pred`` [T] s."""
    return {"trip_id": (trips.trip_id, None), "segment": (trips.segment, None), "driver": (trips.driver, None),
            "n_points": (trips.lengths, None), "dist_km": (trips.dist, "{:.4f}"),
            "true_time_s": (trips.time, "{:.1f}"), "pred_time_s": (pred, "{:.1f}")}


def write(run_dir: str | Path, trips, pred: np.ndarray, baselines: dict[str, np.ndarray]) -> Path:
    """Write ``run_dir/test_predictions.csv`` (:func:`write_columns`). ``trips``: the test split (Trips or a view,
    T trips); ``pred``: [T] s; ``baselines``: {"const_speed": [T] s, "mean_time": [T] s}. Returns the path."""
    cols = trip_columns(trips, pred)
    cols = {**{k: cols[k] for k in COLUMNS[:5]}, "weekday": (trips.week_id, None),
            "departure_min": (trips.time_id, None), **{k: cols[k] for k in COLUMNS[7:9]},
            "const_speed_s": (baselines["const_speed"], "{:.1f}"), "mean_time_s": (baselines["mean_time"], "{:.1f}")}
    return write_columns(Path(run_dir) / FILE, cols)


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
