"""Streaming conversion of raw trajectories into a trips store (:mod:`stfast.data.store`) in bounded memory.

DiDi GAIA, point-CSV, Kaggle Porto and T-Drive files are read block by block
(:data:`~stfast.data.readers._common.BLOCK_BYTES` of raw text at a time, parsed by pyarrow, checked with
numpy), Parquet / Arrow tables row group by row group. Their rows need not be sorted: a trip's rows may
be scattered over the whole input, so the points are first spilled to disk, partitioned by trip number
(trips numbered in order of first appearance, :data:`TRIPS_PER_BUCKET` trips a partition, one file each);
then each partition is read back, its points sorted by trip and time, preprocessed and appended to the
store. Peak memory is one block plus one partition, whatever the input's size, and the result is exactly
what reading the whole input at once and preprocessing it gives (same trips, same order, same
fingerprint). DeepTTE JSON lines are converted block by block too (records are trips already); GeoLife
and the synthetic city are read whole, then written.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from .durable import aside, os_error_line
from .load import DEFAULT_TZ, load_trips, refuse_record_filters, require_trips
from .store import StoreWriter, check_out, write_store
from .trip_filters import TripFilterTally
from .trips import Trajectories, Trips, lengths_to_offsets

log = logging.getLogger("stfast.data")

TRIPS_PER_BUCKET = 2048  # trips per spill partition; partitions are merged up to MAX_POINTS_PER_PART
MAX_POINTS_PER_PART = 500_000  # points preprocessed at a time (about 150 MB of working arrays)
_STREAMED = ("didi", "csv", "parquet", "porto", "tdrive", "polyline")  # point readers that stream through the spill
_COLUMNS = (("code", "<i8"), ("t", "<f8"), ("lng", "<f8"), ("lat", "<f8"), ("state", "<f4"), ("off", "<f8"))


class _Spill:
    """Points appended to per-partition files under ``folder`` (partition = trip code // TRIPS_PER_BUCKET), as
    records of the columns the input has (``state`` and ``off`` only when the reader gives them)."""

    def __init__(self, folder: Path, extra: tuple[str, ...] = ("state", "off")):
        self.folder = folder
        self.points: dict[int, int] = {}
        self.dtype = np.dtype([c for c in _COLUMNS if c[0] in ("code", "t", "lng", "lat") + tuple(extra)])

    def add(self, block: dict) -> None:
        rec = np.empty(len(block["code"]), self.dtype)
        for k in self.dtype.names:
            rec[k] = block[k]
        part = rec["code"] // TRIPS_PER_BUCKET
        if part[0] == part[-1] and (len(part) < 2 or (part == part[0]).all()):
            self._write(int(part[0]), rec)
            return
        step = np.diff(part)
        if (step < 0).any():  # rows not grouped by partition: a stable sort by partition first
            order = np.argsort(part, kind="stable")
            rec, part = rec[order], part[order]
            step = np.diff(part)
        # Why the check: files sorted by trip (DiDi ships them by order) give non-decreasing partitions, and the
        # sort of a whole block took 12 % of converting one (measured: 8 M points, short ids)
        cuts = np.flatnonzero(step) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(part)]):
            self._write(int(part[lo]), rec[lo:hi])

    def _write(self, k: int, rec: np.ndarray) -> None:
        with open(self.folder / f"{k}.bin", "ab") as f:
            f.write(rec.data)
        self.points[k] = self.points.get(k, 0) + len(rec)

    def parts(self, n_trips: int):
        """(first trip code, end code, points sorted by code then time) of consecutive runs of partitions of
        up to MAX_POINTS_PER_PART points (one partition at least); each file is removed once read."""
        n_parts = -(-n_trips // TRIPS_PER_BUCKET)
        k = 0
        while k < n_parts:
            ks = [k]
            total = self.points.get(k, 0)
            while ks[-1] + 1 < n_parts and total + self.points.get(ks[-1] + 1, 0) <= MAX_POINTS_PER_PART:
                ks.append(ks[-1] + 1)
                total += self.points.get(ks[-1], 0)
            recs = []
            for j in ks:
                p = self.folder / f"{j}.bin"
                if p.exists():
                    recs.append(np.fromfile(p, self.dtype))
                    p.unlink()
            rec = np.concatenate(recs) if recs else np.empty(0, self.dtype)
            c, t = rec["code"], rec["t"]
            if len(c) > 1 and not ((c[1:] > c[:-1]) | ((c[1:] == c[:-1]) & (t[1:] >= t[:-1]))).all():
                rec = rec[np.lexsort((t, c))]  # by trip, then time; stable as the readers sort (sorted input: as is)
            yield ks[0] * TRIPS_PER_BUCKET, min((ks[-1] + 1) * TRIPS_PER_BUCKET, n_trips), rec
            k = ks[-1] + 1


@contextlib.contextmanager
def _large_arrays_reused():
    """While converting, glibc's malloc serves arrays up to 256 MiB from its heap and keeps up to 1 GiB it freed
    (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD), instead of mapping and unmapping each large temporary: the page
    faults of fresh mappings were a third of the conversion's CPU time (measured: system time 0.5 → 0.26 s per
    1 M DiDi points, peak RSS +65 MiB). glibc's defaults (128 KiB each) are set back afterwards. Elsewhere
    (not glibc): nothing."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        yield
        return
    m_trim, m_mmap = -1, -3  # <malloc.h>: M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
    mallopt(m_mmap, 256 << 20)
    mallopt(m_trim, 1 << 30)
    try:
        yield
    finally:
        mallopt(m_mmap, 128 << 10)
        mallopt(m_trim, 128 << 10)


