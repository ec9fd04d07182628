"""Raw data that leaves no trip: the one-line error that counts each trip filter on its own and names the flag
that relaxes it, and `stfast data convert`'s trip filter flags (--min-points, --min-time-s, --min-dist-km).
The input is a tiny DiDi GAIA file shaped like ../shared/data's sample: one minute, a fix every 3 s."""
import json

import numpy as np
import pytest
from conftest import one_line_error, random_trips

from stfast.cli import main
from stfast.data.preprocess import PreprocessConfig, preprocess
from stfast.data.readers import read_didi_gaia

T0 = 1477955400  # 2016-11-01 07:10:00 Beijing time, the sample's first second
KM_PER_DEG_LNG = 111.195 * np.cos(np.radians(30.67))


def write_one_minute(path) -> None:
    """Four DiDi orders inside one minute, driving east (GCJ-02 degrees, Unix seconds, no header): A 20 fixes over
    0.57 km, B 20 fixes over 0.2 km, C 2 fixes over 0.03 km, D 20 fixes over 1.1 km; each lasts at most 57 s."""
    rows = []
    for k, (name, n, km) in enumerate((("a", 20, 0.57), ("b", 20, 0.2), ("c", 2, 0.03), ("d", 20, 1.1))):
        lng = 104.06 + np.linspace(0.0, km, n) / KM_PER_DEG_LNG
        lat = 30.67 + 0.01 * k
        rows += [f"{name * 32},{name.upper() * 32},{T0 + 3 * i},{x:.6f},{lat:.5f}" for i, x in enumerate(lng)]
    path.write_text("\n".join(rows))


@pytest.fixture
def minute(tmp_path):
    f = tmp_path / "in" / "gps_20161101_0710"
    f.parent.mkdir()
    write_one_minute(f)
    return f


def test_each_trip_filter_is_counted_on_its_own(minute):
    # first failing rule: C is too_short, A B D too_short_time; on its own min_time_s fails all four
    trips = preprocess(read_didi_gaia(minute), PreprocessConfig())
    assert len(trips) == 0 and trips.dropped["too_short"] == 1 and trips.dropped["too_short_time"] == 3
    tally = trips.trip_filters
    assert tally.trips == 4 and tally.fails == {"too_short": 1, "too_short_time": 4, "too_short_dist": 2}
    assert tally.points == 20 and tally.time_s == 57.0 and 1.09 < tally.dist_km < 1.11
    assert tally.limits == {"min_points": 3, "min_time_s": 60.0, "min_dist_km": 0.5, "max_points": None}


@pytest.mark.parametrize("out", ["sample.store", "sample.jsonl"])
def test_no_trip_left_names_each_filter_its_count_and_flag(minute, tmp_path, capsys, out):
    rc = main(["data", "convert", "--data", str(minute), "--format", "didi", "--min-spacing-km", "0",
               "--out", str(tmp_path / out)])
    err = one_line_error(capsys, rc)
    assert "left no trip: every one of its 4 trips fails a trip filter" in err, err
    assert "4 (all) last less than --min-time-s 60 s (the longest 57 s)" in err, err
    assert "2 cover less than --min-dist-km 0.5 km" in err and "1 has fewer than --min-points 3 points" in err, err
    assert "lower --min-time-s to keep any trip, --min-dist-km or --min-points to keep more" in err, err
    assert "too_short 1, too_short_time 3" in err, err  # the first-failing-rule counts as the store would hold
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]  # nothing written, no temporary folder left


def test_the_default_resampling_is_named_beside_min_points(minute, tmp_path, capsys):
    err = one_line_error(capsys, main(["data", "convert", "--data", str(minute), "--format", "didi",
                                       "--out", str(tmp_path / "s.store")]))
    assert "once resampled to --min-spacing-km 0.2 km apart (0 keeps every point)" in err, err
    assert "4 (all) last less than --min-time-s 60 s" in err, err
    assert not (tmp_path / "s.store").exists()


def test_a_gap_min_that_cuts_every_fix_apart_is_named(minute, tmp_path, capsys):
    err = one_line_error(capsys, main(["data", "convert", "--data", str(minute), "--gap-min", "0.01",
                                       "--out", str(tmp_path / "s.jsonl")]))
    assert "62 (all) have fewer than --min-points 3 points (the most 1) once cut at gaps over --gap-min 0.01" in err
    assert "(or raise --gap-min)" in err, err


