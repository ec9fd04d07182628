"""Atomic checkpoints: write to a temp file in the same folder, fsync, then rename over the target.

A run that dies midway therefore leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch


def save_atomic(obj: dict, path: str | os.PathLike) -> None:
    """torch.save ``obj`` to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load(path: str | os.PathLike, map_location="cpu") -> dict:
    """Load a checkpoint. Raises FileNotFoundError naming the path, or ValueError if it is unreadable."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # truncated or not a checkpoint
        raise ValueError(f"checkpoint {path} is unreadable ({type(e).__name__}: {e})") from e


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
