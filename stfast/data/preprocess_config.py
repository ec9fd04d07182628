"""The settings of :func:`stfast.data.preprocess.preprocess`: what a trips set records of how it was made
(``Trips.preprocess_config``, a store's manifest, a checkpoint)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stfast.data.tz import check_tz


@dataclass
class PreprocessConfig:
    """Settings of :func:`~stfast.data.preprocess.preprocess` (all optional; the defaults suit taxi GPS such as Chengdu/DiDi).

    Attributes:
        max_speed_kmh: a point implying more than this speed (km/h) from the previous kept point is a
            speed outlier. None: no speed filter. Default 200.
        gap_s: a time gap above this (seconds) between consecutive points splits the trip. Default 1200
            (20 min).
        stay_radius_m: radius (metres) of a stay. Default 100 m: above urban GPS noise (10–30 m) and a
            parking manoeuvre, below one city block, so a vehicle in slow traffic that moves a block in
            ``stay_min_s`` is not taken for staying.
        stay_min_s: minimum duration (seconds) of a stay. None: no stay detection. Default 600 (10 min).
        modes: transport modes to keep (GeoLife labels such as {"car", "taxi"}); when given and the
            trajectories carry a ``mode`` array, trips also break where the mode changes and trips of
            other modes (including unlabelled "") are dropped. Ignored, with a warning, when the input
            has no modes. Any iterable of str (a single str is one mode); stored as a frozenset.
        min_spacing_km: when set, resample: keep a point only if it is at least this far (haversine, km)
            from the last kept point; the trip's last point is always kept. DeepTTE's Chengdu samples
            are about 0.2–0.4 km apart; 0.2 is a typical choice. Default None (off).
        tz: time zone of weekID/timeID/dateID: an IANA name such as "Europe/Lisbon" (DST-correct at
            each trip's start, through :mod:`zoneinfo`), or :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`
            (each trip's first timestamp's own UTC offset, UTC where it had none). Default None: the
            trajectories' own ``tz``, their format's default (Asia/Shanghai for GeoLife, DiDi and the
            synthetic city; for the point CSV the timestamps' offsets, else UTC).
        min_points: fewer points than this drops the trip ("too_short"). Default 3, DeepTTE's
            geo-conv kernel size (shorter trips have no conv output).
        min_time_s: a trip shorter than this (seconds) is dropped ("too_short_time"). Default 60.
        min_dist_km: a trip shorter than this (km) is dropped ("too_short_dist"). Default 0.5.
        max_points: when set, a trip with more points is dropped ("too_long"). Default None.

    :meth:`to_dict` / :meth:`from_dict` turn a config into a JSON-able dict and back (for checkpoints).

    Raises:
        ValueError: a value out of range (negative durations or distances, min_points < 1,
            max_points < min_points, an unknown time zone), at construction and again in
            :func:`preprocess` (the dataclass is mutable, so fields set later are checked there).
    """

    max_speed_kmh: float | None = 200.0
    gap_s: float = 1200.0
    stay_radius_m: float = 100.0
    stay_min_s: float | None = 600.0
    modes: frozenset | None = None
    min_spacing_km: float | None = None
    tz: str | None = None
    min_points: int = 3
    min_time_s: float = 60.0
    min_dist_km: float = 0.5
    max_points: int | None = None

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Normalise ``modes`` to a frozenset and check every value (ValueError when out of range)."""
        if self.modes is not None:
            self.modes = frozenset([self.modes] if isinstance(self.modes, str) else self.modes)
        if self.max_speed_kmh is not None and not self.max_speed_kmh > 0:
            raise ValueError(f"max_speed_kmh must be > 0 or None, not {self.max_speed_kmh}")
        if not self.gap_s > 0:
            raise ValueError(f"gap_s must be > 0, not {self.gap_s}")
        if not self.stay_radius_m >= 0:
            raise ValueError(f"stay_radius_m must be >= 0, not {self.stay_radius_m}")
        if self.stay_min_s is not None and not self.stay_min_s > 0:
            raise ValueError(f"stay_min_s must be > 0 or None, not {self.stay_min_s}")
        if self.min_spacing_km is not None and not self.min_spacing_km > 0:
            raise ValueError(f"min_spacing_km must be > 0 or None, not {self.min_spacing_km}")
        if self.tz is not None:
            check_tz(self.tz)
        if int(self.min_points) != self.min_points or self.min_points < 1:
            raise ValueError(f"min_points must be an integer >= 1, not {self.min_points}")
        if not self.min_time_s >= 0 or not self.min_dist_km >= 0:
            raise ValueError("min_time_s and min_dist_km must be >= 0")
        if self.max_points is not None and self.max_points < self.min_points:
            raise ValueError(f"max_points ({self.max_points}) must be >= min_points ({self.min_points})")

    def to_dict(self) -> dict:
        """Every field by name, JSON-able: ``modes`` as a sorted list (or None), the rest as they are."""
        d = dataclasses.asdict(self)
        d["modes"] = None if self.modes is None else sorted(self.modes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PreprocessConfig":
        """The config :meth:`to_dict` wrote (missing keys take the defaults).

        Raises:
            ValueError: a key that is not a field (named), or a value out of range.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown PreprocessConfig field(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return cls(**d)
