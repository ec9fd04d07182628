"""One entry point from a path (or nothing: the synthetic city) to preprocessed trips."""
from __future__ import annotations

import dataclasses
import logging

import numpy as np

from .._plural import counted
from .readers.deeptte_json import DEEPTTE_TZ
from .readers.didi_gaia import DIDI_TZ
from .readers.geolife import GEOLIFE_TZ
from .readers.porto import PORTO_TZ
from .readers.tdrive import TDRIVE_TZ
from .trip_filters import TripFilterTally, no_trips_line
from .synthetic import SyntheticCityConfig
from .trips import DroppedTrips, Trajectories, Trips
from .tz import TZ_FROM_TIMESTAMPS, check_tz

log = logging.getLogger("stfast.data")

DEFAULT_TZ = {
    "geolife": GEOLIFE_TZ,
    "didi": DIDI_TZ,
    "deeptte": DEEPTTE_TZ,
    "csv": TZ_FROM_TIMESTAMPS,  # UTC where a timestamp carries no offset (all naive: "UTC")
    "parquet": TZ_FROM_TIMESTAMPS,  # as csv; a timestamp column with a zone: that zone
    "porto": PORTO_TZ,
    "tdrive": TDRIVE_TZ,
    "synthetic": SyntheticCityConfig.tz,
}
"""The time zone each format uses when ``tz`` is None (see :mod:`stfast.data.tz` for the values)."""


