"""Tests of stfast.data.synthetic: determinism, realistic shape, and a learnable travel-time signal."""
from __future__ import annotations

import math

import numpy as np
import pytest

from stfast.data.synthetic import (
    SyntheticCityConfig,
    _simulate,
    driver_factors,
    generate_city,
    synthetic_trips,
)
from stfast.data.trips import Trajectories, Trips

FIELDS = ("offsets", "lng", "lat", "t", "state", "driver", "source")


def mape(pred, y) -> float:
    return float(np.mean(np.abs(pred - y) / y))


@pytest.fixture(scope="module")
def sim5k():
    cfg = SyntheticCityConfig()
    traj, truth = _simulate(5000, 11, cfg)
    from stfast.data.preprocess import preprocess

    return preprocess(traj, cfg.preprocess_config()), truth


def test_deterministic_for_a_seed():
    a, b = generate_city(300, seed=5), generate_city(300, seed=5)
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
        if x.dtype.kind == "f":
            assert x.tobytes() == y.tobytes(), f
    c = generate_city(300, seed=6)
    assert a.n_points != c.n_points or not np.array_equal(a.lng, c.lng)
    assert not np.array_equal(a.driver, c.driver)
    assert not np.array_equal(a.t[a.offsets[:-1]], c.t[c.offsets[:-1]])
    ta, tb = synthetic_trips(200, seed=2), synthetic_trips(200, seed=2)
    for f in Trips._POINT_FIELDS + Trips._TRIP_FIELDS:
        assert np.array_equal(getattr(ta, f), getattr(tb, f)), f


def test_drivers_shared_across_seeds():
    f1 = driver_factors(SyntheticCityConfig())
    assert f1.shape == (300,) and np.all(f1 > 0)
    assert np.array_equal(f1, driver_factors(SyntheticCityConfig()))
    assert not np.array_equal(f1, driver_factors(SyntheticCityConfig(city_seed=1)))
    assert abs(float(np.std(np.log(f1))) - 0.12) < 0.02
    _, t1 = _simulate(400, 1, SyntheticCityConfig())
    _, t2 = _simulate(400, 2, SyntheticCityConfig())
    assert set(np.round(t1["driver_factor"], 12)) | set(np.round(t2["driver_factor"], 12)) <= set(np.round(f1, 12))


def test_raw_trajectories_shape():
    tr = generate_city(500, seed=0)
    assert isinstance(tr, Trajectories) and len(tr) == 500 and tr.mode is None
    assert tr.lng.dtype == np.float64 and tr.t.dtype == np.float64 and tr.state.dtype == np.float32
    assert np.all(tr.t == np.round(tr.t))  # whole seconds
    assert set(np.unique(tr.state)) <= {0.0, 1.0} and tr.state.mean() > 0.9
    for i in range(0, 500, 37):
        s = tr.points(i)
        dt = np.diff(tr.t[s])
        assert np.all((30 <= dt[:-1]) & (dt[:-1] <= 60)) and 5 < dt[-1] <= 65  # the last fix is the arrival
    # inside the grid around Chengdu (16 km square plus GPS noise)
    assert abs(tr.lng - 104.06).max() < 0.09 and abs(tr.lat - 30.66).max() < 0.08
    assert tr.source[0] == "synthetic-city(seed=0)"


