"""Planned routes → DeepTTE trips: what :meth:`stfast.TrainedModel.eta` asks a model about.

A planned route is a polyline of (lng, lat) WGS-84 points and a departure time, with nothing recorded:
no timestamps, no travel time. DeepTTE's forward pass reads none either. Its inputs are the points, their
cumulative distances, their states, the driver, and the departure's weekday and minute of day, and
:func:`routes_to_trips` derives each exactly as :func:`stfast.data.preprocess.preprocess` does for recorded
trips (haversine cumulative distance, R = 6371 km; calendar ids of the departure in the run's time zone,
:mod:`stfast.data.tz`). Bad input raises :class:`RouteError`, naming the route's index and the field.

Densification (``spacing_km`` set): training resampled dense GPS traces so that each kept point lies at
least ``--min-spacing-km`` (haversine) from the previous kept one, the last point always kept
(:func:`stfast.data.preprocess.preprocess`, step 5). A route of a few waypoints is first interpolated
along its segments (linearly in lng/lat) at steps of at most ``spacing_km / 40``, as a dense GPS
trace of it would be recorded, and then resampled by that same rule. So a route of 3 waypoints and its
recorded trace become near-identical point sequences. States of interpolated points are those of the
segment's start point.
"""
from __future__ import annotations

import datetime as _dt
import math
import zoneinfo
from dataclasses import dataclass

import numpy as np

from .coverage import TrainingArea, box_text
from .geo import haversine_km
from .resample import resample_mask  # the training run's resampling rule (step 5), applied as is
from .trip_view import CHUNK_POINTS, iter_chunks
from .trips import Trips, lengths_to_offsets
from .tz import TZ_FROM_TIMESTAMPS, calendar_ids

MAX_ROUTE_POINTS = 10_000
"""A route with more points than this (as given, or after densification) is refused, not attempted."""
DENSIFY_STEPS = 40  # interpolation steps per spacing (5 m at 0.2 km): kept points lie within 2.5 % of the spacing

_EPOCH = _dt.datetime(1970, 1, 1)
_UTC = _dt.timezone.utc


class RouteError(ValueError):
    """Bad input for one route: ``index`` (0-based, in the order given), ``field`` (``route``,
    ``departure``, ``driver`` or ``states``) and the problem. ``too_large``: the route has more points than
    allowed (an HTTP service answers 413, other problems 422)."""

    def __init__(self, index: int, field: str, message: str, too_large: bool = False):
        self.index, self.field, self.too_large = index, field, too_large
        self.problem = message
        super().__init__(f"route {index}, {field}: {message}")


