"""Helpers shared by the reader modules: error counting, line iteration, path checks."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Iterator

import numpy as np

from stfast.data.errors import TrajectoryFormatError
from stfast.data.trips import DroppedTrips

log = logging.getLogger("stfast.data")


def _check_on_error(on_error: str) -> bool:
    """True for "skip", False for "raise"; anything else is a programming error (ValueError)."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
    return on_error == "skip"


class _Problems:
    """Raise (on_error="raise") or count (on_error="skip") bad records; one summary warning at the end."""

    def __init__(self, on_error: str):
        self.skip = _check_on_error(on_error)
        self.dropped: dict[str, int] = {}
        self.first: TrajectoryFormatError | None = None
        self._bad_trips: dict[str, None] = {}  # ids of trips with a skipped record, in order
        self._gone: list[tuple[str, str]] = []  # (trip id, reason) of whole trips a reader leaves out by rule

    def bad(self, path, line: int | None, field: str | None, reason: str, kind: str = "bad_line",
            trip: str | None = None, at: str | None = None) -> None:
        """A bad record at ``line`` (or ``at``: "row group g, row r") of trip ``trip`` when its id is known:
        raise or count it."""
        err = TrajectoryFormatError(path, line, field, reason, at)
        if not self.skip:
            raise err
        self.dropped[kind] = self.dropped.get(kind, 0) + 1
        if self.first is None:
            self.first = err
        if trip:
            self._bad_trips[trip] = None

    def dropped_trips(self, kept) -> DroppedTrips:
        """Rows (reason "bad_line") for the trips with a skipped record that are not in ``kept``, then those of
        :meth:`drop_trip` (its reasons)."""
        bad = DroppedTrips.of([i for i in self._bad_trips if i not in kept], "bad_line")
        if not self._gone:
            return bad
        ids, why = zip(*self._gone)
        return DroppedTrips.concat([bad, DroppedTrips(np.array(ids, object), np.zeros(len(ids), np.int64),
                                                      np.array(why, object))])

    def drop_trip(self, kind: str, trip: str) -> None:
        """A whole trip left out by the format's rule (e.g. Porto's MISSING_DATA=True): counted under ``kind``
        and listed in :meth:`dropped_trips` with that reason."""
        self.count(kind)
        self._gone.append((trip, kind))

    def count(self, kind: str, n: int = 1) -> None:
        self.dropped[kind] = self.dropped.get(kind, 0) + n

    def warn(self, where) -> None:
        """Log one warning summarising the skipped bad records (not other counts)."""
        if self.first is not None:
            what = ", ".join(f"{v} {k}" for k, v in sorted(self.dropped.items()))
            log.warning("%s: skipped %s (first: %s)", where, what, self.first)


class _BadField(Exception):
    """Internal: a record is bad; carries the field name and the reason (never escapes a reader)."""

    def __init__(self, field: str | None, reason: str):
        super().__init__(reason)
        self.field = field
        self.reason = reason


