"""`--columns` (issue 62 item 6): a CSV of another project's layout, read by naming its columns — one trip per row
with a column of [lng, lat] pairs, a start time and the seconds between fixes (an unnamed index column and a user
id beside them), or one point per row under other names; refused without it, the refusal naming the option."""
import csv
import json

import numpy as np
import pytest
from conftest import one_line_error

from stfast.cli import main
from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers import read_any
from stfast.data.readers.columns import mapped, parse_columns

POLY = "polyline=coords,time=start_time,interval_s=15,driver_id=user"


def _polyline_csv(path, n=300, seed=0):
    """Trips of 8-29 fixes along straight lines around Chengdu, one per row: ,user,coords,start_time."""
    rng = np.random.default_rng(seed)
    rows = []
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", "user", "coords", "start_time"])
        for i in range(n):
            k = int(rng.integers(8, 30))
            x0, y0, ang, step = 104.0 + rng.uniform(0, 0.1), 30.6 + rng.uniform(0, 0.1), rng.uniform(0, 6.28), \
                rng.uniform(0.0008, 0.002)
            pts = [[round(x0 + j * step * np.cos(ang), 6), round(y0 + j * step * np.sin(ang), 6)] for j in range(k)]
            start = f"2016-11-{1 + i % 20:02d}T{7 + i % 12:02d}:10:00+08:00"
            w.writerow([i, f"u{i % 17}", json.dumps(pts), start])
            rows.append((pts, start))
    return rows


def test_a_polyline_layout_reads_with_columns(tmp_path):
    path = tmp_path / "trips.csv"
    rows = _polyline_csv(path, n=40)
    with pytest.raises(TrajectoryFormatError, match="--columns"):  # not recognized: the refusal names the way
        read_any(path)
    with mapped(POLY):
        t = read_any(path)
    assert len(t.offsets) - 1 == 40 and list(t.driver[:3]) == ["u0", "u1", "u2"]
    assert list(t.trip_id[:2]) == ["line2", "line3"]  # no trip_id column: the row's line
    pts, start = rows[5]
    a, b = t.offsets[5], t.offsets[6]
    np.testing.assert_array_equal(np.stack([t.lng[a:b], t.lat[a:b]], 1), np.array(pts))
    import datetime as dt

    t0 = dt.datetime.fromisoformat(start).timestamp()
    np.testing.assert_array_equal(t.t[a:b], t0 + 15.0 * np.arange(b - a))  # fix k at start + k · interval
    assert np.all(t.utc_offset_s[a:b] == 8 * 3600)


def test_a_point_layout_under_other_names_reads_as_the_point_csv(tmp_path):
    rng = np.random.default_rng(1)
    rows = [(f"o{i}", 1478000000 + i * 3600 + k * 20, 104 + rng.uniform(0, .1), 30.6 + rng.uniform(0, .1), "d1")
            for i in range(20) for k in range(10)]
    own, other = tmp_path / "own.csv", tmp_path / "other.csv"
    with open(own, "w", newline="") as f:
        csv.writer(f).writerows([("trip_id", "timestamp", "lng", "lat", "driver_id"), *rows])
    with open(other, "w", newline="") as f:  # an index column, other names, another order, a column not used
        csv.writer(f).writerows([("idx", "Y", "X", "order", "ts", "who", "speed"),
                                 *[(j, r[3], r[2], r[0], r[1], r[4], 9) for j, r in enumerate(rows)]])
    want = read_any(own)
    with mapped("trip_id=order,time=ts,lng=x,lat=y,driver_id=who"):
        got = read_any(other)
    for name in ("offsets", "lng", "lat", "t", "state", "driver", "trip_id"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("spec, words", [
    ("polyline=c,time=t", "interval_s missing"),
    ("polyline=c,time=t,interval_s=0", "interval_s must be > 0"),
    ("polyline=c,time=t,interval_s=x", "interval_s must be a number"),
    ("trip_id=a,time=b,lng=c", "lat missing"),
    ("trip_id=a,time=b,lng=c,lat=d,speed=e", "unknown key 'speed'"),
    ("trip_id=a,trip_id=b", "trip_id given twice"),
    ("trip_id", "is not key=column"),
])
def test_a_bad_columns_text_is_refused_naming_the_option(spec, words):
    with pytest.raises(ValueError, match="--columns") as e:
        parse_columns(spec)
    assert words in str(e.value)


def test_a_mapped_column_the_header_lacks_is_named_with_its_line(tmp_path):
    path = tmp_path / "trips.csv"
    _polyline_csv(path, n=3)
    with pytest.raises(TrajectoryFormatError, match=r"trips.csv:1: .*no column 'path' in the header .*--columns polyline=path"), \
            mapped("polyline=path,time=start_time,interval_s=15"):
        read_any(path)


def test_cli_convert_and_train_on_another_projects_layout(tmp_path, capsys):
    """The issue's acceptance: a CSV of another project's polyline layout converts with --columns and trains; the
    command without --columns is refused in one line naming the option; evaluate without --data reads the run's
    own data through the run's columns."""
    data = tmp_path / "trips.csv"
    _polyline_csv(data, n=300)
    err = one_line_error(capsys, main(["data", "convert", "--data", str(data), "--out", str(tmp_path / "x.store")]))
    assert "could not recognize the format" in err and "--columns" in err
    assert main(["data", "convert", "--data", str(data), "--columns", POLY, "--out", str(tmp_path / "t.store")]) == 0
    assert "wrote 300 trips" in capsys.readouterr().out
    assert main(["train", "--data", str(data), "--columns", POLY, "--epochs", "1", "--batch-size", "32", "--out",
                 str(tmp_path / "run"), "--no-progress", "--threads", "1"]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["n_train"] + s["n_val"] + s["n_test"] == 300 and 0 < s["test_mape"] < 1
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run" / "checkpoint.pt")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"{s['n_test']} trips of the test split")
    err = one_line_error(capsys, main(["train", "--data", str(data), "--columns", "polyline=coords", "--out",
                                       str(tmp_path / "r2")]))
    assert "--columns" in err and "missing" in err
