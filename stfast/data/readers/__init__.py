"""Readers of trajectory files into the CSR containers of :mod:`stfast.data.trips`.

=========  ==========================================  ==================================
format     reader                                      result
=========  ==========================================  ==================================
deeptte    :func:`read_deeptte_jsonl` (JSON lines)     :class:`~stfast.data.trips.Trips`
geolife    :func:`read_geolife` (GeoLife 1.3 .plt)     :class:`~stfast.data.trips.Trajectories`
didi       :func:`read_didi_gaia` (DiDi GAIA gps_*)    :class:`~stfast.data.trips.Trajectories`
csv        :func:`read_csv_points` (point CSV)         :class:`~stfast.data.trips.Trajectories`
porto      :func:`read_porto` (Kaggle ECML/PKDD 2015)  :class:`~stfast.data.trips.Trajectories`
tdrive     :func:`read_tdrive` (T-Drive per-taxi .txt) :class:`~stfast.data.trips.Trajectories`
parquet    :func:`read_parquet_points` (Parquet/Arrow) :class:`~stfast.data.trips.Trajectories`
=========  ==========================================  ==================================

Common rules: every reader raises only :class:`~stfast.data.errors.TrajectoryFormatError` on bad
input (with the 1-based line number and the field name where they apply) and takes
``on_error="raise" | "skip"``; with ``"skip"`` a bad record is left out, counted in the result's
``.dropped`` dict, and one warning on the ``stfast.data`` logger says how many were skipped.

Every result carries each trip's own id (``trip_id``: CSV ``trip_id``, DiDi ``order_id``, GeoLife
``<user>/<file stem>``, DeepTTE ``tripID`` or the line number), ``dropped_trips`` (the skipped trips
whose id is known) and ``tz``, the format's time zone that preprocessing uses by default (GeoLife,
DiDi, DeepTTE, T-Drive: Asia/Shanghai; Porto: Europe/Lisbon; CSV and Parquet: the offsets its timestamps
carry, else UTC, or a Parquet timestamp column's zone).
:func:`detect_format` guesses the format from the content; :func:`read_any` detects and reads.
"""
from __future__ import annotations

import contextlib
import csv
import difflib
import itertools
import json
import logging
import os
import re
import zipfile
from pathlib import Path

from stfast.data.errors import TrajectoryFormatError
from stfast.data.readers._common import _check_on_error, _is_didi_data_file, _require_file, shown
from stfast.data.readers.columns import current as mapped_columns
from stfast.data.readers.csv_points import CSV_REQUIRED, read_csv_points
from stfast.data.readers.deeptte_json import DEEPTTE_KEYS, deeptte_files, read_deeptte_jsonl
from stfast.data.readers.didi_gaia import read_didi_gaia
from stfast.data.readers.geolife import GEOLIFE_EPOCH, GEOLIFE_HEADER_LINES, read_geolife
from stfast.data.readers.parquet_points import is_table_file, read_parquet_points, table_files
from stfast.data.readers.porto import PORTO_REQUIRED, read_porto
from stfast.data.readers.tdrive import first_line_is_tdrive, read_tdrive, tdrive_files

log = logging.getLogger("stfast.data")

FORMATS = ("deeptte", "geolife", "didi", "csv", "porto", "tdrive", "parquet")

_DIDI_LINE = re.compile(r"[^,]+,[^,]+,\d{10},[^,]+,[^,]+")


def _first_nonblank_line(path: Path, limit: int = 1 << 16) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(limit)
    except OSError as e:
        raise TrajectoryFormatError(path, None, None, f"cannot open: {e.strerror or e}") from None
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    lines = text.splitlines()
    if len(head) == limit and lines:
        lines = lines[:-1] if len(lines) > 1 else lines  # the last one may be cut
    for ln in lines:
        if ln.strip():
            return ln.strip()
    return None


NAMES = {"deeptte": "DeepTTE JSON lines", "geolife": "GeoLife .plt", "didi": "DiDi GAIA gps_*", "csv": "a point CSV",
         "porto": "a Porto taxi CSV", "tdrive": "T-Drive taxi .txt", "parquet": "Parquet / Arrow points"}
"""Each format in words, as messages name it."""
_RUN_FILES = ("checkpoint.pt", "last.pt", "metrics.jsonl", "summary.json")  # what marks a training run's folder


def _unrecognized(path, detail: str) -> TrajectoryFormatError:
    from .columns import EXAMPLE

    hint = "" if Path(path).is_dir() else f"; a CSV of another layout reads with --columns {EXAMPLE}"
    return TrajectoryFormatError(
        path, None, None, f"could not recognize the format ({detail}); known formats: {', '.join(FORMATS)}{hint}"
    )


