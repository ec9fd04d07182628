"""Trip ids through reading and preprocessing, the dropped trips with their reason, and the
containers' handling of the new fields (subset, concat, empty, save/load, JSON lines)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import random_trips

from stfast.data.load import load_trips
from stfast.data.preprocess import TRIP_KEYS, PreprocessConfig, preprocess
from stfast.data.readers import read_deeptte_jsonl, read_didi_gaia, read_geolife
from stfast.data.synthetic import generate_city
from stfast.data.trips import DroppedTrips, Trajectories, Trips, lengths_to_offsets

KM_PER_DEG = 6371.0 * math.pi / 180.0
T0 = 1_500_000_000


def _rows(trip, t0, n, dt_s=60, km=0.4, lng=-9.14, lat=38.72):
    return [f"{trip},{t0 + i * dt_s},{lng},{lat + km * i / KM_PER_DEG}" for i in range(n)]


def _csv(tmp_path, rows, name="p.csv"):
    p = tmp_path / name
    p.write_text("trip_id,timestamp,lng,lat\n" + "\n".join(rows) + "\n")
    return str(p)


def test_csv_ids_segments_and_dropped_rows(tmp_path):
    rows = (
        _rows("taxi-7", T0, 6)  # one trip
        + _rows("bus 3", T0, 5) + _rows("bus 3", T0 + 5000, 2) + _rows("bus 3", T0 + 9000, 5)  # 3 pieces
        + _rows("walk", T0, 2)  # too short
        + ["ghost,not a time,1,2", "ghost,also bad,1,2"]  # every row bad: skipped
        + _rows("A", T0 + 100, 4)[:1] + ["A,bad,1,2"]  # one good row left: too short
    )
    trips = load_trips(_csv(tmp_path, rows), on_error="skip", min_spacing_km=0)
    assert trips.trip_id.tolist() == ["taxi-7", "bus 3", "bus 3"]
    assert trips.segment.tolist() == [0, 0, 2] and trips.segment.dtype == np.int64
    assert list(trips.dropped_trips) == [
        ("ghost", 0, "bad_line"),  # reader skips first, then preprocessing in input order
        ("bus 3", 1, "too_short"),
        ("walk", 0, "too_short"),
        ("A", 0, "too_short"),
    ]
    # every listed reason is a counted key (trips), or a reader's count
    for _, _, why in trips.dropped_trips:
        assert why in trips.dropped and (why in TRIP_KEYS or why == "bad_line")


def test_vanished_trajectories_are_listed(tmp_path):
    stay = [f"still,{T0 + 60 * i},-9.14,38.72" for i in range(15)]  # 14 min at one spot: all stay
    trips = load_trips(_csv(tmp_path, stay + _rows("ok", T0, 5)), min_spacing_km=0)
    assert trips.trip_id.tolist() == ["ok"] and list(trips.dropped_trips) == [("still", 0, "stay_point")]
    # readers refuse non-finite values; hand-made trajectories may have them, or no points at all
    ok = np.array([T0 + 60.0 * i for i in range(5)])
    traj = Trajectories(lengths_to_offsets(np.array([2, 0, 5])), np.r_[np.nan, np.nan, np.full(5, -9.14)],
                        np.r_[38.7, 38.7, 38.72 + 0.4 * np.arange(5) / KM_PER_DEG], np.r_[ok[:2], ok],
                        np.ones(7, np.float32), np.array(["d"] * 3, object), np.array(["s"] * 3, object),
                        trip_id=np.array(["nan", "none", "fine"], object))
    got = preprocess(traj)
    assert got.trip_id.tolist() == ["fine"] and got.dropped["empty_trajectory"] == 1
    assert list(got.dropped_trips) == [("nan", 0, "nonfinite_point"), ("none", 0, "empty_trajectory")]


def test_didi_ids_are_order_ids(shared_data):
    path = shared_data / "chengdu_sample" / "didi_gaia_raw_gps" / "gps_20161101_0710"
    orders = list(dict.fromkeys(line.split(",")[1] for line in path.read_text().splitlines() if line.strip()))
    traj = read_didi_gaia(path)
    assert traj.trip_id.tolist() == orders and len(set(orders)) == 491
    trips = load_trips(str(path), min_spacing_km=0, min_time_s=0, min_dist_km=0)
    assert set(trips.trip_id) <= set(orders)
    # every order is either a trip or a dropped row
    assert set(trips.trip_id) | {i for i, _, _ in trips.dropped_trips} == set(orders)


def test_geolife_ids_are_user_and_file(shared_data, tmp_path):
    root = shared_data / "geolife_sample" / "Data"
    traj = read_geolife(root)
    want = [f"{Path(s).parent.parent.name}/{Path(s).stem}" for s in traj.source]
    assert traj.trip_id.tolist() == want and len(set(want)) == len(traj) == 103
    trips = load_trips(str(root))
    assert set(trips.trip_id) | {i for i, _, _ in trips.dropped_trips} == set(want)
    for tid in set(trips.trip_id):  # segments: distinct, increasing within a trajectory
        seg = trips.segment[trips.trip_id == tid]
        assert np.all(np.diff(seg) > 0)
    pieces = sum(1 for i, s, _ in trips.dropped_trips if s > 0) + int((trips.segment > 0).sum())
    assert pieces > 0  # the sample's traces are cut at stays and gaps
    # an empty file is listed by the reader
    user = tmp_path / "Data" / "042" / "Trajectory"
    user.mkdir(parents=True)
    src = next((root / "010" / "Trajectory").glob("*.plt"))
    (user / src.name).write_bytes(src.read_bytes())
    (user / "20990101000000.plt").write_text("Geolife trajectory\n" * 6)
    got = load_trips(str(tmp_path / "Data"))
    assert ("042/20990101000000", 0, "empty_file") in list(got.dropped_trips)


def test_deeptte_ids_line_numbers_and_round_trip(tmp_path, shared_data):
    path = shared_data / "chengdu_deeptte_sample" / "test"
    orig = read_deeptte_jsonl(path)
    assert orig.trip_id.tolist() == [str(i) for i in range(1, 1401)] and not orig.segment.any()
    # convert raw traces → JSON lines → read back: the ids, segments and zone survive
    rows = _rows("x", T0, 5) + _rows("x", T0 + 4000, 5) + _rows("y", T0, 4)
    src = load_trips(_csv(tmp_path, rows), min_spacing_km=0, tz="Europe/Lisbon")
    src.to_jsonl(tmp_path / "conv.jsonl")
    back = read_deeptte_jsonl(tmp_path / "conv.jsonl")
    assert back.trip_id.tolist() == ["x", "x", "y"] and back.segment.tolist() == [0, 1, 0]
    assert back.tz == "Europe/Lisbon" and np.array_equal(back.time_id, src.time_id)
    # a skipped line is listed with its line number (or its tripID)
    lines = (tmp_path / "conv.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["weekID"] = 9
    (tmp_path / "bad.jsonl").write_text("\n".join([lines[0], json.dumps(bad), "{oops", lines[2]]) + "\n")
    got = read_deeptte_jsonl(tmp_path / "bad.jsonl", on_error="skip")
    assert got.trip_id.tolist() == ["x", "y"]
    assert list(got.dropped_trips) == [("x", 1, "bad_line"), ("3", 0, "bad_line")]


def test_containers_keep_ids(tmp_path):
    tr = random_trips(6, seed=3)
    assert tr.trip_id.tolist() == [str(i) for i in range(6)] and tr.segment.tolist() == [0] * 6  # defaults
    tr.trip_id = np.array(list("abcdef"), dtype=object)
    tr.segment = np.arange(6, dtype=np.int64)
    tr.tz = "Europe/Lisbon"
    tr.preprocess_config = PreprocessConfig(tz="Europe/Lisbon", min_points=4)
    tr.dropped, tr.dropped_trips = {"too_short": 1}, DroppedTrips.of(["g"], "too_short")
    sub = tr.subset(np.array([4, 1]))
    assert sub.trip_id.tolist() == ["e", "b"] and sub.segment.tolist() == [4, 1]
    assert sub.tz == "Europe/Lisbon" and sub.preprocess_config == tr.preprocess_config
    both = Trips.concat([sub, tr.subset(np.array([0]))])
    assert both.trip_id.tolist() == ["e", "b", "a"] and both.tz == "Europe/Lisbon"
    mixed = Trips.concat([tr, random_trips(2, seed=4)])
    assert mixed.tz is None and len(mixed.dropped_trips) == 1 and mixed.dropped == {"too_short": 1}
    e = Trips.empty()
    assert e.trip_id.dtype == object and e.segment.dtype == np.int64 and e.week_id.dtype == np.int64
    for mmap in (True, False):
        tr.save(tmp_path / "t")
        got = Trips.load(tmp_path / "t", mmap=mmap)
        assert got.trip_id.tolist() == tr.trip_id.tolist() and got.segment.tolist() == tr.segment.tolist()
        assert got.tz == tr.tz and got.preprocess_config == tr.preprocess_config
        assert got.dropped_trips == tr.dropped_trips and got.dropped == tr.dropped
    # a folder of the previous format (no ids) loads with the default ids
    meta = tmp_path / "t" / "meta.json"
    meta.write_text(json.dumps({"format": "stfast-trips/1", "dropped": {}}))
    for f in ("trip_id", "segment", "dropped_trip_id", "dropped_segment", "dropped_reason"):
        (tmp_path / "t" / f"{f}.npy").unlink()
    old = Trips.load(tmp_path / "t")
    assert old.trip_id.tolist() == [str(i) for i in range(6)] and old.tz is None


def test_dropped_trips_validation():
    with pytest.raises(ValueError, match="equal lengths"):
        DroppedTrips(np.array(["a"], object), np.zeros(2, np.int64), np.array(["x"], object))
    d = DroppedTrips.concat([DroppedTrips.of(["a", "b"], "too_long", [0, 3]), DroppedTrips.empty()])
    assert list(d) == [("a", 0, "too_long"), ("b", 3, "too_long")] and len(d) == 2


def test_config_dict_round_trip_and_every_option_a_keyword(tmp_path):
    cfg = PreprocessConfig(modes={"taxi", "car"}, min_spacing_km=0.3, tz="Europe/Lisbon", max_points=50)
    d = cfg.to_dict()
    assert d["modes"] == ["car", "taxi"] and json.loads(json.dumps(d)) == d
    assert PreprocessConfig.from_dict(json.loads(json.dumps(d))) == cfg
    assert PreprocessConfig.from_dict({}) == PreprocessConfig()
    with pytest.raises(ValueError, match="tz_offset_h"):
        PreprocessConfig.from_dict({"tz_offset_h": 8.0})
    rows = _rows("a", T0, 12) + _rows("b", T0, 4) + _rows("c", T0, 3, dt_s=400)
    p = _csv(tmp_path, rows)
    opts = dict(max_speed_kmh=150.0, stay_radius_m=50.0, stay_min_s=300.0, min_points=5, min_time_s=30.0,
                min_dist_km=0.1, max_points=11)
    got = load_trips(p, min_spacing_km=0, gap_s=300.0, **opts)
    for k, v in opts.items():
        assert getattr(got.preprocess_config, k) == v
    assert got.preprocess_config.gap_s == 300.0 and got.preprocess_config.min_spacing_km is None
    # a: 12 points > max_points; b: 4 < min_points; c: cut at each 400 s gap into 1-point pieces
    assert len(got) == 0 and [r for _, _, r in got.dropped_trips] == ["too_long", "too_short"] + ["too_short"] * 3
    again = load_trips(p, preprocess_config=got.preprocess_config)
    assert list(again.dropped_trips) == list(got.dropped_trips)
    with pytest.raises(TypeError, match="min_pointz"):
        load_trips(p, min_pointz=3)
    # the synthetic city follows a given config, like a file does
    city = load_trips(None, n_synthetic=30, preprocess_config=PreprocessConfig(tz="Asia/Shanghai", max_points=20))
    assert np.all(city.lengths <= 20) and city.preprocess_config.max_points == 20


def test_synthetic_ids_and_direct_preprocess_defaults():
    trips = load_trips(None, n_synthetic=40, seed=2)
    assert trips.trip_id.tolist() == [str(i) for i in range(40)] and not trips.segment.any()
    traj = generate_city(5)
    assert traj.tz == preprocess(traj).tz == "Asia/Shanghai"  # tz None: the trajectories' own
