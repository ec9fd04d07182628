"""Property tests of every reader on bad input (hypothesis): arbitrary bytes, truncated files, wrong
encodings, NaN/inf and out-of-range coordinates, timestamps out of order, large files.

The property: a reader either returns a consistent container (finite, in-range coordinates, valid CSR)
or raises TrajectoryFormatError naming the file, a line inside it (or none) and a reason. Any other
exception fails the test; a reader still busy after HANG_S seconds is interrupted (SIGALRM) and fails
it too. With on_error="skip" the records known to be bad are exactly the ones counted as skipped.
"""
import contextlib
import json
import math
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import random_trips
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stfast.data.errors import TrajectoryFormatError
from stfast.data.preprocess import preprocess
from stfast.data.readers import (
    DEEPTTE_KEYS,
    detect_format,
    read_any,
    read_csv_points,
    read_deeptte_jsonl,
    read_didi_gaia,
    read_geolife,
)
from stfast.data.trips import Trips

HANG_S = 20.0  # a reader of a few kB that runs this long is hung (the hypothesis deadline flags slow ones)
FUZZ = settings(max_examples=50, deadline=5000, suppress_health_check=[HealthCheck.too_slow])

GEOLIFE_HEADER = "Geolife trajectory\nWGS 84\nAltitude is in Feet\nReserved 3\n0,2,255,My Track,0,0,2,8421376\n0\n"
READERS = {  # name: (reader, file name, text before any data line)
    "deeptte": (read_deeptte_jsonl, "trips.jsonl", ""),
    "geolife": (read_geolife, "20081023025304.plt", GEOLIFE_HEADER),
    "didi": (read_didi_gaia, "gps_20161101", ""),
    "csv": (read_csv_points, "points.csv", "trip_id,timestamp,lng,lat\n"),
}


