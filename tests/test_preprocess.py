"""Tests of stfast.data.preprocess: each rule on hand-built trajectories, calendar ids, resampling,
and a property test against a plain-Python reference implementation."""
from __future__ import annotations

import logging
import math
import time as _time
from collections import Counter
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stfast.data.geo import haversine_km
from stfast.data.preprocess import POINT_KEYS, PreprocessConfig, preprocess
from stfast.data.trips import Trajectories, Trips, lengths_to_offsets

LNG0, LAT0 = 104.0, 30.0
KM_PER_DEG_LAT = 6371.0 * math.pi / 180.0
T0 = 1_408_842_480.0  # 2014-08-24 01:08:00 UTC = Sunday 09:08 in UTC+8


def north(km: float) -> float:
    """Degrees of latitude for km northwards."""
    return km / KM_PER_DEG_LAT


def make(trajs, drivers=None, modes=None, state=None, dropped=None) -> Trajectories:
    """Trajectories from a list of [(lng, lat, t), ...] lists."""
    lens = [len(p) for p in trajs]
    pts = [q for p in trajs for q in p]
    arr = np.array(pts, dtype=np.float64).reshape(-1, 3)
    n = len(pts)
    return Trajectories(
        offsets=lengths_to_offsets(np.array(lens, dtype=np.int64)),
        lng=arr[:, 0].copy(), lat=arr[:, 1].copy(), t=arr[:, 2].copy(),
        state=np.ones(n, np.float32) if state is None else np.asarray(state, np.float32),
        driver=np.array(drivers or [str(i) for i in range(len(trajs))], dtype=object),
        source=np.array([f"f{i}" for i in range(len(trajs))], dtype=object),
        trip_id=np.array([f"trip{i}" for i in range(len(trajs))], dtype=object),
        mode=None if modes is None else np.array(modes, dtype=object),
        dropped=dict(dropped or {}),
    )


def line(n, km_step=0.3, dt=60.0, t0=T0, lat0=LAT0, lng0=LNG0):
    """n points going north, km_step apart, dt seconds apart."""
    return [(lng0, lat0 + north(km_step * i), t0 + dt * i) for i in range(n)]


LOOSE = PreprocessConfig(min_points=1, min_time_s=0.0, min_dist_km=0.0)


def point_accounting(out: Trips) -> int:
    return out.n_points + sum(out.dropped.get(k, 0) for k in POINT_KEYS)


# ------------------------------------------------------------------------------------------------
# single rules


def test_clean_line_passes_unchanged():
    pts = line(8)
    out = preprocess(make([pts]))
    assert len(out) == 1 and out.n_points == 8
    np.testing.assert_array_equal(out.lat, [p[1] for p in pts])
    np.testing.assert_array_equal(out.time_gap, 60.0 * np.arange(8))
    assert out.time[0] == 420.0
    assert out.dist[0] == pytest.approx(2.1, rel=1e-9)
    assert out.dropped == {}
    assert out.driver[0] == "0"


def test_duplicates_and_nonpositive_gaps():
    p = line(6)
    pts = [p[0], p[1], p[1],  # exact duplicate
           (p[1][0], p[1][1] + 1e-5, p[1][2]),  # same time, other place
           (p[1][0], p[1][1] + 2e-5, p[1][2] - 30.0),  # out of order
           p[2], p[3], p[3], p[4], p[5]]  # another exact duplicate
    out = preprocess(make([pts]), LOOSE)
    assert out.dropped == {"duplicate_point": 2, "nonpositive_time_gap": 2}
    np.testing.assert_array_equal(out.lat, [q[1] for q in p])
    np.testing.assert_array_equal(out.time_gap, 60.0 * np.arange(6))
    assert point_accounting(out) == len(pts)


def test_point_before_running_max_dropped_after_a_late_point():
    p = line(5)
    pts = [p[0], p[1], p[3], p[2], p[4]]  # p[2] comes after a later point
    out = preprocess(make([pts]), LOOSE)
    assert out.dropped == {"nonpositive_time_gap": 1}
    np.testing.assert_array_equal(out.lat, [p[0][1], p[1][1], p[3][1], p[4][1]])


