"""One entry point from a path (or nothing: the synthetic city) to preprocessed trips."""
from __future__ import annotations

import logging

from .trips import Trajectories, Trips

log = logging.getLogger("stfast.data")


def load_trips(data: str | None, fmt: str = "auto", *, on_error: str = "raise", modes=None,
               min_spacing_km: float | None = 0.2, gap_s: float = 1200.0,
               n_synthetic: int = 20000, seed: int = 0, preprocess_config=None) -> Trips:
    """Read ``data`` in format ``fmt`` (``auto`` detects it) and preprocess raw trajectories into trips.

    ``data=None`` or ``fmt="synthetic"`` generates ``n_synthetic`` trips of the synthetic city with
    ``seed``. For raw traces (GeoLife, DiDi, CSV): ``modes`` (set of GeoLife transport modes) keeps
    only trips those labels cover; ``min_spacing_km`` resamples to points at least that far apart
    (DeepTTE's data is ~0.2–0.4 km apart; None or 0 keeps every point); ``gap_s`` splits trips at
    longer time gaps. ``preprocess_config`` overrides all three.
    Raises TrajectoryFormatError on bad input (see the readers).
    """
    if data is None or fmt == "synthetic":
        from .synthetic import synthetic_trips

        return synthetic_trips(n_synthetic, seed=seed)
    from .readers import read_any

    got = read_any(data, fmt, on_error=on_error)
    if isinstance(got, Trajectories):
        from .preprocess import PreprocessConfig, preprocess

        cfg = preprocess_config or PreprocessConfig(modes=set(modes) if modes else None,
                                                    min_spacing_km=min_spacing_km or None, gap_s=gap_s)
        got = preprocess(got, cfg)
    return got
