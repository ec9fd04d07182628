"""Atomic, hashed checkpoints with a previous generation.

A checkpoint file is ``torch.save`` of a small wrapper ``{"format", "sha256", "payload"}``: ``payload``
is the ``torch.save`` bytes of the state dict and ``sha256`` their SHA-256, so a truncated or corrupted
file is detected on load (a ValueError naming the file) instead of resuming from garbage. Writes go to a
temp file in the same folder, are fsynced, then renamed over the target (POSIX rename is atomic), so a
run that dies midway leaves the previous checkpoint intact. With ``keep_previous`` the file being
replaced is first hard-linked to ``<name>.prev.pt``, the generation :func:`load_first` falls back to, so
the target name never goes missing, not even for a moment.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from ..data.durable import atomic_file, os_error_line

FORMAT = "stfast-checkpoint/1"
log = logging.getLogger("stfast.train")


def previous_path(path: str | os.PathLike) -> Path:
    """``last.pt`` → ``last.prev.pt``: where :func:`save_atomic` keeps the generation it replaces."""
    p = Path(path)
    return p.with_name(f"{p.stem}.prev{p.suffix}")


def _keep_previous(path: Path) -> None:
    """Make the current ``path`` the previous generation while ``path`` itself stays in place: a hard link
    (or, where the file system has none, a copy) under a temp name, renamed over ``.prev.pt``. A kill at
    any point leaves an intact ``path`` (a rename of ``path`` itself would leave a moment with none)."""
    prev = previous_path(path)
    tmp = path.with_name(f".{prev.name}.tmp{os.getpid()}")
    try:
        if tmp.exists():
            tmp.unlink()
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copy2(path, tmp)
        os.replace(tmp, prev)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_atomic(obj: dict, path: str | os.PathLike, keep_previous: bool = False) -> None:
    """torch.save ``obj`` to ``path`` atomically, with the SHA-256 of its bytes; with ``keep_previous``
    an existing ``path`` becomes :func:`previous_path` first.

    Raises:
        ValueError: an OS error (full disk, read-only, permissions), in one line naming ``path``; ``path`` is left
            as it was.
    """
    path = Path(path)
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    buf = io.BytesIO()  # torch.save into a file turns its OSError (a full disk) into a bare RuntimeError
    torch.save({"format": FORMAT, "sha256": hashlib.sha256(payload).hexdigest(), "payload": payload}, buf)

    def previous_kept():  # after the new file is whole, right before it replaces the old
        if keep_previous and path.is_file():
            _keep_previous(path)

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, before_replace=previous_kept) as f:
            f.write(buf.getbuffer())
    except OSError as e:
        raise ValueError(os_error_line(e, f"cannot write {path}")) from None


def _folder_given(path: Path) -> str:
    """The refusal of a folder given for a checkpoint file: a run folder's checkpoint named, a trips store named as
    data, else the file to look for (none suggested that is not there)."""
    from ..data.store import is_store

    if is_store(path):
        return (f"{path} is a trips store (data), not a checkpoint: give it as --data, and as --checkpoint the "
                "checkpoint.pt of a stfast train run")
    have = [path / n for n in ("checkpoint.pt", "last.pt") if (path / n).is_file()]
    if have:
        return f"{path} is a folder: give the checkpoint file, e.g. {have[0]}"
    return (f"{path} is a folder with no checkpoint.pt in it: give the checkpoint file of a stfast train run (its "
            "--out folder's checkpoint.pt)")


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load a checkpoint and check its SHA-256 (files without a hash, from before stfast wrote one,
    load unchecked). Raises FileNotFoundError naming the path, or ValueError if the file is truncated,
    corrupt (hash mismatch) or not a checkpoint."""
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(_folder_given(path))
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated or not a checkpoint
        raise ValueError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e})") from e
    if not (isinstance(obj, dict) and obj.get("format") == FORMAT):
        return obj
    payload = obj.get("payload")
    if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != obj.get("sha256"):
        raise ValueError(f"checkpoint {path} is corrupt (SHA-256 of its payload does not match)")
    try:
        return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)
    except Exception as e:
        raise ValueError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e})") from e


def load_first(paths, map_location="cpu") -> tuple[dict, Path]:
    """The first of ``paths`` that exists and loads intact, and its path. A corrupt or truncated one is
    skipped with a warning naming it and the file used instead.

    Raises:
        FileNotFoundError: none of the paths exists.
        ValueError: every existing one is corrupt (the message names them).
    """
    bad = []
    for p in map(Path, paths):
        if not p.is_file():
            continue
        try:
            state = load(p, map_location)
        except ValueError as e:
            bad.append(str(e))
            continue
        for msg in bad:
            log.warning("%s; using %s instead", msg, p)
        return state, p
    if bad:
        raise ValueError("no intact checkpoint: " + "; ".join(bad))
    raise FileNotFoundError(f"no checkpoint at any of {', '.join(map(str, paths))}")


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])


def save_last(trainer, best: bool = False) -> None:
    """A :class:`~stfast.train.trainer.Trainer`'s last.pt (rank 0; keeping the previous one) and with ``best``
    checkpoint.pt, whose weights are the validated ones: the weights' average under --swa-start or --ema-decay."""
    if trainer.info.is_main:
        st = trainer.state()
        if best:
            save_validated(trainer, st)
        save_atomic(st, trainer.out / "last.pt", keep_previous=True)


def save_validated(trainer, st: dict | None = None) -> None:
    """A Trainer's checkpoint.pt (rank 0): its state ``st`` (default: the current one) with the validated weights."""
    if trainer.info.is_main:
        st = trainer.state() if st is None else st
        save_atomic(dict(st, model_state=trainer.eval_model.state_dict()), trainer.out / "checkpoint.pt")
