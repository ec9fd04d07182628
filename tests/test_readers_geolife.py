"""GeoLife .plt reader: the real sample in ../shared/data and small broken files in tmp_path."""
import datetime as dt
import logging
from pathlib import Path

import numpy as np
import pytest

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers import read_geolife
from stfast.data.readers.geolife import GEOLIFE_EPOCH, read_geolife_labels

HEADER = "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"
UTC = dt.timezone.utc


def _utc(*a) -> float:
    return dt.datetime(*a, tzinfo=UTC).timestamp()


def _write(path: Path, body: str, header: str = HEADER, newline: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((header + body).replace("\n", newline).encode())
    return path


def _user(tmp_path: Path, user: str, files: dict, labels: str | None = None) -> Path:
    for name, body in files.items():
        _write(tmp_path / "Data" / user / "Trajectory" / name, body)
    if labels is not None:
        (tmp_path / "Data" / user / "labels.txt").write_bytes(labels.replace("\n", "\r\n").encode())
    return tmp_path


P1 = "39.984702,116.318417,0,492,39744.1201851852,2008-10-23,02:53:04\n"
P2 = "39.984683,116.31845,0,492,39744.1202546296,2008-10-23,02:53:10\n"
P3 = "39.984686,116.318417,0,-777,39744.1203125,2008-10-23,02:53:15\n"


# --- real sample -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def geolife(shared_data):
    return read_geolife(shared_data / "geolife_sample")


def test_real_counts_match_the_files(shared_data, geolife):
    files = sorted((shared_data / "geolife_sample" / "Data").glob("*/Trajectory/*.plt"))
    assert len(files) == 103 == len(geolife)
    # independent count: every line after the 6 header lines is one point
    per_file = [len(f.read_bytes().splitlines()) - 6 for f in files]
    assert sum(per_file) == 154_048 == geolife.n_points
    assert geolife.lengths.tolist() == per_file  # sorted users, sorted files
    assert list(geolife.source) == [str(f) for f in files]
    assert sorted(set(geolife.driver)) == ["000", "001", "002", "003", "004", "005", "006", "007", "008", "010"]
    assert geolife.dropped == {}
    assert geolife.state.dtype == np.float32 and not geolife.state.any()
    assert geolife.lng.dtype == geolife.lat.dtype == geolife.t.dtype == np.float64


def test_real_first_point_equals_text(shared_data, geolife):
    f = shared_data / "geolife_sample/Data/000/Trajectory/20081023025304.plt"
    assert f.read_bytes().splitlines()[6] == P1.strip().encode()
    i = list(geolife.source).index(str(f))
    s = geolife.points(i)
    assert geolife.driver[i] == "000"
    assert (geolife.lat[s][0], geolife.lng[s][0]) == (39.984702, 116.318417)
    assert geolife.t[s][0] == _utc(2008, 10, 23, 2, 53, 4) == 1224730384.0
    assert geolife.t[s][1] - geolife.t[s][0] == 6.0
    assert geolife.lengths[i] == 914 - 6


def test_real_times_agree_with_days_field(shared_data, geolife):
    # field 5 (days since 1899-12-30) is not used by the reader: an independent check of date+time
    days = []
    for f in geolife.source:
        for line in Path(f).read_bytes().splitlines()[6:]:
            days.append(float(line.split(b",")[4]))
    t_days = GEOLIFE_EPOCH.timestamp() + np.array(days) * 86400.0
    assert np.abs(t_days - geolife.t).max() < 1.0
    assert geolife.t.min() >= _utc(2007, 1, 1) and geolife.t.max() < _utc(2012, 1, 1)


def test_real_labels_give_modes_for_user_010(shared_data, geolife):
    assert geolife.mode is not None and geolife.mode.dtype == object
    user = np.repeat(geolife.driver, geolife.lengths)
    assert set(geolife.mode[user != "010"]) == {""}  # users without labels.txt
    # naive reference: every point against every interval of labels.txt (later rows win)
    rows = (shared_data / "geolife_sample/Data/010/labels.txt").read_text().splitlines()[1:]
    fmt = "%Y/%m/%d %H:%M:%S"
    iv = [
        (dt.datetime.strptime(a, fmt).replace(tzinfo=UTC).timestamp(),
         dt.datetime.strptime(b, fmt).replace(tzinfo=UTC).timestamp(), m)
        for a, b, m in (r.split("\t") for r in rows)
    ]
    t010 = geolife.t[user == "010"]
    want = np.full(len(t010), "", dtype=object)
    for a, b, m in iv:
        want[(t010 >= a) & (t010 <= b)] = m
    got = geolife.mode[user == "010"]
    assert (got == want).all()
    labelled = got[got != ""]
    assert len(labelled) == 3417
    assert {m: int((labelled == m).sum()) for m in set(labelled)} == {"train": 2360, "walk": 578, "bus": 266, "taxi": 213}


def test_real_root_variants_agree(shared_data, geolife):
    data = shared_data / "geolife_sample" / "Data"
    via_data = read_geolife(data)
    assert via_data.n_points == geolife.n_points and np.array_equal(via_data.t, geolife.t)
    u010 = read_geolife(data / "010")
    sel = geolife.subset(geolife.driver == "010")
    assert np.array_equal(u010.lat, sel.lat) and np.array_equal(u010.mode, sel.mode)
    one = sorted((data / "010" / "Trajectory").glob("*.plt"))[0]
    single = read_geolife(one)
    assert len(single) == 1 and single.driver[0] == "010" and single.mode is not None
    only000 = read_geolife(data, users=["000"])
    assert set(only000.driver) == {"000"} and len(only000) == 8 and only000.mode is None
    assert read_geolife(data, users=[0, 10]).n_points == only000.n_points + u010.n_points


# --- small inputs ----------------------------------------------------------------------------------


def test_empty_and_header_only_files_skipped_with_one_warning(tmp_path, caplog):
    root = _user(tmp_path, "001", {"a.plt": P1 + P2, "b.plt": "", "c.plt": P3})
    _write(root / "Data/001/Trajectory/b.plt", "", header="")  # 0 bytes
    _write(root / "Data/002/Trajectory/d.plt", "")  # header only
    _write(root / "Data/002/Trajectory/e.plt", "\n\n")  # header + blank lines
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        tr = read_geolife(root)
    assert len(tr) == 2 and tr.lengths.tolist() == [2, 1]
    assert tr.dropped == {"empty_file": 3}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "3 empty or header-only" in warnings[0].getMessage()


def test_unpadded_date_and_time(tmp_path):
    f = _write(tmp_path / "x.plt", "39.9,116.3,0,100,39449.2923,2008-1-2,7:0:57\n39.9,116.3,0,100,0,2008-01-02,07:00:58\n")
    tr = read_geolife(f)
    assert tr.t.tolist() == [_utc(2008, 1, 2, 7, 0, 57), _utc(2008, 1, 2, 7, 0, 58)]
    assert tr.t[0] == 1199257257.0


def test_missing_altitude_accepted_and_duplicates_kept(tmp_path):
    f = _write(tmp_path / "x.plt", P1 + P1 + P3)
    tr = read_geolife(f)
    assert tr.n_points == 3  # the duplicate timestamp is kept (preprocessing drops it)
    assert tr.t[0] == tr.t[1] and tr.lat[2] == 39.984686


def test_crlf_and_lf_identical(tmp_path):
    a = _write(tmp_path / "lf" / "x.plt", P1 + P2 + P3, newline="\n")
    b = _write(tmp_path / "crlf" / "x.plt", P1 + P2 + P3, newline="\r\n")
    assert b.read_bytes().count(b"\r\n") == 9
    ta, tb = read_geolife(a), read_geolife(b)
    for k in ("lat", "lng", "t", "offsets"):
        assert np.array_equal(getattr(ta, k), getattr(tb, k))


@pytest.mark.parametrize(
    "line, field, words",
    [
        ("abc,116.3,0,0,0,2008-10-23,02:53:04", "lat", "not a number"),
        ("39.9,nan,0,0,0,2008-10-23,02:53:04", "lng", "finite"),
        ("91.0,116.3,0,0,0,2008-10-23,02:53:04", "lat", "[-90, 90]"),
        ("39.9,181,0,0,0,2008-10-23,02:53:04", "lng", "[-180, 180]"),
        ("39.9,116.3,0,x,0,2008-10-23,02:53:04", "altitude", "not a number"),
        ("39.9,116.3,0,0,0,2008-2-30,02:53:04", "date", "invalid date"),
        ("39.9,116.3,0,0,0,2008/10/23,02:53:04", "date", "Y-M-D"),
        ("39.9,116.3,0,0,0,2008-10-23,24:00:00", "time", "out of range"),
        ("39.9,116.3,0,0,0,2008-10-23", None, "7 comma-separated"),
    ],
)
def test_bad_point_line_raises_with_line_and_field(tmp_path, line, field, words):
    f = _write(tmp_path / "Data/003/Trajectory/x.plt", P1 + line + "\n" + P2)
    with pytest.raises(TrajectoryFormatError) as ei:
        read_geolife(tmp_path)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(f), 8, field)
    assert words in e.reason
    assert f"{f}:8" in str(e)
    if field:
        assert f"'{field}'" in str(e)