def test_speed_outliers_against_previous_kept_point():
    p = line(10)
    pts = list(p)
    pts[3] = (LNG0 + 0.5, pts[3][1], pts[3][2])  # ~48 km east within 60 s: a spike
    pts[6] = (LNG0 + 0.5, pts[6][1], pts[6][2])  # two consecutive spikes
    pts[7] = (LNG0 + 0.5, pts[7][1], pts[7][2])
    pts[9] = (LNG0, LAT0 - 0.5, pts[9][2])  # a spike at the very end
    out = preprocess(make([pts]), LOOSE)
    assert out.dropped == {"speed_outlier": 4}
    keep = [0, 1, 2, 4, 5, 8]
    np.testing.assert_array_equal(out.lat, [p[i][1] for i in keep])
    np.testing.assert_array_equal(out.time_gap, [60.0 * i for i in keep])


def test_speed_filter_threshold_and_off():
    # 0.3 km in 6 s = 180 km/h passes at 200 km/h, fails at 150 km/h
    pts = line(4, km_step=0.3, dt=6.0)
    assert preprocess(make([pts]), LOOSE).dropped == {}
    cfg = PreprocessConfig(max_speed_kmh=150.0, min_points=1, min_time_s=0, min_dist_km=0)
    out = preprocess(make([pts]), cfg)
    # sequentially: 1 is too fast from 0; 2 is 0.6 km in 12 s = 180 km/h from 0: dropped too; so is 3
    assert out.dropped == {"speed_outlier": 3}
    off = PreprocessConfig(max_speed_kmh=None, min_points=1, min_time_s=0, min_dist_km=0)
    assert preprocess(make([pts]), off).n_points == 4


def test_split_at_25_minute_gap_not_at_20():
    a = line(5)
    b = line(5, t0=a[-1][2] + 25 * 60, lat0=a[-1][1] + north(0.3))
    c = line(5, t0=b[-1][2] + 20 * 60, lat0=b[-1][1] + north(0.3))  # exactly gap_s: no split
    out = preprocess(make([a + b + c]))
    assert len(out) == 2
    np.testing.assert_array_equal(out.lengths, [5, 10])
    np.testing.assert_array_equal(out.time_gap[:5], 60.0 * np.arange(5))
    np.testing.assert_array_equal(out.time_gap[5:], np.r_[60.0 * np.arange(5), 1440 + 60.0 * np.arange(5)])
    assert out.dropped == {}
    assert list(out.driver) == ["0", "0"]


def test_stay_splits_and_is_removed():
    a = line(6)  # t 0..300, moving 0.3 km / min
    lat_s = a[-1][1] + north(0.3)
    rng = np.random.default_rng(1)
    stay = [(LNG0 + rng.normal(0, 1e-4), lat_s + rng.normal(0, 1e-4), a[-1][2] + 60.0 * (k + 1)) for k in range(16)]
    b = line(6, t0=stay[-1][2] + 60.0, lat0=lat_s + north(0.3))
    out = preprocess(make([a + stay + b]))
    assert out.dropped == {"stay_point": 16}
    np.testing.assert_array_equal(out.lengths, [6, 6])
    np.testing.assert_array_equal(out.lat, [q[1] for q in a + b])
    np.testing.assert_array_equal(out.time_gap, np.r_[60.0 * np.arange(6), 60.0 * np.arange(6)])
    assert point_accounting(out) == 6 + 16 + 6


def test_short_stop_is_not_a_stay():
    a = line(6)
    lat_s = a[-1][1] + north(0.3)
    stop = [(LNG0, lat_s, a[-1][2] + 60.0 * (k + 1)) for k in range(9)]  # 8 minutes
    b = line(6, t0=stop[-1][2] + 60.0, lat0=lat_s + north(0.3))
    out = preprocess(make([a + stop + b]))
    assert out.dropped == {} and len(out) == 1 and out.n_points == 21
    off = preprocess(make([a + stop + b]), PreprocessConfig(stay_min_s=None))
    assert off.n_points == 21


