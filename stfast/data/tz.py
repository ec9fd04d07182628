"""Local time of UTC instants in an IANA time zone (through :mod:`zoneinfo`), vectorized.

DeepTTE's calendar ids (weekID, timeID, dateID) are local time; readers give Unix seconds UTC. A
time-zone value in stfast is one of

* an IANA name (``"Asia/Shanghai"``, ``"Europe/Lisbon"``, ``"UTC"``), read with :mod:`zoneinfo`
  (the system's tz database, or the ``tzdata`` package where the system has none), so local time is
  DST-correct at every instant;
* :data:`TZ_FROM_TIMESTAMPS`: each instant's own UTC offset as written in its timestamp (the point
  CSV's ``2016-11-01T07:10:00+08:00``), UTC where the timestamp carried none.

Time-zone rules are looked up once per distinct hour of the instants (and bisected to the second in
an hour that holds a transition), not once per instant, so a million trips cost milliseconds.
"""
from __future__ import annotations

import datetime as _dt
import zoneinfo

import numpy as np

TZ_FROM_TIMESTAMPS = "UTC+offsets from the timestamps"
"""Time-zone value: the offset each timestamp carries (ISO-8601 ``+hh:mm``/``Z``), UTC where none."""

_SECONDS_PER_DAY = 86400.0
# datetime's range (years 1..9999), a few days inside: instants beyond use the rules at the bound
_T_MIN, _T_MAX = -62_135_596_800 + 3 * 86400, 253_402_300_799 - 3 * 86400


def check_tz(tz) -> str:
    """``tz`` itself when it names a time zone: an IANA name known to :mod:`zoneinfo`, or
    :data:`TZ_FROM_TIMESTAMPS`.

    Raises:
        ValueError: anything else, naming it: ``unknown time zone 'Europe/Lisbonn' (an IANA name such
            as Europe/Lisbon)``.
    """
    if tz == TZ_FROM_TIMESTAMPS or tz == "UTC":
        return tz
    if isinstance(tz, str) and tz:
        try:
            zoneinfo.ZoneInfo(tz)
            return tz
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            pass
    raise ValueError(f"unknown time zone {tz!r} (an IANA name such as Europe/Lisbon)")


def utc_offset_s(t, tz: str) -> np.ndarray:
    """Offset of local time from UTC (seconds, local − UTC) at each instant, in the IANA zone ``tz``.

    Args:
        t: [n] Unix seconds UTC (any real dtype; finite).
        tz: an IANA name (see :func:`check_tz`).

    Returns:
        [n] float64 seconds, DST-correct (Europe/Lisbon: 0 in winter, 3600 in summer). Exact under
        the assumption, true of the tz database, that a zone changes its offset at most once within
        one clock hour.

    Raises:
        ValueError: ``tz`` unknown or :data:`TZ_FROM_TIMESTAMPS` (that needs the timestamps' own
            offsets, not a zone).
    """
    t = np.asarray(t, dtype=np.float64)
    if check_tz(tz) == TZ_FROM_TIMESTAMPS:
        raise ValueError(f"utc_offset_s needs a time-zone name, not {TZ_FROM_TIMESTAMPS!r}")
    if tz == "UTC" or t.size == 0:
        return np.zeros(t.shape)
    zone = zoneinfo.ZoneInfo(tz)

    def off(s: int) -> float:
        return _dt.datetime.fromtimestamp(min(max(s, _T_MIN), _T_MAX), zone).utcoffset().total_seconds()

    sec = np.floor(t).astype(np.int64)  # transitions fall on whole seconds
    hours, inv = np.unique(sec // 3600, return_inverse=True)
    inv = inv.reshape(-1)
    bounds = np.unique(np.concatenate([hours, hours + 1]))
    at = dict(zip(bounds.tolist(), (off(int(h) * 3600) for h in bounds.tolist())))
    a = np.array([at[h] for h in hours.tolist()])
    b = np.array([at[h + 1] for h in hours.tolist()])
    switch = np.full(len(hours), np.iinfo(np.int64).max)  # first second of the hour's new offset
    for k in np.flatnonzero(a != b):
        lo, hi = int(hours[k]) * 3600, int(hours[k]) * 3600 + 3600
        while hi - lo > 1:  # off(lo) == a[k], off(hi) == b[k]
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if off(mid) == a[k] else (lo, mid)
        switch[k] = hi
    return np.where(sec >= switch[inv], b[inv], a[inv]).reshape(t.shape)


def local_to_utc(local_s, tz: str) -> np.ndarray:
    """Unix seconds UTC of local wall-clock times ``local_s`` (seconds since 1970-01-01 00:00 local).

    [n] float64 in, [n] float64 out (two fixed-point passes over :func:`utc_offset_s`). A wall time
    that DST makes ambiguous or skips maps to an instant within the offset change of it. With a fixed
    offset (Asia/Shanghai since 1991) it is exactly ``local_s - offset``. Raises ValueError for an
    unknown ``tz``.
    """
    local = np.asarray(local_s, dtype=np.float64)
    guess = local - utc_offset_s(local, tz)
    return local - utc_offset_s(guess, tz)


def calendar_ids(t, offset_s) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """DeepTTE's calendar ids of instants ``t`` at local offsets ``offset_s``.

    Args:
        t: [n] Unix seconds UTC. offset_s: [n] (or scalar) seconds, local − UTC.

    Returns:
        (week_id, time_id, date_id), each [n] int64: day of the week (Monday = 0), minute of the day
        (0..1439) and day of the month (1..31), of local time ``t + offset_s``.
    """
    local = np.asarray(t, dtype=np.float64) + offset_s
    days = np.floor(local / _SECONDS_PER_DAY).astype(np.int64)
    sec = local - days * _SECONDS_PER_DAY
    time_id = np.clip(np.floor(sec / 60.0).astype(np.int64), 0, 1439)
    week_id = (days + 3) % 7  # 1970-01-01 was a Thursday
    d = days.astype("datetime64[D]")
    date_id = (d - d.astype("datetime64[M]").astype("datetime64[D]")).astype(np.int64) + 1
    return week_id, time_id, date_id
