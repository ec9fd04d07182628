"""Kaggle ECML/PKDD 2015 Porto reader: rows written from the competition's data description."""
import numpy as np
import pytest

from stfast.data.convert import convert_to_store
from stfast.data.errors import TrajectoryFormatError
from stfast.data.fingerprint import compute_fingerprint
from stfast.data.load import load_trips
from stfast.data.readers import detect_format, read_any, read_porto

HEADER = '"TRIP_ID","CALL_TYPE","ORIGIN_CALL","ORIGIN_STAND","TAXI_ID","TIMESTAMP","DAY_TYPE","MISSING_DATA","POLYLINE"\n'
ROWS = [  # the first rows of train.csv as the description gives them (polylines shortened)
    '"1372636858620000589","C","","","20000589","1372636858","A","False","[[-8.618643,41.141412],[-8.618499,41.141376],[-8.620326,41.14251],[-8.622153,41.143815]]"\n',
    '"1372637303620000596","B","","7","20000596","1372637303","A","False","[[-8.639847,41.159826],[-8.640351,41.159871],[-8.642196,41.160114]]"\n',
    '"1372636951620000320","C","","","20000320","1372636951","A","True","[[-8.612964,41.140359],[-8.613378,41.14035]]"\n',
    '"1372636854620000520","C","","","20000520","1372636854","A","False","[]"\n',
    '"1372637091620000337","A","31508","","20000337","1372637091","A","False","[[-8.6109,41.1407],[-8.6108,41.140746],[-8.6099,41.1406]]"\n',
]


def _write(path, rows=ROWS, header=HEADER):
    path.write_text(header + "".join(rows))
    return path


def test_reads_rows_as_trips_every_15_s_and_drops_missing_and_empty(tmp_path):
    t = read_porto(_write(tmp_path / "train.csv"))
    assert list(t.trip_id) == ["1372636858620000589", "1372637303620000596", "1372637091620000337"]
    assert list(t.driver) == ["20000589", "20000596", "20000337"]
    assert list(np.diff(t.offsets)) == [4, 3, 3]
    assert list(t.t[:4]) == [1372636858.0 + 15 * k for k in range(4)]
    assert t.lng[0] == -8.618643 and t.lat[2] == 41.14251
    assert t.tz == "Europe/Lisbon"
    assert t.dropped == {"missing_data": 1, "empty_polyline": 1}
    assert list(t.dropped_trips) == [("1372636951620000320", 0, "missing_data"),
                                     ("1372636854620000520", 0, "empty_polyline")]


def test_detected_by_content_whatever_the_name(tmp_path):
    p = _write(tmp_path / "data.txt")
    assert detect_format(p) == "porto"
    assert len(read_any(p)) == 3


def test_slow_path_reads_what_the_fast_path_reads(tmp_path):
    """Blanks inside polylines and lower-case booleans send a block to the csv/json reader: same result."""
    fast = read_porto(_write(tmp_path / "a.csv"))
    odd = [r.replace("],[", "], [").replace('"False"', '"false"') for r in ROWS]
    slow = read_porto(_write(tmp_path / "b.csv", odd))
    for k in ("offsets", "t", "lng", "lat", "state", "trip_id", "driver"):
        assert np.array_equal(getattr(fast, k), getattr(slow, k)), k
    assert slow.dropped == fast.dropped


def test_repeated_trip_id_is_its_own_trip(tmp_path):
    t = read_porto(_write(tmp_path / "a.csv", ROWS[:2] + ROWS[:1]))
    assert list(t.trip_id) == ["1372636858620000589", "1372637303620000596", "1372636858620000589#2"]


@pytest.mark.parametrize("row, line, field, words", [
    ('"1","C","","","2","13726x","A","False","[[-8.6,41.1]]"\n', 3, "TIMESTAMP", "integer"),
    ('"1","C","","","2","1372636858","A","Maybe","[[-8.6,41.1]]"\n', 3, "MISSING_DATA", "True nor False"),
    ('"1","C","","","2","1372636858","A","False","[[-8.6,41.1],[-8.6]]"\n', 3, "POLYLINE", "fix 1"),
    ('"1","C","","","2","1372636858","A","False","[[-8.6,41.1"\n', 3, "POLYLINE", "not JSON"),
    ('"1","C","","","2","1372636858","A","False","[[-8.6,95.0]]"\n', 3, "POLYLINE", "latitude"),
    ('"","C","","","2","1372636858","A","False","[[-8.6,41.1]]"\n', 3, "TRIP_ID", "empty"),
    ('"1","C","","2","1372636858","A","False","[[-8.6,41.1]]"\n', 3, None, "expected 9 fields"),
])
def test_errors_name_line_and_field(tmp_path, row, line, field, words):
    p = _write(tmp_path / "a.csv", ROWS[:1] + [row] + ROWS[1:2])
    with pytest.raises(TrajectoryFormatError) as e:
        read_porto(p)
    assert (e.value.line, e.value.field) == (line, field) and words in e.value.reason, e.value
    t = read_porto(p, on_error="skip")
    assert len(t) == 2 and t.dropped["bad_line"] == 1


def test_missing_column_is_named(tmp_path):
    with pytest.raises(TrajectoryFormatError, match="POLYLINE"):
        read_porto(_write(tmp_path / "a.csv", ROWS[:1], HEADER.replace(',"POLYLINE"', '')))


def test_store_streams_what_load_trips_gives(tmp_path):
    from stfast.data.synthetic_files import write_porto

    src = tmp_path / "train.csv"
    got = write_porto(src, 300, missing_every=20)
    assert got["missing"] == 15
    store = convert_to_store(src, tmp_path / "store")
    whole = load_trips(str(src))
    assert store.fingerprint == compute_fingerprint(whole) and len(store) == len(whole) > 200
    assert store.tz == "Europe/Lisbon" and store.dropped["missing_data"] == 15
    again = convert_to_store(src, tmp_path / "store2")
    assert again.fingerprint == store.fingerprint


def test_a_porto_file_converts_and_trains_3_epochs_to_beat_constant_speed(tmp_path):
    """Issue 46's acceptance at test size: a Kaggle-format file (3,000 trips, every 100th MISSING_DATA) is
    converted to a store, and 3 epochs on it beat the constant-speed baseline on the test split."""
    import json

    from stfast.cli import main
    from stfast.data.synthetic_files import write_porto

    counts = write_porto(tmp_path / "train.csv", 3000, missing_every=100)
    assert counts["missing"] == 30
    assert main(["data", "convert", "--data", str(tmp_path / "train.csv"), "--out", str(tmp_path / "store")]) == 0
    run = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "store"), "--epochs", "3", "--threads", "1", "--no-progress",
                 "--out", str(run)]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["test_mape"] < s["baseline_const_speed_mape"], s
