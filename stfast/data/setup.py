"""A run's setup: what it derives from its trips before its first step, and the settings that decide it.

A training run on trips derives, from them and its settings (:class:`Setup`): the train / validation / test
split (:func:`split`), then from the training split the driver vocabulary and the normalization statistics
(:mod:`stfast.data.training_stats`), the sub-trip spans of ``--subtrips`` (:func:`subtrip_sets`) and the route
profile its checkpoint records (:class:`~stfast.data.routes.RouteProfile`, with the training area). On a trips
store each is kept in its derived folder (:mod:`stfast.data.derived`) under a key of these settings, so the
next run with the same settings reads it instead.

``stfast data convert`` derives them for :data:`DEFAULT`, the settings of a default ``stfast train --data
STORE`` (:func:`derive_default`), with the same functions a run calls (``stfast.train.run_data``): the keys
are the same, and the first run after convert computes nothing (a 1 M-trip store: ~5 s moved from the first
run into convert). A run with other settings derives its values at its first run and keeps them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .._plural import counted
from .derived import split_views
from .routes import RouteProfile
from .splits import (DEFAULT_SPLIT, data_days, default_date_split, parse_days, parse_fractions, split_by_days,
                     split_random)
from .subtrips import kept_subtrip_spans
from .training_stats import DriverVocab, NormStats

log = logging.getLogger("stfast.data")


@dataclass(frozen=True)
class Setup:
    """The settings that decide what a run derives from its trips (each a ``stfast train`` flag's value).

    Attributes:
        split_by: ``"random"`` or ``"date"`` (--split-by).
        split: train/val/test fractions text, e.g. ``"0.7/0.15/0.15"`` (--split).
        split_days: TRAIN/VAL/TEST days of month text, or None (--split-days).
        split_seed: seed of the random split (--data-seed, else --seed).
        kernel_size: the geo-conv kernel (points) the local statistics span.
        subtrips: sub-trips per training trip (--subtrips; 0: none).
        subtrips_seed: seed of the sub-trips (--seed).
        subtrip_draws: sets of sub-trips drawn (--subtrips-resample epoch: one per epoch; else 1).
    """

    split_by: str
    split: str
    split_days: str | None
    split_seed: int
    kernel_size: int
    subtrips: int
    subtrips_seed: int
    subtrip_draws: int

    @property
    def by_days(self) -> bool:
        """True when the split is by day of month (--split-days or --split-by date)."""
        return bool(self.split_days or self.split_by == "date")

    def split_settings(self) -> dict:
        """The settings the split is kept under (:func:`stfast.data.derived.split_views`), and so every value
        derived from its parts: the one place they are written, for a run and for convert alike."""
        return {"by": self.split_by, "split": self.split, "days": self.split_days, "seed": self.split_seed}


#: a default ``stfast train --data STORE``: preset "real" (stfast.train.presets: --subtrips 1, resampled once),
#: the random split of --split's default with --seed 0, DeepTTEConfig's kernel_size 3
#: (tests/test_store_setup.py checks that the default TrainConfig gives exactly this)
DEFAULT = Setup(split_by="random", split=DEFAULT_SPLIT, split_days=None, split_seed=0, kernel_size=3, subtrips=1,
                subtrips_seed=0, subtrip_draws=1)


def split(trips, setup: Setup) -> tuple:
    """Train / validation / test trips of ``trips`` (Trips or a store) by ``setup``'s rule, as views (an index
    each, no copy: :mod:`stfast.data.trip_view`), kept with a store (:func:`stfast.data.derived.split_views`).

    Raises:
        ValueError: a split is empty (naming it and the flag to change), bad fractions or days, or fewer than
            3 days for ``--split-by date`` without days.
    """
    def days():
        return parse_days(setup.split_days) if setup.split_days else default_date_split(trips.date_id)

    def compute():
        if setup.by_days:
            return split_by_days(trips.date_id, days())
        return split_random(len(trips), parse_fractions(setup.split), setup.split_seed)

    parts = split_views(trips, setup.split_settings(), compute)
    for i, (name, p) in enumerate(zip(("training", "validation", "test"), parts)):
        if len(p) == 0 and setup.by_days:
            raise ValueError(f"the {name} split is empty: no trip falls on day(s) {sorted(days()[i])} "
                             f"({data_days(trips.date_id)}); change --split-days")
        if len(p) == 0:
            raise ValueError(f"the {name} split is empty ({counted(len(trips), 'trip', spec=',')}); change --split")
    return parts


def subtrip_sets(train, setup: Setup) -> list[dict]:
    """The sub-trip span sets of the training split ``train`` (:func:`~stfast.data.subtrips.kept_subtrip_spans`,
    one per draw: ``parent``, ``first``, ``m``, ``k`` [P] int64 each); [] when ``setup.subtrips`` is 0."""
    if not setup.subtrips:
        return []
    return [kept_subtrip_spans(train, setup.subtrips, setup.subtrips_seed, draw=e) for e in range(setup.subtrip_draws)]


def derive_from_train(train, setup: Setup) -> dict[str, float]:
    """Derive (and keep, for a split of a store) what a run needs of its training split ``train``: the driver
    vocabulary, the normalization statistics, the sub-trip spans, the route profile. Returns seconds per value
    (keys ``drivers``, ``norm_stats``, ``subtrips``, ``route_profile``; ~0 where kept already)."""
    secs = {}
    for name, make in (("drivers", lambda: DriverVocab.of_split(train)),
                       ("norm_stats", lambda: NormStats.of_split(train, setup.kernel_size)),
                       ("subtrips", lambda: subtrip_sets(train, setup)),
                       ("route_profile", lambda: RouteProfile.of_split(train))):
        t0 = time.perf_counter()
        make()
        secs[name] = time.perf_counter() - t0
    return secs


def derive(trips, setup: Setup = DEFAULT) -> dict[str, float]:
    """Derive (and keep, on a store) everything a run with ``setup`` derives from ``trips`` before its first step:
    the split, then :func:`derive_from_train`. Returns seconds per value (``split`` and derive_from_train's keys).
    Raises ValueError as :func:`split` (an empty split: the trips are too few for ``setup``)."""
    t0 = time.perf_counter()
    train = split(trips, setup)[0]
    return {"split": time.perf_counter() - t0, **derive_from_train(train, setup)}


def derive_default(store) -> float | None:
    """What ``stfast data convert`` does after writing ``store`` (opened Trips of a store): :func:`derive` for
    :data:`DEFAULT`, so that the first default ``stfast train --data STORE`` finds it all kept. Returns the
    seconds it took, or None when the store is too small for the default split (an empty split: said at info
    level; the first run derives what its own settings need, or says why it cannot)."""
    t0 = time.perf_counter()
    try:
        derive(store, DEFAULT)
    except ValueError as e:
        log.info("%s: not derived for the default run (%s): the first `stfast train` derives what its settings need",
                 getattr(store, "store_path", "the store"), e)
        return None
    return time.perf_counter() - t0

