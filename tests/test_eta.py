"""TrainedModel.eta: planned routes (points and a departure, nothing recorded) → travel times, derived as the
training data was; its coverage and bad-input errors (stfast.data.routes)."""
from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
from _eta_run import CENTER, KM_PER_DEG, raw_departures, train_run

from stfast.data.coverage import TrainingArea
from stfast.data.readers import read_deeptte_jsonl
from stfast.data.routes import MAX_ROUTE_POINTS, RouteError, departure_ids
from stfast.data.tz import TZ_FROM_TIMESTAMPS, calendar_ids, utc_offset_s
from stfast.train.trained import load_model

DEP = "2016-11-02T08:30:00+08:00"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("eta")
    data, ck = train_run(d)
    return d, data, load_model(ck)


def _line(n=12, km=0.25, start=CENTER):
    """A straight route north from ``start``: ``n`` points ``km`` apart, [n, 2] (lng, lat)."""
    return np.array([[start[0], start[1] + i * km / KM_PER_DEG] for i in range(n)])


def test_eta_equals_predict_on_held_out_trips_read_by_another_reader(run, tmp_path):
    d, data, m = run
    test = m.split(m.load_trips(), "test")  # the run's own reading: point CSV + preprocessing
    assert m.tz == TZ_FROM_TIMESTAMPS and len(test) >= 10
    want = m.predict(test)
    jl = tmp_path / "test.jsonl"  # the same trips through another reader: DeepTTE JSON lines ...
    test.to_jsonl(jl)
    recs = read_deeptte_jsonl(jl)
    dep = raw_departures(data)  # ... and each trip's departure as its CSV row wrote it (stdlib csv)
    routes = [np.stack([recs.lng[recs.points(i)], recs.lat[recs.points(i)]], 1) for i in range(len(recs))]
    got = m.eta(routes, [dep[t] for t in recs.trip_id], list(recs.driver),
                [recs.state[recs.points(i)] for i in range(len(recs))], densify=False)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the calendar ids eta derives are the ones preprocessing gave these trips
    tr = m.route_trips(routes, [dep[t] for t in recs.trip_id], densify=False)
    assert tr.week_id.tolist() == test.week_id.tolist() and tr.time_id.tolist() == test.time_id.tolist()
    np.testing.assert_allclose(tr.dist, test.dist, rtol=1e-12)


def test_departure_time_zones():
    # an IANA zone: a naive time is its wall clock, an offset is converted (Lisbon is UTC+1 in July)
    _, week, minute, day = departure_ids(["2016-07-01T08:30:00", "2016-07-01T08:30:00+00:00",
                                          dt.datetime(2016, 7, 1, 8, 30, tzinfo=dt.timezone.utc)], "Europe/Lisbon")
    assert minute.tolist() == [510, 570, 570] and week.tolist() == [4, 4, 4] and day.tolist() == [1, 1, 1]
    # the point CSV's rule: an offset is the local time's, a naive time is UTC (as the CSV reader reads it)
    _, week, minute, _ = departure_ids(["2016-11-01T23:30:00+08:00", "2016-11-01T23:30:00", 1478043000],
                                       TZ_FROM_TIMESTAMPS)
    assert minute.tolist() == [1410, 1410, 1410] and week.tolist() == [1, 1, 1]
    utc, *_ = departure_ids(["2016-11-01T23:30:00Z", dt.datetime(2016, 11, 1, 23, 30)], "UTC")
    assert utc.tolist() == [1478043000.0, 1478043000.0]
    # instants: the local time preprocessing gives a trip starting then (utc_offset_s), DST changes included
    t = np.random.default_rng(0).uniform(1.45e9, 1.5e9, 500).round()
    t = np.concatenate([t, [1459040400.0 + k for k in (-1, 0, 1)], [1477789200.0 + k for k in (-1, 0, 1)]])
    _, week, minute, day = departure_ids([float(x) for x in t], "Europe/Lisbon")
    want = calendar_ids(t, utc_offset_s(t, "Europe/Lisbon"))
    assert [week.tolist(), minute.tolist(), day.tolist()] == [w.tolist() for w in want]
    # a wall time DST repeats is its first occurrence (fold=0): 01:30 on 2016-10-30 in Lisbon is 00:30 UTC
    utc, *_ = departure_ids(["2016-10-30T01:30:00"], "Europe/Lisbon")
    assert utc[0] == dt.datetime(2016, 10, 30, 0, 30, tzinfo=dt.timezone.utc).timestamp()


def test_default_state_is_the_training_splits_majority(run):
    _, _, m = run
    train = m.split(m.load_trips(), "train")
    share = float(np.mean(train.state > 0.5))
    prof = m.route_defaults()
    assert prof.state == int(share >= 0.5) and prof.state_share == pytest.approx(share) and prof.state == 1
    r = _line()
    got = m.eta([r], [DEP])
    assert m.route_trips([r], [DEP]).state.tolist() == [1.0] * len(m.route_trips([r], [DEP]).state)
    n = len(r)
    assert got[0] == pytest.approx(m.eta([r], [DEP], states=[np.ones(n)])[0], rel=1e-12)
    assert got[0] != pytest.approx(m.eta([r], [DEP], states=[np.zeros(n)])[0], rel=1e-9)


