"""Raw GPS trajectories → DeepTTE trips: clean, split, resample, derive the DeepTTE fields.

:func:`preprocess` turns :class:`~stfast.data.trips.Trajectories` (absolute timestamps) into
:class:`~stfast.data.trips.Trips` (cumulative ``time_gap``/``dist_gap``, label ``time``, weekID/timeID/
dateID). Every step is vectorized over the flat CSR arrays; the few rules whose outcome depends on the
previous *kept* point are sequential: speed outliers run in rounds over all trajectories at once, so the number
of Python iterations grows with the worst trajectory, not with the number of points; resampling is a scan per
trip in C++ (:mod:`stfast.data.resample`).

Steps, in order (the ``dropped`` key of each is given in quotes):

1. points with a non-finite lng/lat/t are dropped ("nonfinite_point");
2. exact duplicates (same lng, lat and t as an earlier point of the same trajectory) are dropped
   ("duplicate_point"), then every point whose time is not strictly after the previous kept point's
   ("nonpositive_time_gap"; out of order or repeated timestamps);
3. speed outliers: a point that implies a speed above ``max_speed_kmh`` from the previous *kept* point
   is dropped ("speed_outlier"). The filter trusts the first point of a trajectory;
4. trajectories are cut into trips at time gaps above ``gap_s`` and at stays; stay points are dropped
   ("stay_point"). With ``modes``, trips also break where the transport mode changes, and trips whose
   mode is not in ``modes`` are dropped ("mode_filtered", counted in trips);
5. optional resampling to ``min_spacing_km`` ("resampled");
6. cumulative ``time_gap`` / ``dist_gap``, ``time``, ``dist`` and the departure's calendar ids;
7. trip filters, first failing rule wins: fewer than ``min_points`` points ("too_short"), ``time`` below
   ``min_time_s`` ("too_short_time"), ``dist`` below ``min_dist_km`` ("too_short_dist"), more than
   ``max_points`` points ("too_long") — each counted in trips.

Keys counted in points: nonfinite_point, duplicate_point, nonpositive_time_gap, speed_outlier,
stay_point, resampled, and ``points_of_dropped_trips`` (all points of trips dropped in steps 4 and 7).
Keys counted in trips: mode_filtered, too_short, too_short_time, too_short_dist, too_long, and
empty_trajectory (input trajectories without any point). So
``trips.n_points + sum(point keys) == traj.n_points`` always holds. Counts of the input's own
``dropped`` dict (reader skips) are added in. :mod:`stfast.data.drops` groups the keys by unit and
writes them for people (what the commands print).

Ids: every trip keeps the ``trip_id`` of its input trajectory and gets ``segment``, the 0-based number
of its piece among the pieces step 4 cut the trajectory into (so a trajectory cut into three pieces
whose middle one was too short yields segments 0 and 2). ``Trips.dropped_trips`` lists, after the
reader's own entries, one row per piece dropped in steps 4 or 7 (its reason: the trip key) and one per
input trajectory that lost all its points before step 4 (segment 0; reason "empty_trajectory",
"nonfinite_point" or "stay_point", the step that removed its last points), in input order.

Local time: the calendar ids of step 6 are those of the trip's first point in the time zone
``config.tz`` (DST-correct, :mod:`stfast.data.tz`); None takes the trajectories' own ``tz``, which
the readers set to their format's default (see :func:`stfast.data.load.load_trips`).

Stay definition (after Li et al., "Mining user similarity based on location history", GIS 2008, the
stay-point detection used with GeoLife): point ``i`` anchors a stay when every point from ``i`` to the
first point at least ``stay_min_s`` later lies within ``stay_radius_m`` (haversine) of point ``i``.
Stay points are the union of all anchored windows. Unlike Li et al.'s greedy scan this union does not
depend on where the scan starts, and it covers the whole stay (the last ``stay_min_s`` of a long stay
are covered by windows anchored earlier). A trajectory that ends less than ``stay_min_s`` after a point
has no window there: a stop at the very end is not a stay.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np

from stfast._plural import counted
from stfast.data.drops import POINT_KEYS, TRIP_KEYS  # noqa: F401  (re-exported: the keys by unit)
from stfast.data.geo import haversine_km, path_km
from stfast.data.preprocess_config import PreprocessConfig
from stfast.data.resample import resample_mask
from stfast.data.trip_filters import TripFilterTally
from stfast.data.trips import DroppedTrips, Trajectories, Trips, lengths_to_offsets
from stfast.data.tz import TZ_FROM_TIMESTAMPS, calendar_ids, check_tz, utc_offset_s

log = logging.getLogger("stfast.data")


# ---------------------------------------------------------------------------------------------------
# small CSR helpers over "group ids": a non-decreasing int array naming each point's trajectory/trip
def _first_mask(gid: np.ndarray) -> np.ndarray:
    """[n] bool: True where a point is the first of its group."""
    f = np.ones(len(gid), dtype=bool)
    f[1:] = gid[1:] != gid[:-1]
    return f


def _group_bounds(first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per point: index of its group's first point and one past its group's last point."""
    n = len(first)
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], n)
    g = np.cumsum(first) - 1
    return starts[g], ends[g]


