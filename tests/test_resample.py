"""stfast.data.resample: the C++ scan (stfast._prep.resample_keep) against its numpy reference and a plain loop."""
import numpy as np
import pytest

from stfast import _prep
from stfast.data.geo import haversine_km
from stfast.data.resample import resample_mask, resample_mask_reference


def _walks(rng, lengths, still_every=7):
    """Random walks around Chengdu, one per length, of ~0–90 m steps with some long jumps and standing trips."""
    n = int(lengths.sum())
    step = rng.uniform(-0.0002, 0.0008, (n, 2)) * rng.choice([1.0, 1.0, 1.0, 6.0], (n, 1))
    trip = np.repeat(np.arange(len(lengths)), lengths)
    step[trip % still_every == 3] = 0.0  # trips that never move: only their ends are kept
    xy = np.cumsum(step, axis=0) + [104.06, 30.66]
    return xy[:, 0], xy[:, 1], trip


def _loop(lng, lat, trip, s_km):
    """The rule as written (stfast.data.resample's docstring), one point at a time."""
    keep = np.zeros(len(lng), bool)
    starts = np.flatnonzero(np.r_[True, trip[1:] != trip[:-1]])
    for s, e in zip(starts, np.r_[starts[1:], len(lng)]):
        keep[s] = keep[e - 1] = True
        k = s
        while True:
            nxt = next((i for i in range(k + 1, e) if haversine_km(lng[k], lat[k], lng[i], lat[i]) >= s_km), None)
            if nxt is None:
                break
            keep[nxt] = True
            if nxt >= e - 2:
                break
            k = nxt
    return keep


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("s_km", [0.05, 0.2, 1.0])
def test_scan_equals_numpy_reference(seed, s_km):
    rng = np.random.default_rng([seed, int(s_km * 100)])
    lengths = rng.integers(1, 400, 600)
    lng, lat, trip = _walks(rng, lengths)
    got, want = resample_mask(lng, lat, trip, s_km), resample_mask_reference(lng, lat, trip, s_km)
    assert got.dtype == bool and got.shape == lng.shape
    assert np.array_equal(got, want)
    assert 0 < got.sum() < len(got)


def test_scan_equals_the_rule_point_by_point():
    rng = np.random.default_rng(5)
    lengths = np.r_[1, 2, 3, rng.integers(1, 60, 40)]
    lng, lat, trip = _walks(rng, lengths, still_every=5)
    assert np.array_equal(resample_mask(lng, lat, trip, 0.2), _loop(lng, lat, trip, 0.2))


def test_trips_are_independent_of_how_the_input_is_split():
    """Each trip's mask depends on its own points only: two halves cut between trips give the whole's mask (the
    store conversion resamples partition by partition)."""
    rng = np.random.default_rng(9)
    lengths = rng.integers(1, 300, 200)
    lng, lat, trip = _walks(rng, lengths)
    cut = int(lengths[:97].sum())
    whole = resample_mask(lng, lat, trip, 0.2)
    halves = np.r_[resample_mask(lng[:cut], lat[:cut], trip[:cut], 0.2),
                   resample_mask(lng[cut:], lat[cut:], trip[cut:], 0.2)]
    assert np.array_equal(whole, halves)


def test_empty_and_single_points():
    assert resample_mask(np.zeros(0), np.zeros(0), np.zeros(0, np.int64), 0.2).shape == (0,)
    assert resample_mask([104.0, 104.1], [30.0, 30.0], [0, 1], 0.2).tolist() == [True, True]


@pytest.mark.parametrize("args, match", [
    ((np.zeros((2, 2)), np.zeros(4), np.r_[0], np.r_[4], 0.2), "lng must be 1-D"),
    ((np.zeros(4), np.zeros(3), np.r_[0], np.r_[4], 0.2), "lat has 3 points but lng has 4"),
    ((np.zeros(4), np.zeros(4), np.r_[0, 2], np.r_[4], 0.2), "ends has 1 trips but starts has 2"),
    ((np.zeros(4), np.zeros(4), np.r_[0], np.r_[5], 0.2), r"trip 0 spans \[0, 5\)"),
    ((np.zeros(4), np.zeros(4), np.r_[-1], np.r_[2], 0.2), r"trip 0 spans \[-1, 2\)"),
    ((np.zeros(4), np.zeros(4), np.r_[3], np.r_[2], 0.2), r"trip 0 spans \[3, 2\)"),
    ((np.zeros(4), np.zeros(4), np.r_[0], np.r_[4], 0.0), "s_km must be a finite distance > 0"),
    ((np.zeros(4), np.zeros(4), np.r_[0], np.r_[4], float("nan")), "s_km must be a finite distance > 0"),
])
def test_native_scan_refuses_what_would_leave_its_buffers(args, match):
    with pytest.raises(ValueError, match=match):
        _prep.resample_keep(*args)


def test_trip_ids_must_match_the_points():
    with pytest.raises(ValueError, match="one id per point"):
        resample_mask(np.zeros(3), np.zeros(3), np.zeros(2, np.int64), 0.2)