def convert_to_store(data, out, fmt: str = "auto", *, on_error: str = "raise", modes=None,
                     min_spacing_km: float | None = 0.2, gap_s: float = 1200.0, tz: str | None = None,
                     n_synthetic: int = 20000, seed: int = 0, **options) -> Trips:
    """Read ``data`` (file or folder; None: the synthetic city), preprocess it as
    :func:`stfast.data.load.load_trips` does with the same arguments, and write a trips store at ``out``.

    DiDi GAIA, point CSV, Porto, T-Drive, Parquet / Arrow and DeepTTE JSON lines stream in bounded memory
    (module docstring); GeoLife is read whole.
    ``out`` appears only when complete (a temporary folder beside it is renamed), so an interrupted or failed
    conversion leaves nothing half-written there, and an older store at ``out`` intact.

    Returns:
        The store, opened (:func:`stfast.data.store.open_store`): memory-mapped Trips with the fingerprint.

    ``out`` is refused (before anything is read) unless it is new, empty, or a store holding nothing else
    (:func:`stfast.data.store.check_out`); a symbolic link is followed. Temporary folders of conversions into the same
    parent that were killed are removed.

    Raises:
        TrajectoryFormatError: bad input (file, line, field), as the readers raise it.
        ValueError: ``data`` is a trips store (read as it is, not converted); ``out`` exists and is not a store, or
            holds files stfast did not write; no trip survived
            reading and preprocessing; bad settings (see load_trips); an OS error (read-only file system, full disk,
            permissions), in one line naming the path.
    """
    from .readers import given_format
    from .store import is_store

    if data is not None and is_store(data):  # detect_format would say it recognizes no format in the folder
        raise ValueError(f"--data {data} is a trips store already: train, evaluate or predict on it as it is (an --out "
                         "ending in .jsonl writes its trips as DeepTTE JSON lines)")
    try:
        out = check_out(out)
        with given_format(data, fmt):  # a wrong --format on a file of another format: named
            return _convert(data, out, fmt, on_error=on_error, modes=modes, min_spacing_km=min_spacing_km,
                            gap_s=gap_s, tz=tz, n_synthetic=n_synthetic, seed=seed, **options)
    except OSError as e:
        writing = e.filename is None or _of_out(e.filename, out)
        if isinstance(e, FileNotFoundError) and (e.filename is None or not writing):
            raise  # the input's: said as such by the caller
        raise ValueError(os_error_line(e, f"cannot write the trips store {out}" if writing else
                                       f"cannot read {data}", writing)) from None


def _of_out(path, out) -> bool:
    """Whether ``path`` (an OS error's) is ``out``, in it, or one of its temporary names (``.NAME.tmpPID``...) or in
    one: an error while writing, not reading. (A prefix test of the text took ``s`` of ``--out s`` for input.)"""
    p, o = Path(os.path.abspath(path)), Path(os.path.abspath(out))
    return any(x == o or (x.parent == o.parent and x.name.startswith(f".{o.name}.")) for x in (p, *p.parents))