@dataclass
class RouteProfile:
    """What the training split says about inputs a route does not give.

    Attributes:
        area: the training points' :class:`~stfast.data.coverage.TrainingArea`.
        state: the state (0/1) most training points had, a route's default state.
        state_share: fraction of training points with state 1.
        spacing_km: median distance between consecutive training points (km): the densification spacing of
            runs that did not resample (DeepTTE records, ``--min-spacing-km 0``).
        n_points: training points it describes.
    """

    area: TrainingArea
    state: int
    state_share: float
    spacing_km: float
    n_points: int

    @classmethod
    def from_trips(cls, train: Trips) -> "RouteProfile":
        """The profile of the training split ``train`` (T ≥ 1 trips; Trips or a
        :class:`~stfast.data.trip_view.TripsView`), read in pieces (:func:`~stfast.data.trip_view.iter_chunks`):
        bounded memory on a split of a store of any size. Past one piece the median spacing is that of every
        k-th step (k = pieces), at most about one piece of steps. Raises ValueError when it has no points."""
        n, on, steps = train.n_points, 0, []
        stride = max(1, -(-n // CHUNK_POINTS))
        for part in iter_chunks(train, point_fields=("state", "dist_gap")):
            on += int(np.count_nonzero(np.asarray(part.state, dtype=np.float64) > 0.5))
            step = np.diff(np.asarray(part.dist_gap, dtype=np.float64))
            within = np.ones(len(step), dtype=bool)
            ends = np.asarray(part.offsets[1:-1])
            within[ends[ends > 0] - 1] = False  # not across trips
            step = step[within]
            steps.append(step[step > 0][::stride].copy())  # a copy: a strided view would keep all of them
        share = on / n if n else 0.0
        step = np.concatenate(steps) if steps else np.zeros(0)
        spacing = float(np.median(step)) if step.size else 0.2
        area = TrainingArea.from_point_chunks(
            lambda: ((p.lng, p.lat) for p in iter_chunks(train, point_fields=("lng", "lat"))))
        return cls(area, int(share >= 0.5), share, spacing, n)

    @classmethod
    def of_split(cls, train) -> dict:
        """:meth:`from_trips` of a training split as a dict, computed once per store and split and kept with the
        store (:mod:`stfast.data.derived`; other trips: computed)."""
        from .derived import cached_json

        return cached_json(train, "route_profile", {}, lambda: cls.from_trips(train).to_dict())

    def to_dict(self) -> dict:
        return {"area": self.area.to_dict(), "state": self.state, "state_share": self.state_share,
                "spacing_km": self.spacing_km, "n_points": self.n_points}

    @classmethod
    def from_dict(cls, d: dict) -> "RouteProfile":
        return cls(TrainingArea.from_dict(d["area"]), int(d["state"]), float(d["state_share"]),
                   float(d["spacing_km"]), int(d["n_points"]))


def parse_departure(value, index: int = 0) -> tuple[float, float | None]:
    """A departure (route ``index``) as (seconds, UTC offset in s or None).

    An aware time (a datetime with tzinfo, ISO-8601 text with ``+hh:mm`` or ``Z``) gives (Unix seconds UTC,
    its offset); a naive one (seconds since 1970-01-01 00:00 of its wall clock, None); a number is Unix
    seconds UTC (offset 0.0). Raises RouteError (field ``departure``) for anything else: text that is not
    ISO-8601, a non-finite number, None."""
    if isinstance(value, bool) or value is None:
        raise RouteError(index, "departure", f"expected an ISO-8601 time such as 2016-11-01T08:30:00+08:00, "
                                             f"got {value!r}")
    if isinstance(value, (int, float, np.integer, np.floating)):
        v = float(value)
        if not math.isfinite(v) or abs(v) > 2.5e11:
            raise RouteError(index, "departure", f"Unix seconds out of range: {value!r}")
        return v, 0.0
    if isinstance(value, str):
        s = value.strip()
        if s[-1:] in ("Z", "z"):  # fromisoformat accepts "Z" only from Python 3.11
            s = s[:-1] + "+00:00"
        try:
            value = _dt.datetime.fromisoformat(s)
        except ValueError:
            raise RouteError(index, "departure", f"not an ISO-8601 time (such as 2016-11-01T08:30:00+08:00): "
                                                 f"{value[:60]!r}") from None
    if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime(value.year, value.month, value.day)
    if not isinstance(value, _dt.datetime):
        raise RouteError(index, "departure", f"expected a datetime or ISO-8601 text, got {type(value).__name__}")
    off = value.utcoffset()
    if off is None:
        return (value - _EPOCH).total_seconds(), None
    return (value.replace(tzinfo=None) - _EPOCH).total_seconds() - off.total_seconds(), off.total_seconds()


def departure_ids(departures: list, tz: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Departures ([T], see :func:`parse_departure`) → (Unix seconds UTC, week_id, time_id, date_id), each [T].

    The calendar ids are those preprocessing gives a trip departing then: local time in ``tz``, at the offset
    ``zoneinfo`` gives that instant (what :func:`stfast.data.tz.utc_offset_s` computes for training trips). An
    IANA ``tz`` reads a naive time as wall clock in that zone (a wall time DST repeats is its first occurrence,
    one DST skips is read with the offset before the change: ``zoneinfo``'s ``fold=0``) and converts an aware
    one to it; :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS` (point CSV runs) takes an aware time's own offset and
    reads a naive one as UTC, as the point-CSV reader reads its timestamps. Raises RouteError."""
    zone = None if tz == TZ_FROM_TIMESTAMPS else zoneinfo.ZoneInfo(tz)
    utc = np.zeros(len(departures))
    local_off = np.zeros(len(departures))
    for i, d in enumerate(departures):  # per departure: a request holds a few, zoneinfo answers in microseconds
        sec, off = parse_departure(d, i)
        try:
            if zone is None:
                utc[i], local_off[i] = sec, 0.0 if off is None else off
                continue
            if off is None:
                sec = (_EPOCH + _dt.timedelta(seconds=sec)).replace(tzinfo=zone).timestamp()
            utc[i] = sec
            local_off[i] = _dt.datetime.fromtimestamp(sec, zone).utcoffset().total_seconds()
        except (OverflowError, ValueError, OSError):
            raise RouteError(i, "departure", f"out of the range of dates: {d!r:.60}") from None
    week, minute, day = calendar_ids(utc, local_off)
    return utc, week, minute, day


def check_route(route, index: int, max_points: int = MAX_ROUTE_POINTS) -> np.ndarray:
    """``route`` as an [n, 2] float64 array of (lng, lat) degrees. Raises RouteError (field ``route``): not
    n pairs of numbers, more than ``max_points`` points (``too_large``), a non-finite value, lng outside
    [-180, 180] or lat outside [-90, 90] (naming the point)."""
    n = len(route) if hasattr(route, "__len__") else None
    if n is not None and n > max_points:
        raise RouteError(index, "route", f"{n} points, more than the limit of {max_points}", too_large=True)
    try:
        a = np.asarray(route, dtype=np.float64)
    except (TypeError, ValueError):
        raise RouteError(index, "route", "expected a list of [lng, lat] pairs of numbers") from None
    if a.ndim != 2 or a.shape[1] != 2 or a.shape[0] < 2:
        raise RouteError(index, "route", f"expected at least 2 [lng, lat] pairs, got an array of shape {a.shape}")
    bad = np.flatnonzero(~np.isfinite(a).all(axis=1))
    if bad.size:
        raise RouteError(index, "route", f"point {bad[0]} is not finite: {a[bad[0]].tolist()}")
    for col, name, lim in ((0, "lng", 180), (1, "lat", 90)):
        out = np.flatnonzero(np.abs(a[:, col]) > lim)
        if out.size:
            raise RouteError(index, "route", f"point {out[0]} ({a[out[0], 0]}, {a[out[0], 1]}): {name} must lie in "
                                             f"[-{lim}, {lim}] (WGS-84 degrees, [lng, lat] order)")
    return a


def densify(lng: np.ndarray, lat: np.ndarray, spacing_km: float, state: np.ndarray | None = None):
    """The points training's resampling would keep of a dense trace along the polyline (module docstring).

    Args: lng, lat [n] degrees (n ≥ 2); spacing_km > 0; state [n] or None.
    Returns: (lng, lat, state) [m] arrays (state None when not given): first and last point kept.
    """
    seg = haversine_km(lng[:-1], lat[:-1], lng[1:], lat[1:])
    steps = np.maximum(np.ceil(seg / (spacing_km / DENSIFY_STEPS)).astype(np.int64), 1)
    src = np.repeat(np.arange(len(seg)), steps)
    frac = (np.arange(int(steps.sum())) - np.repeat(np.cumsum(steps) - steps, steps)) / np.repeat(steps, steps)
    flng = np.append(lng[src] + frac * (lng[src + 1] - lng[src]), lng[-1])
    flat = np.append(lat[src] + frac * (lat[src + 1] - lat[src]), lat[-1])
    keep = resample_mask(flng, flat, np.zeros(len(flng), np.int64), spacing_km)
    st = None if state is None else np.append(state[src], state[-1])[keep]
    return flng[keep], flat[keep], st


def routes_to_trips(routes, departures, drivers=None, states=None, *, tz: str, profile: RouteProfile,
                    kernel_size: int = 3, spacing_km: float | None = None,
                    max_points: int = MAX_ROUTE_POINTS) -> Trips:
    """T planned routes as :class:`~stfast.data.trips.Trips`, their fields derived as preprocessing does.

    Args:
        routes: [T] routes, each [n_i, 2] (lng, lat) WGS-84 degrees (arrays or nested lists).
        departures: [T] datetimes, ISO-8601 text or Unix seconds (see :func:`departure_ids`).
        drivers: [T] driver ids (str or int; None entries or None: no driver, the unseen-driver row).
        states: [T] per-point 0/1 arrays ([n_i], as given before densification), None entries or None: the
            profile's default state on every point.
        tz: the run's time zone (an IANA name or TZ_FROM_TIMESTAMPS). profile: the training split's
            :class:`RouteProfile` (area, default state). kernel_size: the geo-conv's k (fewer points is refused).
        spacing_km: densify to this spacing (module docstring); None: use the points as given.
        max_points: the most points a route may have, as given and after densification.

    Returns:
        Trips with T trips in the order given: lng, lat, state, dist_gap (cumulative haversine km), dist,
        driver (str, "" for none), week_id/time_id/date_id of the departure; time_gap and time are 0 (unknown;
        the model does not read them); trip_id ``route <i>``.

    Raises:
        RouteError: the first bad route: malformed, too many points (``too_large``), non-finite or out-of-range
            coordinates, a point outside ``profile.area``, fewer than ``kernel_size`` points, states that are
            not one 0/1 value per point, a departure that does not parse. TypeError: lists of other lengths.
    """
    t = len(routes)
    for name, v in (("departures", departures), ("drivers", drivers), ("states", states)):
        if v is not None and (isinstance(v, (str, bytes)) or len(v) != t):
            raise TypeError(f"{name} must be a list of one value per route ({t}), got {v!r:.80}")
    pts, sts = [], []
    for i, r in enumerate(routes):
        a = check_route(r, i, max_points)
        st = None if states is None or states[i] is None else _check_states(states[i], len(a), i)
        lng, lat = a[:, 0], a[:, 1]
        if spacing_km:
            est = int(haversine_km(lng[:-1], lat[:-1], lng[1:], lat[1:]).sum() / spacing_km) + 2
            if est > max_points:
                raise RouteError(i, "route", f"densified to the training spacing of {spacing_km:g} km it would have "
                                             f"about {est} points, more than the limit of {max_points}", too_large=True)
            lng, lat, st = densify(lng, lat, spacing_km, st)
        if len(lng) < kernel_size:
            km = float(haversine_km(lng[:-1], lat[:-1], lng[1:], lat[1:]).sum())
            raise RouteError(i, "route", f"{len(lng)} points ({km:.3f} km) after densification, DeepTTE's geo-conv "
                                         f"needs at least kernel_size={kernel_size}" if spacing_km else
                             f"{len(lng)} points, DeepTTE's geo-conv needs at least kernel_size={kernel_size}")
        inside = profile.area.covers(lng, lat)
        if not inside.all():
            j = int(np.argmin(inside))
            raise RouteError(i, "route", f"point ({lng[j]:.6f}, {lat[j]:.6f}) lies outside the training area (no "
                                         f"training point within about {profile.area.cell_km:g} km of it; the "
                                         f"training points' bounding box is {box_text(profile.area.bbox)})")
        pts.append((lng, lat))
        sts.append(np.full(len(lng), profile.state, np.float32) if st is None else st.astype(np.float32))
    _, week, minute, day = departure_ids(list(departures), tz)
    lengths = np.array([len(p[0]) for p in pts], dtype=np.int64)
    lng = np.concatenate([p[0] for p in pts]) if t else np.zeros(0)
    lat = np.concatenate([p[1] for p in pts]) if t else np.zeros(0)
    gaps = [np.concatenate([[0.0], np.cumsum(haversine_km(a[:-1], b[:-1], a[1:], b[1:]))]) for a, b in pts]
    dist_gap = np.concatenate(gaps) if t else np.zeros(0)
    drv = np.array(["" if drivers is None or drivers[i] is None else str(drivers[i]) for i in range(t)], dtype=object)
    return Trips(offsets=lengths_to_offsets(lengths), lng=lng, lat=lat,
                 state=np.concatenate(sts) if t else np.zeros(0, np.float32), time_gap=np.zeros(len(lng)),
                 dist_gap=dist_gap, dist=np.array([g[-1] for g in gaps], dtype=np.float64), time=np.zeros(t),
                 driver=drv, week_id=week, time_id=minute, date_id=day,
                 trip_id=np.array([f"route {i}" for i in range(t)], dtype=object), tz=tz)


def _check_states(states, n: int, index: int) -> np.ndarray:
    try:
        s = np.asarray(states, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise RouteError(index, "states", "expected one 0 or 1 per point") from None
    if len(s) != n:
        raise RouteError(index, "states", f"{len(s)} values for {n} points: give one 0 or 1 per point")
    bad = np.flatnonzero((s != 0) & (s != 1))
    if bad.size:
        raise RouteError(index, "states", f"value {s[bad[0]]!r} at point {bad[0]}: states are 0 or 1")
    return s