def test_stay_off_keeps_long_stop():
    a = line(6)
    stop = [(LNG0, a[-1][1], a[-1][2] + 60.0 * (k + 1)) for k in range(20)]
    out = preprocess(make([a + stop]), PreprocessConfig(stay_min_s=None))
    assert out.n_points == 26 and out.dropped == {}
    out2 = preprocess(make([a + stop]))  # the last moving point is part of the stay
    assert out2.dropped == {"stay_point": 21} and out2.n_points == 5


def test_mode_split_and_filter():
    pts = line(16)
    modes = ["walk"] * 5 + ["car"] * 6 + ["bus"] * 5
    tr = make([pts], modes=modes)
    out = preprocess(tr, PreprocessConfig(modes={"car", "bus"}))
    assert out.dropped == {"mode_filtered": 1, "points_of_dropped_trips": 5}
    np.testing.assert_array_equal(out.lengths, [6, 5])
    np.testing.assert_array_equal(out.lat, [q[1] for q in pts[5:]])
    # without modes: no split
    assert len(preprocess(tr)) == 1
    # a single string is one mode
    assert PreprocessConfig(modes="car").modes == frozenset({"car"})


def test_modes_without_labels_warns_and_keeps(caplog):
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        out = preprocess(make([line(6)]), PreprocessConfig(modes={"car"}))
    assert len(out) == 1
    assert any("no mode labels" in r.message for r in caplog.records)


def test_trip_filters_each_fire_once():
    trajs = [
        line(2, km_step=1.0),  # too_short (2 points)
        line(4, km_step=0.5, dt=15.0),  # 45 s: too_short_time (1.5 km in 15 s steps = 120 km/h)
        line(4, km_step=0.1, dt=60.0),  # 0.3 km: too_short_dist
        line(12),  # too_long with max_points=10
        line(8),  # kept
    ]
    cfg = PreprocessConfig(max_points=10)
    out = preprocess(make(trajs), cfg)
    assert out.dropped == {"too_short": 1, "too_short_time": 1, "too_short_dist": 1, "too_long": 1,
                           "points_of_dropped_trips": 2 + 4 + 4 + 12}
    assert len(out) == 1 and out.driver[0] == "4"
    assert point_accounting(out) == sum(len(p) for p in trajs)


def test_input_dropped_merged_and_logged_once(caplog):
    tr = make([line(2), line(6)], dropped={"empty_file": 2, "too_short": 1})
    with caplog.at_level(logging.INFO, logger="stfast.data"):
        out = preprocess(tr)
    assert out.dropped == {"empty_file": 2, "too_short": 2, "points_of_dropped_trips": 2}
    infos = [r for r in caplog.records if r.levelno == logging.INFO and r.name == "stfast.data"]
    # the totals, once; the drop counts are the command's to say, once (stfast.data.drops, tests/test_drops.py)
    assert len(infos) == 1 and "preprocess: 2 trajectories (8 points) -> 1 trip (6 points)" in infos[0].getMessage()
    assert "too_short" not in infos[0].getMessage()


def test_calendar_ids_in_utc_plus_8():
    assert datetime(2014, 8, 24, 1, 8, tzinfo=timezone.utc).timestamp() == T0
    # Sunday 2014-08-24 09:08 local; Monday 2014-09-01 04:30 local (still August 31 in UTC)
    t1 = datetime(2014, 8, 31, 20, 30, 59, tzinfo=timezone.utc).timestamp()
    out = preprocess(make([line(6, t0=T0), line(6, t0=t1)]), PreprocessConfig(tz="Asia/Shanghai"))
    np.testing.assert_array_equal(out.week_id, [6, 0])
    np.testing.assert_array_equal(out.time_id, [9 * 60 + 8, 4 * 60 + 30])
    np.testing.assert_array_equal(out.date_id, [24, 1])
    assert out.week_id.dtype == np.int64 and out.time_id.dtype == np.int64
    assert out.tz == out.preprocess_config.tz == "Asia/Shanghai"
    utc = preprocess(make([line(6, t0=t1)]))  # hand-made Trajectories default to UTC
    assert (utc.week_id[0], utc.time_id[0], utc.date_id[0]) == (6, 20 * 60 + 30, 31) and utc.tz == "UTC"


