"""Damage detection for what stfast keeps on disk: checksums of files, seals of JSON records, and the stamps that say a
file has not changed since it was last checked.

Checksums are XXH3-64 (the ``xxhash`` library): non-cryptographic, at memory speed (about 10 GB/s on one core), so
a store of many gigabytes is checked in seconds; they detect damage (flipped bits, truncation, files swapped or
edited), not tampering. A store records one per file in its manifest at conversion (:mod:`stfast.data.store`); a
file is hashed again when its :func:`stamp` (size, mtime, inode, ctime) differs from the one recorded when it was
last found intact, so an unchanged store opens without reading its columns.
"""
from __future__ import annotations

import json
import os

import xxhash

CHECKSUM = "xxh3_64"  # the key under which checksums are recorded (named by the algorithm)
_READ = 8 << 20  # bytes hashed at a time: memory stays flat whatever the file's size


class DamagedError(ValueError):
    """A file stfast wrote (a store's column, its manifest, a kept derived value) is not what was written.

    Attributes:
        path: the damaged file (str). reason: what was found, in words.
    """

    def __init__(self, path: str | os.PathLike, reason: str, fix: str = ""):
        self.path, self.reason, self.fix = str(path), reason, fix
        super().__init__(f"{self.path}: damaged ({reason})" + (f"; {fix}" if fix else ""))

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.path, self.reason, self.fix))


def checksum_differs(path: str | os.PathLike, got: str, recorded: str,
                     when: str = "when it was written") -> DamagedError:
    """The damage of ``path`` whose checksum is ``got`` where ``recorded`` (hex :data:`CHECKSUM`s) was recorded
    ``when`` ("at conversion"): one wording for every checksum stfast checks (a store's file, a sealed record, a
    kept derived value)."""
    return DamagedError(path, f"its {CHECKSUM} checksum {got} differs from {recorded}, recorded {when}")


def file_checksum(path: str | os.PathLike) -> str:
    """Hex XXH3-64 of the file's bytes, read in pieces of 8 MiB. Raises OSError."""
    h = xxhash.xxh3_64()
    buf = bytearray(_READ)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def stamp(path: str | os.PathLike) -> list[int]:
    """[size in bytes, mtime ns, inode, ctime ns] of ``path``: any write, truncation, rename over it or copy changes
    one of them. Raises OSError."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _canonical(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, default=str).encode()


def seal(record: dict) -> dict:
    """``record`` (JSON-serializable) with its checksum under :data:`CHECKSUM`, for :func:`unseal` to check."""
    body = {k: v for k, v in record.items() if k != CHECKSUM}
    return {**body, CHECKSUM: xxhash.xxh3_64_hexdigest(_canonical(body))}


def unseal(record, path: str | os.PathLike) -> dict:
    """``record`` as :func:`seal` made it, its checksum checked (and removed).

    Raises:
        DamagedError: not a sealed record, or its content differs from what was sealed (an edit, a key missing).
    """
    if not isinstance(record, dict) or CHECKSUM not in record:
        raise DamagedError(path, f"no {CHECKSUM} checksum in it")
    body = {k: v for k, v in record.items() if k != CHECKSUM}
    got = xxhash.xxh3_64_hexdigest(_canonical(body))
    if got != record[CHECKSUM]:
        raise checksum_differs(path, got, record[CHECKSUM])
    return body


def read_sealed(path: str | os.PathLike) -> dict:
    """The sealed JSON record in file ``path`` (:func:`unseal`). Raises OSError when unreadable, DamagedError when
    not JSON or not intact."""
    text = open(path, "rb").read()
    try:
        record = json.loads(text)
    except ValueError as e:
        raise DamagedError(path, f"not JSON: {e}" if text else "empty file") from None
    return unseal(record, path)
