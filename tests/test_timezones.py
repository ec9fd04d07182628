"""Local time of the calendar ids: IANA time zones through zoneinfo, per-format defaults, the point
CSV's own offsets, and what --split-by date sees."""
from __future__ import annotations

import datetime as dt
import json
import logging
import math
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stfast.data.load import DEFAULT_TZ, load_trips
from stfast.data.preprocess import PreprocessConfig
from stfast.data.splits import default_date_split, split_by_days
from stfast.data.synthetic import SyntheticCityConfig, generate_city
from stfast.data.tz import TZ_FROM_TIMESTAMPS, check_tz, local_to_utc, utc_offset_s

LISBON = (-9.14, 38.72)
KM_PER_DEG = 6371.0 * math.pi / 180.0


def _csv(path, starts, n=8, dt_s=60, fmt=lambda t: dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")):
    """A point CSV of one trip per start (Unix s UTC): n points dt_s apart going 0.4 km north.
    ``fmt`` writes a timestamp (default: naive ISO-8601 in UTC)."""
    rows = ["trip_id,timestamp,lng,lat"]
    for k, t0 in enumerate(starts):
        for i in range(n):
            rows.append(f"p{k},{fmt(t0 + i * dt_s)},{LISBON[0]},{LISBON[1] + 0.4 * i / KM_PER_DEG}")
    path.write_text("\n".join(rows) + "\n")
    return path


def _utc(*a) -> float:
    return dt.datetime(*a, tzinfo=dt.timezone.utc).timestamp()


def _ids_by_datetime(t0, zone: str):
    d = [dt.datetime.fromtimestamp(t, ZoneInfo(zone)) for t in t0]
    return [x.weekday() for x in d], [x.hour * 60 + x.minute for x in d], [x.day for x in d]


def test_portugal_trip_gets_lisbon_local_time_summer_and_winter(tmp_path):
    # 23:30 UTC: in summer (WEST, UTC+1) already 00:30 of the next day in Lisbon; in winter (WET) not
    starts = [_utc(2023, 7, 15, 23, 30), _utc(2023, 1, 14, 23, 30)]
    p = _csv(tmp_path / "lisbon.csv", starts)
    lis = load_trips(str(p), tz="Europe/Lisbon", min_spacing_km=0)
    assert len(lis) == 2 and lis.tz == "Europe/Lisbon" and lis.preprocess_config.tz == "Europe/Lisbon"
    week, minute, day = _ids_by_datetime(starts, "Europe/Lisbon")
    assert lis.week_id.tolist() == week and lis.time_id.tolist() == minute and lis.date_id.tolist() == day
    assert (lis.date_id.tolist(), lis.time_id.tolist()) == ([16, 14], [30, 23 * 60 + 30])
    # the same file as China's local time (the old fixed UTC+8) and as naive UTC (the CSV default)
    sh = load_trips(str(p), tz="Asia/Shanghai", min_spacing_km=0)
    assert sh.time_id.tolist() == [7 * 60 + 30, 7 * 60 + 30] and sh.date_id.tolist() == [16, 15]
    utc = load_trips(str(p), min_spacing_km=0)
    assert utc.tz == "UTC" and utc.time_id.tolist() == [23 * 60 + 30] * 2 and utc.date_id.tolist() == [15, 14]


def test_split_by_date_sees_one_lisbon_day_where_utc8_saw_two(tmp_path):
    # trips from 07:00 to 22:00 Lisbon summer time on 2023-07-15: in UTC+8 the evening ones are the 16th
    starts = [_utc(2023, 7, 15, 6, 0) + 3600 * h for h in range(16)]
    p = _csv(tmp_path / "day.csv", starts)
    lis = load_trips(str(p), tz="Europe/Lisbon", min_spacing_km=0)
    sh = load_trips(str(p), tz="Asia/Shanghai", min_spacing_km=0)
    assert len(lis) == len(sh) == 16
    with pytest.raises(ValueError, match=r"the data has 1 \(the data's days of month: \[\d+\]\)"):
        default_date_split(lis.date_id)
    with pytest.raises(ValueError, match=r"the data has 2 \(the data's days of month: \[15, 16\]\)"):
        default_date_split(sh.date_id)
    train, val, test = split_by_days(lis.date_id, ({15}, set(), set()))
    assert len(train) == 16 and len(val) == len(test) == 0
    train, _, _ = split_by_days(sh.date_id, ({15}, set(), set()))
    assert 0 < len(train) < 16


def test_csv_timestamp_offsets_are_the_default_and_an_explicit_zone_overrides(tmp_path):
    # one trip written in India time (+05:30), one in Lisbon summer time (+01:00), one naive (UTC)
    starts = [_utc(2023, 7, 15, 2, 0), _utc(2023, 7, 15, 10, 0), _utc(2023, 7, 15, 20, 0)]
    offsets = [19800, 3600, None]

    def write(t):
        k = min(range(3), key=lambda j: abs(t - starts[j]))
        if offsets[k] is None:
            return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        return dt.datetime.fromtimestamp(t, dt.timezone(dt.timedelta(seconds=offsets[k]))).isoformat()

    p = _csv(tmp_path / "mixed.csv", starts, fmt=write)
    got = load_trips(str(p), min_spacing_km=0)
    assert got.tz == TZ_FROM_TIMESTAMPS == DEFAULT_TZ["csv"]
    assert got.time_id.tolist() == [7 * 60 + 30, 11 * 60, 20 * 60]
    # reading back what was saved repeats it; an explicit zone overrides the written offsets
    again = load_trips(str(p), preprocess_config=PreprocessConfig.from_dict(
        json.loads(json.dumps(got.preprocess_config.to_dict()))))
    assert again.time_id.tolist() == got.time_id.tolist()
    lis = load_trips(str(p), min_spacing_km=0, tz="Europe/Lisbon")
    assert lis.time_id.tolist() == [3 * 60, 11 * 60, 21 * 60]


def test_format_defaults(shared_data):
    geo = load_trips(str(shared_data / "geolife_sample" / "Data" / "010"))
    assert geo.tz == DEFAULT_TZ["geolife"] == "Asia/Shanghai"
    utc = load_trips(str(shared_data / "geolife_sample" / "Data" / "010"), tz="UTC")
    assert len(utc) == len(geo) and utc.tz == "UTC"
    assert np.array_equal((utc.time_id + 8 * 60) % 1440, geo.time_id)  # China has no DST since 1991
    didi = load_trips(str(shared_data / "chengdu_sample" / "didi_gaia_raw_gps"), min_spacing_km=0,
                      min_time_s=0, min_dist_km=0)  # one minute of data: keep the short trips
    assert didi.tz == DEFAULT_TZ["didi"] == "Asia/Shanghai"
    t0 = 1477955400  # the file's minute, 2016-11-01 07:10 in Chengdu
    assert len(didi) and np.all(didi.time_id // 60 == dt.datetime.fromtimestamp(t0, ZoneInfo("Asia/Shanghai")).hour)
    city = load_trips(None, n_synthetic=50)
    assert city.tz == DEFAULT_TZ["synthetic"] == SyntheticCityConfig().tz == "Asia/Shanghai"


def test_deeptte_records_keep_their_ids_and_an_explicit_zone_only_warns(shared_data, caplog):
    path = str(shared_data / "chengdu_deeptte_sample" / "test")
    plain = load_trips(path)
    assert plain.tz == DEFAULT_TZ["deeptte"] and plain.preprocess_config is None
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        other = load_trips(path, tz="Europe/Lisbon")
    assert np.array_equal(other.time_id, plain.time_id) and other.tz == "Asia/Shanghai"
    assert any("does not change them" in r.getMessage() for r in caplog.records)


def test_synthetic_city_in_another_zone(tmp_path):
    lis = load_trips(None, n_synthetic=200, seed=3, tz="Europe/Lisbon")
    traj = generate_city(200, seed=3)
    assert lis.tz == "Europe/Lisbon" and len(lis) == 200
    t0 = traj.t[traj.offsets[:-1]]  # synthetic trips keep their first fix
    week, minute, day = _ids_by_datetime(t0, "Europe/Lisbon")
    assert lis.week_id.tolist() == week and lis.time_id.tolist() == minute and lis.date_id.tolist() == day


@pytest.mark.parametrize("bad", ["Europe/Lisbonn", "", "+08:00", "../../etc/passwd", 8.0])
def test_unknown_zone_is_a_value_error_naming_it(tmp_path, bad):
    p = _csv(tmp_path / "one.csv", [_utc(2023, 7, 15, 10)])
    with pytest.raises(ValueError, match=r"unknown time zone .* \(an IANA name such as Europe/Lisbon\)") as e:
        load_trips(str(p), tz=bad)
    assert repr(bad) in str(e.value)
    with pytest.raises(ValueError, match="unknown time zone"):
        PreprocessConfig(tz=bad)
    with pytest.raises(ValueError, match="unknown time zone"):
        SyntheticCityConfig(tz=bad)
    with pytest.raises(ValueError, match="unknown time zone"):
        load_trips(None, n_synthetic=5, tz=bad)
    assert check_tz("Europe/Lisbon") == "Europe/Lisbon" and check_tz(TZ_FROM_TIMESTAMPS) == TZ_FROM_TIMESTAMPS


ZONES = ["Europe/Lisbon", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "America/Santiago",
         "Asia/Shanghai", "Pacific/Chatham", "UTC"]


def _transitions(zone: str, lo: int, hi: int) -> list[int]:
    """Seconds at which ``zone`` changes its offset in [lo, hi), found hour by hour, then bisected."""
    z = ZoneInfo(zone)
    off = lambda s: dt.datetime.fromtimestamp(s, z).utcoffset()  # noqa: E731
    out = []
    for h in range(lo, hi, 3600):
        if off(h) != off(h + 3600):
            a, b = h, h + 3600
            while b - a > 1:
                m = (a + b) // 2
                a, b = (m, b) if off(m) == off(a) else (a, m)
            out.append(b)
    return out


@settings(max_examples=60, deadline=None)
@given(zone=st.sampled_from(ZONES), year=st.integers(1975, 2035), seed=st.integers(0, 2**32 - 1))
def test_offsets_match_datetime_around_dst_transitions(zone, year, seed):
    lo, hi = int(_utc(year, 1, 1)), int(_utc(year + 1, 1, 1))
    edges = _transitions(zone, lo, hi)
    rng = np.random.default_rng(seed)
    t = np.concatenate([rng.uniform(lo, hi, 200), *[e + np.array([-3601.0, -1.0, -0.5, 0.0, 0.25, 1.0, 1800.0]) for e in edges]])
    got = utc_offset_s(t, zone)
    want = [dt.datetime.fromtimestamp(math.floor(x), ZoneInfo(zone)).utcoffset().total_seconds() for x in t]
    assert got.dtype == np.float64 and got.tolist() == want
    # local wall time back to UTC: exact away from the ambiguous/skipped hour of a change, up to the
    # float64 rounding of t + offset - offset (a t just below 2**29 s, early January 1987, loses its last
    # bit when the offset lifts it past 2**29: hypothesis found that in Australia/Lord_Howe)
    far = t[np.all(np.abs(t[:, None] - np.asarray(edges + [-1e18])[None, :]) > 2 * 3600, axis=1)]
    back = local_to_utc(far + utc_offset_s(far, zone), zone)
    assert np.abs(back - far).max(initial=0.0) <= 2 * np.spacing(np.abs(far).max(initial=1.0) + 86400.0)


def test_offsets_empty_and_timestamps_value_needs_offsets():
    assert utc_offset_s(np.zeros(0), "Europe/Lisbon").shape == (0,)
    with pytest.raises(ValueError, match="needs a time-zone name"):
        utc_offset_s(np.zeros(3), TZ_FROM_TIMESTAMPS)