def _what_to_give(folder: Path, files: list[Path]) -> str:
    """For a folder no format recognizes, what in it to give as --data instead: a subfolder of DiDi GAIA gps_* files
    (a data set's folder with its notes beside), or one of its JSON-lines files when other files sit beside them (the
    Chengdu sample: config.json, SOURCE.txt and the records ``test``); empty when neither."""
    for sub in sorted(c for c in folder.iterdir() if c.is_dir() and not c.name.startswith(".")):
        try:
            if any(_is_didi_data_file(c) for c in itertools.islice(sub.iterdir(), 1000)):
                return f"; its folder {sub.name} holds DiDi GAIA gps_* files: --data {sub}"
        except OSError:  # a folder it may not read: not a hint, and not the error to report
            continue
    records = [f for f in files if _is_json_object(_first_nonblank_line(f))]  # a config.json's "{" line is not
    if records:
        return f"; {records[0].name} is JSON lines, with other files beside it: --data {records[0]}"
    return ""


def _is_json_object(line: str | None) -> bool:
    """Whether ``line`` is a whole JSON object (a JSON-lines record)."""
    try:
        return line is not None and line.startswith("{") and isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _not_trajectories(path: Path) -> TrajectoryFormatError | None:
    """A stfast output given as data (a checkpoint, a training run's folder): the error that names it, else None."""
    if path.is_dir():
        held = [n for n in _RUN_FILES if (path / n).is_file()]
        if held:
            return TrajectoryFormatError(path, None, None, f"is the folder of a training run ({', '.join(held)}), not "
                                         "trajectories: give its checkpoint.pt as --checkpoint and the trips as --data")
        return None
    try:
        names = zipfile.ZipFile(path).namelist() if zipfile.is_zipfile(path) else []
    except (OSError, zipfile.BadZipFile):
        names = []
    if any(n.endswith("/data.pkl") for n in names):  # torch.save's archive
        return TrajectoryFormatError(path, None, None, "is a stfast checkpoint (a model), not trajectories: give it "
                                     "as --checkpoint and the trips as --data")
    return None


def _closest_header(names: list[str]) -> str:
    """What a header line (``names``, as written) lacks of the header format it is closest to: ``; closest: csv
    (a point CSV), which needs column 'lat' (has 'latitude')``; empty when it shares fewer than 2 names with each."""
    have = {n.strip().lower() for n in names}
    best = max((("csv", CSV_REQUIRED), ("porto", PORTO_REQUIRED)), key=lambda f: len(have & {c.lower() for c in f[1]}))
    fmt, need = best
    if len(have & {c.lower() for c in need}) < 2:
        return ""
    missing = [c for c in need if c.lower() not in have]
    parts = []
    for c in missing:
        other = sorted(have - {n.lower() for n in need})
        near = [n for n in other if n.startswith(c.lower())] or difflib.get_close_matches(c.lower(), other, n=1)
        parts.append(f"'{c}'" + (f" (has '{near[0]}': rename it)" if near else ""))
    return f"; closest: {fmt} ({NAMES[fmt]}), whose header lacks column {', '.join(parts)}"


def detect_format(path: str | os.PathLike) -> str:
    """Guess the format of ``path`` from its content; returns one of :data:`FORMATS`.

    Rules, in order: a directory holding ``.plt`` files (at any depth) → ``"geolife"``; a directory
    holding ``gps_*`` files → ``"didi"``; a directory holding Parquet / Arrow files (by suffix, the first
    checked by its magic bytes) → ``"parquet"``; a directory whose files (:func:`deeptte_files`) all start with
    ``{`` → ``"deeptte"``; a directory whose non-empty ``*.txt`` files all start with a T-Drive line →
    ``"tdrive"``; a ``.plt`` file or one whose first line is ``Geolife trajectory`` → ``"geolife"``; a file
    starting with Parquet's ``PAR1`` or Arrow's ``ARROW1`` (or an IPC stream's marker) → ``"parquet"``;
    first non-blank line starting with ``{`` → ``"deeptte"``; a header line whose comma-separated names
    include ``trip_id,timestamp,lng,lat`` → ``"csv"``, or ``TRIP_ID, TAXI_ID, TIMESTAMP, MISSING_DATA,
    POLYLINE`` → ``"porto"``; a line ``taxi_id,yyyy-mm-dd HH:MM:SS,lng,lat`` → ``"tdrive"``; a line of 5
    comma fields whose third is a 10-digit integer (no header) → ``"didi"``.

    Raises:
        TrajectoryFormatError: missing path ("no such file"), or nothing matched (the message lists
        the known formats).
    """
    p = _require_file(path)
    own = _not_trajectories(p)
    if own is not None:
        raise own
    if p.is_dir():
        if next(iter(p.rglob("*.plt")), None) is not None:
            return "geolife"
        if any(_is_didi_data_file(c) for c in p.iterdir()):
            return "didi"
        tables = table_files(p)
        if tables and is_table_file(tables[0]):
            return "parquet"
        files = deeptte_files(p)
        if files and all((_first_nonblank_line(f) or "").startswith("{") for f in files):
            return "deeptte"
        txt = [ln for ln in map(_first_nonblank_line, tdrive_files(p)) if ln is not None]
        if txt and all(map(first_line_is_tdrive, txt)):
            return "tdrive"
        raise _unrecognized(path, "directory holds neither .plt, gps_*, Parquet / Arrow nor T-Drive files, nor "
                                  "only JSON-lines files" + _what_to_give(p, files))
    if p.suffix.lower() == ".plt":
        return "geolife"
    if is_table_file(p):
        return "parquet"
    first = _first_nonblank_line(p)
    if first is None:
        raise _unrecognized(path, "file is empty")
    if first.startswith("{"):
        return "deeptte"
    if first.lower() == "geolife trajectory":
        return "geolife"
    try:
        row = next(csv.reader([first]))
    except (csv.Error, StopIteration):
        row = []
    names = {c.strip().lower() for c in row}
    if set(CSV_REQUIRED) <= names:
        return "csv"
    if {n.upper() for n in names} >= set(PORTO_REQUIRED):
        return "porto"
    if first_line_is_tdrive(first):
        return "tdrive"
    if _DIDI_LINE.fullmatch(first):
        return "didi"
    raise _unrecognized(path, f"first line {shown(first)!r}{_closest_header(row)}")


