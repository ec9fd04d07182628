"""DeepTTE JSON-lines reader: the Chengdu test file and small broken files in tmp_path."""
import json
import logging

import numpy as np
import pytest

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers import DEEPTTE_KEYS, read_deeptte_jsonl


def _rec(**over):
    r = {
        "time_gap": [0.0, 20.0, 61.0],
        "dist_gap": [0.0, 0.3, 0.5],
        "lngs": [104.04, 104.05, 104.06],
        "lats": [30.61, 30.62, 30.63],
        "states": [1.0, 1.0, 0.0],
        "dist": 0.49,
        "time": 61.0,
        "driverID": 2725,
        "weekID": 3,
        "timeID": 606,
        "dateID": 27,
    }
    r.update(over)
    return r


def _write(tmp_path, lines, name="trips.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return p


# --- real file -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chengdu(shared_data):
    return read_deeptte_jsonl(shared_data / "chengdu_deeptte_sample" / "test")


def test_real_counts(chengdu):
    assert len(chengdu) == 1400
    assert chengdu.n_points == 50_037
    assert round(chengdu.n_points / len(chengdu), 2) == 35.74
    assert (chengdu.lengths.min(), chengdu.lengths.max()) == (15, 126)
    assert len(set(chengdu.driver)) == 396
    assert chengdu.dropped == {}


def test_real_labels_and_ids(chengdu):
    last = chengdu.offsets[1:] - 1
    assert np.array_equal(chengdu.time, chengdu.time_gap[last])  # exactly, as documented
    assert (chengdu.time_gap[chengdu.offsets[:-1]] == 0).all()
    assert (chengdu.time.min(), chengdu.time.max()) == (231.0, 3517.0)
    assert round(float(chengdu.time.mean()), 1) == 1552.6
    assert np.bincount(chengdu.week_id).tolist() == [200] * 7
    assert sorted(set(chengdu.date_id.tolist())) == list(range(24, 31))
    assert chengdu.time_id.min() >= 360 and chengdu.time_id.max() <= 1423
    assert int((chengdu.state == 1).sum()) == 36_997 and int((chengdu.state == 0).sum()) == 13_040
    assert np.allclose(chengdu.dist, 0.99937216 * chengdu.dist_gap[last], rtol=1e-6)
    assert chengdu.state.dtype == np.float32 and chengdu.week_id.dtype == np.int64
    assert chengdu.driver.dtype == object and isinstance(chengdu.driver[0], str)


def test_real_records_equal_text(shared_data, chengdu):
    lines = (shared_data / "chengdu_deeptte_sample" / "test").read_text().splitlines()
    for i in (0, 1, 777, 1399):
        rec = chengdu.record(i)
        # the original keys as in the file; the ids added: line number, segment 0, the default zone
        assert {k: rec[k] for k in DEEPTTE_KEYS} == json.loads(lines[i])
        assert (rec["tripID"], rec["segment"], rec["tz"]) == (str(i + 1), 0, "Asia/Shanghai")
    first = json.loads(lines[0])
    assert chengdu.driver[0] == str(first["driverID"]) == "7361" and chengdu.time[0] == 816.0


# --- small inputs ----------------------------------------------------------------------------------


def test_good_small_file_and_blank_lines(tmp_path):
    p = _write(tmp_path, ["", _rec(), "   ", _rec(driverID="abc", time_gap=[0.0, 5, 9], time=9)])
    tr = read_deeptte_jsonl(p)
    assert len(tr) == 2 and tr.lengths.tolist() == [3, 3]
    assert tr.driver.tolist() == ["2725", "abc"]
    assert tr.time.tolist() == [61.0, 9.0] and tr.time_gap.dtype == np.float64


@pytest.mark.parametrize("key", DEEPTTE_KEYS)
def test_missing_key_is_named(tmp_path, key):
    r = _rec()
    del r[key]
    p = _write(tmp_path, [_rec(), r])
    with pytest.raises(TrajectoryFormatError) as ei:
        read_deeptte_jsonl(p)
    e = ei.value
    assert (e.line, e.field, e.reason) == (2, key, "key is missing")
    assert f"{p}:2" in str(e) and key in str(e)


@pytest.mark.parametrize(
    "over, field, words",
    [
        ({"lats": [30.61, 30.62]}, "lats", "has 2 values but lngs has 3"),
        ({"dist_gap": [0.0, 0.3, 0.5, 0.6]}, "dist_gap", "has 4 values"),
        ({"time_gap": [0.0, 30.0, 20.0], "time": 20.0}, "time_gap", "decreases at index 2"),
        ({"dist_gap": [0.0, 0.5, 0.3]}, "dist_gap", "decreases"),
        ({"time_gap": [5.0, 20.0, 61.0]}, "time_gap", "start at 0"),
        ({"time": 70.0}, "time", "!= time_gap[-1]"),
        ({"lngs": [], "lats": [], "states": [], "time_gap": [], "dist_gap": []}, "lngs", "empty"),
        ({"lats": [30.61, "x", 30.63]}, "lats", "non-numeric"),
        ({"lats": [30.61, True, 30.63]}, "lats", "non-numeric"),
        ({"lats": [30.61, 91.0, 30.63]}, "lats", "[-90, 90]"),
        ({"lngs": [104.0, 104.0, -181.0]}, "lngs", "[-180, 180]"),
        ({"states": "1,1,0"}, "states", "expected a list"),
        ({"weekID": 7}, "weekID", "outside"),
        ({"timeID": 1440}, "timeID", "outside"),
        ({"timeID": 6.5}, "timeID", "integer"),
        ({"dateID": -1}, "dateID", "outside"),
        ({"dist": "9"}, "dist", "number"),
        ({"dist": -1.0}, "dist", "negative"),
        ({"time_gap": [0.0, 0.0, 0.0], "time": 0.0}, "time", "must be > 0"),  # MAPE divides by it
        ({"driverID": [1]}, "driverID", "integer or string"),
    ],
)
def test_bad_record(tmp_path, over, field, words):
    p = _write(tmp_path, [_rec(), _rec(), _rec(**over)])
    with pytest.raises(TrajectoryFormatError) as ei:
        read_deeptte_jsonl(p)
    assert (ei.value.line, ei.value.field) == (3, field)
    assert words in ei.value.reason
    assert f"{p}:3" in str(ei.value)


def test_non_finite_numbers(tmp_path):
    p = tmp_path / "nan.jsonl"
    p.write_text(json.dumps(_rec()).replace('"dist": 0.49', '"dist": NaN') + "\n")
    with pytest.raises(TrajectoryFormatError, match="'dist'.*not finite"):
        read_deeptte_jsonl(p)
    p.write_text(json.dumps(_rec()).replace("30.62", "Infinity") + "\n")
    with pytest.raises(TrajectoryFormatError, match="'lats'.*non-finite"):
        read_deeptte_jsonl(p)


def test_time_tolerance(tmp_path):
    p = _write(tmp_path, [_rec(time=61.5)])
    assert read_deeptte_jsonl(p).time[0] == 61.5
    with pytest.raises(TrajectoryFormatError, match="tolerance 0.1"):
        read_deeptte_jsonl(p, time_tolerance_s=0.1)


@pytest.mark.parametrize("bad", ['{"time_gap": [0.0, 1.0', "[1, 2, 3]", "not json"])
def test_invalid_json(tmp_path, bad):
    p = _write(tmp_path, [_rec(), bad])
    with pytest.raises(TrajectoryFormatError) as ei:
        read_deeptte_jsonl(p)
    assert ei.value.line == 2 and ei.value.field is None
    assert f"{p}:2" in str(ei.value)


def test_skip_mode_counts(tmp_path, caplog):
    p = _write(tmp_path, [_rec(), "{oops", _rec(weekID=9), "", _rec(time=1.0), _rec(dateID=5)])
    (tmp_path / "raw").write_bytes(p.read_bytes() + b'{"x": "\xff"}\n')
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        tr = read_deeptte_jsonl(tmp_path / "raw", on_error="skip")
    assert len(tr) == 2 and tr.date_id.tolist() == [27, 5]
    assert tr.dropped == {"bad_line": 4}
    assert any("4 bad_line" in r.getMessage() and ":2" in r.getMessage() for r in caplog.records)


def test_all_skipped_and_empty_file(tmp_path, caplog):
    tr = read_deeptte_jsonl(_write(tmp_path, ["{bad"]), on_error="skip")
    assert len(tr) == 0 and tr.dropped == {"bad_line": 1} and tr.week_id.dtype == np.int64
    e = tmp_path / "empty"
    e.write_text("\n\n")
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        tr = read_deeptte_jsonl(e)
    assert len(tr) == 0 and tr.dropped == {"empty_file": 1}
    assert any("no records" in r.getMessage() for r in caplog.records)
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        read_deeptte_jsonl(tmp_path / "missing")


def test_roundtrip_to_jsonl(tmp_path):
    p = _write(tmp_path, [_rec(), _rec(driverID="d7")])
    tr = read_deeptte_jsonl(p)
    tr.to_jsonl(tmp_path / "out.jsonl")
    back = read_deeptte_jsonl(tmp_path / "out.jsonl")
    assert [back.record(i) for i in range(2)] == [tr.record(i) for i in range(2)]


def test_a_folder_of_files_reads_as_their_concatenation(shared_data, chengdu, tmp_path):
    """The original DeepTTE data is a folder of JSON-lines files (train_00 … train_04): read in name order,
    the trips equal the one file's, identified as <file>:<line>; a bad line names its file and line."""
    from stfast.data.readers import detect_format, read_any

    lines = (shared_data / "chengdu_deeptte_sample" / "test").read_text().splitlines(keepends=True)
    folder = tmp_path / "deeptte"
    folder.mkdir()
    (folder / "train_01").write_text("".join(lines[600:]))
    (folder / "train_00").write_text("".join(lines[:600]))
    (folder / ".hidden").write_text("not json\n")
    assert detect_format(folder) == "deeptte"
    got = read_any(folder)
    assert len(got) == len(chengdu) and got.tz == chengdu.tz
    for name in ("offsets", "lng", "lat", "time_gap", "dist_gap", "time", "date_id"):
        assert np.array_equal(getattr(got, name), getattr(chengdu, name)), name
    assert (got.trip_id[0], got.trip_id[599], got.trip_id[600]) == ("train_00:1", "train_00:600", "train_01:1")
    assert len(set(got.trip_id)) == len(got)
    (folder / "train_02").write_text(json.dumps(_rec()) + "\n" + json.dumps(_rec(time=0.0, time_gap=[0.0] * 3)) + "\n")
    with pytest.raises(TrajectoryFormatError) as ei:
        read_deeptte_jsonl(folder)
    assert f"{folder / 'train_02'}:2" in str(ei.value) and ei.value.field == "time"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TrajectoryFormatError, match="holds no files"):
        read_deeptte_jsonl(empty)