@pytest.mark.parametrize("seed", range(5))
def test_calendar_ids_match_datetime(seed):
    rng = np.random.default_rng(seed)
    ts = rng.uniform(0, 2e9, 30).round()
    tz = str(rng.choice(["America/New_York", "UTC", "Asia/Kolkata", "Asia/Shanghai", "Europe/Lisbon",
                         "Australia/Lord_Howe"]))
    out = preprocess(make([line(5, t0=t) for t in ts]), PreprocessConfig(tz=tz))
    for k, t in enumerate(ts):
        d = datetime.fromtimestamp(t, tz=ZoneInfo(tz))
        assert out.week_id[k] == d.weekday()
        assert out.time_id[k] == d.hour * 60 + d.minute
        assert out.date_id[k] == d.day


def test_resampling_spacing():
    rng = np.random.default_rng(3)
    n = 300
    steps = rng.uniform(0.0, 0.08, n)
    ang = np.cumsum(rng.normal(0, 0.6, n))
    lat = LAT0 + np.cumsum(steps * np.cos(ang)) / KM_PER_DEG_LAT
    lng = LNG0 + np.cumsum(steps * np.sin(ang)) / (KM_PER_DEG_LAT * math.cos(math.radians(LAT0)))
    pts = [(lng[i], lat[i], T0 + 5.0 * i) for i in range(n)]
    raw = preprocess(make([pts]), PreprocessConfig(stay_min_s=None))
    res = preprocess(make([pts]), PreprocessConfig(stay_min_s=None, min_spacing_km=0.2))
    assert len(res) == 1 and raw.n_points == n
    d = haversine_km(res.lng[:-1], res.lat[:-1], res.lng[1:], res.lat[1:])
    assert np.all(d[:-1] >= 0.2) and res.n_points < n / 2
    assert res.lng[-1] == lng[-1] and res.lat[-1] == lat[-1] and res.time[0] == raw.time[0]
    assert res.dropped["resampled"] == n - res.n_points
    # sequential reference
    kept = [0]
    for i in range(1, n):
        if haversine_km(lng[kept[-1]], lat[kept[-1]], lng[i], lat[i]) >= 0.2:
            kept.append(i)
    if kept[-1] != n - 1:
        kept.append(n - 1)
    np.testing.assert_array_equal(res.lat, lat[kept])


def test_dist_gap_is_haversine_sum():
    rng = np.random.default_rng(5)
    trajs = []
    for k in range(5):
        m = int(rng.integers(5, 30))
        lat = LAT0 + np.cumsum(rng.uniform(0.001, 0.003, m))
        lng = LNG0 + np.cumsum(rng.normal(0, 0.002, m))
        trajs.append([(lng[i], lat[i], T0 + 1000 * k + 30.0 * i) for i in range(m)])
    out = preprocess(make(trajs), PreprocessConfig(gap_s=1e9))
    assert len(out) == 5
    for i in range(len(out)):
        s = out.points(i)
        steps = haversine_km(out.lng[s][:-1], out.lat[s][:-1], out.lng[s][1:], out.lat[s][1:])
        np.testing.assert_allclose(out.dist_gap[s], np.r_[0.0, np.cumsum(steps)], rtol=1e-12, atol=1e-12)
        assert out.dist_gap[s][0] == 0.0 and np.all(np.diff(out.dist_gap[s]) >= 0)
        assert out.dist[i] == out.dist_gap[s][-1] and out.time[i] == out.time_gap[s][-1]