def _hav_idx(lng, lat, a, b) -> np.ndarray:
    """Haversine km between points a and b (index arrays into lng/lat)."""
    return haversine_km(lng[a], lat[a], lng[b], lat[b])


def _add(d: dict, key: str, n) -> None:
    n = int(n)
    if n:
        d[key] = d.get(key, 0) + n


# ---------------------------------------------------------------------------------------------------
# the steps; each takes the current point arrays and returns a keep mask (or new ids)


def _order_and_duplicates(t, lng, lat, gid, dropped) -> np.ndarray:
    """Keep mask dropping exact duplicates, then points not strictly after the previous kept point."""
    n = len(t)
    first = _first_mask(gid)
    if n == 0 or np.all(first[1:] | (t[1:] > t[:-1])):
        return np.ones(n, dtype=bool)
    # exact integer key ordering (group, time): the rank of t among all times, offset per group
    _, rank = np.unique(t, return_inverse=True)
    rank = rank.reshape(-1).astype(np.int64)
    key = gid.astype(np.int64) * (int(rank.max()) + 1) + rank
    # duplicates: same (group, t, lng, lat) as an earlier point; only points sharing a key can be
    order = np.argsort(key, kind="stable")
    eq = key[order][1:] == key[order][:-1]
    tied = np.sort(order[np.r_[eq, False] | np.r_[False, eq]])
    dup = np.zeros(n, dtype=bool)
    if tied.size:
        o = tied[np.lexsort((tied, lat[tied], lng[tied], key[tied]))]
        same = (key[o][1:] == key[o][:-1]) & (lng[o][1:] == lng[o][:-1]) & (lat[o][1:] == lat[o][:-1])
        dup[o[1:][same]] = True
    _add(dropped, "duplicate_point", dup.sum())
    keep = ~dup
    # strictly after the running maximum of the earlier (kept) points of the same group. Keys of a
    # later group exceed all keys of earlier groups, so the running maximum restarts at each group.
    k2 = key[keep]
    ok = np.ones(len(k2), dtype=bool)
    if len(k2) > 1:
        runmax = np.maximum.accumulate(k2)
        ok[1:] = k2[1:] > runmax[:-1]
    _add(dropped, "nonpositive_time_gap", (~ok).sum())
    keep[np.flatnonzero(keep)[~ok]] = False
    return keep


def _speed_outliers(t, lng, lat, gid, vmax_kmh, dropped) -> np.ndarray:
    """Keep mask dropping points whose speed from the previous kept point exceeds vmax_kmh.

    Exact sequential semantics, run in rounds over all trajectories at once: between two flagged
    points the adjacent speeds are valid (both ends kept), so each round resolves one candidate per
    affected trajectory and then jumps to the next adjacent flag.
    """
    n = len(t)
    keep = np.ones(n, dtype=bool)
    if n < 2:
        return keep
    first = _first_mask(gid)
    speed = np.zeros(n)
    with np.errstate(divide="ignore", invalid="ignore"):  # t may repeat across a trajectory boundary
        speed[1:] = path_km(lng, lat) / np.diff(t) * 3600.0
    flagged = np.flatnonzero((speed > vmax_kmh) & ~first)
    if flagged.size == 0:
        return keep
    _, gend = _group_bounds(first)
    fg = gid[flagged]
    c = flagged[np.r_[True, fg[1:] != fg[:-1]]]  # first flag of each trajectory
    lk = c - 1
    while c.size:
        v = _hav_idx(lng, lat, lk, c) / (t[c] - t[lk]) * 3600.0
        ok = v <= vmax_kmh
        keep[c[~ok]] = False
        # ok: c is kept and adjacent speeds hold up to the next flag of the same trajectory
        pos = np.searchsorted(flagged, c, side="right")
        nxt = flagged[np.minimum(pos, flagged.size - 1)]
        has_next = (pos < flagged.size) & (nxt < gend[c])
        new_c = np.where(ok, np.where(has_next, nxt, gend[c]), c + 1)
        new_lk = np.where(ok, new_c - 1, lk)
        alive = new_c < gend[c]
        c, lk = new_c[alive], new_lk[alive]
    _add(dropped, "speed_outlier", (~keep).sum())
    return keep


