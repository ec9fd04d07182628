"""The data flags (``--data``, ``--format``, ``--on-error`` and the preprocessing settings), declared once.

:class:`DataOptions` declares them (:func:`stfast._options.option`); ``stfast train``'s TrainConfig takes
each declaration with :func:`~stfast._options.same_option`, and ``stfast data convert`` builds its parser
from here alone, so converting data imports neither torch nor the model layers.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import _options
from .._options import CommaList, Scaled, option
from .preprocess_config import PreprocessConfig
from .readers import FORMATS

#: the settings that decide which trips raw data becomes (field names), in flag order
PREPROCESS_OPTIONS = ("modes", "min_spacing_km", "gap_s", "tz")


def _check_columns(spec: str) -> None:
    from .readers.columns import parse_columns

    parse_columns(spec)  # ValueError naming --columns


def _check_tz(tz: str) -> None:
    from .tz import check_tz

    try:
        check_tz(tz)
    except ValueError as e:
        raise ValueError(f"--tz: {e}") from None


@dataclass
class DataOptions:
    """What data a command reads and how raw trajectories are preprocessed (each field is a flag)."""

    data: str | None = option(None, "file or folder of trajectories (default: the synthetic city)")
    format: str = option("auto", "input format (auto: recognized by content)", choices=("auto", "synthetic", *FORMATS))
    on_error: str = option("raise", "bad records: stop with an error naming file and line, or skip and count them",
                           choices=("raise", "skip"))
    columns: str | None = option(None, "a CSV of another layout, its columns named: trip_id=…,time=…,lng=…,lat=…"
                                       "[,driver_id=…][,state=…] (a point per row) or polyline=…,time=…,"
                                       "interval_s=…[,trip_id=…][,driver_id=…] (a trip per row, [[lng, lat], …])",
                                 check=_check_columns, unset="(none: the format's own names)")
    modes: tuple = option((), "GeoLife transport modes to keep, e.g. car,taxi,bus (empty: all)", cli=CommaList(),
                          unset="(all)")
    min_spacing_km: float = option(0.2, "raw traces: resample to points at least this far apart (0: keep every point)",
                                   unit="km", ge=0.0)
    gap_s: float = option(PreprocessConfig.gap_s, "raw traces: split trips at time gaps above this (minutes)",
                          unit="s", gt=0.0, flag="--gap-min", cli=Scaled(60.0, "minutes"))
    tz: str | None = option(None, "time zone of local time (time of day, weekday, date), an IANA name such as "
                                  "Europe/Lisbon; default: Asia/Shanghai for GeoLife, DeepTTE JSON and DiDi GAIA, "
                                  "and for a point CSV the UTC offset its timestamps carry, else UTC",
                            check=_check_tz, unset="(the format's default)")


@dataclass
class TripFilterOptions:
    """The trip filters of ``stfast data convert`` (each field is a flag; None: PreprocessConfig's default). A
    store keeps the values in its manifest, so ``stfast train --data STORE`` trains on the trips they kept."""

    min_points: int | None = option(None, "drop trips with fewer points than this, after resampling (default: "
                                          f"{PreprocessConfig.min_points}, DeepTTE's geo-conv kernel)", ge=1)
    min_time_s: float | None = option(None, "drop trips whose travel time is under this many seconds (default: "
                                            f"{PreprocessConfig.min_time_s:g})", unit="s", ge=0.0)
    min_dist_km: float | None = option(None, "drop trips that cover less than this many km (default: "
                                             f"{PreprocessConfig.min_dist_km:g})", unit="km", ge=0.0)


def trip_filters_from_args(args) -> dict:
    """The trip filter flags given in parsed ``args`` ({PreprocessConfig field: value}, those not given left out),
    each checked. Raises ValueError naming the flag."""
    opts = {k: v for k, v in _options.values_from_args(TripFilterOptions, args).items() if v is not None}
    for k, v in opts.items():
        _options.check_value(TripFilterOptions, k, v)
    return opts


def preprocess_options_from_args(args) -> dict:
    """The preprocessing flags of parsed ``args`` as field values (:data:`PREPROCESS_OPTIONS`; None: not given,
    where the parser's default is None), each given value checked. Raises ValueError naming the flag."""
    opts = _options.values_from_args(DataOptions, args, PREPROCESS_OPTIONS)
    for k, v in opts.items():
        if v is not None:
            _options.check_value(DataOptions, k, v)
    return opts