class ReaderHang(Exception):
    pass


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_S):
    """Interrupt the block after ``seconds`` of wall time (main thread, POSIX)."""

    def on_alarm(signum, frame):
        raise ReaderHang(f"reader still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _check_container(got) -> None:
    assert len(got.offsets) >= 1 and got.offsets[0] == 0 and np.all(np.diff(got.offsets) >= 0)
    assert np.isfinite(got.lng).all() and np.isfinite(got.lat).all()
    assert (np.abs(got.lng) <= 180).all() and (np.abs(got.lat) <= 90).all()
    if isinstance(got, Trips):
        assert np.isfinite(got.time_gap).all() and np.isfinite(got.dist_gap).all()
        assert np.isfinite(got.time).all() and (got.dist >= 0).all()
    else:
        assert np.isfinite(got.t).all() and len(got.t) == got.n_points
    assert all(isinstance(v, int) and v >= 0 for v in got.dropped.values())


def read_checked(fmt: str, path: Path, on_error: str):
    """The reader's result, or the TrajectoryFormatError it raised (checked: file, line, reason)."""
    reader = READERS[fmt][0]
    data = path.read_bytes()
    # the CSV reader counts lines as Python's csv module does (a lone \r ends a line too), the others at \n
    n_lines = max(data.count(b"\n"), len(data.splitlines())) + 1
    try:
        with hang_guard():
            got = reader(path, on_error=on_error)
    except TrajectoryFormatError as e:
        assert e.path == str(path), e
        assert isinstance(e.reason, str) and e.reason.strip(), e
        assert e.line is None or 1 <= e.line <= n_lines, (e.line, n_lines)
        assert str(path) in str(e)
        return e
    _check_container(got)
    if fmt != "deeptte" and got.n_points:  # raw traces go on to preprocessing: it must cope too
        with hang_guard():
            preprocess(got)
    return got


_TMP = tempfile.TemporaryDirectory(prefix="stfast-fuzz-")  # removed at exit; examples overwrite their file


def _write(data: bytes, name: str) -> Path:
    p = Path(_TMP.name) / name
    p.write_bytes(data)
    return p


# ---------------------------------------------------------------- arbitrary and damaged bytes
@pytest.mark.parametrize("fmt", list(READERS))
@FUZZ
@given(body=st.binary(max_size=600), with_prefix=st.booleans(), on_error=st.sampled_from(["raise", "skip"]))
def test_arbitrary_bytes(fmt, body, with_prefix, on_error):
    prefix = READERS[fmt][2].encode() if with_prefix else b""
    path = _write(prefix + body, READERS[fmt][1])
    read_checked(fmt, path, on_error)
    with hang_guard():  # format detection sees the same bytes
        try:
            detect_format(path)
            read_any(path, on_error=on_error)
        except TrajectoryFormatError as e:
            assert e.path == str(path) and e.reason


@st.composite
def printable_noise(draw):
    """Text made of the characters these formats are built from (reaches deeper than random bytes)."""
    alphabet = st.sampled_from(list("0123456789.,-+eE:TZ \t\r\n{}[]\"nNaIifty") + ["NaN", "Infinity", "1e999", "-777"])
    return "".join(draw(st.lists(alphabet, max_size=200)))


@pytest.mark.parametrize("fmt", list(READERS))
@FUZZ
@given(body=printable_noise(), on_error=st.sampled_from(["raise", "skip"]))
def test_format_shaped_noise(fmt, body, on_error):
    path = _write((READERS[fmt][2] + body).encode(), READERS[fmt][1])
    read_checked(fmt, path, on_error)


# ---------------------------------------------------------------- structured points with known faults
GOOD_TS = st.integers(1_400_000_000, 1_500_000_000)
BAD_NUMBER = st.sampled_from(["nan", "NaN", "inf", "-inf", "1e999", "", "abc", "1" * 5000, "0x10", "1,5"])


def _coord(lo: float, hi: float, limit: float):
    """(text, good) for a coordinate: in range and finite, or surely bad (non-finite, outside ±limit, garbage)."""
    good = st.floats(lo, hi, allow_nan=False).map(lambda v: (repr(v), True))
    out = st.floats(limit * (1 + 1e-9) + 1e-6, 1e300).flatmap(
        lambda v: st.sampled_from([(repr(v), False), (repr(-v), False)]))
    bad = BAD_NUMBER.filter(lambda s: "," not in s).map(lambda s: (s, False))
    return st.one_of(good, good, good, out, bad)


@st.composite
def point_rows(draw):
    """Rows of (trip, unix_ts, ts_good, lng_text, lng_good, lat_text, lat_good), timestamps in any order."""
    n = draw(st.integers(1, 25))
    rows = []
    for _ in range(n):
        trip = draw(st.integers(0, 3))
        ts = draw(GOOD_TS)
        ts_text, ts_good = draw(st.one_of(st.just((str(ts), True)), st.just((str(ts), True)),
                                          BAD_NUMBER.filter(lambda s: "," not in s and s != "0x10").map(lambda s: (s, False))))
        lng, lng_good = draw(_coord(-180, 180, 180))
        lat, lat_good = draw(_coord(-90, 90, 90))
        rows.append((trip, ts, ts_text, ts_good, lng, lng_good, lat, lat_good))
    return rows


def _geolife_line(r) -> str:
    _, ts, ts_text, ts_good, lng, _, lat, _ = r
    import datetime as dt

    d = dt.datetime.fromtimestamp(ts, dt.timezone.utc)
    days = (ts / 86400.0) + 25569.0
    date = d.strftime("%Y-%m-%d") if ts_good else ts_text  # a bad timestamp becomes a bad date field
    return f"{lat},{lng},0,492,{days!r},{date},{d.strftime('%H:%M:%S')}"


SERIALIZE = {
    "geolife": (_geolife_line, GEOLIFE_HEADER, 7),
    "didi": (lambda r: f"driver{r[0]},order{r[0]},{r[2]},{r[4]},{r[6]}", "", 1),
    "csv": (lambda r: f"trip{r[0]},{r[2]},{r[4]},{r[6]}", "trip_id,timestamp,lng,lat\n", 2),
}


@pytest.mark.parametrize("fmt", list(SERIALIZE))
@FUZZ
@given(rows=point_rows(), crlf=st.booleans())
def test_points_with_known_faults(fmt, rows, crlf):
    line_of, head, first_line = SERIALIZE[fmt]
    text = head + "".join(line_of(r) + "\n" for r in rows)
    path = _write(text.replace("\n", "\r\n" if crlf else "\n").encode(), READERS[fmt][1])
    good = [r[3] and r[5] and r[7] for r in rows]
    strict = read_checked(fmt, path, "raise")
    if all(good):
        assert not isinstance(strict, Exception), strict
        assert strict.n_points == len(rows)
    else:
        assert isinstance(strict, TrajectoryFormatError)
        assert strict.line == first_line + good.index(False), (strict, rows)
    lenient = read_checked(fmt, path, "skip")
    assert not isinstance(lenient, Exception), lenient
    assert lenient.n_points == sum(good)
    assert lenient.dropped.get("bad_line", 0) == len(good) - sum(good)
    kept = sorted(r[1] for r, g in zip(rows, good) if g)
    assert sorted(lenient.t.tolist()) == pytest.approx(kept)
    if fmt != "geolife":  # CSV and DiDi sort each trip's points by time (GeoLife keeps file order)
        for i in range(len(lenient)):
            assert np.all(np.diff(lenient.t[lenient.points(i)]) >= 0)


# ---------------------------------------------------------------- DeepTTE records with known faults
def _perturbations():
    """(name, function(record) -> JSON text) that surely make a DeepTTE record bad."""
    def setitem(key, value):
        return lambda r, j: json.dumps({**r, key: value})

    def setpoint(key, value):
        def f(r, j):
            lst = list(r[key])
            lst[j % len(lst)] = value
            return json.dumps({**r, key: lst})
        return f

    def out_of_order(r, j):
        tg = list(r["time_gap"])
        i = 1 + j % (len(tg) - 1)
        tg[i] = tg[i - 1] - 5.0
        return json.dumps({**r, "time_gap": tg})

    return [
        ("nan lng", setpoint("lngs", math.nan)),
        ("inf lat", setpoint("lats", math.inf)),
        ("-inf lng", setpoint("lngs", -math.inf)),
        ("lat 91", setpoint("lats", 91.5)),
        ("lng -181", setpoint("lngs", -181.0)),
        ("time_gap out of order", out_of_order),
        ("missing key", lambda r, j: json.dumps({k: v for k, v in r.items()
                                                 if k != sorted(DEEPTTE_KEYS)[j % len(DEEPTTE_KEYS)]})),
        ("tripID list", setitem("tripID", ["a"])),
        ("segment -1", setitem("segment", -1)),
        ("unknown tz", setitem("tz", "Mars/Olympus")),
        ("weekID 7", setitem("weekID", 7)),
        ("timeID 1440", setitem("timeID", 1440)),
        ("dateID -1", setitem("dateID", -1)),
        ("time mismatch", lambda r, j: json.dumps({**r, "time": r["time"] + 50.0})),
        ("states short", lambda r, j: json.dumps({**r, "states": r["states"][:-1]})),
        ("lngs not a list", setitem("lngs", "104.0")),
        ("driverID list", setitem("driverID", [1])),
        ("huge integer", lambda r, j: json.dumps(r).replace('"dist": ', '"dist": ' + "9" * 5000 + ", \"x\": ", 1)),
        ("huge exponent", lambda r, j: json.dumps(r).replace('"dist": ', '"dist": 1e999, "x": ', 1)),
        ("truncated", lambda r, j: json.dumps(r)[: 1 + j % (len(json.dumps(r)) - 1)]),
        ("not an object", lambda r, j: json.dumps([r])),
        ("deep nesting", lambda r, j: "[" * 100_000 + "]" * 100_000),
    ]


PERTURB = _perturbations()
POOL = random_trips(30, seed=5, min_len=2, max_len=12)


@FUZZ
@given(recs=st.lists(st.tuples(st.integers(0, len(POOL) - 1),
                               st.one_of(st.none(), st.none(), st.integers(0, len(PERTURB) - 1)),
                               st.integers(0, 10_000)), min_size=1, max_size=12),
       blank=st.booleans())
def test_deeptte_records_with_known_faults(recs, blank):
    lines, good = [], []
    for i, p, j in recs:
        r = POOL.record(i)
        lines.append(json.dumps(r) if p is None else PERTURB[p][1](r, j))
        good.append(p is None)
    text = ("\n\n" if blank else "\n").join(lines) + "\n"
    path = _write(text.encode(), "trips.jsonl")
    line_no = [1 + k * (2 if blank else 1) for k in range(len(lines))]
    strict = read_checked("deeptte", path, "raise")
    if all(good):
        assert len(strict) == len(recs)
    else:
        assert isinstance(strict, TrajectoryFormatError)
        assert strict.line == line_no[good.index(False)], (strict, [PERTURB[p][0] for _, p, _ in recs if p is not None])
    lenient = read_checked("deeptte", path, "skip")
    assert len(lenient) == sum(good) and lenient.dropped.get("bad_line", 0) == len(good) - sum(good)
    expect = [POOL.time[i] for (i, p, _), g in zip(recs, good) if g]
    assert lenient.time.tolist() == expect


# ---------------------------------------------------------------- truncated files and wrong encodings
def _valid_text(fmt: str, seed: int, driver: str = "d") -> str:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 30))
    if fmt == "deeptte":
        tr = random_trips(max(n // 5, 1), seed=seed, max_len=8)
        recs = [tr.record(i) for i in range(len(tr))]
        for r in recs:
            r["driverID"] = driver + str(r["driverID"])
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    ts = 1_477_955_400 + np.sort(rng.integers(0, 3600, n))
    lng, lat = 104.0 + rng.normal(0, 0.05, n), 30.6 + rng.normal(0, 0.05, n)
    rows = [(k % 3, int(t), str(int(t)), True, repr(float(x)), True, repr(float(y)), True) for k, (t, x, y) in enumerate(zip(ts, lng, lat))]
    line_of, head, _ = SERIALIZE[fmt]
    if fmt == "csv":
        return "trip_id,timestamp,lng,lat,driver_id\n" + "".join(f"{line_of(r)},{driver}{r[0]}\n" for r in rows)
    if fmt == "didi":
        return "".join(f"{driver}{r[0]},order{r[0]},{r[2]},{r[4]},{r[6]}\n" for r in rows)
    return head + "".join(line_of(r) + "\n" for r in rows)


@pytest.mark.parametrize("fmt", list(READERS))
@FUZZ
@given(seed=st.integers(0, 10_000), cut=st.floats(0, 1), on_error=st.sampled_from(["raise", "skip"]))
def test_truncated_files(fmt, seed, cut, on_error):
    data = _valid_text(fmt, seed).encode()
    whole = read_checked(fmt, _write(data, READERS[fmt][1]), "raise")
    assert not isinstance(whole, Exception), whole  # the untruncated file is valid
    read_checked(fmt, _write(data[: int(cut * len(data))], READERS[fmt][1]), on_error)


@pytest.mark.parametrize("fmt", list(READERS))
@FUZZ
@given(seed=st.integers(0, 10_000), encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "gbk", "cp1252"]),
       on_error=st.sampled_from(["raise", "skip"]))