def test_skip_mode_counts_bad_lines(tmp_path, caplog):
    f = _write(tmp_path / "x.plt", P1 + "bad\n" + P2 + "1,2,3\n" + P3)
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        tr = read_geolife(f, on_error="skip")
    assert tr.n_points == 3 and tr.dropped == {"bad_line": 2}
    assert any("2 bad_line" in r.getMessage() for r in caplog.records)
    g = _write(tmp_path / "y.plt", "bad\n")
    tr2 = read_geolife(g, on_error="skip")
    assert len(tr2) == 0 and tr2.dropped == {"bad_line": 1, "no_valid_points": 1}


def test_labels_assign_modes_and_unlabelled_users_get_empty(tmp_path):
    labels = "Start Time\tEnd Time\tTransportation Mode\n2008/10/23 02:53:05\t2008/10/23 02:53:15\twalk\n"
    root = _user(tmp_path, "010", {"a.plt": P1 + P2 + P3}, labels=labels)
    _user(tmp_path, "011", {"b.plt": P1})
    tr = read_geolife(root)
    assert tr.mode.tolist() == ["", "walk", "walk", ""]  # interval ends inclusive
    assert read_geolife(root, users=["011"]).mode is None


@pytest.mark.parametrize(
    "row, field",
    [
        ("2008/10/23 02:53:05\t2008/10/23 02:53:15", None),
        ("2008/13/23 02:53:05\t2008/10/23 02:53:15\tbus", "Start Time"),
        ("2008/10/23 02:53:05\t2008/10/23 02:53\tbus", "End Time"),
        ("2008/10/23 02:53:05\t2008/10/23 02:53:00\tbus", "End Time"),
        ("2008/10/23 02:53:05\t2008/10/23 02:53:15\t ", "Transportation Mode"),
    ],
)
def test_bad_label_line_raises_with_labels_line(tmp_path, row, field):
    labels = f"Start Time\tEnd Time\tTransportation Mode\n2008/10/23 02:53:05\t2008/10/23 02:53:15\twalk\n{row}\n"
    root = _user(tmp_path, "010", {"a.plt": P1}, labels=labels)
    with pytest.raises(TrajectoryFormatError) as ei:
        read_geolife(root)
    assert ei.value.line == 3 and ei.value.field == field
    assert str(root / "Data/010/labels.txt") + ":3" in str(ei.value)
    start, end, modes = read_geolife_labels(root / "Data/010/labels.txt", on_error="skip")
    assert modes.tolist() == ["walk"] and end[0] - start[0] == 10.0