def _convert(data, out: Path, fmt: str, *, on_error: str, modes, min_spacing_km, gap_s: float, tz: str | None,
             n_synthetic: int, seed: int, **options) -> Trips:
    from .preprocess import PreprocessConfig, _clean, _cut
    from .readers import detect_format

    kw = dict(on_error=on_error, modes=modes, min_spacing_km=min_spacing_km, gap_s=gap_s, tz=tz, **options)
    from .readers.columns import current as mapped_columns

    cmap = mapped_columns()
    if cmap is not None and data is not None:  # --columns: a CSV of another layout (readers.columns)
        if fmt not in ("auto", "csv"):
            raise ValueError(f"--columns reads a CSV: give --format csv or auto, not {fmt}")
        fmt = "polyline" if cmap.layout == "polyline" else "csv"
    elif data is not None and fmt != "synthetic":
        fmt = detect_format(data) if fmt == "auto" else fmt
    if data is not None and fmt == "deeptte":
        refuse_record_filters(data, options)
        return _convert_deeptte(data, out, on_error, tz, options.get("min_points"))
    if data is None or fmt not in _STREAMED:
        trips = load_trips(data, fmt, n_synthetic=n_synthetic, seed=seed, **kw)
        require_trips(trips, str(data) if data is not None else "the synthetic city")
        return write_store(trips, out, {"data": None if data is None else str(data), "format": fmt or "synthetic"})
    from .readers._common import _Problems, _read_ahead, _TripCodes
    from .readers.csv_points import iter_csv_blocks
    from .readers.didi_gaia import iter_didi_blocks
    from .readers.parquet_points import iter_parquet_blocks
    from .readers.polyline_csv import iter_polyline_blocks
    from .readers.porto import iter_porto_blocks
    from .readers.tdrive import iter_tdrive_blocks

    cfg = PreprocessConfig(modes=set(modes) if modes else None, min_spacing_km=min_spacing_km or None,
                           gap_s=gap_s, **options)
    if tz is not None:
        cfg.tz = tz
    probs, codes, tally = _Problems(on_error), _TripCodes(), TripFilterTally()
    out = Path(out)
    with StoreWriter(out, {"data": str(data), "format": fmt}) as w, _large_arrays_reused():
        spill = aside(out, "spill")
        spill.mkdir(parents=True, exist_ok=True)
        try:
            sp = _Spill(spill, {"didi": (), "porto": ("state",), "tdrive": ("state",)}.get(fmt, ("state", "off")))
            if fmt == "didi":
                blocks, meta = iter_didi_blocks(data, probs, codes), {"tz": DEFAULT_TZ["didi"], "offsets": False}
            else:
                meta = {}
                it = {"csv": iter_csv_blocks, "parquet": iter_parquet_blocks, "porto": iter_porto_blocks,
                      "tdrive": iter_tdrive_blocks, "polyline": iter_polyline_blocks}[fmt]
                blocks = it(data, probs, codes, meta)
            for b in blocks:
                sp.add(b)
            probs.warn(data)
            ids = list(codes.code)  # trip ids in code order (a dict keeps insertion order)
            w.add_dropped(probs.dropped, probs.dropped_trips(codes.code))
            carry = [0.0]  # dist_gap's running sum, continued from chunk to chunk (see preprocess)
            data_log = logging.getLogger("stfast.data")
            level = data_log.level
            data_log.setLevel(logging.WARNING)  # preprocess logs a summary per call: one for the whole input below
            def clean(part):  # in _read_ahead's worker: the next partition is read and cleaned meanwhile
                lo, hi, rec = part
                traj = Trajectories(
                    offsets=lengths_to_offsets(np.bincount(rec["code"] - lo, minlength=hi - lo)),
                    lng=rec["lng"], lat=rec["lat"], t=rec["t"],
                    state=rec["state"] if "state" in rec.dtype.names else np.ones(len(rec), np.float32),
                    driver=np.array(codes.driver[lo:hi], object), source=np.array(codes.source[lo:hi], object),
                    trip_id=np.array(ids[lo:hi], object),
                    utc_offset_s=rec["off"] if meta["offsets"] else None, tz=meta["tz"])
                return _clean(traj, cfg)

            try:
                for _, cleaned in _read_ahead(sp.parts(len(codes)), clean, depth=2, workers=2):
                    w.append(_cut(cleaned, carry, tally))  # in order: the running sums continue from part to part
            finally:
                data_log.setLevel(level)
            if w.n_trips == 0:
                none = Trips.empty()
                none.dropped, none.preprocess_config, none.trip_filters = w.dropped, cfg, tally
                require_trips(none, str(data))
            done = w.finish()
        finally:
            shutil.rmtree(spill, ignore_errors=True)
    log.debug("%s: %d trips, %d points → %s", data, len(done), done.n_points, out)  # the caller says the drops
    return done


def _convert_deeptte(data, out, on_error: str, tz: str | None, min_points: int | None) -> Trips:
    """DeepTTE JSON lines (a file, or a folder of them) to a store, block by block: the records as written,
    those with fewer than ``min_points`` points dropped (:func:`stfast.data.load.drop_short_records`)."""
    from .load import drop_short_records
    from .preprocess import PreprocessConfig
    from .readers._common import _require_file
    from .readers.deeptte_json import deeptte_files, iter_file_blocks

    p = _require_file(data)
    files = [(f, f"{f.name}:") for f in deeptte_files(p)] if p.is_dir() else [(p, "")]
    min_points = PreprocessConfig.min_points if min_points is None else int(min_points)
    zones: set = set()
    tally = TripFilterTally()
    with StoreWriter(out, {"data": str(data), "format": "deeptte"}) as w, _large_arrays_reused():
        for f, prefix in files:
            done: dict = {}
            for trips in iter_file_blocks(f, on_error, 1.0, prefix, done):
                w.append(drop_short_records(trips, min_points, tally))
            w.add_dropped(done["dropped"], done["dropped_trips"])
            zones |= set(done["tz"].split(", "))
        w.tz = ", ".join(sorted(zones))
        if tz is not None and tz != w.tz:
            log.warning("%s: DeepTTE records carry their own weekID/timeID/dateID (computed in %s); tz=%s "
                        "does not change them", data, w.tz, tz)
        if w.n_trips == 0:
            none = Trips.empty()
            none.dropped, none.trip_filters = w.dropped, tally
            require_trips(none, str(data))
        return w.finish()