def _stays(t, lng, lat, gid, radius_km, min_s) -> np.ndarray:
    """[n] bool: stay points (see the module docstring for the definition)."""
    n = len(t)
    stay = np.zeros(n, dtype=bool)
    if n < 2:
        return stay
    first = _first_mask(gid)
    gstart, gend = _group_bounds(first)
    # j[i] = first index of the same group with t[j] >= t[i] + min_s (gend[i] when none). Search a
    # monotone float key (group-relative time plus a per-group base), then fix ±1 with exact times.
    trel = t - t[gstart]
    starts = np.flatnonzero(first)
    span = trel[np.append(starts[1:], n) - 1]
    base = np.concatenate(([0.0], np.cumsum(span + min_s + 1.0)[:-1]))
    key = base[np.cumsum(first) - 1] + trel
    j = np.searchsorted(key, key + min_s * (1 - 1e-12), side="left")
    j = np.clip(j, np.arange(n) + 1, gend)
    ar = np.arange(n)
    for _ in range(64):  # exactness fix-up (the key is exact to ~1e-7 s; one pass is normally enough)
        jj = np.minimum(j, gend - 1)
        fwd = (j < gend) & (t[jj] - t < min_s)
        back = (j - 1 > ar) & (t[j - 1] - t >= min_s)
        if not (fwd.any() or back.any()):
            break
        j = j + fwd - back
    has = j < gend
    cand = np.flatnonzero(has)
    cand = cand[_hav_idx(lng, lat, cand, j[cand]) <= radius_km]
    if cand.size == 0:
        return stay
    # every point of each candidate window i..j[i] must lie within the radius; chunk the pairs
    w = j[cand] - cand + 1
    anchors = []
    lo = 0
    budget = 4_000_000
    while lo < cand.size:
        cs = np.cumsum(w[lo:])
        hi = lo + max(1, int(np.searchsorted(cs, budget, side="right")))
        ci, wi = cand[lo:hi], w[lo:hi]
        off = lengths_to_offsets(wi)
        pts = np.repeat(ci - off[:-1], wi) + np.arange(off[-1])
        anc = np.repeat(ci, wi)
        outside = (_hav_idx(lng, lat, anc, pts) > radius_km).astype(np.int64)
        bad = np.add.reduceat(outside, off[:-1])
        anchors.append(ci[bad == 0])
        lo = hi
    a = np.concatenate(anchors)
    if a.size:
        cover = np.zeros(n + 1, dtype=np.int64)
        np.add.at(cover, a, 1)
        np.add.at(cover, j[a] + 1, -1)
        stay = np.cumsum(cover[:-1]) > 0
    return stay


def _start_offsets(traj: Trajectories, tz: str, t0: np.ndarray, i0: np.ndarray) -> np.ndarray:
    """[T'] float64 seconds local − UTC at the trips' first points (UTC t0, input indices i0)."""
    if tz != TZ_FROM_TIMESTAMPS:
        return utc_offset_s(t0, tz)
    if traj.utc_offset_s is None:
        return np.zeros(len(t0))
    off = np.asarray(traj.utc_offset_s, dtype=np.float64)[i0]
    return np.where(np.isnan(off), 0.0, off)


def _dropped_rows(traj: Trajectories, parts: list) -> DroppedTrips:
    """DroppedTrips of (trajectory index, segment, reason) array triples, in input order."""
    if not parts:
        return DroppedTrips.empty()
    k, seg, why = (np.concatenate(c) for c in zip(*parts))
    order = np.lexsort((seg, k))
    return DroppedTrips(np.asarray(traj.trip_id, dtype=object)[k[order]], seg[order], why.astype(object)[order])


# ---------------------------------------------------------------------------------------------------