def test_empty_and_type_errors():
    out = preprocess(make([]))
    assert len(out) == 0 and out.n_points == 0 and out.week_id.dtype == np.int64
    out = preprocess(make([[], line(1)]))
    assert len(out) == 0 and out.dropped == {"empty_trajectory": 1, "too_short": 1, "points_of_dropped_trips": 1}
    assert list(out.dropped_trips) == [("trip0", 0, "empty_trajectory"), ("trip1", 0, "too_short")]
    assert out.trip_id.dtype == object and out.segment.dtype == np.int64
    with pytest.raises(TypeError):
        preprocess("not trajectories")
    with pytest.raises(TypeError):
        preprocess(make([line(3)]), {"gap_s": 10})


def test_mutable_config_is_checked_and_modes_normalised():
    tr = make([line(16)], modes=["walk"] * 5 + ["car"] * 11)
    cfg = PreprocessConfig()
    cfg.modes = {"car"}  # set after construction, as a plain set
    out = preprocess(tr, cfg)
    assert cfg.modes == frozenset({"car"}) and out.n_points == 11
    cfg.gap_s = -1
    with pytest.raises(ValueError):
        preprocess(tr, cfg)


@pytest.mark.parametrize("kw", [dict(gap_s=0), dict(min_points=0), dict(max_speed_kmh=-1), dict(stay_min_s=0),
                                dict(min_spacing_km=0), dict(max_points=2), dict(tz="Europe/Lisbonn"),
                                dict(tz="+08:00"), dict(tz="")])
def test_config_validation(kw):
    with pytest.raises(ValueError):
        PreprocessConfig(**kw)