def test_blocks_are_parsed_side_by_side(shared_data, chengdu, tmp_path, monkeypatch):
    """The JSON-lines reader parses two blocks at once (pyarrow and numpy release the GIL: with 2 free cores the
    parse, the bulk of converting real-shaped records, takes about half the wall time), and the trips are those
    of a one-block read."""
    import threading

    from stfast.data.readers import _common
    from stfast.data.readers import deeptte_json as dj

    src = shared_data / "chengdu_deeptte_sample" / "test"
    together = threading.Barrier(2, timeout=10)
    parse = dj._fast_block
    calls = []

    def fast(block, first, tol, id_prefix):
        calls.append(first)
        if len(calls) <= 2:
            together.wait()  # BrokenBarrierError unless two blocks are parsed at the same time
        return parse(block, first, tol, id_prefix)

    monkeypatch.setattr(dj, "_fast_block", fast)
    monkeypatch.setattr(_common, "BLOCK_BYTES", max(1, src.stat().st_size // 5))
    got = read_deeptte_jsonl(src)
    assert len(calls) >= 4
    for k in ("offsets", "lng", "lat", "state", "time_gap", "dist_gap", "dist", "time", "driver", "week_id",
              "time_id", "date_id", "trip_id", "segment"):
        assert np.array_equal(getattr(got, k), getattr(chengdu, k)), k


def test_a_folder_with_a_pretty_printed_config_reads_its_records(shared_data, tmp_path):
    """Issue 62: a folder of DeepTTE records beside a pretty-printed config.json (the statistics, as the original
    DeepTTE keeps them) reads the records and leaves the config out (before: "config.json:1: invalid JSON"); a file
    of several lines that is not one JSON document is still read as records, and its bad line named."""
    src = shared_data / "chengdu_deeptte_sample"
    lines = (src / "test").read_text().splitlines()[:30]
    (tmp_path / "trips").write_text("\n".join(lines) + "\n")
    (tmp_path / "config.json").write_text(json.dumps(json.loads((src / "config.json").read_text()), indent=2))
    t = read_deeptte_jsonl(tmp_path)
    assert len(t) == 30
    broken = tmp_path / "broken"  # a file of several lines that is not one JSON document is still read, and named
    broken.write_text("{\n  \"lngs\": [1,\n")
    with pytest.raises(TrajectoryFormatError, match="broken:1"):
        read_deeptte_jsonl(tmp_path)