def test_profile_of_an_older_checkpoint_is_computed_from_the_training_data(run):
    _, _, m = run
    saved = m.route_defaults().to_dict()
    old = load_model(m.path)
    old.route_profile = None  # as a checkpoint written before the profile existed
    assert old.route_defaults().to_dict() == saved


def test_unseen_or_absent_driver_takes_the_unknown_row(run):
    _, _, m = run
    r = [_line()] * 4
    got = m.eta(r, [DEP] * 4, ["nobody", None, "", "d1"])
    assert got[0] == got[1] == got[2]
    assert "d1" in m.drivers.index and abs(got[3] - got[0]) > 1e-6  # a known driver has its own row
    assert m.eta(r[:1], [DEP])[0] == pytest.approx(got[0], rel=1e-6)  # no drivers list (float32: batch-size rounding)


def test_three_waypoints_and_their_dense_trace_agree(run):
    _, _, m = run
    ways = np.array([CENTER, (CENTER[0] + 0.02, CENTER[1]), (CENTER[0] + 0.02, CENTER[1] + 0.02)])
    dense = np.concatenate([np.linspace(ways[0], ways[1], 100, endpoint=False), np.linspace(ways[1], ways[2], 101)])
    a, b = m.route_trips([ways], [DEP]), m.route_trips([dense], [DEP])
    spacing = m.densify_spacing_km()
    assert spacing == 0.2 and abs(len(a.lng) - len(b.lng)) <= 2
    steps = np.diff(a.dist_gap)
    assert (steps[:-1] >= spacing - 1e-9).all() and steps.max() < 1.05 * spacing  # training's spacing
    e = m.eta([ways, dense], [DEP, DEP])
    assert abs(e[0] - e[1]) / e[1] < 0.02
    assert len(m.route_trips([ways], [DEP], densify=False).lng) == 3  # off: the points as given


def _bad(m, route, dep=DEP, **kw):
    """The RouteError of ``route`` given as the second of two routes (the first is fine)."""
    with pytest.raises(RouteError) as e:
        states = kw.pop("states", None)
        m.eta([_line(), route], [DEP, dep], states=None if states is None else [None, states], **kw)
    assert e.value.index == 1 and str(e.value).startswith("route 1, ")
    return e.value


def test_points_outside_the_training_area_are_refused(run):
    _, _, m = run
    far = _line(start=(CENTER[0] + 0.5, CENTER[1]))  # ~48 km east
    e = _bad(m, far)
    assert e.field == "route" and "outside the training area" in str(e) and "bounding box" in str(e)
    # partly outside: a route leaving the area is refused too, not extrapolated
    e = _bad(m, np.array([CENTER, (CENTER[0] + 0.3, CENTER[1])]))
    assert "outside the training area" in str(e)
    # the rule: occupied 1 km cells and their neighbours, not the bounding box
    area = TrainingArea.from_points([0.0, 0.1], [0.0, 0.0])
    assert area.covers([0.0, 0.1, 0.05, 0.005], [0.0, 0.0, 0.0, 0.0]).tolist() == [True, True, False, True]


def test_too_short_for_the_kernel(run):
    _, _, m = run
    e = _bad(m, _line(2), densify=False)
    assert e.field == "route" and "kernel_size=3" in str(e)
    e = _bad(m, _line(2, km=0.1))  # 0.1 km densified at 0.2 km: still 2 points
    assert "kernel_size=3" in str(e) and "after densification" in str(e)
    e = _bad(m, _line(1))
    assert "at least 2" in str(e)


@pytest.mark.parametrize("value, words", [
    (math.nan, "not finite"), (math.inf, "not finite"), (95.0, "lat must lie in [-90, 90]"),
])
def test_non_finite_or_out_of_range_coordinates(run, value, words):
    _, _, m = run
    r = _line()
    r[4, 1] = value
    e = _bad(m, r)
    assert e.field == "route" and "point 4" in str(e) and words in str(e)
    e = _bad(m, [[104.0, "north"], [104.0, 30.0]])
    assert "[lng, lat] pairs" in str(e)


@pytest.mark.parametrize("dep", ["tomorrow", "2016-13-01T08:00", "", None, math.nan, True])
def test_unparsable_departure(run, dep):
    _, _, m = run
    e = _bad(m, _line(), dep=dep)
    assert e.field == "departure"


def test_too_many_points_are_refused_not_attempted(run):
    _, _, m = run
    e = _bad(m, np.repeat(_line(2), (MAX_ROUTE_POINTS + 1) // 2 + 1, axis=0), densify=False)
    assert e.too_large and "limit of 10000" in str(e)
    # few points, but densified to the training spacing they would be too many
    e = _bad(m, np.array([CENTER, (CENTER[0], CENTER[1] + 25.0)]))
    assert e.too_large and "densified" in str(e)


def test_states_must_be_one_bit_per_point(run):
    _, _, m = run
    e = _bad(m, _line(), states=[1, 0])
    assert e.field == "states" and "2 values for 12 points" in str(e)
    e = _bad(m, _line(), states=[2] * 12)
    assert e.field == "states"


def test_lists_of_other_lengths(run):
    _, _, m = run
    with pytest.raises(TypeError, match="departures"):
        m.eta([_line(), _line()], [DEP])
    assert m.eta([], []).shape == (0,)