def test_non_utf8_line(tmp_path):
    f = tmp_path / "x.plt"
    f.write_bytes(HEADER.encode() + P1.encode() + b"39.9\xff,116.3,0,0,0,2008-10-23,02:53:04\n")
    with pytest.raises(TrajectoryFormatError, match=r"x\.plt:8"):
        read_geolife(f)
    assert read_geolife(f, on_error="skip").dropped == {"bad_line": 1}


def test_missing_root_no_files_unknown_user(tmp_path):
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        read_geolife(tmp_path / "nope")
    (tmp_path / "Data").mkdir()
    with pytest.raises(TrajectoryFormatError, match="no .plt files"):
        read_geolife(tmp_path)
    _user(tmp_path, "001", {"a.plt": P1})
    with pytest.raises(TrajectoryFormatError, match="user.*999"):
        read_geolife(tmp_path, users=["999"])
    with pytest.raises(ValueError, match="on_error"):
        read_geolife(tmp_path, on_error="ignore")


# --- worker processes ------------------------------------------------------------------------------

_FIELDS = ("offsets", "lng", "lat", "t", "state", "driver", "source", "trip_id")


def _same(a, b) -> None:
    for k in _FIELDS:
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert (a.mode is None) == (b.mode is None)
    if a.mode is not None:
        assert a.mode.tolist() == b.mode.tolist()
    assert a.dropped == b.dropped and list(a.dropped) == list(b.dropped)
    assert list(a.dropped_trips) == list(b.dropped_trips) and a.tz == b.tz


