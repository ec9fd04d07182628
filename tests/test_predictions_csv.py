"""Predictions CSVs (stfast.train.run_predictions): written in chunks, linear in the trips, the same text as
row by row."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from stfast.data.synthetic import synthetic_trips
from stfast.data.trips import Trips
from stfast.train import run_predictions


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("chunk", [1, 7, 65_536])
def test_chunks_give_the_rows_written_one_by_one(tmp_path, monkeypatch, chunk):
    trips = synthetic_trips(40, seed=3)
    view = trips.view(np.random.default_rng(0).permutation(len(trips))[:29])
    pred = np.random.default_rng(1).uniform(10, 5000, len(view))
    monkeypatch.setattr(run_predictions, "CHUNK_ROWS", chunk)
    out = run_predictions.write_columns(tmp_path / "p.csv", {**run_predictions.trip_columns(view, pred),
                                                            "flag": (pred > 1000, None)})
    want = [[str(view.trip_id[i]), str(int(view.segment[i])), str(view.driver[i]), str(int(view.lengths[i])),
             f"{view.dist[i]:.4f}", f"{view.time[i]:.1f}", f"{pred[i]:.1f}", str(bool(pred[i] > 1000))]
            for i in range(len(view))]
    rows = _rows(out)
    assert rows[0] == ["trip_id", "segment", "driver", "n_points", "dist_km", "true_time_s", "pred_time_s", "flag"]
    assert rows[1:] == want
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]  # no temporary left


def test_a_column_is_read_once_per_chunk_not_once_per_row(tmp_path, monkeypatch):
    """The old writer indexed ``trips.lengths`` (np.diff of all offsets) once per row: quadratic in the trips
    (1 M trips: 7 minutes)."""
    trips = synthetic_trips(50, seed=4)
    calls = []
    real = Trips.lengths.fget
    monkeypatch.setattr(Trips, "lengths", property(lambda self: calls.append(1) or real(self)))
    monkeypatch.setattr(run_predictions, "CHUNK_ROWS", 16)
    run_predictions.write_columns(tmp_path / "p.csv", run_predictions.trip_columns(trips, np.ones(len(trips))))
    assert len(calls) == 1
    assert len(_rows(tmp_path / "p.csv")) == 51


def test_a_failed_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("old\n")
    with pytest.raises(AttributeError):  # a format that is not a str.format text, past the first rows
        run_predictions.write_columns(path, {"a": (np.arange(3), None), "b": (np.arange(3.0), 5)})
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]
