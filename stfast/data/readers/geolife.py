"""GeoLife GPS Trajectories 1.3 (Microsoft Research Asia) reader.

Format (GeoLife User Guide 1.3, "Trajectory Data"): ``Data/<user>/Trajectory/<YYYYMMDDhhmmss>.plt``,
one trajectory per file, CRLF line endings. Lines 1–6 are a fixed header (ignored). Every further
line is one point with 7 comma-separated fields::

    lat, lng, 0, altitude (feet, -777 = invalid), days since 1899-12-30 (float), date, time
    39.984702,116.318417,0,492,39744.1201851852,2008-10-23,02:53:04

Date and time are GMT. Labelled users have ``Data/<user>/labels.txt``: a header line
``Start Time<TAB>End Time<TAB>Transportation Mode`` then rows
``2007/06/26 11:32:29<TAB>2007/06/26 11:40:29<TAB>bus`` (GMT).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import logging
import math
import multiprocessing as mp
import os
from array import array
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable

import numpy as np

from stfast.data.cores import usable_cores
from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import _BadField, _finite, _lng_lat, _iter_lines, _Problems, _require_file
from stfast.data.trips import DroppedTrips, Trajectories, lengths_to_offsets

log = logging.getLogger("stfast.data")

GEOLIFE_EPOCH = _dt.datetime(1899, 12, 30, tzinfo=_dt.timezone.utc)
"""Day 0 of the PLT "days" field (field 5), as in Excel/OLE Automation dates."""
GEOLIFE_HEADER_LINES = 6
"""Number of header lines at the top of every .plt file (ignored)."""
GEOLIFE_TZ = "Asia/Shanghai"
"""Default time zone of GeoLife data (most of it recorded in Beijing; its timestamps are GMT)."""
GEOLIFE_ALTITUDE_MISSING = -777.0
"""Altitude value (feet) that marks an invalid altitude."""
GEOLIFE_FIELDS = ("lat", "lng", "zero", "altitude", "days", "date", "time")
"""Names used in error messages for the 7 fields of a .plt point line."""

_UNIX_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


def _day_seconds(y: int, m: int, d: int, field: str) -> int:
    """Unix seconds of 00:00 UTC on the civil date y-m-d; _BadField if no such date."""
    try:
        return (_dt.date(y, m, d).toordinal() - _UNIX_EPOCH_ORDINAL) * 86400
    except (ValueError, OverflowError) as e:  # OverflowError: a year beyond C long
        raise _BadField(field, f"invalid date: {e}") from None


def _clock_seconds(text: str, field: str) -> float:
    """Seconds since midnight of ``H:M:S`` (no zero padding needed; seconds may be fractional)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise _BadField(field, f"expected H:M:S, got {text!r}")
    try:
        h, mi, s = int(parts[0]), int(parts[1]), float(parts[2])
    except ValueError:
        raise _BadField(field, f"expected H:M:S, got {text!r}") from None
    if not (0 <= h < 24 and 0 <= mi < 60 and 0.0 <= s < 60.0):
        raise _BadField(field, f"time out of range: {text!r}")
    return h * 3600 + mi * 60 + s


def _parse_date(text: str, sep: str, field: str, cache: dict) -> int:
    v = cache.get(text)
    if v is None:
        parts = text.split(sep)
        if len(parts) != 3:
            raise _BadField(field, f"expected Y{sep}M{sep}D, got {text!r}")
        try:
            y, m, d = (int(x) for x in parts)
        except ValueError:
            raise _BadField(field, f"expected Y{sep}M{sep}D, got {text!r}") from None
        v = cache[text] = _day_seconds(y, m, d, field)
    return v



_isfinite = math.isfinite