def test_million_points_in_seconds():
    rng = np.random.default_rng(0)
    n_traj = 20_000
    lens = rng.integers(20, 80, n_traj)
    n = int(lens.sum())
    dt = rng.uniform(2, 60, n)
    t = T0 + np.cumsum(dt)
    heading = np.cumsum(rng.normal(0, 0.3, n))
    step = rng.uniform(0.0, 60.0, n) * dt / 3600  # 0..60 km/h
    lat = LAT0 + np.cumsum(step * np.cos(heading)) / KM_PER_DEG_LAT
    lng = LNG0 + np.cumsum(step * np.sin(heading)) / KM_PER_DEG_LAT
    spikes = rng.choice(n, n // 500, replace=False)
    lat[spikes] += 0.3
    tr = Trajectories(lengths_to_offsets(lens), lng, lat, t, np.ones(n, np.float32),
                      np.array([str(i % 300) for i in range(n_traj)], object), np.array(["s"] * n_traj, object))
    t0 = _time.perf_counter()
    out = preprocess(tr, PreprocessConfig(min_spacing_km=0.2))
    elapsed = _time.perf_counter() - t0
    assert n > 900_000
    assert elapsed < 15.0, f"{n} points took {elapsed:.1f} s"
    assert point_accounting(out) == n


# ------------------------------------------------------------------------------------------------
# property test against a plain-Python reference


def reference(tr: Trajectories, cfg: PreprocessConfig):
    """Point-by-point implementation of the documented rules: kept trips (points, traj, time, dist,
    segment), dropped counts, dropped rows (traj id, segment, reason) in input order."""
    drop = Counter()
    rows = []  # (traj index, segment, reason)
    trips = []  # (point indices, traj index)
    hav = lambda i, j: float(haversine_km(tr.lng[i], tr.lat[i], tr.lng[j], tr.lat[j]))  # noqa: E731
    for k in range(len(tr)):
        idx = [i for i in range(tr.offsets[k], tr.offsets[k + 1])
               if np.isfinite(tr.lng[i]) and np.isfinite(tr.lat[i]) and np.isfinite(tr.t[i])]
        drop["nonfinite_point"] += tr.lengths[k] - len(idx)
        n_pieces = len(trips)
        seen, nodup = set(), []
        for i in idx:
            key = (tr.t[i], tr.lng[i], tr.lat[i])
            if key in seen:
                drop["duplicate_point"] += 1
            else:
                seen.add(key)
                nodup.append(i)
        ordered = []
        for i in nodup:
            if ordered and tr.t[i] <= max(tr.t[j] for j in ordered):
                drop["nonpositive_time_gap"] += 1
            else:
                ordered.append(i)
        pts = []
        for i in ordered:
            if cfg.max_speed_kmh is not None and pts and \
                    hav(pts[-1], i) / (tr.t[i] - tr.t[pts[-1]]) * 3600 > cfg.max_speed_kmh:
                drop["speed_outlier"] += 1
            else:
                pts.append(i)
        stay = [False] * len(pts)
        if cfg.stay_min_s is not None:
            for a in range(len(pts)):
                b = next((b for b in range(a + 1, len(pts)) if tr.t[pts[b]] - tr.t[pts[a]] >= cfg.stay_min_s), None)
                if b is not None and all(hav(pts[a], pts[c]) <= cfg.stay_radius_m / 1000 for c in range(a, b + 1)):
                    for c in range(a, b + 1):
                        stay[c] = True
        drop["stay_point"] += sum(stay)
        cur = []
        for c, i in enumerate(pts):
            brk = c == 0 or stay[c - 1] or tr.t[i] - tr.t[pts[c - 1]] > cfg.gap_s
            if cfg.modes is not None and tr.mode is not None and c > 0:
                brk = brk or tr.mode[i] != tr.mode[pts[c - 1]]
            if brk and cur:
                trips.append((cur, k))
                cur = []
            if not stay[c]:
                cur.append(i)
        if cur:
            trips.append((cur, k))
        if len(trips) == n_pieces:  # the trajectory lost every point before it was cut
            why = "empty_trajectory" if tr.lengths[k] == 0 else "nonfinite_point" if not idx else "stay_point"
            drop["empty_trajectory"] += tr.lengths[k] == 0
            rows.append((k, 0, why))
    out = []
    seg = [sum(1 for _, kk in trips[:p] if kk == k) for p, (_, k) in enumerate(trips)]
    for (pts, k), sg in zip(trips, seg):
        if cfg.modes is not None and tr.mode is not None and tr.mode[pts[0]] not in cfg.modes:
            drop["mode_filtered"] += 1
            drop["points_of_dropped_trips"] += len(pts)
            rows.append((k, sg, "mode_filtered"))
            continue
        if cfg.min_spacing_km is not None:
            kept = [pts[0]]
            for i in pts[1:]:
                if hav(kept[-1], i) >= cfg.min_spacing_km:
                    kept.append(i)
            if kept[-1] != pts[-1]:
                kept.append(pts[-1])
            drop["resampled"] += len(pts) - len(kept)
            pts = kept
        time = tr.t[pts[-1]] - tr.t[pts[0]]
        dist = sum(hav(a, b) for a, b in zip(pts[:-1], pts[1:]))
        if len(pts) < cfg.min_points:
            reason = "too_short"
        elif time < cfg.min_time_s:
            reason = "too_short_time"
        elif dist < cfg.min_dist_km:
            reason = "too_short_dist"
        elif cfg.max_points is not None and len(pts) > cfg.max_points:
            reason = "too_long"
        else:
            out.append((pts, k, time, dist, sg))
            continue
        drop[reason] += 1
        drop["points_of_dropped_trips"] += len(pts)
        rows.append((k, sg, reason))
    rows.sort(key=lambda r: r[:2])
    return out, {k: int(v) for k, v in drop.items() if v}, [(tr.trip_id[k], sg, why) for k, sg, why in rows]


point_st = st.tuples(
    st.sampled_from(["move", "move", "move", "still", "dup", "back", "jump", "nan"]),
    st.integers(1, 900),  # dt seconds
    st.floats(0.0, 1.5),  # km moved
    st.floats(0.0, 2 * math.pi),  # heading
    st.sampled_from(["car", "car", "walk", ""]),
)


def build(raw_trajs) -> Trajectories:
    trajs, modes = [], []
    for k, pts in enumerate(raw_trajs):
        t, lat, lng, out = T0 + 3600.0 * k, LAT0, LNG0, []
        for kind, dt, km, hd, mode in pts:
            if kind == "dup" and out:
                out.append(out[-1])
                modes.append(modes[-1])
                continue
            if kind == "nan":
                out.append((math.nan, lat, round(t)))
                modes.append(mode)
                continue
            if kind == "back":
                t -= dt / 10
            elif kind == "jump":
                t += dt / 100
                km *= 40
            else:
                t += dt
            if kind != "still":
                lat += km * math.cos(hd) / KM_PER_DEG_LAT
                lng += km * math.sin(hd) / (KM_PER_DEG_LAT * math.cos(math.radians(lat)))
            else:
                lat += 1e-5 * math.cos(hd)
            out.append((lng, lat, round(t)))
            modes.append(mode)
        trajs.append(out)
    return make(trajs, modes=modes)


cfg_st = st.builds(
    PreprocessConfig,
    gap_s=st.sampled_from([600.0, 1200.0]),
    stay_min_s=st.sampled_from([None, 300.0, 600.0]),
    stay_radius_m=st.sampled_from([50.0, 100.0]),
    modes=st.sampled_from([None, frozenset({"car"}), frozenset({"car", ""})]),
    min_spacing_km=st.sampled_from([None, 0.2, 0.5]),
    min_points=st.sampled_from([1, 3]),
    min_time_s=st.sampled_from([0.0, 60.0]),
    min_dist_km=st.sampled_from([0.0, 0.5]),
    max_points=st.sampled_from([None, 12]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(point_st, max_size=40), max_size=6), cfg_st)
def test_property_matches_reference_and_invariants(raw, cfg):
    tr = build(raw)
    out = preprocess(tr, cfg)
    ref, ref_drop, ref_rows = reference(tr, cfg)

    # same trips, points, ids, counts and dropped rows as the point-by-point reference
    assert out.dropped == ref_drop
    assert list(out.dropped_trips) == ref_rows
    assert len(out) == len(ref)
    for i, (pts, k, time, dist, seg) in enumerate(ref):
        s = out.points(i)
        np.testing.assert_array_equal(out.lng[s], tr.lng[pts])
        np.testing.assert_array_equal(out.lat[s], tr.lat[pts])
        assert out.driver[i] == tr.driver[k]
        assert (out.trip_id[i], out.segment[i]) == (tr.trip_id[k], seg)
        assert out.time[i] == time
        assert out.dist[i] == pytest.approx(dist, rel=1e-9, abs=1e-12)

    # invariants
    assert point_accounting(out) == tr.n_points
    assert np.all(out.lengths >= cfg.min_points)
    if cfg.max_points is not None:
        assert np.all(out.lengths <= cfg.max_points)
    assert np.all(out.time >= cfg.min_time_s) and np.all(out.dist >= cfg.min_dist_km)
    for i in range(len(out)):
        s = out.points(i)
        tg, dg = out.time_gap[s], out.dist_gap[s]
        assert tg[0] == 0.0 and np.all(np.diff(tg) > 0)
        if cfg.min_spacing_km is None:  # resampling may leave wider gaps between kept points
            assert np.all(np.diff(tg) <= cfg.gap_s)
        assert dg[0] == 0.0 and np.all(np.diff(dg) >= 0)
        assert out.time[i] == tg[-1] and out.dist[i] == dg[-1]
        if cfg.min_spacing_km is not None and len(tg) > 2:
            d = haversine_km(out.lng[s][:-2], out.lat[s][:-2], out.lng[s][1:-1], out.lat[s][1:-1])
            assert np.all(d >= cfg.min_spacing_km)
    assert np.all((0 <= out.week_id) & (out.week_id <= 6))
    assert np.all((0 <= out.time_id) & (out.time_id < 1440))
    assert np.all((1 <= out.date_id) & (out.date_id <= 31))
