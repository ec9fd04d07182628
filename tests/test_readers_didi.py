"""DiDi GAIA reader and the GCJ-02 ↔ WGS-84 conversion."""
import logging
from collections import defaultdict

import numpy as np
import pytest

from stfast.data.errors import TrajectoryFormatError
from stfast.data.geo import gcj02_to_wgs84, haversine_km, path_km, wgs84_to_gcj02
from stfast.data.readers import read_didi_gaia

D1, O1 = "d" * 32, "a" * 32
D2, O2 = "e" * 32, "b" * 32


# --- GCJ-02 ----------------------------------------------------------------------------------------


def test_gcj_reference_values():
    # hujiulong/gcoord unit tests (test/unit/crs/WGS84.spec.ts, GCJ02.spec.ts), to 5 decimals
    lng, lat = wgs84_to_gcj02(123.0, 45.0)
    assert abs(lng - 123.00607541) < 5e-6 and abs(lat - 45.00197815) < 5e-6
    lng, lat = gcj02_to_wgs84(123.0, 45.0)
    assert abs(lng - 122.99395597) < 5e-6 and abs(lat - 44.99804071) < 5e-6
    # Tiananmen (WGS-84 116.397128, 39.916527): GCJ offset ≈ +0.0062° lng, +0.0014° lat
    lng, lat = wgs84_to_gcj02(116.397128, 39.916527)
    assert abs((lng - 116.397128) - 0.0062) < 2e-4 and abs((lat - 39.916527) - 0.0014) < 2e-4


def test_gcj_round_trip_below_half_metre():
    rng = np.random.default_rng(0)
    lng = rng.uniform(73.0, 135.0, 20_000)
    lat = rng.uniform(18.0, 53.0, 20_000)
    g_lng, g_lat = wgs84_to_gcj02(lng, lat)
    w_lng, w_lat = gcj02_to_wgs84(g_lng, g_lat)
    assert haversine_km(lng, lat, w_lng, w_lat).max() * 1000 < 0.5
    # even one refinement step is far below a metre; zero steps is not exact
    w1 = gcj02_to_wgs84(g_lng, g_lat, iterations=1)
    assert haversine_km(lng, lat, *w1).max() * 1000 < 0.5
    w0 = gcj02_to_wgs84(g_lng, g_lat, iterations=0)
    assert haversine_km(lng, lat, *w0).max() * 1000 > 0.5