def preprocess(traj: Trajectories, config: PreprocessConfig | None = None, carry: list | None = None) -> Trips:
    """Clean raw GPS trajectories and cut them into DeepTTE trips (steps in the module docstring).

    Args:
        traj: T raw trajectories, N points in all (lng/lat float64 degrees, t float64 Unix seconds UTC,
            state float32, optional mode). Points are expected in time order within a trajectory
            (readers sort); out-of-order points are dropped, not reordered.
        config: the rules' parameters, see :class:`PreprocessConfig` (None: the defaults).

    Returns:
        :class:`~stfast.data.trips.Trips` with T' trips and N' <= N points: lng/lat float64 degrees,
        state float32, time_gap float64 s (0 first, strictly increasing), dist_gap float64 km
        (cumulative haversine, R = 6371 km, 0 first), time = time_gap[-1] s, dist = dist_gap[-1] km,
        driver (the trajectory's), week_id (0..6, Monday = 0), time_id (minute of day 0..1439) and
        date_id (day of month) of the first point in local time (``config.tz``, else ``traj.tz``),
        trip_id [T'] object str (the trajectory's) and segment [T'] int64 (see the module docstring).
        Trips keep the order of their trajectories and of time. ``dropped`` holds the counts (keys in
        the module docstring) plus ``traj.dropped``; ``dropped_trips`` the dropped trips and pieces
        after ``traj.dropped_trips``; ``tz`` the time zone used; ``preprocess_config`` a copy of
        ``config`` whose ``tz`` is that zone; ``trip_filters`` a
        :class:`~stfast.data.trip_filters.TripFilterTally` (each trip filter's count on its own). One INFO
        line on the ``stfast.data`` logger summarises the counts.

    ``carry`` (streaming, :mod:`stfast.data.convert`): a one-element list holding the running sum of the
    distances between consecutive points that ``dist_gap`` takes differences of (start with ``[0.0]``);
    updated in place. Consecutive chunks of trajectories preprocessed in order with one
    carry give, bit for bit, the trips of the whole input preprocessed at once.

    Raises:
        TypeError: ``traj`` is not a Trajectories or ``config`` not a PreprocessConfig.
        ValueError: a config value out of range (see :class:`PreprocessConfig`), or neither
            ``config.tz`` nor ``traj.tz`` names a time zone.
    """
    return _cut(_clean(traj, config), carry)


@dataclass
class _Cleaned:
    """What :func:`_clean` leaves for :func:`_cut`: the kept points (``idx`` into the input) and their trip
    numbers ``tid``, each trip's trajectory and segment, the counts and rows dropped so far."""

    traj: Trajectories
    cfg: PreprocessConfig
    lng_all: np.ndarray
    lat_all: np.ndarray
    t_all: np.ndarray
    idx: np.ndarray
    tid: np.ndarray
    trip_traj: np.ndarray
    trip_seg: np.ndarray
    dropped: dict
    gone: list


