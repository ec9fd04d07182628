"""A seeded synthetic taxi city: the embedded default dataset of ``stfast train``.

:func:`generate_city` draws raw GPS trajectories (absolute timestamps, GPS noise) of taxi trips on a
Manhattan road grid, so that the real preprocessing path runs on them; :func:`synthetic_trips` is
``preprocess(generate_city(...))``. The generative model, all of it in :class:`SyntheticCityConfig`:

* roads: a square grid of ``grid_km`` with ``block_km`` blocks centred on (``center_lng``,
  ``center_lat``) (default Chengdu); trips run between intersections along staircase paths of up to
  four straight legs; with probability ``p_arterial`` a trip whose box contains an arterial road
  travels along it;
* trip length: lognormal route length (median ``dist_median_km``, log-sd ``dist_sigma``), truncated to
  [``dist_min_km``, ``dist_max_km``], spread like the Chengdu DeepTTE sample (mean ≈ 9.5 km);
* departure: a day in ``n_days`` days from ``start_date`` (local), an hour from taxi-demand weights
  ``hour_weights``, a uniform second within the hour;
* speed of each block (km/h) = hourly speed profile (weekday / weekend, interpolated at the departure
  minute: morning and evening rush hours slow, nights fast) × ring factor of the block's distance from
  the centre (centre slow, periphery fast) × arterial factor × driver factor (lognormal, log-sd
  ``driver_sigma``, fixed per ``city_seed``) × trip factor (log-sd ``trip_sigma``) × block factor
  (log-sd ``block_sigma``); each turn adds ``turn_delay_s`` of waiting;
* GPS: the first fix at departure, then fixes every ``sample_interval_s`` (uniform integer seconds)
  up to 5 s before arrival, the last fix at arrival (whole seconds; so the last interval is 5–65 s
  with the defaults); isotropic Gaussian noise of ``gps_noise_m`` per axis;
  taxi state 1, with 1–2 zeros at the start / end of a trip with probability ``p_state0_end`` each.

Everything is vectorized over trips and blocks (20,000 trips in well under a second on one core).
Two calls with the same ``n_trips``, ``seed`` and config return bitwise identical arrays. The driver
factors depend on ``config.city_seed`` only, so datasets drawn with different ``seed`` share the same
drivers (train on one seed, test on another).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stfast.data.geo import EARTH_RADIUS_KM
from stfast.data.preprocess import PreprocessConfig, preprocess
from stfast.data.trips import Trajectories, Trips, lengths_to_offsets
from stfast.data.tz import TZ_FROM_TIMESTAMPS, check_tz, local_to_utc

_KM_PER_DEG = EARTH_RADIUS_KM * math.pi / 180.0

# free-flow-ish speed (km/h) at each hour of the day, before region/driver factors
_WEEKDAY_KMH = (42, 45, 48, 48, 46, 40, 30, 18, 14, 18, 24, 25, 24, 23, 24, 23, 20, 14, 13, 17, 24, 28, 32, 38)
_WEEKEND_KMH = (38, 41, 44, 45, 44, 42, 38, 34, 30, 27, 23, 22, 23, 23, 22, 21, 20, 19, 19, 21, 24, 27, 30, 35)
# taxi demand by hour of departure (relative)
_HOUR_WEIGHTS = (2.0, 1.5, 1.0, 0.7, 0.5, 0.7, 2.0, 4.0, 6.0, 5.0, 5.0, 5.0,
                 5.0, 5.0, 5.0, 5.0, 5.0, 6.0, 6.0, 6.0, 5.0, 5.0, 4.0, 3.0)


@dataclass(frozen=True)
class SyntheticCityConfig:
    """Parameters of the synthetic city (see the module docstring for the model).

    Attributes (units in the names or below):
        center_lng, center_lat: grid centre, degrees (default Chengdu 104.06, 30.66).
        grid_km: side of the square road grid (16 km). block_km: block length (0.5 km).
        n_drivers: drivers (300); ``driver`` strings "0".."n_drivers-1".
        city_seed: seed of the city-level draws (driver factors), independent of the trips' seed.
        driver_sigma, trip_sigma, block_sigma: log-sd of the driver, per-trip and per-block speed
            factors (0.12, 0.05, 0.10).
        weekday_kmh, weekend_kmh: 24 hourly speeds (km/h), linearly interpolated at the departure minute
            (value of hour h at h:30).
        hour_weights: 24 relative weights of the departure hour.
        ring_km: radii (km from the centre) of the ring boundaries (3, 6); ring_factor: speed factor of
            each ring, inside out (0.75, 0.95, 1.2).
        arterial_rows_km, arterial_cols_km: y (north) of east–west and x (east) of north–south arterial
            roads, km from the centre, snapped to the grid ((2.0,), (-3.0,)); arterial_factor: their
            speed factor (1.6); p_arterial: probability that a trip whose box contains one uses it (0.5).
        turn_delay_s: wait per turn (15 s).
        dist_median_km, dist_sigma, dist_min_km, dist_max_km: route length distribution (8.8 km,
            0.42, 2 km, 28 km; the route is snapped to whole blocks).
        sample_interval_s: (lo, hi) GPS fix interval, integer seconds uniform (30, 60).
        gps_noise_m: GPS noise sd per axis (10 m).
        p_state0_end: probability of 1–2 state-0 fixes at each end of a trip (0.3).
        start_date: first local day "YYYY-MM-DD" (2014-08-01); n_days: days of departures (31).
        tz: IANA time zone of the city's local time ("Asia/Shanghai", UTC+8 all year); departures
            are drawn in local time and preprocessed in the same zone.

    Raises:
        ValueError: a value out of range (non-positive sizes or scales, tables of the wrong length,
            dist_min_km > dist_max_km or a route that cannot fit the grid, an unknown time zone).
    """

    center_lng: float = 104.06
    center_lat: float = 30.66
    grid_km: float = 16.0
    block_km: float = 0.5
    n_drivers: int = 300
    city_seed: int = 0
    driver_sigma: float = 0.12
    trip_sigma: float = 0.05
    block_sigma: float = 0.10
    weekday_kmh: tuple = _WEEKDAY_KMH
    weekend_kmh: tuple = _WEEKEND_KMH
    hour_weights: tuple = _HOUR_WEIGHTS
    ring_km: tuple = (3.0, 6.0)
    ring_factor: tuple = (0.75, 0.95, 1.2)
    arterial_rows_km: tuple = (2.0,)
    arterial_cols_km: tuple = (-3.0,)
    arterial_factor: float = 1.6
    p_arterial: float = 0.5
    turn_delay_s: float = 15.0
    dist_median_km: float = 8.8
    dist_sigma: float = 0.42
    dist_min_km: float = 2.0
    dist_max_km: float = 28.0
    sample_interval_s: tuple = (30, 60)
    gps_noise_m: float = 10.0
    p_state0_end: float = 0.3
    start_date: str = "2014-08-01"
    n_days: int = 31
    tz: str = "Asia/Shanghai"

    def __post_init__(self):
        for name in ("weekday_kmh", "weekend_kmh", "hour_weights"):
            v = tuple(getattr(self, name))
            object.__setattr__(self, name, v)
            if len(v) != 24 or min(v) < 0 or (name != "hour_weights" and min(v) <= 0):
                raise ValueError(f"{name} needs 24 values (> 0 for speeds, >= 0 for weights)")
        if sum(self.hour_weights) <= 0:
            raise ValueError("hour_weights must not all be 0")
        for name in ("grid_km", "block_km", "n_drivers", "arterial_factor", "dist_median_km", "n_days"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("driver_sigma", "trip_sigma", "block_sigma", "dist_sigma", "gps_noise_m", "turn_delay_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")
        if len(self.ring_factor) != len(self.ring_km) + 1 or min(self.ring_factor) <= 0:
            raise ValueError("ring_factor needs len(ring_km) + 1 positive values")
        blocks = round(self.grid_km / self.block_km)
        if blocks < 2:
            raise ValueError("grid_km must hold at least 2 blocks")
        if not 0 < self.dist_min_km <= self.dist_max_km <= 2 * blocks * self.block_km:
            raise ValueError("need 0 < dist_min_km <= dist_max_km <= 2 * grid_km")
        lo, hi = self.sample_interval_s
        if not 1 <= lo <= hi:
            raise ValueError("sample_interval_s must be (lo, hi) with 1 <= lo <= hi")
        for name in ("p_arterial", "p_state0_end"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a probability")
        np.datetime64(self.start_date, "D")  # raises ValueError on a bad date
        if check_tz(self.tz) == TZ_FROM_TIMESTAMPS:
            raise ValueError(f"tz must be an IANA time-zone name, not {self.tz!r}")

    @property
    def n_blocks(self) -> int:
        """Blocks along one side of the grid; intersections are 0..n_blocks on each axis."""
        return int(round(self.grid_km / self.block_km))

    def preprocess_config(self) -> PreprocessConfig:
        """The PreprocessConfig :func:`synthetic_trips` uses (the defaults, in this city's time zone)."""
        return PreprocessConfig(tz=self.tz)


def driver_factors(config: SyntheticCityConfig = SyntheticCityConfig()) -> np.ndarray:
    """[n_drivers] float64 speed factor of each driver (lognormal, median 1), from ``city_seed``."""
    rng = np.random.default_rng([config.city_seed, 0x5EED])
    return np.exp(config.driver_sigma * rng.standard_normal(config.n_drivers))


def _speed_profile(table, minute_of_day: np.ndarray) -> np.ndarray:
    """Hourly table (value at h:30) interpolated at minutes of the day, periodic."""
    x = np.arange(-1, 25) * 60.0 + 30.0
    y = np.r_[table[-1], table, table[0]].astype(np.float64)
    return np.interp(minute_of_day, x, y)


def _segment_rank(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For CSR lengths: owner index of each element and its rank inside its segment."""
    off = lengths_to_offsets(lengths)
    owner = np.repeat(np.arange(len(lengths)), lengths)
    return owner, np.arange(off[-1]) - off[:-1][owner]


def _simulate(n_trips: int, seed: int, config: SyntheticCityConfig):
    """The generator; returns the Trajectories and a dict of per-trip ground truth."""
    cfg = config
    if int(n_trips) != n_trips or n_trips < 0:
        raise ValueError(f"n_trips must be a non-negative integer, not {n_trips}")
    n = int(n_trips)
    rng = np.random.default_rng([int(seed), 0xC17])
    G, bk = cfg.n_blocks, cfg.block_km
    half = G / 2.0

    # --- departures --------------------------------------------------------------------------
    day = rng.integers(0, cfg.n_days, n)
    w = np.asarray(cfg.hour_weights, dtype=np.float64)
    hour = rng.choice(24, size=n, p=w / w.sum())
    sec_of_day = hour * 3600 + rng.integers(0, 3600, n)
    start_day = np.datetime64(cfg.start_date, "D").astype(np.int64)  # days since 1970-01-01
    local_day = start_day + day
    weekend = ((local_day + 3) % 7) >= 5
    dep = local_to_utc((local_day * 86400 + sec_of_day).astype(np.float64), cfg.tz)
    minute = sec_of_day / 60.0
    base_kmh = np.where(weekend, _speed_profile(cfg.weekend_kmh, minute), _speed_profile(cfg.weekday_kmh, minute))

    driver = rng.integers(0, cfg.n_drivers, n)
    drv_f = driver_factors(cfg)[driver]
    trip_f = np.exp(cfg.trip_sigma * rng.standard_normal(n))

    # --- routes: length, box, legs --------------------------------------------------------------
    L = np.exp(math.log(cfg.dist_median_km) + cfg.dist_sigma * rng.standard_normal(n))
    bad = (L < cfg.dist_min_km) | (L > cfg.dist_max_km)
    while bad.any():  # truncated lognormal by redrawing
        L[bad] = np.exp(math.log(cfg.dist_median_km) + cfg.dist_sigma * rng.standard_normal(int(bad.sum())))
        bad = (L < cfg.dist_min_km) | (L > cfg.dist_max_km)
    nb = np.clip(np.round(L / bk).astype(np.int64), max(1, math.ceil(cfg.dist_min_km / bk - 1e-9)), 2 * G)
    nx = np.round(nb * rng.uniform(size=n)).astype(np.int64)
    nx = np.clip(nx, nb - G, G)
    ny = nb - nx
    sx = np.where(rng.uniform(size=n) < 0.5, -1, 1)
    sy = np.where(rng.uniform(size=n) < 0.5, -1, 1)
    lox = (rng.uniform(size=n) * (G - nx + 1)).astype(np.int64)
    loy = (rng.uniform(size=n) * (G - ny + 1)).astype(np.int64)
    ox = np.where(sx > 0, lox, lox + nx)
    oy = np.where(sy > 0, loy, loy + ny)
    dx, dy = sx * nx, sy * ny

    # staircase: legs (a1, b1, a2, b2) on alternating axes, the first axis chosen at random
    x_first = rng.uniform(size=n) < 0.5
    fa, fb = rng.uniform(size=n), rng.uniform(size=n)
    na, nbb = np.where(x_first, dx, dy), np.where(x_first, dy, dx)
    a1 = np.round(na * fa).astype(np.int64)
    b1 = np.round(nbb * fb).astype(np.int64)
    legs = np.stack([a1, b1, na - a1, nbb - b1], axis=1)
    # arterials: travel along a row (east-west) or a column (north-south) inside the trip's box
    rows = np.unique(np.clip(np.round(np.asarray(cfg.arterial_rows_km, float) / bk + half), 0, G).astype(np.int64))
    cols = np.unique(np.clip(np.round(np.asarray(cfg.arterial_cols_km, float) / bk + half), 0, G).astype(np.int64))
    use_art = rng.uniform(size=n) < cfg.p_arterial
    pick = rng.uniform(size=n)
    cand_row = np.full(n, -1)
    for r in rows:
        inside = (np.minimum(oy, oy + dy) <= r) & (r <= np.maximum(oy, oy + dy)) & (nx > 0)
        cand_row = np.where(inside & ((cand_row < 0) | (pick < 0.5)), r, cand_row)
    cand_col = np.full(n, -1)
    for c in cols:
        inside = (np.minimum(ox, ox + dx) <= c) & (c <= np.maximum(ox, ox + dx)) & (ny > 0)
        cand_col = np.where(inside & ((cand_col < 0) | (pick < 0.5)), c, cand_col)
    by_row = use_art & (cand_row >= 0) & ((cand_col < 0) | (pick < 0.5))
    by_col = use_art & ~by_row & (cand_col >= 0)
    zero = np.zeros(n, dtype=np.int64)
    # row: y to the row, all of x along it, rest of y (y-first); column: the same with axes swapped
    legs = np.where(by_row[:, None], np.stack([cand_row - oy, dx, oy + dy - cand_row, zero], 1), legs)
    legs = np.where(by_col[:, None], np.stack([cand_col - ox, dy, ox + dx - cand_col, zero], 1), legs)
    x_first = np.where(by_row, False, np.where(by_col, True, x_first))

    # --- blocks ------------------------------------------------------------------------------
    leg_is_x = np.stack([x_first, ~x_first, x_first, ~x_first], axis=1)
    step_x = np.where(leg_is_x, np.sign(legs), 0)
    step_y = np.where(leg_is_x, 0, np.sign(legs))
    leg_len = np.abs(legs)
    # leg start intersections
    vx, vy = np.where(leg_is_x, legs, 0), np.where(leg_is_x, 0, legs)
    start_x = ox[:, None] + np.cumsum(vx, axis=1) - vx
    start_y = oy[:, None] + np.cumsum(vy, axis=1) - vy
    flat_len = leg_len.reshape(-1)
    leg_id, k = _segment_rank(flat_len)
    bsx = start_x.reshape(-1)[leg_id] + k * step_x.reshape(-1)[leg_id]  # block start intersection
    bsy = start_y.reshape(-1)[leg_id] + k * step_y.reshape(-1)[leg_id]
    bux, buy = step_x.reshape(-1)[leg_id], step_y.reshape(-1)[leg_id]
    trip_of_block = leg_id // 4
    blocks_per_trip = leg_len.sum(axis=1)
    mx = (bsx + 0.5 * bux - half) * bk  # block midpoint, km east / north of the centre
    my = (bsy + 0.5 * buy - half) * bk
    r = np.hypot(mx, my)
    ring = np.searchsorted(np.asarray(cfg.ring_km, float), r)
    region_f = np.asarray(cfg.ring_factor, float)[ring]
    on_art = ((buy == 0) & np.isin(bsy, rows)) | ((bux == 0) & np.isin(bsx, cols))
    art_f = np.where(on_art, cfg.arterial_factor, 1.0)
    block_f = np.exp(cfg.block_sigma * rng.standard_normal(len(bsx)))
    t_mean = bk / (base_kmh[trip_of_block] * region_f * art_f * drv_f[trip_of_block]) * 3600.0
    travel = t_mean / (trip_f[trip_of_block] * block_f)
    toff = lengths_to_offsets(blocks_per_trip)
    first_block = np.zeros(len(bsx), dtype=bool)
    first_block[toff[:-1][blocks_per_trip > 0]] = True
    turn = np.zeros(len(bsx), dtype=bool)
    turn[1:] = ((bux[1:] != bux[:-1]) | (buy[1:] != buy[:-1])) & ~first_block[1:]
    wait = np.where(turn, cfg.turn_delay_s, 0.0)
    dur = wait + travel
    cum = np.cumsum(dur)
    total = cum[toff[1:] - 1] - np.r_[0.0, cum][toff[:-1]]  # per-trip travel time (s)
    bstart = cum - dur - np.r_[0.0, cum][toff[:-1]][trip_of_block]  # block start, s since departure
    oracle = np.bincount(trip_of_block, weights=t_mean + wait, minlength=n)

    # --- GPS fixes ------------------------------------------------------------------------------
    lo, hi = cfg.sample_interval_s
    arrive = np.maximum(np.round(total), 1.0)
    m = (arrive // lo).astype(np.int64) + 1  # enough intervals to pass the arrival
    owner, rank = _segment_rank(m)
    gaps = rng.integers(lo, hi + 1, len(owner)).astype(np.float64)
    goff = lengths_to_offsets(m)
    cg = np.cumsum(gaps)
    rel = cg - np.r_[0.0, cg][goff[:-1]][owner]
    keep = rel < arrive[owner] - 5.0
    mid_owner, mid_rel = owner[keep], rel[keep]
    # all fixes: departure (0), the kept intermediate ones, arrival; grouped by trip in time order
    f_owner = np.concatenate([np.arange(n), mid_owner, np.arange(n)])
    f_rel = np.concatenate([np.zeros(n), mid_rel, arrive])
    order = np.lexsort((f_rel, f_owner))
    f_owner, f_rel = f_owner[order], f_rel[order]
    n_fix = np.bincount(f_owner, minlength=n)
    # position at each fix: find the block by time (a per-trip base keeps the search key monotone)
    base = np.r_[0.0, np.cumsum(arrive + 1e4)[:-1]]
    bkey = base[trip_of_block] + bstart
    pos_t = np.minimum(f_rel, total[f_owner])  # arrival is rounded; clamp to the route's end
    b = np.searchsorted(bkey, base[f_owner] + pos_t, side="right") - 1
    b = np.clip(b, toff[:-1][f_owner], toff[1:][f_owner] - 1)
    frac = np.clip((pos_t - bstart[b] - wait[b]) / travel[b], 0.0, 1.0)
    px = (bsx[b] + frac * bux[b] - half) * bk
    py = (bsy[b] + frac * buy[b] - half) * bk
    noise = rng.standard_normal((len(px), 2)) * (cfg.gps_noise_m / 1000.0)
    px, py = px + noise[:, 0], py + noise[:, 1]
    lat = cfg.center_lat + py / _KM_PER_DEG
    lng = cfg.center_lng + px / (_KM_PER_DEG * math.cos(math.radians(cfg.center_lat)))
    t = dep[f_owner] + f_rel

    # --- taxi state ------------------------------------------------------------------------------
    _, fr = _segment_rank(n_fix)
    z_start = np.where(rng.uniform(size=n) < cfg.p_state0_end, rng.integers(1, 3, n), 0)
    z_end = np.where(rng.uniform(size=n) < cfg.p_state0_end, rng.integers(1, 3, n), 0)
    state = np.ones(len(t), dtype=np.float32)
    state[(fr < z_start[f_owner]) | (fr >= n_fix[f_owner] - z_end[f_owner])] = 0.0

    traj = Trajectories(
        offsets=lengths_to_offsets(n_fix), lng=lng, lat=lat, t=t, state=state,
        driver=np.array([str(d) for d in range(cfg.n_drivers)], dtype=object)[driver],
        source=np.full(n, f"synthetic-city(seed={int(seed)})", dtype=object),
        trip_id=np.arange(n).astype(str).astype(object), tz=cfg.tz,
    )
    # mean block region factor and arterial share per trip (for diagnostics and tests)
    cnt = np.maximum(blocks_per_trip, 1)
    truth = {
        "oracle_time": oracle,  # expected seconds without the trip/block noise
        "travel_time": total,  # simulated seconds before rounding
        "route_km": blocks_per_trip * bk,
        "base_kmh": base_kmh,
        "driver_factor": drv_f,
        "trip_factor": trip_f,
        "region_factor": np.bincount(trip_of_block, weights=region_f, minlength=n) / cnt,
        "arterial_share": np.bincount(trip_of_block, weights=on_art, minlength=n) / cnt,
        "turns": np.bincount(trip_of_block, weights=turn, minlength=n),
        "weekend": weekend,
        "hour": hour,
    }
    return traj, truth


def generate_city(n_trips: int, seed: int = 0, config: SyntheticCityConfig = SyntheticCityConfig()) -> Trajectories:
    """Raw GPS of ``n_trips`` synthetic taxi trips, one trajectory per trip.

    Args:
        n_trips: T, number of trips (>= 0).
        seed: seed of the trips (departures, routes, noise); the drivers' speed factors come from
            ``config.city_seed``.
        config: the city, see :class:`SyntheticCityConfig`.

    Returns:
        :class:`~stfast.data.trips.Trajectories` with T trajectories and N points (about 35 per trip):
        ``lng``/``lat`` [N] float64 degrees, ``t`` [N] float64 Unix seconds UTC (whole seconds; local
        time is that of ``config.tz``), ``state`` [N] float32 0/1, ``driver`` [T] object str,
        ``source`` [T] object str ``"synthetic-city(seed=S)"``, ``trip_id`` [T] object str, the trip's
        index ("0".."T-1"), ``mode`` None, ``tz`` ``config.tz``. Bitwise deterministic
        for (n_trips, seed, config). Every trip passes :meth:`SyntheticCityConfig.preprocess_config`.

    Raises:
        ValueError: n_trips negative or not an integer.
    """
    return _simulate(n_trips, seed, config)[0]


def synthetic_trips(n_trips: int, seed: int = 0, config: SyntheticCityConfig = SyntheticCityConfig()) -> Trips:
    """``preprocess(generate_city(n_trips, seed, config), config.preprocess_config())``.

    Returns:
        :class:`~stfast.data.trips.Trips` with (normally exactly) ``n_trips`` DeepTTE trips: points about
        0.2–0.5 km apart, median about 33 points, mean ``dist`` about 9 km, mean ``time`` about 1,500 s.

    Raises:
        ValueError: n_trips negative or not an integer.
    """
    return preprocess(generate_city(n_trips, seed, config), config.preprocess_config())
