"""The one exception every trajectory reader raises on bad input."""
from __future__ import annotations

import os


class TrajectoryFormatError(ValueError):
    """Bad input in a trajectory file.

    Attributes:
        path: file that holds the bad record (str).
        line: 1-based line number, or None when the fault is not tied to one line.
        at: where in a file without lines (a Parquet / Arrow table: ``"row group 2, row 17"``, 0-based), or None.
        field: name of the offending field (for example ``"time_gap"``), or None.
        reason: what is wrong, in words.

    Subclasses ValueError so that callers catching ValueError still see it, but readers never raise
    a bare KeyError/IndexError/ValueError.
    """

    def __init__(self, path: str | os.PathLike, line: int | None, field: str | None, reason: str,
                 at: str | None = None):
        self.path = str(path)
        self.line = line
        self.at = at
        self.field = field
        self.reason = reason
        where = self.path if line is None else f"{self.path}:{line}"
        where = where if at is None else f"{where}: {at}"
        what = f" field '{field}'" if field else ""
        super().__init__(f"{where}:{what} {reason}".replace(": ", ": ", 1))

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.path, self.line, self.field, self.reason, self.at))