def _parse_point(line: str, date_cache: dict) -> tuple[float, float, float]:
    """(lat, lng, unix seconds) of one .plt point line; _BadField on any problem."""
    f = line.split(",")
    # fast path for well-formed lines; anything unusual goes to the checked path below for the message
    try:
        if len(f) == 7:
            lat, lng, alt, days = float(f[0]), float(f[1]), float(f[3]), float(f[4])
            day = date_cache[f[5]]
            h, mi, sec = f[6].split(":")
            h, mi, sec = int(h), int(mi), float(sec)
            if (
                -90.0 <= lat <= 90.0
                and -180.0 <= lng <= 180.0
                and _isfinite(alt)
                and _isfinite(days)
                and 0 <= h < 24
                and 0 <= mi < 60
                and 0.0 <= sec < 60.0
            ):
                return lat, lng, day + h * 3600 + mi * 60 + sec
    except (ValueError, KeyError):
        pass
    return _parse_point_checked(f, date_cache)


def _parse_point_checked(f: list[str], date_cache: dict) -> tuple[float, float, float]:
    if len(f) != 7:
        raise _BadField(None, f"expected 7 comma-separated fields, got {len(f)}")
    lng, lat = _lng_lat(f[1], f[0])
    _finite(f[3], "altitude")  # -777 (missing) is a valid number
    _finite(f[4], "days")
    t = _parse_date(f[5].strip(), "-", "date", date_cache) + _clock_seconds(f[6].strip(), "time")
    return lat, lng, t


def _read_plt(path: Path, probs: _Problems, date_cache: dict) -> tuple[array, array, array, bool]:
    """Points of one file as array('d') lat, lng, t; the flag says whether any data line existed."""
    lat, lng, t = array("d"), array("d"), array("d")
    any_data = False
    for no, line in _iter_lines(path):
        if no <= GEOLIFE_HEADER_LINES:
            continue
        if line is None:
            any_data = True
            probs.bad(path, no, None, "line is not valid UTF-8 text")
            continue
        if not line.strip():
            continue
        any_data = True
        try:
            a, b, c = _parse_point(line, date_cache)
        except _BadField as e:
            probs.bad(path, no, e.field, e.reason)
            continue
        lat.append(a)
        lng.append(b)
        t.append(c)
    return lat, lng, t, any_data


def _parse_label_time(text: str, field: str, cache: dict) -> float:
    parts = text.strip().split()
    if len(parts) != 2:
        raise _BadField(field, f"expected 'YYYY/MM/DD HH:MM:SS', got {text!r}")
    return _parse_date(parts[0], "/", field, cache) + _clock_seconds(parts[1], field)


def read_geolife_labels(path: str | os.PathLike, *, on_error: str = "raise", _probs=None):
    """Read a GeoLife ``labels.txt``.

    Returns ``(start, end, mode)``: [L] float64 Unix seconds UTC (inclusive interval), [L] float64,
    [L] object str transport mode, in file order. The header line (starting with ``Start Time``) is
    skipped; blank lines are ignored.

    Raises:
        TrajectoryFormatError: a row without 3 tab-separated fields, a bad time, end before start, an
        empty mode (with the labels file's line number; skipped and counted under
        ``"bad_label_line"`` with ``on_error="skip"``).
    """
    probs = _probs if _probs is not None else _Problems(on_error)
    path = _require_file(path)
    starts, ends, modes = array("d"), array("d"), []
    cache: dict = {}
    for no, line in _iter_lines(path):
        if line is None:
            probs.bad(path, no, None, "line is not valid UTF-8 text", "bad_label_line")
            continue
        if not line.strip():
            continue
        if no == 1 and line.lstrip().lower().startswith("start time"):
            continue
        f = line.split("\t")
        try:
            if len(f) != 3:
                raise _BadField(None, f"expected 3 tab-separated fields, got {len(f)}")
            s = _parse_label_time(f[0], "Start Time", cache)
            e = _parse_label_time(f[1], "End Time", cache)
            mode = f[2].strip()
            if e < s:
                raise _BadField("End Time", "end time before start time")
            if not mode:
                raise _BadField("Transportation Mode", "empty mode")
        except _BadField as err:
            probs.bad(path, no, err.field, err.reason, "bad_label_line")
            continue
        starts.append(s)
        ends.append(e)
        modes.append(mode)
    if _probs is None:
        probs.warn(path)
    return np.array(starts, dtype=np.float64), np.array(ends, dtype=np.float64), np.array(modes, dtype=object)