_READERS = {
    "deeptte": read_deeptte_jsonl,
    "geolife": read_geolife,
    "didi": read_didi_gaia,
    "csv": read_csv_points,
    "porto": read_porto,
    "tdrive": read_tdrive,
    "parquet": read_parquet_points,
}


def read_any(path: str | os.PathLike, format: str = "auto", *, on_error: str = "raise"):
    """Read ``path`` with the reader of ``format`` (``"auto"``: :func:`detect_format`).

    Returns :class:`~stfast.data.trips.Trips` for ``"deeptte"``, else
    :class:`~stfast.data.trips.Trajectories`. Logs the chosen format at INFO on ``stfast.data``.

    Raises:
        TrajectoryFormatError: missing path (``"no such file"``), unrecognised content, bad records.
        ValueError: ``format`` not ``"auto"`` nor one of :data:`FORMATS`, or a bad ``on_error``.
    """
    _check_on_error(on_error)
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be 'auto' or one of {FORMATS}, not {format!r}")
    _require_file(path)
    cmap = mapped_columns()
    if cmap is not None:  # --columns: a CSV of another layout, read through the names it gives
        if format not in ("auto", "csv"):
            raise ValueError(f"--columns reads a CSV: give --format csv or auto, not {format}")
        log.info("%s: reading as a CSV of %s, through --columns", path, "trips" if cmap.layout == "polyline" else "points")
        if cmap.layout == "polyline":
            from .polyline_csv import read_polyline_csv

            return read_polyline_csv(path, on_error=on_error)
        return _READERS["csv"](path, on_error=on_error)
    fmt = detect_format(path) if format == "auto" else format
    log.info("%s: reading as %s%s", path, fmt, " (detected)" if format == "auto" else "")
    with given_format(path, format):
        return _READERS[fmt](path, on_error=on_error)


@contextlib.contextmanager
def given_format(path, format: str):
    """Reading ``path`` as ``format``, a format the user gave (``auto``: none): a TrajectoryFormatError of a file
    that detection recognizes as another format is raised as one that names it (``--format csv (a point CSV) does
    not fit: it looks like DeepTTE JSON lines; give --format deeptte``), the reader's own reason cut short."""
    try:
        yield
    except TrajectoryFormatError as e:
        if format in ("auto", "synthetic") or path is None:
            raise
        try:
            actual = detect_format(path)
        except TrajectoryFormatError:
            raise e from None
        if actual == format:
            raise
        raise TrajectoryFormatError(path, None, None, f"--format {format} ({NAMES[format]}) does not fit: it looks "
                                    f"like {NAMES[actual]}; give --format {actual} or --format auto "
                                    f"(as {format}: {shown(e.reason, 100)})") from None


__all__ = [
    "FORMATS",
    "DEEPTTE_KEYS",
    "CSV_REQUIRED",
    "GEOLIFE_EPOCH",
    "GEOLIFE_HEADER_LINES",
    "detect_format",
    "given_format",
    "read_any",
    "read_csv_points",
    "read_deeptte_jsonl",
    "read_didi_gaia",
    "read_geolife",
    "read_parquet_points",
    "read_porto",
    "read_tdrive",
]