def _clean(traj: Trajectories, config: PreprocessConfig | None) -> _Cleaned:
    """Steps 1–4 of :func:`preprocess` (checks, cleaning, cutting into trips): everything that does not need the
    running sums, so that :mod:`stfast.data.convert` can clean the next chunk while it cuts this one."""
    if not isinstance(traj, Trajectories):
        raise TypeError(f"preprocess expects Trajectories, got {type(traj).__name__}")
    if config is None:
        config = PreprocessConfig()
    if not isinstance(config, PreprocessConfig):
        raise TypeError(f"config must be a PreprocessConfig, got {type(config).__name__}")
    config.validate()
    tz = config.tz if config.tz is not None else traj.tz
    if tz is None:
        raise ValueError("the trajectories carry no time zone (tz None, e.g. concatenated from sources "
                         "with different ones): set PreprocessConfig.tz")
    cfg = dataclasses.replace(config, tz=check_tz(tz))
    dropped: dict[str, int] = {}
    gone: list[tuple] = []  # (trajectory index, segment, reason) arrays of what yields no trip
    n_in = traj.n_points
    n_traj = len(traj)

    def vanish(before: np.ndarray, reason: str) -> np.ndarray:
        """Record trajectories that had points (``before``) and have none now; the new alive mask."""
        alive = np.bincount(gid, minlength=n_traj) > 0
        k = np.flatnonzero(before & ~alive)
        gone.append((k, np.zeros(len(k), np.int64), np.full(len(k), reason, object)))
        return alive

    lng_all = np.asarray(traj.lng, dtype=np.float64)
    lat_all = np.asarray(traj.lat, dtype=np.float64)
    t_all = np.asarray(traj.t, dtype=np.float64)
    idx = np.arange(n_in, dtype=np.int64)
    gid = np.repeat(np.arange(len(traj), dtype=np.int64), traj.lengths)

    whole = True  # idx is still arange(n_in): the columns are used as they are, not gathered

    def compact(mask):
        nonlocal idx, gid, whole
        if mask.all():  # the common case on clean input: nothing to drop, no copies
            return
        idx, gid, whole = idx[mask], gid[mask], False

    def cols():
        """t, lng, lat of the points left."""
        return (t_all, lng_all, lat_all) if whole else (t_all[idx], lng_all[idx], lat_all[idx])

    # 1. non-finite values
    finite = np.isfinite(lng_all) & np.isfinite(lat_all) & np.isfinite(t_all)
    _add(dropped, "nonfinite_point", (~finite).sum())
    vanish(np.ones(n_traj, dtype=bool), "empty_trajectory")
    _add(dropped, "empty_trajectory", (traj.lengths == 0).sum())
    compact(finite)
    alive = vanish(traj.lengths > 0, "nonfinite_point")

    # 2. duplicates and non-positive time gaps
    compact(_order_and_duplicates(*cols(), gid, dropped))

    # 3. speed outliers
    if cfg.max_speed_kmh is not None:
        compact(_speed_outliers(*cols(), gid, cfg.max_speed_kmh, dropped))

    # 4. split into trips at gaps, stays and mode changes
    t, lng, lat = cols()
    if cfg.stay_min_s is not None:
        stay = _stays(t, lng, lat, gid, cfg.stay_radius_m / 1000.0, cfg.stay_min_s)
    else:
        stay = np.zeros(len(idx), dtype=bool)
    start = _first_mask(gid)
    if len(idx) > 1:
        start[1:] |= stay[:-1] | (np.diff(t) > cfg.gap_s)
    use_modes = cfg.modes is not None and traj.mode is not None
    if cfg.modes is not None and traj.mode is None:
        log.warning("preprocess: modes=%s given but the trajectories carry no mode labels; not filtering",
                    sorted(cfg.modes))
    if use_modes and len(idx) > 1:
        m = traj.mode[idx]
        start[1:] |= m[1:] != m[:-1]
    _add(dropped, "stay_point", stay.sum())
    keep = ~stay
    start = start[keep]
    compact(keep)
    vanish(alive, "stay_point")  # steps 2 and 3 keep a trajectory's first point: only stays empty one
    tid = np.cumsum(start) - 1  # trip id per point
    trip_traj = gid[start]  # source trajectory of each trip
    piece = np.arange(len(trip_traj))
    trip_seg = piece - np.maximum.accumulate(np.where(_first_mask(trip_traj), piece, 0))

    if use_modes and len(idx):
        trip_mode = traj.mode[idx[start]]
        ok = np.fromiter((mm in cfg.modes for mm in trip_mode), dtype=bool, count=len(trip_mode))
        _add(dropped, "mode_filtered", (~ok).sum())
        gone.append((trip_traj[~ok], trip_seg[~ok], np.full(int((~ok).sum()), "mode_filtered", object)))
        pmask = ok[tid]
        _add(dropped, "points_of_dropped_trips", (~pmask).sum())
        compact(pmask)
        tid = np.cumsum(_first_mask(tid[pmask])) - 1
        trip_traj, trip_seg = trip_traj[ok], trip_seg[ok]
    return _Cleaned(traj, cfg, lng_all, lat_all, t_all, idx, tid, trip_traj, trip_seg, dropped, gone)