def _user_id(u) -> str:
    return f"{u:03d}" if isinstance(u, int) else str(u)


def _plt_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix.lower() == ".plt" and p.is_file())


def _collect(root: Path, users) -> list[tuple[str, Path | None, list[Path]]]:
    """[(user, user folder or None, sorted .plt files)] for every layout ``root`` may have."""
    if root.is_file():
        traj = root.parent
        udir = traj.parent if traj.name.lower() == "trajectory" else traj
        return [(udir.name, udir, [root])]
    if (root / "Data").is_dir():
        root = root / "Data"
    if (root / "Trajectory").is_dir():  # one user folder
        return [(root.name, root, _plt_files(root / "Trajectory"))]
    if _plt_files(root):  # a Trajectory folder (or any folder of .plt files)
        udir = root.parent if root.name.lower() == "trajectory" else root
        return [(udir.name, udir, _plt_files(root))]
    out = []
    for udir in sorted(p for p in root.iterdir() if p.is_dir()):
        if (udir / "Trajectory").is_dir():
            out.append((udir.name, udir, _plt_files(udir / "Trajectory")))
    return out


READ_CHUNK_BYTES = 8 << 20
"""About this many bytes of consecutive ``.plt`` files of one user make one task of a reading worker."""
PARALLEL_MIN_BYTES = 16 << 20
"""``workers=None`` reads less ``.plt`` data than this in the calling process (a pool costs more than it saves)."""


_PLT_COLUMNS = ("lat", "lng", "zero", "altitude", "days", "date", "time")


def _ints(parts, k: int) -> np.ndarray:
    """Part ``k`` of every row of a list array of 3 parts, as int64 (pyarrow raises on anything else)."""
    import pyarrow.compute as pc

    return pc.cast(pc.list_element(parts, k), "int64").to_numpy()


def _digits(col, seps: dict[int, int]) -> np.ndarray | None:
    """(n, 3) int64 of a pyarrow string array whose every value is 3 zero-padded numbers of 4|2 and 2, 2 digits
    with the byte ``seps[i]`` at position ``i`` (``YYYY-MM-DD``, ``HH:MM:SS``); None when any value is not."""
    width = 3 * 2 + 2 + (2 if 4 in seps else 0)
    offs = np.frombuffer(col.buffers()[1], np.int32, len(col) + 1, col.offset * 4)
    if len(col) == 0 or (np.diff(offs) != width).any():
        return None
    b = np.frombuffer(col.buffers()[2], np.uint8)[offs[0]:offs[-1]].reshape(-1, width)
    at = sorted(seps)
    if any((b[:, i] != c).any() for i, c in seps.items()):
        return None
    v = b.astype(np.int64) - ord("0")
    dig = np.delete(v, at, axis=1)
    if ((dig < 0) | (dig > 9)).any():
        return None
    bounds = [0, at[0], at[1] - 1, width - 2]
    out = np.zeros((len(b), 3), np.int64)
    for k in range(3):
        for j in range(bounds[k], bounds[k + 1]):
            out[:, k] = out[:, k] * 10 + dig[:, j]
    return out


