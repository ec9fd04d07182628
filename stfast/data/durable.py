"""Writes that survive a crash: fsync of files and folders before a rename, a folder replaced by two renames that the
next open completes or undoes, and the temporary folders of processes that died cleaned up by the next writer.

POSIX ``rename`` is atomic, but without ``fsync`` the renamed file's data (and the rename itself) may still be in the
page cache when the machine loses power: after a reboot the new name can point at an empty or partial file. So a
writer fsyncs the file (its data), then renames it, then fsyncs the folder (the rename). A folder cannot be renamed
over a non-empty one, so replacing one takes two renames (the old aside as ``.NAME.old<PID>``, the new into place):
:func:`recover_folder` finishes or undoes what a process killed between them left.

Temporary names are ``.NAME.<kind><PID>`` (kind ``tmp``, ``spill``, ``old``) beside ``NAME``: :func:`dead_leftovers`
finds those whose process is gone.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from pathlib import Path
from typing import IO, Callable, Iterator

log = logging.getLogger("stfast.data")

_ASIDE = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|spill|old)(?P<pid>\d+)$")


def aside(path: Path, kind: str, pid: int | None = None) -> Path:
    """``dir/NAME`` → ``dir/.NAME.<kind><pid>`` (default: this process's): a temporary name beside ``path``."""
    return path.with_name(f".{path.name}.{kind}{os.getpid() if pid is None else pid}")


def fsync_file(path: str | os.PathLike) -> None:
    """Flush ``path``'s data to the disk (it must be closed or flushed by its writer first). Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(d: str | os.PathLike) -> None:
    """Flush folder ``d``'s entries (the renames and creations in it) to the disk; nothing where the platform cannot
    open or fsync a folder (the rename itself is still atomic)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(folder: str | os.PathLike) -> None:
    """fsync every file under ``folder``, then every folder from the deepest up (``folder`` included)."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for f in files:
            fsync_file(os.path.join(root, f))
        fsync_dir(root)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", before_replace: Callable[[], None] | None = None,
                **open_kw) -> Iterator[IO]:
    """A file to write ``path`` through, durably and atomically: the block writes a temporary file beside it
    (:func:`aside`), which is fsynced, renamed into place (after ``before_replace()``, where given) and its folder
    fsynced when the block ends; on any failure (in the block too) the temporary is removed and ``path`` is as it
    was. ``mode`` and ``open_kw`` are :func:`open`'s (a writing mode). Raises OSError."""
    path = Path(path)
    tmp = aside(path, "tmp")
    try:
        with open(tmp, mode, **open_kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` durably and atomically (:func:`atomic_file`). Raises OSError."""
    with atomic_file(path) as f:
        f.write(data)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (on this machine) and has not ended. A process of another user counts as
    alive; one that ended and waits for its parent to collect its exit status (a zombie: a killed convert whose
    parent has not waited for it yet) does not, where ``/proc`` tells."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _ended(pid)


def _ended(pid: int) -> bool:
    """Whether every thread of process ``pid`` has ended (state Z or X in ``/proc/PID/task/*/stat``); False where
    that cannot be read (no ``/proc``, the process gone meanwhile)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for t in tasks:
            with open(f"/proc/{pid}/task/{t}/stat", "rb") as f:
                stat = f.read()
            states.append(stat[stat.rfind(b")") + 2:][:1])  # after the command name, which may hold ") "
    except OSError:
        return False
    return bool(states) and all(st in (b"Z", b"X") for st in states)


def replace_folder(new: Path, out: Path) -> None:
    """Make the complete folder ``new`` (beside ``out``) the folder ``out``, durably: ``new``'s files and folders
    fsynced, an existing ``out`` renamed aside (``.NAME.old<PID>``), ``new`` renamed to ``out``, the parent fsynced,
    then the old one removed. A crash between the two renames leaves ``out`` missing and the old folder aside, which
    :func:`recover_folder` (called by the next open or write) renames back. Raises OSError."""
    fsync_tree(new)
    old = aside(out, "old")
    if out.exists():
        os.replace(out, old)
        fsync_dir(out.parent)
    os.replace(new, out)
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)


def recover_folder(out: Path, is_ours: Callable[[Path], bool]) -> None:
    """Finish what :func:`replace_folder` of a process that died left of ``out``: with ``out`` missing, the old folder
    it had renamed aside is renamed back (the swap undone, logged); with ``out`` in place, a leftover old folder is
    removed (the swap was done). Only folders ``is_ours`` accepts are touched, only those of dead processes.

    Raises:
        ValueError: the old folder could not be renamed back (read-only parent): the message names both paths.
    """
    try:
        olds = [p for p in out.parent.iterdir() if _is_dead_aside(p, out.name, "old")]
    except OSError:
        return
    for old in sorted(olds, reverse=True):
        if not is_ours(old):
            continue
        if not os.path.lexists(out):
            try:
                os.replace(old, out)
                fsync_dir(out.parent)
            except OSError as e:
                raise ValueError(f"{out} is missing and its previous version is at {old} (a conversion was stopped "
                                 f"while replacing it); renaming it back failed ({e.strerror}): rename it to "
                                 f"{out.name} yourself") from None
            log.warning("%s: restored from %s, where a conversion stopped while replacing it left it", out, old.name)
        else:
            shutil.rmtree(old, ignore_errors=True)


def _is_dead_aside(p: Path, name: str | None, kind: str | None, files: bool = False) -> bool:
    m = _ASIDE.match(p.name)
    return bool(m and (name is None or m["name"] == name) and (kind is None or m["kind"] == kind)
                and (p.is_dir() or (files and p.is_file())) and not p.is_symlink() and not pid_alive(int(m["pid"])))


def dead_leftovers(parent: Path, kinds: tuple[str, ...], files: bool = False) -> list[Path]:
    """The folders (and with ``files``, the files) ``.NAME.<kind><PID>`` in ``parent`` (of the ``kinds`` given) whose
    process ``PID`` is gone."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if any(_is_dead_aside(p, None, k, files) for k in kinds))


_HINTS = {errno.EROFS: "the file system is read-only: choose a folder on a writable one",
          errno.ENOSPC: "the disk is full: free space or choose a folder on another disk",
          errno.EDQUOT: "the disk quota is exceeded: free space or choose a folder on another disk",
          errno.EACCES: "permission denied: choose a folder you may write, or change its permissions",
          errno.EPERM: "operation not permitted: choose a folder you may write, or change its permissions",
          # a rename of a mount point (the folder a bind mount is attached to, read-only or not)
          errno.EBUSY: "a mount point (or a path in use) cannot be replaced: write to a folder inside it, or to a "
                       "new path"}


def refuse_under_a_file(out: str | os.PathLike, flag: str = "--out") -> None:
    """ValueError naming ``flag`` and the file when the nearest existing path above ``out`` is a file, not a folder:
    nothing can be written under it (the OS error would come only after the input was read, and named a temporary)."""
    for p in Path(os.path.abspath(out)).parents:
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise ValueError(f"{flag} {out}: {p} is a file, not a folder, so nothing can be written under it; "
                                 "choose a path in a folder")
            return


def os_error_line(e: OSError, doing: str, writing: bool = True) -> str:
    """One line for an OS error while ``doing`` (e.g. ``"writing the trips store /data/s"``): the path, the system's
    words and, when ``writing``, what to do (read-only file system, full disk, permissions)."""
    where = f" {e.filename}" if e.filename else ""
    hint = _HINTS.get(e.errno) if writing else None
    return f"{doing}:{where}{':' if where else ''} {e.strerror or e}" + (f"; {hint}" if hint else "")