def load_trips(data: str | None, fmt: str = "auto", *, on_error: str = "raise", modes=None,
               min_spacing_km: float | None = 0.2, gap_s: float = 1200.0, tz: str | None = None,
               n_synthetic: int = 20000, seed: int = 0, preprocess_config=None, **options) -> Trips:
    """Read ``data`` in format ``fmt`` (``auto`` detects it) and preprocess raw trajectories into trips.

    Args:
        data: a path (file or folder, see :mod:`stfast.data.readers`), or None for the synthetic city.
        fmt: ``"auto"``, ``"synthetic"`` or one of :data:`stfast.data.readers.FORMATS`.
        on_error: ``"raise"`` or ``"skip"`` bad records (see the readers).
        modes: GeoLife transport modes to keep (an iterable of str; None or empty: all).
        min_spacing_km: resample raw traces to points at least this far apart, km (DeepTTE's data is
            ~0.2–0.4 km apart; None or 0 keeps every point).
        gap_s: split raw traces at time gaps longer than this, seconds.
        tz: time zone of the calendar ids (weekID/timeID/dateID): an IANA name such as
            ``"Europe/Lisbon"`` (DST-correct) or :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`. None: the
            format's default, :data:`DEFAULT_TZ` — Asia/Shanghai for GeoLife, DiDi GAIA, DeepTTE
            JSON and the synthetic city; for the point CSV the UTC offsets written in its timestamps,
            UTC where a timestamp has none. An explicit name applies to every format that has
            absolute times; DeepTTE records carry their calendar ids already, so there it only checks
            the name and warns when it differs from the records' zone.
        n_synthetic, seed: size and seed of the synthetic city (``data=None`` or ``fmt="synthetic"``).
        preprocess_config: a :class:`~stfast.data.preprocess.PreprocessConfig` used as is instead of
            ``modes``, ``min_spacing_km``, ``gap_s`` and ``options`` (``tz``, when given, still
            overrides its ``tz``): to repeat a load, pass the ``preprocess_config`` of the Trips it
            returned (``PreprocessConfig.from_dict(cfg.to_dict())`` after a JSON round trip).
        **options: any other :class:`~stfast.data.preprocess.PreprocessConfig` field by name
            (``max_speed_kmh``, ``stay_radius_m``, ``stay_min_s``, ``min_points``, ``min_time_s``,
            ``min_dist_km``, ``max_points``).

    The synthetic city is preprocessed with its own config
    (:meth:`~stfast.data.synthetic.SyntheticCityConfig.preprocess_config`), so ``modes``,
    ``min_spacing_km``, ``gap_s`` and ``options`` do not apply to it; ``tz`` and
    ``preprocess_config`` do.

    Returns:
        :class:`~stfast.data.trips.Trips` with ``trip_id``/``segment`` per trip, ``dropped`` counts,
        ``dropped_trips`` rows, ``tz`` (the zone used, resolved: an IANA name or
        :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`) and ``preprocess_config`` (what preprocessing
        used, ``tz`` resolved; None for DeepTTE JSON, which is not preprocessed: only its records with
        fewer than ``min_points`` points are dropped, see :func:`drop_short_records`).

    Raises:
        TrajectoryFormatError: bad input (see the readers).
        ValueError: an unknown time zone ("unknown time zone 'Europe/Lisbonn' (an IANA name such as
            Europe/Lisbon)"), an option value out of range (see PreprocessConfig).
        TypeError: an ``options`` name that is not a PreprocessConfig field.
    """
    from .preprocess import PreprocessConfig, preprocess

    fields = {f.name for f in dataclasses.fields(PreprocessConfig)} - {"modes", "min_spacing_km", "gap_s", "tz"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise TypeError(f"load_trips() got unknown option(s) {', '.join(unknown)}; "
                        f"PreprocessConfig options: {', '.join(sorted(fields))}")
    if tz is not None:
        check_tz(tz)
    if preprocess_config is not None and not isinstance(preprocess_config, PreprocessConfig):
        raise TypeError(f"preprocess_config must be a PreprocessConfig, got {type(preprocess_config).__name__}")

    def with_tz(cfg):
        return cfg if tz is None else dataclasses.replace(cfg, tz=tz)

    if data is None or fmt == "synthetic":
        from .synthetic import generate_city

        city = SyntheticCityConfig()
        return preprocess(generate_city(n_synthetic, seed=seed, config=city),
                          with_tz(preprocess_config or city.preprocess_config()))
    from .store import is_store

    if is_store(data):
        return _open_store_as(data, fmt, tz, preprocess_config, modes=set(modes) if modes else None,
                              min_spacing_km=min_spacing_km or None, gap_s=gap_s, **options)
    from .readers import read_any

    got = read_any(data, fmt, on_error=on_error)
    if isinstance(got, Trajectories):
        cfg = preprocess_config or PreprocessConfig(modes=set(modes) if modes else None,
                                                    min_spacing_km=min_spacing_km or None, gap_s=gap_s,
                                                    **options)
        return preprocess(got, with_tz(cfg))
    refuse_record_filters(data, options if preprocess_config is None else {})
    if tz is not None and tz != got.tz:
        log.warning("%s: DeepTTE records carry their own weekID/timeID/dateID (computed in %s); tz=%s "
                    "does not change them", data, got.tz, tz)
    min_points = preprocess_config.min_points if preprocess_config is not None else options.get("min_points")
    return drop_short_records(got, PreprocessConfig.min_points if min_points is None else int(min_points))


def _open_store_as(path, fmt: str, tz: str | None, preprocess_config, **asked) -> Trips:
    """The store at ``path`` (memory-mapped, :func:`stfast.data.store.open_store`) when the settings asked
    for agree with those it was made with; ValueError naming both values otherwise. ``preprocess_config``
    (a checkpoint's) must match in every field; otherwise the settings in ``asked`` (PreprocessConfig field
    names) that differ from the defaults of :func:`load_trips` count as asked for, the rest as not given."""
    from .preprocess import PreprocessConfig
    from .store import open_store

    if fmt not in ("auto", "store"):
        raise ValueError(f"{path} is a trips store (it has a manifest.json): --format {fmt} does not apply; "
                         "omit --format")
    trips = open_store(path)
    made = trips.preprocess_config
    if preprocess_config is not None:
        want = {k: v for k, v in preprocess_config.to_dict().items() if k != "tz" or v is not None}
    else:
        defaults = {"modes": None, "min_spacing_km": 0.2, "gap_s": PreprocessConfig.gap_s}
        want = {k: sorted(v) if k == "modes" and v is not None else v for k, v in asked.items()
                if v != defaults.get(k, getattr(PreprocessConfig, k, None))}
    have = {} if made is None else made.to_dict()
    for k, v in want.items():
        if made is None and k != "min_points":
            raise ValueError(f"{path} is a store of DeepTTE records, which are not preprocessed: {k}={v!r} does not "
                             "apply; omit it")
        if made is not None and have.get(k) != v:
            raise ValueError(f"{k}={v!r} differs from the trips store {path}'s {k}={have.get(k)!r}: its trips were "
                             f"preprocessed with {k}={have.get(k)!r}; omit the setting, or convert the raw data again "
                             "with the new one")
    if tz is not None and check_tz(tz) != trips.tz:
        raise ValueError(f"tz={tz!r} differs from the trips store {path}'s tz={trips.tz!r}: its calendar ids were "
                         f"computed in {trips.tz}; omit the time zone, or convert the raw data again with the new one")
    return trips


def store_settings(path) -> dict:
    """The settings the trips store at ``path`` was made with, from its manifest alone, in the terms of
    :func:`load_trips`'s arguments: ``tz`` (resolved: an IANA name or
    :data:`~stfast.data.tz.TZ_FROM_TIMESTAMPS`) and, for preprocessed trips (not DeepTTE records), ``modes``
    (sorted tuple; empty: all), ``min_spacing_km`` (float; 0: every point kept), ``gap_s`` (float, s) and the
    trip filters ``min_points`` (int), ``min_time_s`` (float, s), ``min_dist_km`` (float, km).
    Raises ValueError when ``path`` is not a trips store."""
    from .preprocess import PreprocessConfig
    from .store import read_manifest

    m = read_manifest(path)
    out = {"tz": m.get("tz")}
    cfg = m.get("preprocess_config")
    if cfg is not None:
        out.update(modes=tuple(sorted(cfg.get("modes") or ())), min_spacing_km=float(cfg.get("min_spacing_km") or 0.0),
                   gap_s=float(cfg["gap_s"]))
        out.update({k: cfg.get(k, getattr(PreprocessConfig, k)) for k in ("min_points", "min_time_s", "min_dist_km")})
    return out


def require_trips(trips: Trips, source: str, convert_flags: bool = True, model: str | None = None) -> Trips:
    """``trips`` if it holds any; else ValueError saying in one line that nothing survived reading and
    preprocessing of ``source``: each trip filter that drops trips on its own, how many and the flag that relaxes
    it, then the counts of what was dropped and why (:func:`stfast.data.trip_filters.no_trips_line`;
    ``convert_flags``, ``model`` as there)."""
    if len(trips) == 0:
        raise ValueError(no_trips_line(source, trips.dropped, trips.trip_filters, trips.preprocess_config,
                                       convert_flags, model))
    return trips


def refuse_record_filters(data, options: dict) -> None:
    """DeepTTE records are used as written: ``min_time_s`` or ``min_dist_km`` in ``options`` (PreprocessConfig
    fields; None counts as not given) would be ignored, so it is refused (ValueError naming flag and field)."""
    unused = sorted(k for k in ("min_time_s", "min_dist_km") if options.get(k) is not None)
    if unused:
        said = " and ".join(f"--{k.replace('_', '-')} ({k})" for k in unused)
        raise ValueError(f"{said}: not for {data}, DeepTTE records, used as written (only --min-points drops any); "
                         "omit it")


def drop_short_records(trips: Trips, min_points: int, tally: TripFilterTally | None = None) -> Trips:
    """DeepTTE records are used as written, but one with fewer than ``min_points`` points (default 3,
    DeepTTE's geo-conv kernel) has no geo-conv output and would stop a whole training or prediction
    batch: such trips are dropped and counted as preprocessing counts them ("too_short" in ``dropped``,
    one ``dropped_trips`` row each), so every input trip stays accounted for. The records are counted in
    ``tally`` (None: a new one), which the Trips returned carry as ``trip_filters``."""
    short = trips.lengths < min_points
    tally = TripFilterTally() if tally is None else tally
    tally.add(trips.lengths, None, None, [("too_short", short)], {"min_points": min_points})
    if not short.any():
        trips.trip_filters = tally
        return trips
    kept = trips.subset(np.flatnonzero(~short))
    kept.dropped = dict(trips.dropped or {})
    kept.dropped["too_short"] = kept.dropped.get("too_short", 0) + int(short.sum())
    kept.dropped["points_of_dropped_trips"] = (kept.dropped.get("points_of_dropped_trips", 0)
                                               + int(trips.lengths[short].sum()))
    kept.dropped_trips = DroppedTrips.concat([trips.dropped_trips, DroppedTrips(
        trips.trip_id[short], trips.segment[short], np.full(int(short.sum()), "too_short", dtype=object))])
    kept.tz, kept.preprocess_config, kept.trip_filters = trips.tz, trips.preprocess_config, tally
    log.warning("%s with fewer than %d points (min_points) dropped (too_short)", counted(int(short.sum()), "trip", spec=","),
                min_points)
    return kept
