"""Generic point-CSV reader."""
import datetime as dt
import logging

import numpy as np
import pytest

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers import read_csv_points

T0 = dt.datetime(2016, 11, 1, 7, 10, 0, tzinfo=dt.timezone.utc).timestamp()  # 1477984200


def _csv(tmp_path, text, name="points.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_iso_and_unix_timestamps_equal(tmp_path):
    unix = _csv(tmp_path, f"trip_id,timestamp,lng,lat\nA,{T0:.0f},104.0,30.6\nA,{T0 + 3:.1f},104.1,30.7\n", "u.csv")
    iso = _csv(
        tmp_path,
        "trip_id,timestamp,lng,lat\nA,2016-11-01T07:10:00,104.0,30.6\nA,2016-11-01 15:10:03+08:00,104.1,30.7\n",
        "i.csv",
    )
    z = _csv(tmp_path, "trip_id,timestamp,lng,lat\nA,2016-11-01T07:10:00Z,104.0,30.6\nA,2016-11-01T07:10:03.000+00:00,104.1,30.7\n", "z.csv")
    a, b, c = read_csv_points(unix), read_csv_points(iso), read_csv_points(z)
    assert a.t.tolist() == b.t.tolist() == c.t.tolist() == [1477984200.0, 1477984203.0]
    assert np.array_equal(a.lng, b.lng) and np.array_equal(a.lat, c.lat)


def test_columns_any_order_grouping_and_defaults(tmp_path):
    p = _csv(
        tmp_path,
        "lat, LNG ,note,timestamp,trip_id\n"
        "30.1,104.1,x,100,B\n"
        "30.2,104.2,y,50,A\n"
        "30.3,104.3,z,90,B\n"
        "\n"
        '30.4,104.4,"q,r",90,B\n',
    )
    tr = read_csv_points(p)
    assert tr.driver.tolist() == ["", ""] and tr.lengths.tolist() == [3, 1]  # B first: file order
    assert tr.t.tolist() == [90.0, 90.0, 100.0, 50.0]  # sorted in trip, stable for ties
    assert tr.lat.tolist() == [30.3, 30.4, 30.1, 30.2]
    assert (tr.state == 0).all() and tr.state.dtype == np.float32
    assert tr.source.tolist() == [str(p)] * 2 and tr.mode is None


def test_driver_and_state_columns(tmp_path):
    p = _csv(tmp_path, "trip_id,driver_id,state,timestamp,lng,lat\n1,d9,1,5,104,30\n1,d9,0,6,104,30\n2,d8,1,1,104,30\n")
    tr = read_csv_points(p)
    assert tr.driver.tolist() == ["d9", "d8"] and tr.state.tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize("missing", ["trip_id", "timestamp", "lng", "lat"])
def test_missing_column_is_named(tmp_path, missing):
    cols = [c for c in ["trip_id", "timestamp", "lng", "lat"] if c != missing]
    p = _csv(tmp_path, ",".join(cols) + "\n" + ",".join(["1"] * len(cols)) + "\n")
    with pytest.raises(TrajectoryFormatError) as ei:
        read_csv_points(p)
    assert ei.value.field == missing and ei.value.line == 1
    assert f"missing required column '{missing}'" in str(ei.value) and str(p) in str(ei.value)


@pytest.mark.parametrize(
    "row, field, words",
    [
        ("A,yesterday,104,30", "timestamp", "neither ISO-8601"),
        ("A,2016-13-01T00:00:00,104,30", "timestamp", "neither ISO-8601"),
        ("A,nan,104,30", "timestamp", "finite"),
        ("A,5,east,30", "lng", "not a number"),
        ("A,5,104,-91", "lat", "[-90, 90]"),
        (",5,104,30", "trip_id", "empty"),
        ("A,5,104", None, "expected 4 fields"),
    ],
)
def test_bad_row(tmp_path, row, field, words):
    p = _csv(tmp_path, f"trip_id,timestamp,lng,lat\nA,1,104,30\n{row}\n")
    with pytest.raises(TrajectoryFormatError) as ei:
        read_csv_points(p)
    assert (ei.value.line, ei.value.field) == (3, field) and words in ei.value.reason
    assert f"{p}:3" in str(ei.value)


def test_driver_conflict_and_skip_mode(tmp_path, caplog):
    p = _csv(tmp_path, "trip_id,timestamp,lng,lat,driver_id\nA,1,104,30,x\nA,2,104,30,y\nA,x,1,1,x\nB,3,104,30,z\n")
    with pytest.raises(TrajectoryFormatError, match=r":3: field 'driver_id'"):
        read_csv_points(p)
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        tr = read_csv_points(p, on_error="skip")
    assert tr.dropped == {"bad_line": 2} and tr.lengths.tolist() == [1, 1]
    assert any("2 bad_line" in r.getMessage() for r in caplog.records)


def test_empty_header_only_missing_and_bom(tmp_path, caplog):
    with pytest.raises(TrajectoryFormatError, match="no header"):
        read_csv_points(_csv(tmp_path, "\n\n", "e.csv"))
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        assert len(read_csv_points(_csv(tmp_path, "trip_id,timestamp,lng,lat\n", "h.csv"))) == 0
    assert any("header only" in r.getMessage() for r in caplog.records)
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        read_csv_points(tmp_path / "nope.csv")
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufefftrip_id,timestamp,lng,lat\r\nA,1,104,30\r\n".encode())
    assert read_csv_points(bom).lng.tolist() == [104.0]
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"trip_id,timestamp,lng,lat\nA,1,104,30\nA\xff,2,104,30\n")
    with pytest.raises(TrajectoryFormatError, match=r"bad\.csv:3"):
        read_csv_points(bad)
