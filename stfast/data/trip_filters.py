"""The trip filters' tally, and the one line that says why reading and preprocessing left no trip.

The trip filters (step 7 of :func:`stfast.data.preprocess.preprocess`: ``min_points``, ``min_time_s``,
``min_dist_km``, ``max_points``) count a dropped trip under the first rule it fails (``dropped``), so that the
counts add up. Where every trip is dropped that is not what a user needs: relaxing the first rule may only hand
the trips to the next. :class:`TripFilterTally` counts each filter on its own, over all candidate trips, with
the longest trip seen; :func:`no_trips_line` turns it into the error of a command that got no trip, naming each
filter's count and the flag of ``stfast data convert`` that relaxes it. Measured on the DiDi GAIA sample of
../shared/data (one minute of 491 orders, docs/data.md): all 491 last under 60 s, so ``--min-time-s`` alone
drops every one of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: the trip filters in the order preprocessing applies them: (dropped reason, PreprocessConfig field)
FILTERS = (("too_short", "min_points"), ("too_short_time", "min_time_s"), ("too_short_dist", "min_dist_km"),
           ("too_long", "max_points"))
_FIELD = dict(FILTERS)


@dataclass
class TripFilterTally:
    """What the trip filters saw: ``trips`` candidate trips (int), ``fails`` {dropped reason: the trips that fail
    that filter on its own} (a trip can count under several reasons), ``limits`` {PreprocessConfig field: the
    value the filter used}, and the largest ``points`` (int), travel time ``time_s`` (float, s) and distance
    ``dist_km`` (float, km) among the candidates."""

    trips: int = 0
    fails: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    points: int = 0
    time_s: float = 0.0
    dist_km: float = 0.0

    def add(self, lengths: np.ndarray, time: np.ndarray | None, dist: np.ndarray | None, rules,
            limits: dict) -> None:
        """Count candidate trips: ``lengths`` [T] int points, ``time`` [T] float s and ``dist`` [T] float km (None:
        not known, DeepTTE records filtered by length only), ``rules`` [(reason, [T] bool fails)] and the
        ``limits`` they used ({PreprocessConfig field: value})."""
        self.limits.update(limits)
        if len(lengths) == 0:
            return
        self.trips += len(lengths)
        for reason, bad in rules:
            self.fails[reason] = self.fails.get(reason, 0) + int(np.count_nonzero(bad))
        self.points = max(self.points, int(np.max(lengths)))
        if time is not None:
            self.time_s = max(self.time_s, float(np.max(time)))
        if dist is not None:
            self.dist_km = max(self.dist_km, float(np.max(dist)))


def _flag(name: str) -> str | None:
    """The ``stfast data convert`` flag of PreprocessConfig field ``name`` (None: only the Python API sets it)."""
    from .._options import flag, options
    from .options import TripFilterOptions

    return flag(TripFilterOptions, name) if name in options(TripFilterOptions) else None


def _default_gap_s() -> float:
    from .preprocess_config import PreprocessConfig

    return PreprocessConfig.gap_s


def _say(reason: str, n: int, of: int, cfg, tally: TripFilterTally) -> str:
    """One filter's part: "491 (all) last less than --min-time-s 60 s (the longest 59 s)"."""
    name = _FIELD[reason]
    value = tally.limits.get(name)
    f = _flag(name)
    # an int as typed: ':g' wrote 10**23 as 1e+23 and raised OverflowError beyond a float's range
    shown = f"{value}" if isinstance(value, (int, np.integer)) else f"{value:g}"
    setting = f"{f} {shown}" if f else f"{name}={value}"
    count = f"{n:,}" + (" (all)" if n == of else "")
    have, last, cover = ("has", "lasts", "covers") if n == 1 else ("have", "last", "cover")
    if reason == "too_short":  # the settings that took points away name their flags too
        how = []
        if cfg is not None and cfg.gap_s != _default_gap_s():
            how.append(f"cut at gaps over --gap-min {cfg.gap_s / 60:g}")
        if cfg is not None and cfg.min_spacing_km:
            how.append(f"resampled to --min-spacing-km {cfg.min_spacing_km:g} km apart (0 keeps every point)")
        return f"{count} {have} fewer than {setting} points (the most {tally.points:,})" + (
            f" once {' and '.join(how)}" if how else "")
    if reason == "too_short_time":
        return f"{count} {last} less than {setting} s (the longest {tally.time_s:g} s)"
    if reason == "too_short_dist":
        return f"{count} {cover} less than {setting} km (the longest {tally.dist_km:.3g} km)"
    return f"{count} {have} more than {setting} points"


def no_trips_line(source: str, dropped: dict, tally: TripFilterTally | None, cfg, convert_flags: bool = True,
                  model: str | None = None) -> str:
    """The error of a command whose input left no trip, in one line: when trips reached the trip filters, each
    filter that drops any of them on its own, with its count, its setting and the flag that relaxes it, largest
    count first; then the drop counts (:func:`stfast.data.drops.describe`). ``cfg``: the PreprocessConfig used
    (None: DeepTTE records, filtered by ``min_points`` only). ``convert_flags``: the command takes the trip
    filters' flags (``stfast data convert``); False (``stfast train``): the line says to convert with them.
    ``model``: the checkpoint whose run's settings these are (``stfast evaluate`` / ``predict``): the line says so,
    as relaxing them means training again."""
    from .drops import describe

    drops = describe(dropped) if any(dropped.values()) else "nothing was dropped: no input trips"
    parts = sorted(((n, r) for r, n in (tally.fails.items() if tally else ()) if n), key=lambda x: -x[0])
    if not parts:
        return f"{source}: reading and preprocessing left no trip: {drops}; check --format, --modes, " \
               "--min-spacing-km and --gap-min"
    said = "; ".join(_say(r, n, tally.trips, cfg, tally) for n, r in parts)
    every = [f for n, r in parts if n == tally.trips and (f := _flag(_FIELD[r]))]
    more = [f for n, r in parts if n < tally.trips and (f := _flag(_FIELD[r]))]
    if every:
        how = f"lower {' and '.join(every)} to keep any trip" + (f", {' or '.join(more)} to keep more" if more else "")
    else:
        how = f"lower {' or '.join(more)} to keep trips" if more else "relax these settings to keep trips"
    if tally.fails.get("too_short") and cfg is not None and cfg.gap_s != _default_gap_s():
        how += " (or raise --gap-min)"
    if (every or more) and model is not None:  # the model's settings: its scores are for trips that pass them
        how = (f"these are the settings {model} was trained with: give trips that pass them, or train a model on "
               f"data converted with {' and '.join(every + more)} lowered (flags of stfast data convert)")
    elif (every or more) and not convert_flags:
        how += " (flags of stfast data convert: convert with them and train on the store it writes)"
    every_one = "its one trip fails" if tally.trips == 1 else f"every one of its {tally.trips:,} trips fails"
    return f"{source}: reading and preprocessing left no trip: {every_one} a trip filter: {said}; {how}. In all: {drops}"
