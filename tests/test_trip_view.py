"""Splits as views (stfast.data.trip_view): a run's train/validation/test splits of a memory-mapped trips store
keep the store's columns and an index (no copy of its points per rank), read exactly as copied subsets do, and
a run from a store resumes, evaluates and predicts with neither the raw data nor a second hashing of it."""
from __future__ import annotations

import csv
import json
import mmap

import numpy as np
import pytest
import torch

from conftest import random_trips
from stfast.cli import main
from stfast.data import fingerprint as fp_mod
from stfast.data import routes as routes_mod
from stfast.data import store as store_mod
from stfast.data import training_stats as stats_mod
from stfast.data import trip_view
from stfast.data.dataset import NormStats, TripDataset
from stfast.data.routes import RouteProfile
from stfast.data.store import write_store
from stfast.data.synthetic import synthetic_trips
from stfast.data.trips import Trips
from stfast.train.config import TrainConfig
from stfast.train.run_data import RunData
from stfast.train.trained import load_model


def _owned_bytes(obj, seen: set, depth: int = 0) -> int:
    """Bytes of the numpy arrays reachable from ``obj`` (attributes, dicts, lists, tuples) that live in this
    process's own memory: not views of a memory map."""
    if id(obj) in seen or depth > 6:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        b = obj
        while isinstance(b, np.ndarray) and b.base is not None:
            b = b.base
        return 0 if isinstance(b, mmap.mmap) or isinstance(getattr(b, "base", None), mmap.mmap) else obj.nbytes
    if isinstance(obj, (torch.Tensor, str, bytes, int, float)):
        return 0
    if isinstance(obj, dict):
        return sum(_owned_bytes(v, seen, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_owned_bytes(v, seen, depth + 1) for v in obj)
    return _owned_bytes(vars(obj), seen, depth + 1) if hasattr(obj, "__dict__") else 0


def test_splits_of_a_store_hold_no_copy_of_its_points(tmp_path):
    """RunData of a store (what every rank builds): its splits and datasets hold no per-point array of their
    own, only per-trip ones; batches read as from copied subsets."""
    trips = random_trips(600, seed=3, min_len=20, max_len=60)
    store = write_store(trips, tmp_path / "store")
    point_bytes = sum(getattr(store, f).nbytes for f in Trips._POINT_FIELDS)
    # --subtrips 0: sub-trips are new trips, made in memory (the real preset's one piece per trip copies them)
    data = RunData.load(TrainConfig(data=str(tmp_path / "store"), epochs=1, subtrips=0), torch.float32)
    parts = (data.train, data.val, data.test, data.train_ds, data.val_ds, data.test_ds)
    own = _owned_bytes(parts, set())
    # the splits' index, lengths and the few per-trip fields read (8 bytes a trip each); ~40 points a trip
    assert own < 0.1 * point_bytes, (own, point_bytes)
    assert all(p.base.lng.filename == store.lng.filename for p in parts[:3])  # the store's own mapped file
    for split, ds in zip(parts[:3], parts[3:]):
        copy = store.subset(split.index)
        idx = np.arange(0, len(split), 7)
        b, c = ds.batch(idx), TripDataset(copy, data.vocab).batch(idx)
        assert all(torch.equal(getattr(b, k), getattr(c, k)) for k in vars(b)), "a view batches as its copy"
    assert NormStats.from_trips(data.train) == NormStats.from_trips(store.subset(data.train.index)) == data.stats


def test_view_reads_as_its_subset(monkeypatch):
    trips = random_trips(300, seed=5)
    idx = np.random.default_rng(0).permutation(300)[:200]
    v, s = trips.view(idx), trips.subset(idx)
    assert len(v) == len(s) and v.n_points == s.n_points
    for f in ("offsets", "lengths", *Trips._POINT_FIELDS, *Trips._TRIP_FIELDS):
        assert np.array_equal(getattr(v, f), getattr(s, f)), f
    assert v.record(17) == s.record(17) and v.tz == s.tz and v.dropped == {} and len(v.dropped_trips) == 0
    sub = v.subset([5, 0, 9])
    assert sub.base is trips and np.array_equal(sub.trip_id, s.subset([5, 0, 9]).trip_id)
    m = v.materialize()
    assert type(m) is Trips and all(np.array_equal(getattr(m, f), getattr(s, f)) for f in Trips._POINT_FIELDS)
    assert RouteProfile.from_trips(v).to_dict() == RouteProfile.from_trips(s).to_dict()
    whole = NormStats.from_trips(s)
    assert NormStats.from_trips(v) == whole  # one piece: numpy's mean/std exactly
    # in pieces (a split of a large store): the same statistics up to rounding, the same area
    monkeypatch.setattr(trip_view, "CHUNK_POINTS", 500)
    monkeypatch.setattr(stats_mod, "iter_chunks", lambda t, **kw: trip_view.iter_chunks(t, 500, **kw))
    monkeypatch.setattr(routes_mod, "iter_chunks", lambda t, **kw: trip_view.iter_chunks(t, 500, **kw))
    assert sum(len(p) for p in trip_view.iter_chunks(v, 500)) == len(v) > len(next(trip_view.iter_chunks(v, 500)))
    pieces = NormStats.from_trips(v).to_dict()
    assert pieces == pytest.approx(whole.to_dict(), rel=1e-12)
    prof, ref = RouteProfile.from_trips(v), RouteProfile.from_trips(s)
    assert np.array_equal(prof.area.cells, ref.area.cells) and prof.area.bbox == ref.area.bbox
    assert prof.state_share == ref.state_share and prof.spacing_km == pytest.approx(ref.spacing_km, rel=0.2)
    with pytest.raises(IndexError):
        trips.view([300])


@pytest.mark.parametrize("max_points", [10_000_000, 700])
def test_chunks_gather_only_the_point_fields_a_pass_reads(max_points):
    """iter_chunks(point_fields=...): the pieces carry those point fields, equal to a full gather's, and None for
    the others (NormStats and RouteProfile read 4 and 2 of a store split's 5 columns); trip fields as before."""
    trips = random_trips(120, seed=4, max_len=30)
    v = trips.view(np.random.default_rng(4).permutation(120)[:90])
    full = list(trip_view.iter_chunks(v, max_points))
    some = list(trip_view.iter_chunks(v, max_points, point_fields=("lng", "dist_gap")))
    assert len(full) == len(some) >= (2 if max_points < 1000 else 1)
    for a, b in zip(full, some):
        assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.lng, b.lng)
        assert np.array_equal(a.dist_gap, b.dist_gap) and np.array_equal(a.time, b.time)
        assert b.lat is None and b.state is None and b.time_gap is None
    with pytest.raises(ValueError, match=r"point_fields \['speed'\] are not point fields of Trips"):
        trips.subset(np.arange(3), point_fields=("lng", "speed"))


