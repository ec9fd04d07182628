"""Format detection by content and read_any."""
import logging

import pytest

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers import FORMATS, detect_format, read_any, read_csv_points
from stfast.data.trips import Trajectories, Trips


def test_formats_tuple():
    assert FORMATS == ("deeptte", "geolife", "didi", "csv", "porto", "tdrive", "parquet")


@pytest.mark.parametrize(
    "rel, fmt",
    [
        ("geolife_sample", "geolife"),
        ("geolife_sample/Data", "geolife"),
        ("geolife_sample/Data/010", "geolife"),
        ("geolife_sample/Data/000/Trajectory/20081023025304.plt", "geolife"),
        ("chengdu_deeptte_sample/test", "deeptte"),
        ("chengdu_sample/didi_gaia_raw_gps/gps_20161101_0710", "didi"),
        ("chengdu_sample/didi_gaia_raw_gps", "didi"),
    ],
)
def test_detect_real(shared_data, rel, fmt):
    assert detect_format(shared_data / rel) == fmt


def test_detect_by_content_not_name(tmp_path):
    (tmp_path / "a.txt").write_text('\n  \n{"lngs": []}\n')
    (tmp_path / "b.json").write_text("trip_id,timestamp,lng,lat\nA,1,104,30\n")
    (tmp_path / "c.csv").write_text("abc,def,1477955400,104.07,30.66\n")
    (tmp_path / "d.dat").write_text("Geolife trajectory\nWGS 84\n")
    (tmp_path / "e.csv").write_text('"lat","trip_id","driver_id","timestamp","lng"\n')
    assert [detect_format(tmp_path / n) for n in ("a.txt", "b.json", "c.csv", "d.dat", "e.csv")] == [
        "deeptte", "csv", "didi", "geolife", "csv"
    ]


@pytest.mark.parametrize(
    "content",
    [
        "hello world\n",
        "abc,def,14779554,104.07,30.66\n",  # 8-digit time: not DiDi
        "trip,time,lng,lat\n1,2,3,4\n",  # header with the wrong names
        "",
    ],
)
def test_unrecognizable(tmp_path, content):
    p = tmp_path / "mystery"
    p.write_text(content)
    with pytest.raises(TrajectoryFormatError) as ei:
        detect_format(p)
    msg = str(ei.value)
    assert str(p) in msg and "could not recognize" in msg
    assert all(f in msg for f in FORMATS)
    with pytest.raises(TrajectoryFormatError, match="could not recognize"):
        read_any(p)


def test_unrecognizable_directory_and_binary(tmp_path):
    (tmp_path / "readme.md").write_text("# nothing\n")
    with pytest.raises(TrajectoryFormatError, match="could not recognize"):
        detect_format(tmp_path)
    b = tmp_path / "blob"
    b.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(TrajectoryFormatError, match="could not recognize"):
        detect_format(b)


def test_missing_path(tmp_path):
    with pytest.raises(TrajectoryFormatError) as ei:
        read_any(tmp_path / "nope")
    assert ei.value.reason == "no such file" and ei.value.line is None and str(tmp_path / "nope") in str(ei.value)
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        detect_format(tmp_path / "nope")