def test_length_distribution_and_labels(sim5k):
    trips, _ = sim5k
    assert len(trips) == 5000 and trips.dropped == {}
    lens = trips.lengths
    assert lens.min() >= 3
    assert 20 <= np.median(lens) <= 50
    assert 7.0 <= trips.dist.mean() <= 12.0 and 1100 <= trips.time.mean() <= 2000
    last = trips.offsets[1:] - 1
    np.testing.assert_array_equal(trips.time, trips.time_gap[last])
    np.testing.assert_array_equal(trips.dist, trips.dist_gap[last])
    spacing = np.diff(trips.dist_gap)[np.diff(trips.time_gap) > 0]
    assert 0.2 <= spacing.mean() <= 0.4
    assert set(np.unique(trips.week_id)) == set(range(7))
    assert len(np.unique(trips.date_id)) >= 28
    assert len(np.unique(trips.time_id // 60)) == 24
    assert len(np.unique(trips.driver)) > 250


def test_rush_hour_slower_than_night(sim5k):
    trips, _ = sim5k
    hour = trips.time_id // 60
    workday = trips.week_id < 5
    v = trips.dist / trips.time * 3600

    def speed(h):
        m = workday & np.isin(hour, h)
        return v[m].sum() / m.sum()

    assert speed([7, 8, 17, 18]) < 0.6 * speed([0, 1, 2, 3, 4])


def test_constant_speed_mape_in_range(sim5k):
    trips, _ = sim5k
    v = trips.dist.sum() / trips.time.sum()
    assert 0.20 <= mape(trips.dist / v, trips.time) <= 0.40


def test_oracle_knowing_the_factors_is_accurate(sim5k):
    trips, truth = sim5k
    assert mape(truth["oracle_time"], trips.time) < 0.10


def _features(trips: Trips, cfg: SyntheticCityConfig) -> np.ndarray:
    """One-hot hour × (workday, weekend), one-hot driver, ring shares and arterial share from GPS."""
    n = len(trips)
    hour = trips.time_id // 60 + 24 * (trips.week_id >= 5)
    H = np.zeros((n, 48))
    H[np.arange(n), hour] = 1
    D = np.zeros((n, cfg.n_drivers))
    D[np.arange(n), trips.driver.astype(int)] = 1
    km = 6371.0 * math.pi / 180
    x = (trips.lng - cfg.center_lng) * km * math.cos(math.radians(cfg.center_lat))
    y = (trips.lat - cfg.center_lat) * km
    ring = np.searchsorted(np.asarray(cfg.ring_km), np.hypot(x, y))
    owner = np.repeat(np.arange(n), trips.lengths)
    R = np.zeros((n, len(cfg.ring_factor) + 1))
    for k in range(len(cfg.ring_factor)):
        R[:, k] = np.bincount(owner, weights=ring == k, minlength=n) / trips.lengths
    art = np.zeros(len(x), dtype=bool)
    for r in cfg.arterial_rows_km:
        art |= np.abs(y - r) < 0.03
    for c in cfg.arterial_cols_km:
        art |= np.abs(x - c) < 0.03
    R[:, -1] = np.bincount(owner, weights=art, minlength=n) / trips.lengths
    return np.hstack([H, D, R])


def test_linear_fit_beats_constant_speed(sim5k):
    """log(time/dist) on hour, driver and region features: ≥ 30 % lower MAPE than constant speed."""
    trips, _ = sim5k
    cfg = SyntheticCityConfig()
    X = _features(trips, cfg)
    y = np.log(trips.time / trips.dist)
    train, test = np.arange(4000), np.arange(4000, 5000)
    beta, *_ = np.linalg.lstsq(X[train], y[train], rcond=None)
    pred = trips.dist[test] * np.exp(X[test] @ beta)
    v = trips.dist[train].sum() / trips.time[train].sum()
    const = mape(trips.dist[test] / v, trips.time[test])
    linear = mape(pred, trips.time[test])
    assert linear <= 0.7 * const, (linear, const)


def test_small_and_empty():
    assert len(synthetic_trips(0)) == 0 and generate_city(0).n_points == 0
    one = synthetic_trips(1, seed=4)
    assert len(one) == 1 and one.n_points >= 3
    rec = one.record(0)
    assert rec["time"] == rec["time_gap"][-1] and isinstance(rec["driverID"], int)


def test_validation():
    with pytest.raises(ValueError):
        generate_city(-1)
    with pytest.raises(ValueError):
        generate_city(2.5)
    for kw in (dict(grid_km=0), dict(weekday_kmh=(10,) * 23), dict(ring_factor=(1.0,)),
               dict(dist_min_km=5, dist_max_km=4), dict(dist_max_km=100), dict(sample_interval_s=(0, 10)),
               dict(p_arterial=2), dict(start_date="2014-13-01"), dict(driver_sigma=-1)):
        with pytest.raises(ValueError):
            SyntheticCityConfig(**kw)


def test_other_config_changes_output():
    small = SyntheticCityConfig(grid_km=8.0, dist_median_km=4.0, dist_max_km=14.0, dist_min_km=1.0)
    trips = synthetic_trips(300, seed=0, config=small)
    assert len(trips) == 300 and trips.dist.mean() < 6.0


def test_trips_save_and_memory_mapped_load_round_trip(tmp_path):
    tr = synthetic_trips(300, seed=4)
    tr.dropped = {"short": 2}
    tr.save(tmp_path / "city")
    tr.save(tmp_path / "city")  # replaces an existing folder
    for mmap in (True, False):
        got = Trips.load(tmp_path / "city", mmap=mmap)
        assert isinstance(got.lng, np.memmap) == mmap and got.dropped == {"short": 2}
        for name in ("offsets", *Trips._POINT_FIELDS, "dist", "time", "week_id", "time_id", "date_id"):
            a, b = getattr(tr, name), getattr(got, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        assert got.driver.tolist() == tr.driver.tolist()
        sub = got.subset(np.array([5, 1]))  # a memory-mapped container works like an in-memory one
        assert sub.lengths.tolist() == tr.lengths[[5, 1]].tolist()
    with pytest.raises(ValueError, match="not a trips folder"):
        Trips.load(tmp_path)


def test_a_save_killed_between_its_renames_loses_no_trips(tmp_path, monkeypatch, caplog):
    """Trips.save replaces a folder by renaming it aside and the new one in: a kill between the two renames
    leaves only the aside copy, which load reads (the previous data set, not nothing), and the next save
    removes it."""
    import os

    first, second = synthetic_trips(40, seed=1), synthetic_trips(50, seed=2)
    first.save(tmp_path / "city")
    real = os.replace
    calls = []

    def killed_at_the_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the kill
        real(src, dst)

    monkeypatch.setattr(os, "replace", killed_at_the_second_rename)
    with pytest.raises(KeyboardInterrupt):
        second.save(tmp_path / "city")
    monkeypatch.setattr(os, "replace", real)
    assert not (tmp_path / "city").exists()
    got = Trips.load(tmp_path / "city")
    assert len(got) == 40 and np.array_equal(got.lng, first.lng)
    assert "interrupted" in caplog.text and ".city.old" in caplog.text
    second.save(tmp_path / "city")
    assert len(Trips.load(tmp_path / "city")) == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["city"]  # the aside copy and the temp folder are gone