def test_gcj_float32_offset_within_millimetres():
    """The readers' float32 offset with two refinements: positions stay float64, the result within 2.5 mm of
    the float64 inverse all over China, 0.25 mm around Chengdu."""
    from stfast.data.readers.didi_gaia import _to_wgs84

    rng = np.random.default_rng(7)
    for lng, lat, mm in ((rng.uniform(73.0, 135.0, 50_000), rng.uniform(18.0, 53.0, 50_000), 2.5),
                         (rng.uniform(103.9, 104.2, 50_000), rng.uniform(30.5, 30.8, 50_000), 0.25)):
        w64 = gcj02_to_wgs84(lng, lat)
        w32 = _to_wgs84(lng, lat)
        assert w32[0].dtype == np.float64 and w32[1].dtype == np.float64
        assert 0 < haversine_km(*w64, *w32).max() * 1e6 < mm  # km·1e6 = mm; and not the float64 numbers
        g = wgs84_to_gcj02(*w32)
        assert haversine_km(lng, lat, *g).max() * 1e6 < mm  # round trip back to the input


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gcj_inverse_of_a_large_input_in_slices_equals_it_whole(dtype):
    """Past _GCJ_SLICE points the inverse runs slice by slice (for the cache): the same bits and shape as whole,
    broadcasting included, points outside China unchanged."""
    from stfast.data.geo import _GCJ_SLICE, _gcj02_to_wgs84

    rng = np.random.default_rng(11)
    lng = rng.uniform(60.0, 140.0, (3, _GCJ_SLICE // 2 + 17))  # 1.5 slices and a partial one, some outside
    lat = rng.uniform(0.0, 56.0, lng.shape[1])
    got = gcj02_to_wgs84(lng, lat, dtype=dtype, iterations=2)
    want = _gcj02_to_wgs84(*np.broadcast_arrays(lng, lat), 2, dtype)
    assert got[0].shape == got[1].shape == lng.shape
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert (got[0] != lng).any()


@pytest.mark.parametrize("n", [0, 1, 2, 3, 1001])
def test_path_km_is_haversine_of_consecutive_points_bit_for_bit(n):
    rng = np.random.default_rng(n)
    lng, lat = rng.uniform(-180, 180, n), rng.uniform(-90, 90, n)
    d = path_km(lng, lat)
    assert d.shape == (max(n - 1, 0),)
    assert np.array_equal(d, haversine_km(lng[:-1], lat[:-1], lng[1:], lat[1:]) if n else np.zeros(0))


@pytest.mark.parametrize("lng, lat", [(116.397128, 39.916527), (104.0657, 30.6595), (121.4737, 31.2304)])
def test_gcj_offset_magnitude_in_chinese_cities(lng, lat):
    g = wgs84_to_gcj02(lng, lat)
    assert 100 < haversine_km(lng, lat, *g) * 1000 < 700
    w = gcj02_to_wgs84(lng, lat)
    assert 100 < haversine_km(lng, lat, *w) * 1000 < 700


@pytest.mark.parametrize("lng, lat", [(2.3522, 48.8566), (139.6917, 35.6895), (-74.0, 40.7), (183.0, 45.0)])
def test_gcj_identity_outside_china(lng, lat):
    assert wgs84_to_gcj02(lng, lat) == (lng, lat)
    assert gcj02_to_wgs84(lng, lat) == (lng, lat)


# --- real file -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gps_file(shared_data):
    return shared_data / "chengdu_sample" / "didi_gaia_raw_gps" / "gps_20161101_0710"


@pytest.fixture(scope="module")
def didi(gps_file):
    return read_didi_gaia(gps_file)


def test_real_counts(gps_file, didi):
    raw = gps_file.read_bytes()
    assert not raw.endswith(b"\n") and raw.count(b"\n") == 8244  # 8,245 rows, last one unterminated
    assert didi.n_points == 8245 and len(didi) == 491
    assert len(set(didi.driver)) == 491 and didi.lengths.max() == 22
    assert (didi.state == 1).all() and didi.state.dtype == np.float32
    assert didi.mode is None and set(didi.source) == {str(gps_file)} and didi.dropped == {}
    assert (didi.t.min(), didi.t.max()) == (1477955400.0, 1477957459.0)


def test_real_orders_match_independent_grouping(gps_file, didi):
    groups = defaultdict(list)
    first_seen = []
    for line in gps_file.read_text().splitlines():
        d, o, ts, x, y = line.split(",")
        if o not in groups:
            first_seen.append((o, d))
        groups[o].append((int(ts), float(x), float(y)))
    assert [d for _, d in first_seen] == list(didi.driver)
    shifts = []
    for i, (o, _) in enumerate(first_seen):
        pts = sorted(groups[o], key=lambda p: p[0])  # stable: equal times keep file order
        s = didi.points(i)
        assert didi.t[s].tolist() == [float(p[0]) for p in pts]
        raw_lng = np.array([p[1] for p in pts])
        raw_lat = np.array([p[2] for p in pts])
        # converting back gives the raw GCJ-02 coordinates
        g_lng, g_lat = wgs84_to_gcj02(didi.lng[s], didi.lat[s])
        assert np.abs(g_lng - raw_lng).max() < 1e-7 and np.abs(g_lat - raw_lat).max() < 1e-7
        shifts.append(haversine_km(raw_lng, raw_lat, didi.lng[s], didi.lat[s]) * 1000)
    shifts = np.concatenate(shifts)
    assert 100 < shifts.min() and shifts.max() < 700
    assert 103.9 < didi.lng.min() and didi.lng.max() < 104.3
    assert 30.5 < didi.lat.min() and didi.lat.max() < 30.9
    # the appended watermark row (2,000 s after the rest) is kept by the reader
    last = np.flatnonzero(didi.t == 1477957459.0)
    assert len(last) == 1
    i = int(np.searchsorted(didi.offsets, last[0], side="right")) - 1
    assert first_seen[i][0].startswith("f977eaa9") and last[0] == didi.offsets[i + 1] - 1
    assert (didi.lng[last[0]], didi.lat[last[0]]) == (didi.lng[last[0] - 1], didi.lat[last[0] - 1])


def test_real_directory(gps_file, didi):
    both = read_didi_gaia(gps_file.parent)  # gps_*.sha256 beside it is not read
    assert both.n_points == didi.n_points and np.array_equal(both.lng, didi.lng)


# --- small inputs ----------------------------------------------------------------------------------


def _row(d, o, t, x=104.07, y=30.66):
    return f"{d},{o},{t},{x},{y}"


def test_sorting_grouping_and_no_final_newline(tmp_path):
    p = tmp_path / "gps_x"
    p.write_text("\n".join([_row(D1, O1, 1477955406), _row(D2, O2, 1477955400), _row(D1, O1, 1477955403, 104.08),
                            _row(D1, O1, 1477955403, 104.09)]))
    tr = read_didi_gaia(p)
    assert tr.driver.tolist() == [D1, D2] and tr.lengths.tolist() == [3, 1]
    assert tr.t.tolist() == [1477955403.0, 1477955403.0, 1477955406.0, 1477955400.0]
    g_lng, _ = wgs84_to_gcj02(tr.lng, tr.lat)
    assert np.round(g_lng[:3], 6).tolist() == [104.08, 104.09, 104.07]  # duplicates kept, file order


@pytest.mark.parametrize(
    "row, field, words",
    [
        (f"{D1},{O1},1477955400,104.07", None, "5 comma-separated"),
        (f"{D1},{O1},14779x5400,104.07,30.66", "unix_ts", "not a number"),
        (f"{D1},{O1},1477955400,104.07,abc", "lat", "not a number"),
        (f"{D1},{O1},1477955400,inf,30.66", "lng", "finite"),
        (f"{D1},{O1},1477955400,104.07,95", "lat", "[-90, 90]"),
        (f",{O1},1477955400,104.07,30.66", "driver_id", "empty"),
        (f"{D2},{O1},1477955400,104.07,30.66", "driver_id", "driven by"),
    ],
)
def test_bad_row(tmp_path, row, field, words):
    p = tmp_path / "gps_x"
    p.write_text(_row(D1, O1, 1477955400) + "\n" + row + "\n")
    with pytest.raises(TrajectoryFormatError) as ei:
        read_didi_gaia(p)
    assert (ei.value.line, ei.value.field) == (2, field) and words in ei.value.reason
    assert f"{p}:2" in str(ei.value)


def test_skip_mode_and_directory(tmp_path, caplog):
    (tmp_path / "gps_a").write_text(_row(D1, O1, 1477955400) + "\nbroken\n" + _row(D2, O2, 5) + "\n")
    (tmp_path / "gps_b").write_text(_row(D1, O1, 1477955390, 104.1) + "\n")  # same order, earlier time
    (tmp_path / "gps_b.sha256").write_text("deadbeef  gps_b\n")
    (tmp_path / "gps_c").write_text("")
    with caplog.at_level(logging.WARNING, logger="stfast.data"):
        tr = read_didi_gaia(tmp_path, on_error="skip")
    assert tr.dropped == {"bad_line": 1, "empty_file": 1}
    assert tr.lengths.tolist() == [2, 1] and tr.t[:2].tolist() == [1477955390.0, 1477955400.0]
    assert tr.source.tolist() == [str(tmp_path / "gps_a")] * 2
    msgs = " ".join(r.getMessage() for r in caplog.records)
    assert "1 bad_line" in msgs and "gps_a:2" in msgs and "1 empty gps file" in msgs
    with pytest.raises(TrajectoryFormatError, match=r"gps_a:2"):
        read_didi_gaia(tmp_path)


def test_missing_and_empty_directory(tmp_path):
    with pytest.raises(TrajectoryFormatError, match="no such file"):
        read_didi_gaia(tmp_path / "gps_nope")
    with pytest.raises(TrajectoryFormatError, match="no gps_"):
        read_didi_gaia(tmp_path)