def test_wrong_encodings(fmt, seed, encoding, on_error):
    driver = {"latin-1": "é", "cp1252": "é", "gbk": "司机"}.get(encoding, "司机")
    data = _valid_text(fmt, seed, driver=driver).encode(encoding)
    read_checked(fmt, _write(data, READERS[fmt][1]), on_error)


# ---------------------------------------------------------------- large files (bounded size and time)
def test_large_point_csv_reads_fully(tmp_path):
    n = 200_000  # about 7 MB
    rng = np.random.default_rng(0)
    ts = rng.integers(1_477_955_400, 1_478_041_800, n)  # out of order inside every trip
    lng, lat = 104.0 + rng.normal(0, 0.05, n), 30.6 + rng.normal(0, 0.05, n)
    trip = rng.integers(0, 5000, n)
    body = "\n".join(f"t{a},{b},{c:.6f},{d:.6f}" for a, b, c, d in zip(trip, ts, lng, lat))
    p = tmp_path / "big.csv"
    p.write_text("trip_id,timestamp,lng,lat\n" + body + "\nt1,nan,104,30\n")
    got = read_checked("csv", p, "skip")
    assert got.n_points == n and got.dropped == {"bad_line": 1} and len(got) == len(np.unique(trip))
    err = read_checked("csv", p, "raise")
    assert isinstance(err, TrajectoryFormatError) and err.line == n + 2 and err.field == "timestamp"


def test_one_huge_deeptte_line(tmp_path):
    tr = random_trips(1, seed=3, min_len=200_000, max_len=200_000)  # one 200k-point trip, ~20 MB line
    p = tmp_path / "huge.jsonl"
    tr.to_jsonl(p)
    got = read_checked("deeptte", p, "raise")
    assert got.n_points == 200_000
    with open(p, "ab") as f:  # the same line again, cut short: no end of line, invalid JSON
        f.write(p.read_bytes()[: 5_000_000])
    err = read_checked("deeptte", p, "raise")
    assert isinstance(err, TrajectoryFormatError) and err.line == 2
