"""T-Drive reader: per-taxi files as the T-Drive user guide describes them (taxi id, date time, lng, lat)."""
import numpy as np
import pytest

from stfast.data.convert import convert_to_store
from stfast.data.errors import TrajectoryFormatError
from stfast.data.fingerprint import compute_fingerprint
from stfast.data.load import load_trips
from stfast.data.readers import detect_format, read_tdrive

TAXI1 = ("1,2008-02-02 15:36:08,116.51172,39.92123\n1,2008-02-02 15:46:08,116.51135,39.93883\n"
         "1,2008-02-02 15:56:08,116.51627,39.91034\n1,2008-02-02 16:56:08,116.47186,39.91248\n")
TAXI2 = "2,2008-02-02 13:33:52,116.36422,39.88781\n2,2008-02-02 13:37:16,116.37481,39.88782\n"
TAXI10 = "10,2008-02-02 13:33:52,116.36422,39.88781\n10,2008-02-02 13:37:16,116.37481,39.88782\n"


def _folder(tmp_path, files=None):
    d = tmp_path / "taxi_log_2008_by_id"
    d.mkdir()
    for name, text in (files or {"10.txt": TAXI10, "1.txt": TAXI1, "2.txt": TAXI2,
                                 "3.txt": ""}).items():
        (d / name).write_text(text)
    return d


def test_folder_reads_one_trajectory_per_taxi_in_natural_order_beijing_time(tmp_path):
    d = _folder(tmp_path)
    assert detect_format(d) == "tdrive" and detect_format(d / "1.txt") == "tdrive"
    t = read_tdrive(d)
    assert list(t.trip_id) == ["1", "2", "10"] and list(t.driver) == ["1", "2", "10"]
    assert list(np.diff(t.offsets)) == [4, 2, 2]
    assert t.t[0] == 1201937768.0  # 2008-02-02 15:36:08 +08:00
    assert t.tz == "Asia/Shanghai" and t.source[0].endswith("1.txt")


def test_trips_cut_at_gaps_as_geolife(tmp_path):
    d = _folder(tmp_path, {"1.txt": TAXI1 * 1})
    trips = load_trips(str(d), min_spacing_km=0, gap_s=1200)
    assert list(trips.segment) == [0]  # the 60-min gap cuts; the 1-point tail is too short: 1 trip of 3 points
    assert trips.lengths[0] == 3


def test_slow_path_reads_what_the_fast_path_reads(tmp_path):
    fast = read_tdrive(_folder(tmp_path))
    (tmp_path / "b").mkdir()
    slow = read_tdrive(_folder(tmp_path / "b", {"1.txt": TAXI1.replace(",", ", "), "2.txt": TAXI2,
                                                 "10.txt": TAXI10}))
    for k in ("offsets", "t", "lng", "lat", "trip_id"):
        assert np.array_equal(getattr(fast, k), getattr(slow, k)), k


@pytest.mark.parametrize("line, field, words", [
    ("1,2008-02-30 15:36:08,116.5,39.9", "time", "yyyy-mm-dd"),
    ("1,2008-02-02 15:36:08,196.5,39.9", "lng", "outside"),
    ("1,2008-02-02 15:36:08,116.5,abc", "lat", "not a number"),
    (",2008-02-02 15:36:08,116.5,39.9", "taxi_id", "empty"),
    ("1,2008-02-02 15:36:08,116.5", None, "4 comma-separated"),
    ("2,2008-02-02 15:36:08,116.5,39.9", "taxi_id", "one file per taxi"),
])
def test_errors_name_line_and_field(tmp_path, line, field, words):
    d = _folder(tmp_path, {"1.txt": TAXI2, "2.txt": TAXI1 + line + "\n"})
    with pytest.raises(TrajectoryFormatError) as e:
        read_tdrive(d)
    assert e.value.path.endswith("2.txt") and (e.value.line, e.value.field) == (5, field)
    assert words in e.value.reason, e.value
    assert read_tdrive(d, on_error="skip").dropped["bad_line"] == 1


def test_store_streams_what_load_trips_gives(tmp_path):
    from stfast.data.synthetic_files import write_tdrive

    write_tdrive(tmp_path / "td", 300)
    store = convert_to_store(tmp_path / "td", tmp_path / "store")
    whole = load_trips(str(tmp_path / "td"))
    assert store.fingerprint == compute_fingerprint(whole) and len(store) == len(whole) > 200
    assert store.tz == "Asia/Shanghai"