def test_store_run_resumes_evaluates_and_predicts_without_raw_data_or_rehashing(tmp_path, monkeypatch, capsys):
    """The store's fingerprint is computed once, at conversion: training, --resume, evaluate and predict --split
    read it from the manifest (hashing raises here) and never the raw file (deleted)."""
    raw = tmp_path / "trips.jsonl"
    random_trips(150, seed=8, max_len=25).to_jsonl(raw)
    store = tmp_path / "store"
    assert main(["data", "convert", "--data", str(raw), "--out", str(store)]) == 0
    raw.unlink()

    def no_hashing(trips):
        raise AssertionError("the store's fingerprint was hashed again")

    monkeypatch.setattr(fp_mod, "compute_fingerprint", no_hashing)
    monkeypatch.setattr(store_mod, "compute_fingerprint", no_hashing)
    run = tmp_path / "run"
    args = ["train", "--data", str(store), "--epochs", "1", "--batch-size", "32", "--out", str(run),
            "--no-progress", "--threads", "1"]
    assert main(args) == 0
    args[args.index("--epochs") + 1] = "2"
    assert main([*args, "--resume"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run / "checkpoint.pt"), "--split", "test"]) == 0
    assert f"MAPE {100 * summary['test_mape']:.2f} %" in capsys.readouterr().out
    preds = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(run / "checkpoint.pt"), "--split", "test", "--out", str(preds)]) == 0
    rows = list(csv.DictReader(open(preds)))
    m = load_model(run / "checkpoint.pt")
    test = m.split(m.load_trips(), "test")
    assert len(rows) == summary["n_test"] == len(test)
    assert sorted(r["trip_id"] for r in rows) == sorted(test.trip_id.tolist())
    assert np.mean([abs(float(r["pred_time_s"]) / float(r["true_time_s"]) - 1) for r in rows]) == pytest.approx(
        summary["test_mape"], abs=1e-4)  # the CSV rounds the times


def test_subtrips_of_a_store_are_spans_batched_in_place(tmp_path):
    """--subtrips at scale: the pieces are index spans kept with the store (read memory-mapped, shared by the
    ranks), not a copy of the training split per rank; their batches are those of the copied pieces."""
    from stfast.data.subtrips import WithSubtrips, subtrips

    write_store(random_trips(200, seed=2), tmp_path / "store")
    cfg = TrainConfig(data=str(tmp_path / "store"), epochs=1, subtrips=2)
    data = RunData.load(cfg, torch.float32)
    assert isinstance(data.train_ds.trips, WithSubtrips) and len(data.train_ds) > len(data.train)
    assert any(p.name.startswith("subtrips-") for p in (tmp_path / "store" / "derived").iterdir())
    again = RunData.load(cfg, torch.float32)
    assert not again.train_ds.trips.first.flags.writeable  # read back memory-mapped
    copied = TripDataset(Trips.concat([data.train.materialize(), subtrips(data.train, 2, cfg.seed)]),
                         data.vocab, torch.float32)
    idx = np.random.default_rng(0).permutation(len(copied))[:64]
    a, b = again.train_ds.batch(idx), copied.batch(idx)
    for k in ("lng", "lat", "state", "time_gap", "dist_gap", "lengths", "dist", "time", "driver", "week_id", "time_id"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k


def test_pieces_hold_one_piece_at_a_time(monkeypatch):
    """Statistics and the route profile of a split read in pieces keep nothing of a piece but its summary: the
    peak of memory they allocate does not grow with the split (4x the trips, the same peak within 1.5x)."""
    import tracemalloc

    trips = synthetic_trips(4000, seed=6)  # one city: its training area's cells do not grow with the trips
    for mod in (stats_mod, routes_mod):
        monkeypatch.setattr(mod, "iter_chunks", lambda t, **kw: trip_view.iter_chunks(t, 2000, **kw))
    monkeypatch.setattr(routes_mod, "CHUNK_POINTS", 2000)
    for fn in (NormStats.from_trips, RouteProfile.from_trips):
        peaks = []
        for n in (1000, 4000):
            v = trips.view(np.arange(n)[::-1])
            v.offsets  # noqa: B018 (the view's own offsets and lengths: kept, as in a run)
            fn(v)  # once before: the modules it imports on first use are not what is measured
            tracemalloc.start()
            fn(v)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        assert peaks[1] < 1.5 * peaks[0], (fn.__qualname__, peaks)
