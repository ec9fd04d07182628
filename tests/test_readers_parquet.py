"""Parquet / Arrow IPC point tables: the point CSV's columns, read row group by row group."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stfast.data.convert import convert_to_store
from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers import detect_format, read_csv_points, read_parquet_points

CSV = ("trip_id,timestamp,lng,lat,driver_id,state\n"
       "a,2016-11-01T07:10:00+08:00,104.05,30.65,d1,1\n"
       "b,1477955400,104.07,30.67,d2,0\n"
       "a,2016-11-01T07:11:00+08:00,104.06,30.66,d1,1\n"
       "b,1477955460,104.08,30.68,d2,0\n")


def _table(**over):
    cols = {"trip_id": ["a", "b", "a", "b"],
            "timestamp": ["2016-11-01T07:10:00+08:00", "1477955400", "2016-11-01T07:11:00+08:00", "1477955460"],
            "lng": [104.05, 104.07, 104.06, 104.08], "lat": [30.65, 30.67, 30.66, 30.68],
            "driver_id": ["d1", "d2", "d1", "d2"], "state": [1.0, 0.0, 1.0, 0.0]}
    cols.update(over)
    return pa.table(cols)


def _same(a, b):
    for k in ("offsets", "t", "lng", "lat", "state", "driver", "trip_id"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert np.array_equal(a.utc_offset_s, b.utc_offset_s, equal_nan=True) and a.tz == b.tz


def test_parquet_and_arrow_read_as_the_csv_of_the_same_rows(tmp_path):
    (tmp_path / "p.csv").write_text(CSV)
    pq.write_table(_table(), tmp_path / "p.parquet", row_group_size=3)
    with pa.ipc.new_file(tmp_path / "p.arrow", _table().schema) as w:
        w.write_table(_table(), max_chunksize=1)
    with pa.ipc.new_stream(tmp_path / "s.bin", _table().schema) as w:
        w.write_table(_table(), max_chunksize=2)
    ref = read_csv_points(tmp_path / "p.csv")
    for name in ("p.parquet", "p.arrow", "s.bin"):
        assert detect_format(tmp_path / name) == "parquet"
        _same(ref, read_parquet_points(tmp_path / name))


def test_integer_ids_numeric_and_timestamp_columns(tmp_path):
    ts = pa.array(np.array([1477955400, 1477955400, 1477955460, 1477955460], "datetime64[s]"))
    pq.write_table(_table(trip_id=[1, 2, 1, 2], timestamp=ts), tmp_path / "t.parquet")
    t = read_parquet_points(tmp_path / "t.parquet")
    assert list(t.trip_id) == ["1", "2"] and t.t[0] == 1477955400.0 and t.tz == "UTC"
    pq.write_table(_table(timestamp=pa.array(ts, pa.timestamp("s", "Asia/Shanghai"))), tmp_path / "z.parquet")
    assert read_parquet_points(tmp_path / "z.parquet").tz == "Asia/Shanghai"


def test_store_from_parquet_equals_store_from_the_csv(tmp_path):
    """Acceptance: a table holding exactly a point CSV's rows gives the same trips and fingerprint."""
    import pyarrow.csv as pacsv

    from stfast.data.synthetic_files import write_porto  # any sizeable CSV: the point CSV of a converted city
    from stfast.data.readers import read_any

    write_porto(tmp_path / "porto.csv", 200)
    tr = read_any(tmp_path / "porto.csv")
    n = np.diff(tr.offsets)
    iso = pa.compute.strftime(pa.array((tr.t + 3600).astype("datetime64[s]")), "%Y-%m-%dT%H:%M:%S+01:00")
    tab = pa.table({"trip_id": np.repeat(tr.trip_id.astype(str), n), "timestamp": iso,
                    "lng": tr.lng, "lat": tr.lat, "driver_id": np.repeat(tr.driver.astype(str), n)})
    tab = tab.take(np.random.default_rng(0).permutation(len(tab)))  # rows in any order
    pacsv.write_csv(tab, tmp_path / "points.csv")
    pq.write_table(tab, tmp_path / "points.parquet", row_group_size=5000)
    a = convert_to_store(tmp_path / "points.csv", tmp_path / "sa")
    b = convert_to_store(tmp_path / "points.parquet", tmp_path / "sb")
    assert len(a) == len(b) > 150 and a.fingerprint == b.fingerprint
    assert list(a.trip_id) == list(b.trip_id) and a.tz == b.tz


@pytest.mark.parametrize("over, field, row, words", [
    ({"lng": [104.05, 104.07, 194.06, 104.08]}, "lng", 2, "outside"),
    ({"lat": [30.65, None, 30.66, 30.68]}, "lat", 1, "null"),
    ({"trip_id": ["a", "b", "", "b"]}, "trip_id", 2, "empty"),
    ({"timestamp": ["2016-11-01T07:10:00+08:00", "1477955400", "yesterday", "1477955460"]}, "timestamp", 2, "ISO"),
    ({"driver_id": ["d1", "d2", "d1", "d3"]}, "driver_id", 3, "has driver"),
])
def test_errors_name_file_row_group_and_row(tmp_path, over, field, row, words):
    p = tmp_path / "bad.parquet"
    pq.write_table(_table(**over), p, row_group_size=2)
    with pytest.raises(TrajectoryFormatError) as e:
        read_parquet_points(p)
    assert e.value.path == str(p) and e.value.field == field and words in e.value.reason
    assert e.value.at == f"row group {row // 2}, row {row % 2}" and e.value.at in str(e.value)
    assert read_parquet_points(p, on_error="skip").dropped["bad_line"] == 1


def test_missing_column_and_not_a_table(tmp_path):
    pq.write_table(_table().drop(["lat"]), tmp_path / "a.parquet")
    with pytest.raises(TrajectoryFormatError, match="missing required column 'lat'"):
        read_parquet_points(tmp_path / "a.parquet")
    (tmp_path / "b.parquet").write_text("trip_id\n")
    with pytest.raises(TrajectoryFormatError, match="not a Parquet"):
        read_parquet_points(tmp_path / "b.parquet")