def test_train_on_raw_data_says_to_convert_with_the_flags(minute, tmp_path, capsys):
    err = one_line_error(capsys, main(["train", "--data", str(minute), "--format", "didi",
                                       "--out", str(tmp_path / "run")]))
    assert "--min-time-s 60" in err and "flags of stfast data convert: convert with them" in err, err
    assert not (tmp_path / "run").exists()


def test_lowered_trip_filters_keep_trips_and_the_store_keeps_them(minute, tmp_path, capsys):
    store = tmp_path / "sample.store"
    assert main(["data", "convert", "--data", str(minute), "--format", "didi", "--min-spacing-km", "0",
                 "--min-time-s", "30", "--min-dist-km", "0.1", "--out", str(store)]) == 0
    assert "wrote 3 trips (60 points)" in capsys.readouterr().out
    manifest = json.loads((store / "manifest.json").read_text())
    cfg = manifest["preprocess_config"]
    assert (cfg["min_points"], cfg["min_time_s"], cfg["min_dist_km"]) == (3, 30.0, 0.1)
    assert manifest["dropped"] == {"too_short": 1, "points_of_dropped_trips": 2}
    assert main(["data", "convert", "--data", str(minute), "--format", "didi", "--min-spacing-km", "0",
                 "--min-time-s", "0", "--min-dist-km", "0", "--min-points", "2", "--out", str(store)]) == 0
    assert "wrote 4 trips (62 points)" in capsys.readouterr().out


def test_a_bad_trip_filter_value_is_refused(minute, tmp_path, capsys):
    err = one_line_error(capsys, main(["data", "convert", "--data", str(minute), "--min-points", "0",
                                       "--out", str(tmp_path / "s.store")]))
    assert "--min-points must be ≥ 1, got 0" in err, err
    assert not (tmp_path / "s.store").exists()


def test_deeptte_records_take_min_points_only(tmp_path, capsys):
    jsonl = tmp_path / "trips.jsonl"
    random_trips(20, min_len=5, max_len=30).to_jsonl(jsonl)
    for out in ("r.store", "r.jsonl"):
        err = one_line_error(capsys, main(["data", "convert", "--data", str(jsonl), "--min-time-s", "45",
                                           "--out", str(tmp_path / out)]))
        assert "--min-time-s (min_time_s): not for" in err and "DeepTTE records" in err, err
        err = one_line_error(capsys, main(["data", "convert", "--data", str(jsonl), "--min-points", "1000",
                                           "--out", str(tmp_path / out)]))
        assert "20 (all) have fewer than --min-points 1000 points (the most 30)" in err, err
        assert "lower --min-points to keep any trip" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trips.jsonl"]


def test_a_trip_filter_flag_against_a_store_must_be_the_stores(minute, tmp_path, capsys):
    store = tmp_path / "s.store"
    assert main(["data", "convert", "--data", str(minute), "--min-spacing-km", "0", "--min-time-s", "30",
                 "--min-dist-km", "0.1", "--out", str(store)]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, main(["data", "convert", "--data", str(store), "--min-time-s", "45",
                                       "--out", str(tmp_path / "t.jsonl")]))
    assert f"--min-time-s 45 differs from the trips store {store}'s --min-time-s 30" in err, err
    assert not (tmp_path / "t.jsonl").exists()
    assert main(["data", "convert", "--data", str(store), "--min-time-s", "30", "--min-points", "3",
                 "--out", str(tmp_path / "t.jsonl")]) == 0
    assert "wrote 3 trips" in capsys.readouterr().out


def test_a_huge_min_points_is_named_as_typed(minute, tmp_path, capsys):
    # the flag's value was formatted as a float: 10**23 read '1e+23', 10**400 raised OverflowError (a traceback)
    for n in (10 ** 23, 10 ** 400):
        err = one_line_error(capsys, main(["data", "convert", "--data", str(minute), "--min-points", str(n),
                                           "--out", str(tmp_path / "s.store")]))
        assert f"4 (all) have fewer than --min-points {n} points (the most " in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