def test_read_any_real_and_logs_format(shared_data, caplog):
    with caplog.at_level(logging.INFO, logger="stfast.data"):
        trips = read_any(shared_data / "chengdu_deeptte_sample" / "test")
    assert isinstance(trips, Trips) and len(trips) == 1400
    assert any("deeptte" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    didi = read_any(shared_data / "chengdu_sample" / "didi_gaia_raw_gps")
    assert isinstance(didi, Trajectories) and len(didi) == 491
    geo = read_any(shared_data / "geolife_sample" / "Data" / "010")
    assert isinstance(geo, Trajectories) and len(geo) == 14 and geo.mode is not None


def test_read_any_explicit_format_and_options(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("trip_id,timestamp,lng,lat\nA,1,104,30\nA,oops,104,30\n")
    tr = read_any(p, on_error="skip")
    assert isinstance(tr, Trajectories) and tr.dropped == {"bad_line": 1}
    with pytest.raises(TrajectoryFormatError, match=r"p\.csv:3: field 'timestamp'"):
        read_any(p, "csv")
    with pytest.raises(TrajectoryFormatError):  # forced wrong reader: its own format error
        read_any(p, "didi")
    with pytest.raises(ValueError, match="format"):
        read_any(p, "parquet")
    with pytest.raises(ValueError, match="on_error"):
        read_any(p, on_error="warn")


@pytest.mark.parametrize("header, lacks", [
    ("trip_id,timestamp,lng,driver_id", "lacks column 'lat'"),
    ("trip_id,timestamp,lng,latitude", "lacks column 'lat' (has 'latitude': rename it)"),
    ("TRIP_ID,TAXI_ID,TIMESTAMP,POLYLINE", "closest: porto (a Porto taxi CSV), whose header lacks column 'MISSING_DATA'"),
])
def test_an_unrecognized_header_names_the_closest_format_and_what_it_lacks(tmp_path, header, lacks):
    """Issue 52: a point CSV without its lat column said only 'could not recognize the format'."""
    p = tmp_path / "points.csv"
    p.write_text(header + "\nA,1477955400,104.07,x\n")
    with pytest.raises(TrajectoryFormatError, match="could not recognize") as ei:
        detect_format(p)
    assert lacks in str(ei.value) and ("closest: csv (a point CSV)" in str(ei.value) or "porto" in lacks)


def test_a_wrong_format_on_a_recognizable_file_names_the_format_it_is(shared_data, tmp_path):
    """Issue 52: --format csv on DeepTTE JSON lines printed the 2.5 KB first line as a CSV header, without a word
    about what the file is. Now: which format it looks like and the flag to give, the line cut to ~80 characters,
    from read_any and from the streamed conversion to a store alike."""
    from stfast.data.convert import convert_to_store

    data = shared_data / "chengdu_deeptte_sample" / "test"
    for read in (lambda: read_any(data, "csv"), lambda: convert_to_store(data, tmp_path / "store", "csv")):
        with pytest.raises(TrajectoryFormatError) as ei:
            read()
        msg = str(ei.value)
        assert "--format csv (a point CSV) does not fit: it looks like DeepTTE JSON lines; give --format deeptte" in msg
        assert len(msg) < 400, msg
    assert not (tmp_path / "store").exists()
    with pytest.raises(TrajectoryFormatError) as ei:  # the CSV reader itself quotes the header cut short
        read_csv_points(data)
    assert len(str(ei.value)) < 250 and str(ei.value).endswith("...)")
    p = tmp_path / "p.csv"
    p.write_text("trip_id,timestamp,lng,lat\nA,1477955400,104.07,30.6\nA,1477955460,104.08,30.61\n")
    with pytest.raises(TrajectoryFormatError, match="looks like a point CSV; give --format csv"):
        read_any(p, "deeptte")


def test_an_unrecognized_folder_names_what_to_give_in_it(tmp_path):
    """A data set's folder with its notes beside the data (../shared/data/chengdu_sample: SOURCE.txt and the folder
    didi_gaia_raw_gps; chengdu_deeptte_sample: config.json, SOURCE.txt and the records file test) said only 'could not
    recognize the format'; now it names the subfolder or the file to give as --data."""
    didi = tmp_path / "chengdu_sample"
    (didi / "didi_gaia_raw_gps").mkdir(parents=True)
    (didi / "didi_gaia_raw_gps" / "gps_20161101_0710").write_text("a,b,1477955400,104.07,30.66\n")
    (didi / "SOURCE.txt").write_text("where it came from\n")
    with pytest.raises(TrajectoryFormatError, match="could not recognize") as ei:
        detect_format(didi)
    assert f"; its folder didi_gaia_raw_gps holds DiDi GAIA gps_* files: --data {didi / 'didi_gaia_raw_gps'}" \
        in str(ei.value), ei.value
    deeptte = tmp_path / "chengdu_deeptte_sample"
    deeptte.mkdir()
    (deeptte / "config.json").write_text('{\n    "dist_mean": 9.6\n}\n')
    (deeptte / "SOURCE.txt").write_text("where it came from\n")
    (deeptte / "test").write_text('{"lngs": []}\n')
    with pytest.raises(TrajectoryFormatError, match="could not recognize") as ei:
        detect_format(deeptte)
    assert f"; test is JSON lines, with other files beside it: --data {deeptte / 'test'}" in str(ei.value), ei.value
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrajectoryFormatError, match=r"only JSON-lines files\); known formats"):
        detect_format(tmp_path / "empty")