def _fast_plt(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """The points of one ``.plt`` file as :func:`_read_plt` gives them, parsed by pyarrow's CSV reader and
    checked with numpy; None when anything is unusual (a bad or blank-but-not-empty line, a quote, a field
    pyarrow and Python would read differently, an unreadable file): :func:`_read_plt` then reads the file line
    by line, with its exact checks and messages."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    try:
        buf = path.read_bytes()
    except OSError:
        return None
    at = 0
    for _ in range(GEOLIFE_HEADER_LINES):
        at = buf.find(b"\n", at) + 1
        if at == 0:
            at = len(buf)
            break
    body = buf[at:]
    if body.count(b"\r") != body.count(b"\r\n"):  # a lone CR ends a line for pyarrow, not for _read_plt
        return None
    if not body.strip(b"\r\n"):
        return (np.zeros(0), np.zeros(0), np.zeros(0), False) if not body.strip() else None
    f64 = pa.float64()
    try:
        tab = pacsv.read_csv(
            pa.py_buffer(body),
            read_options=pacsv.ReadOptions(column_names=list(_PLT_COLUMNS), use_threads=False),
            parse_options=pacsv.ParseOptions(quote_char=False, ignore_empty_lines=True),
            convert_options=pacsv.ConvertOptions(
                column_types={"lat": f64, "lng": f64, "altitude": f64, "days": f64, "date": pa.string(),
                              "time": pa.string()},
                include_columns=["lat", "lng", "altitude", "days", "date", "time"], null_values=[],
                strings_can_be_null=False))
        if any(c.null_count for c in tab.columns):
            return None
        tab = tab.combine_chunks()
        ymd = _digits(tab["date"].chunk(0), {4: ord("-"), 7: ord("-")})
        hms = _digits(tab["time"].chunk(0), {2: ord(":"), 5: ord(":")})
        if ymd is not None and hms is not None:  # zero-padded, as GeoLife writes them
            (y, m, d), (h, mi), sec = ymd.T, hms.T[:2], hms[:, 2].astype(np.float64)
        else:
            date = pc.split_pattern(tab["date"].chunk(0), "-")
            clock = pc.split_pattern(tab["time"].chunk(0), ":")
            if not (pc.all(pc.equal(pc.list_value_length(date), 3)).as_py()
                    and pc.all(pc.equal(pc.list_value_length(clock), 3)).as_py()):
                return None
            y, m, d = (_ints(date, k) for k in range(3))
            h, mi = _ints(clock, 0), _ints(clock, 1)
            sec = pc.cast(pc.list_element(clock, 2), "float64").to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    lat, lng, alt, days = (tab[c].to_numpy() for c in ("lat", "lng", "altitude", "days"))
    with np.errstate(invalid="ignore"):
        ok = ((lat >= -90.0) & (lat <= 90.0) & (lng >= -180.0) & (lng <= 180.0) & np.isfinite(alt)
              & np.isfinite(days) & (h >= 0) & (h < 24) & (mi >= 0) & (mi < 60) & (sec >= 0.0) & (sec < 60.0)
              & (y >= 1) & (y <= 9999) & (m >= 1) & (m <= 12) & (d >= 1))
    if not ok.all():
        return None
    month = ((y - 1970) * 12 + (m - 1)).astype("datetime64[M]")
    first = month.astype("datetime64[D]").astype(np.int64)
    if (d > (month + 1).astype("datetime64[D]").astype(np.int64) - first).any():  # no such day
        return None
    t = ((first + d - 1) * 86400 + h * 3600 + mi * 60).astype(np.float64) + sec
    return lat, lng, t, True


def _read_chunk(paths: list[str], on_error: str) -> tuple:
    """One task: the points of the ``.plt`` files ``paths`` (in order), in this process or a worker's.

    Returns ``(lengths [F] int64, any_data [F] bool, lat, lng, t [sum(lengths)] float64, dropped counts,
    first skipped error or None)``. Raises TrajectoryFormatError (``on_error="raise"``), which pickles, so a
    worker's error reaches the caller as it is."""
    probs, date_cache = _Problems(on_error), {}
    parts = [_fast_plt(Path(p)) or _read_plt(Path(p), probs, date_cache) for p in paths]
    lengths = np.array([len(p[0]) for p in parts], dtype=np.int64)
    any_data = np.array([p[3] for p in parts], dtype=bool)
    cat = lambda k: np.concatenate([np.asarray(p[k], dtype=np.float64) for p in parts]) if parts else np.zeros(0)
    return lengths, any_data, cat(0), cat(1), cat(2), probs.dropped, probs.first


def _split_chunk(chunk: tuple, probs: _Problems):
    """Count a task's skipped records into ``probs``, then yield ``(lat, lng, t, any_data)`` per file."""
    lengths, any_data, lat, lng, t, dropped, first = chunk
    for kind, n in dropped.items():
        probs.count(kind, n)
    if probs.first is None:
        probs.first = first
    ends = np.cumsum(lengths)
    for e, n, a in zip(ends, lengths, any_data):
        yield lat[e - n:e], lng[e - n:e], t[e - n:e], bool(a)


def _tasks(files: list[Path], parallel: bool) -> list[list[str]]:
    """Consecutive runs of ``files`` of about :data:`READ_CHUNK_BYTES` each (all of them in one when not
    ``parallel``)."""
    if not parallel:
        return [[str(f) for f in files]] if files else []
    out, size = [], READ_CHUNK_BYTES
    for f in files:
        if size >= READ_CHUNK_BYTES:
            out.append([])
            size = 0
        out[-1].append(str(f))
        size += f.stat().st_size
    return out


def _worker_count(workers: int | None, groups) -> int:
    """Processes that read: ``workers`` when given; else one per usable core, or 1 (this process) for less
    than :data:`PARALLEL_MIN_BYTES` of ``.plt`` files."""
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1 or None, not {workers!r}")
        return workers
    cores = usable_cores()
    if cores < 2 or sum(f.stat().st_size for _, _, files in groups for f in files) < PARALLEL_MIN_BYTES:
        return 1
    return cores


@contextlib.contextmanager
def _read_users(groups, on_error: str, workers: int | None):
    """Yields an iterator of ``(user, user folder, files, task results in file order)`` per group, in order.

    With more than one worker the tasks run in a process pool (fork where the platform has it: the workers
    need nothing that is not already imported) and their results are taken in submission order, so the
    first error raised is the one a sequential read raises first, and the pool is shut down (pending tasks
    cancelled) when the caller is done or fails."""
    n = _worker_count(workers, groups)
    per_group = [_tasks(files, n > 1) for _, _, files in groups]
    flat = [t for tasks in per_group for t in tasks]
    pool = None
    if n > 1 and len(flat) > 1:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        pool = ProcessPoolExecutor(min(n, len(flat)), mp_context=ctx)
        results = pool.map(_read_chunk, flat, itertools.repeat(on_error))
    else:
        results = (_read_chunk(t, on_error) for t in flat)  # lazily: stops at the first error

    def per_user():
        for (user, udir, files), tasks in zip(groups, per_group):
            yield user, udir, files, [next(results) for _ in tasks]

    try:
        yield per_user()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def read_geolife(
    root: str | os.PathLike,
    *,
    on_error: str = "raise",
    users: Iterable[str | int] | None = None,
    workers: int | None = None,
) -> Trajectories:
    """Read GeoLife 1.3 ``.plt`` trajectories (one trajectory per file).

    Args:
        root: the folder holding ``Data/``, the ``Data/`` folder, one user folder (holding
            ``Trajectory/``), a ``Trajectory`` folder, or a single ``.plt`` file.
        on_error: ``"raise"`` or ``"skip"`` (skip bad point lines / label lines, counted in
            ``dropped["bad_line"]`` / ``dropped["bad_label_line"]``, one warning).
        users: only these user ids (``"010"`` or ``10``); default all.
        workers: processes that parse the ``.plt`` files (tasks of consecutive files of one user, about
            :data:`READ_CHUNK_BYTES` each); None: one per usable core when there are at least
            :data:`PARALLEL_MIN_BYTES` of files, else 1 (this process). The result, the dropped counts and
            the error raised do not depend on it. Each file is parsed by pyarrow's CSV reader and checked
            with numpy; a file with anything unusual in it (a bad line, a blank line of spaces, a quote) is read
            line by line instead, which gives the same points and the exact error.

    Returns:
        :class:`~stfast.data.trips.Trajectories`, users in sorted order, files in name (= start time)
        order: ``lng``, ``lat`` [N] float64 degrees WGS-84; ``t`` [N] float64 Unix seconds UTC from the
        date and time fields (GMT; non-zero-padded values such as ``2008-1-2``, ``7:0:57`` accepted;
        field 5 is only checked to be a number); ``state`` [N] float32 zeros; ``driver`` [T] the user
        folder name; ``trip_id`` [T] ``<user>/<file stem>`` (``010/20081023025304``); ``source`` [T]
        the file path; ``tz`` :data:`GEOLIFE_TZ`; ``mode`` [N] object str transport mode from
        ``<user>/labels.txt`` ("" where no interval covers the point or the user has no labels), or
        None when no selected user has a labels file. Points keep file order (duplicate timestamps
        are kept). Empty or header-only files are left out, counted in ``dropped["empty_file"]`` and
        reported in one warning; a file whose every line was skipped counts as
        ``dropped["no_valid_points"]``; ``dropped_trips`` lists both kinds by trip id.

    Raises:
        TrajectoryFormatError: missing root, no ``.plt`` files, unknown ``users``, a point line
            without 7 fields, a non-finite/non-numeric lat/lng/altitude/days, lat outside [-90, 90],
            lng outside [-180, 180], a bad date or time (field names ``lat``, ``lng``, ``altitude``,
            ``days``, ``date``, ``time``; line numbers count the header), or a bad labels.txt row.
    """
    probs = _Problems(on_error)
    rootp = _require_file(root)
    groups = _collect(rootp, users)
    if users is not None:
        if isinstance(users, (str, int)):
            users = [users]
        wanted = {_user_id(u) for u in users}
        missing = wanted - {g[0] for g in groups}
        if missing:
            raise TrajectoryFormatError(root, None, None, f"user(s) not found: {', '.join(sorted(missing))}")
        groups = [g for g in groups if g[0] in wanted]
    if not any(files for _, _, files in groups):
        raise TrajectoryFormatError(root, None, None, "no .plt files found")

    lats, lngs, ts, lens, drivers, sources, user_of_traj, ids = [], [], [], [], [], [], [], []
    labels: dict[int, tuple] = {}
    empty: list[Path] = []
    lost: list[tuple[str, str]] = []  # (trip id, reason) of files that give no trajectory
    with _read_users(groups, on_error, workers) as per_user:
        for gi, (user, udir, files, chunks) in enumerate(per_user):
            points = (p for chunk in chunks for p in _split_chunk(chunk, probs))
            for f, (la, ln, t, any_data) in zip(files, points):
                if not len(la):
                    if any_data:
                        probs.count("no_valid_points")
                    else:
                        empty.append(f)
                    lost.append((f"{user}/{f.stem}", "no_valid_points" if any_data else "empty_file"))
                    continue
                lats.append(la)
                lngs.append(ln)
                ts.append(t)
                lens.append(len(la))
                drivers.append(user)
                ids.append(f"{user}/{f.stem}")
                sources.append(str(f))
                user_of_traj.append(gi)
            lab = udir / "labels.txt" if udir is not None else None
            if lab is not None and lab.is_file():
                labels[gi] = read_geolife_labels(lab, _probs=probs)

    if empty:
        probs.count("empty_file", len(empty))
        log.warning("skipped %d empty or header-only .plt file(s) (first: %s)", len(empty), empty[0])
    probs.warn(root)

    lengths = np.array(lens, dtype=np.int64)
    offsets = lengths_to_offsets(lengths)
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0)
    lat, lng, t = cat(lats), cat(lngs), cat(ts)
    mode = None
    if labels:
        mode = np.full(len(t), "", dtype=object)
        traj_user = np.array(user_of_traj, dtype=np.int64)
        for gi, (start, end, modes) in labels.items():
            tr = np.flatnonzero(traj_user == gi)
            if len(tr) == 0 or len(start) == 0:
                continue
            pts = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in tr])
            order = np.argsort(t[pts], kind="stable")
            st = t[pts][order]
            lo = np.searchsorted(st, start, side="left")
            hi = np.searchsorted(st, end, side="right")
            for a, b, m in zip(lo, hi, modes):  # later intervals win where intervals overlap
                if b > a:
                    mode[pts[order[a:b]]] = m
    return Trajectories(
        offsets=offsets,
        lng=lng,
        lat=lat,
        t=t,
        state=np.zeros(len(t), dtype=np.float32),
        driver=np.array(drivers, dtype=object),
        source=np.array(sources, dtype=object),
        mode=mode,
        trip_id=np.array(ids, dtype=object),
        dropped=dict(probs.dropped),
        dropped_trips=DroppedTrips([i for i, _ in lost], np.zeros(len(lost), np.int64), [r for _, r in lost]),
        tz=GEOLIFE_TZ,
    )
