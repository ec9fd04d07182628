"""What a run derives from a store (split, drivers, normalization, route profile) is computed once per store and
settings, kept with the store, and read again by the next run, rank or command."""
import json
import os

import numpy as np
import pytest

from stfast.data import dataset, derived, routes
from stfast.data.store import open_store, write_store
from stfast.data.synthetic import synthetic_trips
from stfast.train.config import TrainConfig
from stfast.train.run_data import split_trips


@pytest.fixture()
def store(tmp_path):
    write_store(synthetic_trips(300, seed=1), tmp_path / "store")
    return tmp_path / "store"


def _derive(path, **over):
    cfg = TrainConfig(data=str(path), **over)
    train, val, test = split_trips(open_store(path), cfg)
    return (train, val, test), dataset.NormStats.of_split(train, 3), dataset.DriverVocab.of_split(train), \
        routes.RouteProfile.of_split(train)


def test_second_run_reads_what_the_first_computed(store, monkeypatch):
    (tr, va, te), stats, vocab, profile = _derive(store)
    kept = sorted(p.name.split("-")[0] for p in (store / "derived").iterdir())
    assert kept == ["drivers", "norm_stats", "route_profile", "split"]
    assert not [p for p in (store / "derived").iterdir() if p.name.startswith(".")]  # no temporary left

    def boom(*a, **k):
        raise AssertionError("recomputed")

    monkeypatch.setattr(dataset.NormStats, "from_trips", boom)
    monkeypatch.setattr(routes.RouteProfile, "from_trips", boom)
    monkeypatch.setattr("stfast.data.setup.split_random", boom)
    (tr2, va2, te2), stats2, vocab2, profile2 = _derive(store)
    assert not tr2.index.flags.writeable  # read memory-mapped (mode r): the ranks share its pages
    assert [list(v.index) for v in (tr2, va2, te2)] == [list(v.index) for v in (tr, va, te)]
    assert stats2 == stats and vocab2.to_list() == vocab.to_list() and profile2 == profile


def test_kept_values_equal_computed_ones(store):
    (tr, _, _), stats, vocab, profile = _derive(store)
    assert stats == dataset.NormStats.from_trips(tr, 3)
    assert vocab.to_list() == dataset.DriverVocab(tr.driver).to_list()
    assert profile == routes.RouteProfile.from_trips(tr).to_dict()


def test_other_settings_or_data_get_their_own_values(store, tmp_path):
    (a, _, _), *_ = _derive(store)
    (b, _, _), *_ = _derive(store, split="0.5/0.25/0.25")
    assert len(b) != len(a)
    (c, _, _), *_ = _derive(store, seed=5)  # the split seed follows --seed
    assert list(c.index) != list(a.index)
    write_store(synthetic_trips(300, seed=2), store)  # converted again: another fingerprint
    assert not (store / "derived").exists()
    (d, _, _), stats, *_ = _derive(store)
    assert stats == dataset.NormStats.from_trips(d, 3)


def test_unwritable_store_computes(store, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError("read-only")

    monkeypatch.setattr(derived.Path, "mkdir", refuse)
    (tr, _, _), stats, *_ = _derive(store)
    assert stats == dataset.NormStats.from_trips(tr, 3) and not (store / "derived").exists()


def test_raw_trips_and_other_views_are_not_kept(store):
    trips = open_store(store)
    some = trips.view(np.arange(10))
    assert derived._where(some, "norm_stats", {}) is None  # an unmarked view: no key
    mem = synthetic_trips(50, seed=3)
    assert derived._where(mem, "norm_stats", {}) is None  # not a store
    assert json.loads(json.dumps(derived.cached_json(mem, "x", {}, lambda: {"a": 1}))) == {"a": 1}
    assert os.listdir(store) and not (store / "derived").exists()