def _finite(text: str, field: str) -> float:
    """Parse a finite float from one text field; _BadField naming the field otherwise."""
    try:
        v = float(text)
    except ValueError:
        raise _BadField(field, f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise _BadField(field, f"not a finite number: {text!r}")
    return v


def _lng_lat(lng_text: str, lat_text: str) -> tuple[float, float]:
    """Parse and range-check one coordinate pair (degrees); _BadField naming lng or lat otherwise."""
    x, y = _finite(lng_text, "lng"), _finite(lat_text, "lat")
    if not -180.0 <= x <= 180.0:
        raise _BadField("lng", f"longitude {x} outside [-180, 180]")
    if not -90.0 <= y <= 90.0:
        raise _BadField("lat", f"latitude {y} outside [-90, 90]")
    return x, y


def shown(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (``...`` at the end when cut): a line of the input quoted in a
    message (a DeepTTE record is kilobytes)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _require_file(path) -> Path:
    p = Path(path)
    if not p.exists():
        raise TrajectoryFormatError(path, None, None, "no such file")
    return p


def _iter_lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """(1-based line number, text without line ending) for every line; text None if not UTF-8.

    Reads in binary so CRLF and LF give identical text and a bad byte spoils only its own line.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TrajectoryFormatError(path, None, None, f"cannot open: {e.strerror or e}") from None
    with f:
        for i, raw in enumerate(f, 1):
            try:
                yield i, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield i, None


BLOCK_BYTES = 32 << 20  # raw bytes parsed at a time by the block readers (bounded memory, any file size)
_PARSE_CHUNK = 4 << 20  # pyarrow's chunk within a block: chunks are parsed on pyarrow's threads


def _iter_blocks(path: Path, size: int | None = None) -> Iterator[tuple[int, bytearray]]:
    """(1-based number of its first line, bytes) of consecutive blocks of whole lines of ``path``, each about
    ``size`` bytes (default :data:`BLOCK_BYTES`; a longer line is one block); the last may lack a final newline.
    Each block is a fresh bytearray read in place (``readinto``): no copy of the block is made on the way."""
    size = size or BLOCK_BYTES
    try:
        f = open(path, "rb", buffering=0)
    except OSError as e:
        raise TrajectoryFormatError(path, None, None, f"cannot open: {e.strerror or e}") from None
    with f:
        line, rest = 1, b""
        while True:
            buf = bytearray(len(rest) + size)
            buf[:len(rest)] = rest
            got, at = 0, len(rest)
            with memoryview(buf) as view:
                while at < len(buf):  # a raw file may return less than asked before its end
                    k = f.readinto(view[at:])
                    if not k:
                        break
                    at += k
                    got += k
            del buf[at:]
            if not got:
                if rest:
                    yield line, buf
                return
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                rest = buf
                continue
            rest = bytes(buf[cut:])
            del buf[cut:]
            yield line, buf
            line += buf.count(b"\n")


_END = object()


def _read_ahead(blocks: Iterator, parse, depth: int = 2, workers: int = 1) -> Iterator[tuple]:
    """(block, parse(block)) for each item of ``blocks``, in order, while worker threads read and parse the next
    ``depth`` blocks (pyarrow's reader and numpy release the GIL, so parsing overlaps with what the caller does
    with a block; with ``workers`` > 1, blocks are also parsed side by side, for a parse that outweighs the
    caller's work). Blocks are read one at a time (a lock), numbered as read, and handed on in that order.
    ``parse`` must not touch shared state; anything order-dependent (trip codes) stays with the caller. Errors of
    either are raised here, in order."""
    import itertools
    import threading
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()
    number = itertools.count()

    def task():
        with lock:  # blocks are read in order, numbered as read: a later task may take an earlier block
            k = next(number)
            try:
                item = next(blocks, _END)
            except BaseException as e:  # noqa: B036 (raised by the caller, in order)
                return k, None, None, e
        try:
            return k, item, (None if item is _END else parse(item)), None
        except BaseException as e:  # noqa: B036
            return k, item, None, e

    with ThreadPoolExecutor(workers, thread_name_prefix="stfast-read") as pool:
        running = deque(pool.submit(task) for _ in range(max(depth, workers)))
        done: dict = {}
        for want in itertools.count():
            while want not in done:
                k, *rest = running.popleft().result()
                done[k] = rest
            item, got, err = done.pop(want)
            if err is not None:
                raise err
            if item is _END:
                return
            running.append(pool.submit(task))
            yield item, got


def _block_lines(first: int, block: bytes) -> Iterator[tuple[int, str | None]]:
    """The lines of a block as :func:`_iter_lines` gives them (numbered from ``first``)."""
    raws = block.split(b"\n")
    if block.endswith(b"\n"):
        raws.pop()
    for i, raw in enumerate(raws, first):
        try:
            yield i, raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            yield i, None


class _TripCodes:
    """Trip id → code (0, 1, ... in order of first appearance) over a whole input, with each trip's driver
    and source file: what the point readers share between the blocks of a file and between files."""

    def __init__(self):
        self.code: dict[str, int] = {}
        self.driver: list[str] = []
        self.source: list[str] = []

    def __len__(self) -> int:
        return len(self.driver)

    def add(self, trip: str, driver: str, source: str) -> int:
        c = self.code[trip] = len(self.driver)
        self.driver.append(driver)
        self.source.append(source)
        return c

    def of_row(self, trip: str, driver: str, source: str, conflict: str) -> int:
        """The code of ``trip`` (added when new) for a row naming ``driver``; _BadField("driver_id",
        ``conflict`` formatted with ``trip``, ``was``, ``now``) when the trip has another driver."""
        c = self.code.get(trip)
        if c is None:
            return self.add(trip, driver, source)
        if self.driver[c] != driver:
            raise _BadField("driver_id", conflict.format(trip=trip, was=self.driver[c], now=driver))
        return c

    def encode_block(self, trips, drivers, source: str):
        """Codes [n] int64 of a block's rows from its ``trips`` and ``drivers`` columns (pyarrow string arrays of
        n rows), new trips added in order of first appearance; None when some row names another driver for
        its trip than the trip's first row (the caller then reads the block line by line to name it), and
        nothing is added."""
        import pyarrow as pa
        import pyarrow.compute as pc

        enc = pc.dictionary_encode(trips)
        local = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        uniq = enc.dictionary.to_pylist()
        # dictionary order is first appearance: a row starts a trip where its index exceeds all before it
        first = np.flatnonzero(local > np.maximum.accumulate(np.concatenate([[-1], local[:-1]])))
        first_drv = drivers.take(pa.array(first)).to_pylist()
        known = [self.code.get(u) for u in uniq]
        want = [first_drv[i] if c is None else self.driver[c] for i, c in enumerate(known)]
        if not pc.all(pc.equal(pa.array(want, pa.string()).take(enc.indices), drivers)).as_py():
            return None
        codes = np.array([self.add(u, first_drv[i], source) if c is None else c for i, (u, c) in
                          enumerate(zip(uniq, known))], dtype=np.int64)
        return codes[local]


def _is_didi_data_file(p: Path) -> bool:
    """A DiDi GAIA point file name: gps_* with no extension (or .csv/.txt), so gps_*.sha256 is not one."""
    return p.name.startswith("gps_") and p.suffix.lower() in ("", ".csv", ".txt") and p.is_file()


def _collect_points(path, blocks, probs: _Problems, codes: _TripCodes, meta: dict):
    """:class:`~stfast.data.trips.Trajectories` of a point reader's blocks (dicts of ``code``, ``t``, ``lng``,
    ``lat``, ``state`` and, when ``meta["offsets"]``, ``off``): one trajectory per code, points sorted by time
    (stable), trips in code order, ``dropped``/``dropped_trips`` from ``probs``; ``meta`` is read once the
    blocks are exhausted (``tz``, ``offsets``)."""
    from stfast.data.trips import Trajectories, lengths_to_offsets

    parts = list(blocks)
    probs.warn(path)

    def cat(k, dt):
        return np.concatenate([b[k] for b in parts]).astype(dt, copy=False) if parts else np.zeros(0, dt)

    code, t = cat("code", np.int64), cat("t", np.float64)
    order = np.lexsort((t, code))
    return Trajectories(
        offsets=lengths_to_offsets(np.bincount(code, minlength=len(codes)).astype(np.int64)),
        lng=cat("lng", np.float64)[order], lat=cat("lat", np.float64)[order], t=t[order],
        state=cat("state", np.float32)[order],
        driver=np.array(codes.driver, dtype=object), source=np.array(codes.source, dtype=object), mode=None,
        trip_id=np.array(list(codes.code), dtype=object),
        utc_offset_s=cat("off", np.float64)[order] if meta.get("offsets") else None,
        dropped=dict(probs.dropped), dropped_trips=probs.dropped_trips(codes.code), tz=meta["tz"])