def _small_tasks(monkeypatch, nbytes: int = 1) -> None:
    """Every .plt file its own task of a worker (tasks are cut in the parent, so forked workers need no patch)."""
    monkeypatch.setattr("stfast.data.readers.geolife.READ_CHUNK_BYTES", nbytes)


def test_workers_read_the_real_sample_as_one_process(shared_data, geolife, monkeypatch):
    from stfast.data.fingerprint import compute_fingerprint
    from stfast.data.preprocess import PreprocessConfig, preprocess

    _small_tasks(monkeypatch, 200_000)  # a few files per task, several tasks per user
    one = read_geolife(shared_data / "geolife_sample", workers=1)
    _same(geolife, one)
    for n in (2, 3):
        many = read_geolife(shared_data / "geolife_sample", workers=n)
        _same(one, many)
    cfg = PreprocessConfig()
    assert compute_fingerprint(preprocess(one, cfg)) == compute_fingerprint(preprocess(many, cfg))


def test_workers_auto_count_uses_a_pool_only_for_enough_data(tmp_path, monkeypatch):
    import stfast.data.readers.geolife as gl

    made = []

    class Recording(gl.ProcessPoolExecutor):
        def __init__(self, max_workers, **kw):
            made.append(max_workers)
            super().__init__(max_workers, **kw)

    monkeypatch.setattr(gl, "ProcessPoolExecutor", Recording)
    monkeypatch.setattr(gl.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    for u in range(4):
        _user(tmp_path, f"{u:03d}", {"a.plt": P1 + P2, "b.plt": P3})
    _small_tasks(monkeypatch)
    one = read_geolife(tmp_path, workers=1)
    assert made == [] and len(one) == 8
    _same(one, read_geolife(tmp_path))  # auto: far less than PARALLEL_MIN_BYTES, so this process
    assert made == []
    monkeypatch.setattr(gl, "PARALLEL_MIN_BYTES", 1)
    _same(one, read_geolife(tmp_path))  # auto: one worker per usable core
    assert made == [3]
    _same(read_geolife(tmp_path, users=["002"], workers=1),
          read_geolife(tmp_path, users=["002"], workers=8))  # never more workers than tasks
    assert made == [3, 2]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers"):
            read_geolife(tmp_path, workers=bad)


def _broken_layout(tmp_path: Path) -> Path:
    """Users 000..005 with 3 files each; bad point lines in 002/b (line 8), 002/c and 004/a, a bad labels row in
    003 (line 3), an all-bad file in 001, an empty file in 005."""
    bad = "39.9,116.3,0,0,0,2008-10-23,25:00:00\n"
    for u in range(6):
        _user(tmp_path, f"{u:03d}", {"a.plt": P1 + P2, "b.plt": P2 + P3, "c.plt": P1 + P3})
    _write(tmp_path / "Data/001/Trajectory/b.plt", bad + bad)
    _write(tmp_path / "Data/002/Trajectory/b.plt", P1 + bad + P3)
    _write(tmp_path / "Data/002/Trajectory/c.plt", "x,y\n" + P2)
    (tmp_path / "Data/003/labels.txt").write_bytes(b"Start Time\tEnd Time\tTransportation Mode\r\n"
                                                   b"2008/10/23 02:53:05\t2008/10/23 02:53:15\twalk\r\nnope\r\n")
    _write(tmp_path / "Data/004/Trajectory/a.plt", P1 + "1,2\n")
    _write(tmp_path / "Data/005/Trajectory/c.plt", "")
    return tmp_path


@pytest.mark.parametrize("users, where, line, field", [
    (None, "Data/001/Trajectory/b.plt", 7, "time"),  # the first bad line in file order, though later ones exist
    (["002", "003", "004"], "Data/002/Trajectory/b.plt", 8, "time"),
    (["003", "004"], "Data/003/labels.txt", 3, None),  # a user's labels are read after its files
    (["004", "005"], "Data/004/Trajectory/a.plt", 8, None),
])
def test_worker_error_is_the_sequential_read_s(tmp_path, monkeypatch, users, where, line, field):
    root = _broken_layout(tmp_path)
    _small_tasks(monkeypatch)
    errors = []
    for n in (1, 2, 4):
        with pytest.raises(TrajectoryFormatError) as ei:
            read_geolife(root, users=users, workers=n)
        errors.append(ei.value)
    assert {(type(e), str(e), e.path, e.line, e.field, e.reason) for e in errors} == {
        (TrajectoryFormatError, str(errors[0]), str(root / where), line, field, errors[0].reason)}


def test_workers_skip_mode_counts_and_warns_as_one_process(tmp_path, monkeypatch, caplog):
    root = _broken_layout(tmp_path)
    _small_tasks(monkeypatch)
    results, warnings = [], []
    for n in (1, 2, 4):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stfast.data"):
            results.append(read_geolife(root, on_error="skip", workers=n))
        warnings.append([r.getMessage() for r in caplog.records])
    one = results[0]
    assert one.dropped == {"bad_line": 5, "no_valid_points": 1, "bad_label_line": 1, "empty_file": 1}
    assert f"first: {root / 'Data/001/Trajectory/b.plt'}:7" in warnings[0][-1]
    for tr, w in zip(results[1:], warnings[1:]):
        _same(one, tr)
        assert w == warnings[0]


# --- the vectorized parse --------------------------------------------------------------------------


def _line_by_line(monkeypatch, *args, **kw):
    import stfast.data.readers.geolife as gl

    with monkeypatch.context() as m:
        m.setattr(gl, "_fast_plt", lambda path: None)
        return read_geolife(*args, **kw)


def test_fast_parse_of_the_real_sample_equals_the_line_by_line_read(shared_data, geolife, monkeypatch):
    from stfast.data.readers.geolife import _fast_plt

    files = sorted((shared_data / "geolife_sample").rglob("*.plt"))
    assert all(_fast_plt(f) is not None for f in files)  # real files take the fast path
    _same(geolife, _line_by_line(monkeypatch, shared_data / "geolife_sample"))


@pytest.mark.parametrize("body, fast", [
    (P1 + P2 + P3, True),
    (P1 + "\n\n" + P2, True),  # empty lines: skipped by both
    ("39.9,116.3,0,100,39449.2923,2008-1-2,7:0:57\n" + P1, True),  # not zero-padded: the split path
    ("39.9,116.3,0,100,39449.2923,2008-10-23,07:00:57.5\n", True),  # fractional seconds
    (P1 + " \n" + P2, False),  # a blank line of spaces: line by line
    ('"39.9",116.3,0,100,0,2008-10-23,07:00:57\n', False),  # quotes: Python's float() refuses them
    ("39.9,116.3,0,,0,2008-10-23,07:00:57\n", False),  # an empty number: refused, not null
    ("39.9,116.3,0,NaN,0,2008-10-23,07:00:57\n", False),
    ("39.9,116.3,0,1,0,2008-02-30,07:00:57\n", False),  # no such day
    ("39.9,116.3,0,1,0,2008-10-23,23:59:60\n", False),
    ("39.9,116.3,0,1,0,2008-10-23,24:00:00\n", False),
    ("39.9 ,116.3,0,1,0,2008-10-23, 07:00:57\n", False),  # int() takes " 07", the fast parse does not
    ("39.9 ,116.3,0,1,0,2008-10-23,07:00:57\n", True),  # both take "39.9 " as 39.9
    ("39.9,116.3,0,1,0,2008-10-23,7:0:5x\n", False),
    (P1 + "39.9,116.3,0,1,0\r2008-10-23,07:00:57\n", False),  # a lone CR is inside a line, not a line end
    ("", True), ("\n\n", True),
])
def test_fast_parse_equals_the_line_by_line_read_or_leaves_the_file_to_it(tmp_path, monkeypatch, body, fast):
    """The vectorized parse of a file gives exactly what the line-by-line read gives, or nothing (None): then
    the line-by-line read, with its checks and messages, reads the file."""
    from stfast.data.readers.geolife import _fast_plt

    f = _write(tmp_path / "Data/001/Trajectory/x.plt", body)
    assert (_fast_plt(f) is not None) is fast
    for on_error in ("raise", "skip"):
        try:
            want = _line_by_line(monkeypatch, f, on_error=on_error)
        except TrajectoryFormatError as e:
            with pytest.raises(TrajectoryFormatError) as ei:
                read_geolife(f, on_error=on_error)
            assert str(ei.value) == str(e)
        else:
            _same(want, read_geolife(f, on_error=on_error))
