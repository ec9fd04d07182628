"""One entry point from a path (or nothing: the synthetic city) to preprocessed trips."""
from __future__ import annotations

import dataclasses
import logging

from .trips import Trajectories, Trips

log = logging.getLogger("stfast.data")


def load_trips(data: str | None, fmt: str = "auto", *, on_error: str = "raise", modes=None,
               n_synthetic: int = 20000, seed: int = 0, preprocess_config=None) -> Trips:
    """Read ``data`` in format ``fmt`` (``auto`` detects it) and preprocess raw trajectories into trips.

    ``data=None`` or ``fmt="synthetic"`` generates ``n_synthetic`` trips of the synthetic city with
    ``seed``. ``modes`` (set of GeoLife transport modes) keeps only trips those labels cover.
    Raises TrajectoryFormatError on bad input (see the readers).
    """
    if data is None or fmt == "synthetic":
        from .synthetic import synthetic_trips

        return synthetic_trips(n_synthetic, seed=seed)
    from .readers import read_any

    got = read_any(data, fmt, on_error=on_error)
    if isinstance(got, Trajectories):
        from .preprocess import PreprocessConfig, preprocess

        cfg = preprocess_config or PreprocessConfig()
        if modes:
            cfg = dataclasses.replace(cfg, modes=set(modes))
        got = preprocess(got, cfg)
    return got