def _cut(c: _Cleaned, carry: list | None, tally: TripFilterTally | None = None) -> Trips:
    """Steps 5–7 of :func:`preprocess` on what :func:`_clean` left (``carry`` as there). ``tally``: the trip
    filters' counts are added to it (streaming: one tally over all chunks); None: a new one. The Trips returned
    carry it as ``trip_filters``."""
    tally = TripFilterTally() if tally is None else tally
    traj, cfg, lng_all, lat_all, t_all = c.traj, c.cfg, c.lng_all, c.lat_all, c.t_all
    idx, tid, trip_traj, trip_seg, dropped, gone = c.idx, c.tid, c.trip_traj, c.trip_seg, c.dropped, c.gone
    n_in = traj.n_points

    # 5. resampling
    if cfg.min_spacing_km is not None and len(idx):
        keep = resample_mask(lng_all[idx], lat_all[idx], tid, cfg.min_spacing_km)
        _add(dropped, "resampled", (~keep).sum())
        idx, tid = idx[keep], tid[keep]  # trips keep their first and last point, so no trip vanishes

    n = len(idx)
    if n == 0:
        return _finish(Trips.empty(), traj, n_in, dropped, _dropped_rows(traj, gone), cfg, tally)

    # 6. DeepTTE fields
    t, lng, lat = t_all[idx], lng_all[idx], lat_all[idx]
    first = _first_mask(tid)
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, n))
    offsets = lengths_to_offsets(lengths)
    tg = np.repeat(np.arange(len(starts)), lengths)
    adj = np.zeros(n)
    adj[1:] = path_km(lng, lat)
    adj[first] = 0.0
    if carry is not None:  # dist_gap's sum continues from the chunks before: one sequential cumsum, as over all
        adj[0] += carry[0]
    cum = np.cumsum(adj)
    if carry is not None:
        carry[0] = float(cum[-1])
    dist_gap = cum - cum[starts][tg]
    time_gap = t - t[starts][tg]
    last = offsets[1:] - 1
    time, dist = time_gap[last], dist_gap[last]

    # 7. trip filters (first failing rule wins)
    reason = np.full(len(starts), -1)
    rules = [
        ("too_short", lengths < cfg.min_points),
        ("too_short_time", time < cfg.min_time_s),
        ("too_short_dist", dist < cfg.min_dist_km),
    ]
    if cfg.max_points is not None:
        rules.append(("too_long", lengths > cfg.max_points))
    tally.add(lengths, time, dist, rules, {"min_points": cfg.min_points, "min_time_s": cfg.min_time_s,
                                           "min_dist_km": cfg.min_dist_km, "max_points": cfg.max_points})
    for r, (name, bad) in enumerate(rules):
        hit = bad & (reason < 0)
        reason[hit] = r
        _add(dropped, name, hit.sum())
    ok = reason < 0
    _add(dropped, "points_of_dropped_trips", lengths[~ok].sum())
    names = np.array([name for name, _ in rules], dtype=object)
    gone.append((trip_traj[~ok], trip_seg[~ok], names[reason[~ok]]))
    pmask = ok[tg]

    week_id, time_id, date_id = calendar_ids(
        t[starts[ok]], _start_offsets(traj, cfg.tz, t[starts[ok]], idx[starts[ok]]))
    pidx = idx[pmask]
    state = np.asarray(traj.state)[pidx].astype(np.float32)
    trips = Trips(
        offsets=lengths_to_offsets(lengths[ok]),
        lng=lng[pmask], lat=lat[pmask], state=state,
        time_gap=time_gap[pmask], dist_gap=dist_gap[pmask],
        dist=dist[ok], time=time[ok],
        driver=np.asarray(traj.driver, dtype=object)[trip_traj[ok]],
        week_id=week_id, time_id=time_id, date_id=date_id,
        trip_id=np.asarray(traj.trip_id, dtype=object)[trip_traj[ok]], segment=trip_seg[ok],
    )
    return _finish(trips, traj, n_in, dropped, _dropped_rows(traj, gone), cfg, tally)


def _finish(trips: Trips, traj: Trajectories, n_in: int, dropped: dict, rows: DroppedTrips,
            cfg: PreprocessConfig, tally: TripFilterTally) -> Trips:
    merged = dict(traj.dropped or {})
    for k, v in dropped.items():
        merged[k] = merged.get(k, 0) + v
    trips.dropped = merged
    trips.dropped_trips = DroppedTrips.concat([traj.dropped_trips, rows])
    trips.tz, trips.preprocess_config, trips.trip_filters = cfg.tz, cfg, tally
    # the drops are said once, by the command (stfast.data.drops.describe): here only the totals
    log.info("preprocess: %s (%s) -> %s (%s)", counted(len(traj), "trajectory", "trajectories", spec=","),
             counted(n_in, "point", spec=","), counted(len(trips), "trip", spec=","),
             counted(trips.n_points, "point", spec=","))
    return trips
