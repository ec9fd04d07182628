"""Sub-trajectory augmentation (stfast.data.subtrips, `--subtrips N`): every piece is a contiguous run of its
trip's points with that run's own travel time, distance and departure time; the training run adds them to its
training batches only."""
import numpy as np
import pytest
from conftest import random_trips
from hypothesis import given, settings
from hypothesis import strategies as st

from stfast.data.subtrips import add_subtrips, subtrips
from stfast.data.trips import Trips


def _same(a, b) -> bool:
    """Two Trips hold the same arrays."""
    names = ("offsets", *a._POINT_FIELDS, *a._TRIP_FIELDS)
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in names)


def _parent_index(trips, pieces_ids):
    ids = {str(t): i for i, t in enumerate(trips.trip_id)}
    return np.array([ids[s.split("~sub")[0]] for s in pieces_ids])


@settings(deadline=None, max_examples=40)  # a per-piece loop: slow on a loaded 2-core machine, not wrong
@given(seed=st.integers(0, 2**31), n=st.integers(1, 3), frac=st.floats(0.1, 0.9))
def test_every_piece_is_a_contiguous_run_of_its_trip_with_its_own_labels(seed, n, frac):
    trips = random_trips(30, seed=seed % 1000, min_len=3, max_len=30)
    # a crossing of midnight: a late departure whose pieces start the next day
    trips.time_id[:5] = 1430
    out = add_subtrips(trips, n, seed, min_fraction=frac)
    t = len(trips)
    assert _same(out.subset(np.arange(t)), trips)  # the recorded trips come first, unchanged
    pieces = out.subset(np.arange(t, len(out)))
    parent = _parent_index(trips, pieces.trip_id)
    assert len(pieces) <= n * int(np.sum(trips.lengths >= 4))
    for i, p in enumerate(parent):
        src, dst = trips.points(p), pieces.points(i)
        m, length = dst.stop - dst.start, src.stop - src.start
        assert max(3, min(int(np.ceil(frac * length)), length - 1)) <= m <= length - 1
        # find where the piece starts in its trip: its first point's coordinates
        start = int(np.flatnonzero((trips.lng[src] == pieces.lng[dst][0]) & (trips.lat[src] == pieces.lat[dst][0]))[0])
        run = slice(src.start + start, src.start + start + m)
        np.testing.assert_array_equal(pieces.lng[dst], trips.lng[run])
        np.testing.assert_array_equal(pieces.state[dst], trips.state[run])
        np.testing.assert_allclose(pieces.time_gap[dst], trips.time_gap[run] - trips.time_gap[run.start])
        np.testing.assert_allclose(pieces.dist_gap[dst], trips.dist_gap[run] - trips.dist_gap[run.start])
        assert pieces.time_gap[dst][0] == 0 and pieces.dist_gap[dst][0] == 0
        assert pieces.time[i] == pytest.approx(pieces.time_gap[dst][-1]) and pieces.time[i] > 0
        scale = trips.dist[p] / trips.dist_gap[src][-1]
        assert pieces.dist[i] == pytest.approx(pieces.dist_gap[dst][-1] * scale)
        minute = trips.time_id[p] + int(trips.time_gap[run.start] // 60)
        assert pieces.time_id[i] == minute % 1440
        assert pieces.week_id[i] == (trips.week_id[p] + minute // 1440) % 7
        assert pieces.date_id[i] == trips.date_id[p] + minute // 1440
        assert pieces.driver[i] == trips.driver[p]


def test_pieces_are_seeded_and_zero_adds_none():
    trips = random_trips(40, seed=3)
    a, b, c = add_subtrips(trips, 2, 7), add_subtrips(trips, 2, 7), add_subtrips(trips, 2, 8)
    assert _same(a, b) and not _same(a, c)
    assert add_subtrips(trips, 0, 7) is trips
    # trips too short for a strict piece (3 points) give none; a stop (no time passes) gives none
    short = random_trips(10, seed=4, min_len=3, max_len=3)
    assert len(add_subtrips(short, 3, 0)) == len(short)


@pytest.mark.parametrize("n, frac", [(-1, 0.5), (1.5, 0.5), (1, 0.0), (1, 1.0)])
def test_bad_arguments_are_refused(n, frac):
    with pytest.raises(ValueError, match="sub-trips per trip|min_fraction"):
        add_subtrips(random_trips(5), n, 0, min_fraction=frac)


def test_a_run_trains_on_the_pieces_and_reports_the_recorded_trips(shared_data):
    from stfast.train.config import TrainConfig
    from stfast.train.run_data import RunData

    data = str(shared_data / "chengdu_deeptte_sample" / "test")
    common = dict(data=data, split_days="24-28/29/30")
    plain = RunData.load(TrainConfig(**common, subtrips=0), dtype=__import__("torch").float32)
    aug = RunData.load(TrainConfig(**common, subtrips=2), dtype=__import__("torch").float32)
    assert len(plain.train_ds) == len(plain.train) == 1000
    assert len(aug.train) == 1000 and 1000 < len(aug.train_ds) <= 3000
    assert aug.stats == plain.stats and aug.vocab.to_list() == plain.vocab.to_list()  # of the recorded trips
    assert len(aug.val_ds) == len(plain.val_ds) and len(aug.test_ds) == len(plain.test_ds)
    assert "(+" in aug.describe() and "sub-trips" in aug.describe()
    assert TrainConfig(**common).subtrips == 1 and TrainConfig().subtrips == 0  # --preset real / paper


def test_draws_are_independent_sets_and_draw_0_is_the_once_set():
    trips = random_trips(40, seed=5)
    d0, d1, again = subtrips(trips, 2, 7, draw=0), subtrips(trips, 2, 7, draw=1), subtrips(trips, 2, 7, draw=1)
    assert _same(Trips.concat([trips, d0]), add_subtrips(trips, 2, 7))  # --subtrips-resample once: set 0
    assert _same(d1, again) and len(d0) > 0 and len(d1) > 0
    assert not np.array_equal(d0.lengths, d1.lengths) or not np.array_equal(d0.lng, d1.lng)
    with pytest.raises(ValueError, match="draw"):
        subtrips(trips, 1, 0, draw=-1)


def test_resample_epoch_gives_each_epoch_the_trips_and_its_own_pieces():
    """--subtrips-resample epoch: every epoch's batches cover each recorded trip once and exactly one set of
    pieces, set e in epoch e (past the last set, they repeat); under once every epoch covers all of train_ds."""
    import torch

    from stfast.train.config import TrainConfig
    from stfast.train.run_data import RunData

    common = dict(n_synthetic=300, epochs=3, subtrips=2, preset="paper")
    once = RunData.load(TrainConfig(**common, subtrips_resample="once"), dtype=torch.float32)
    fresh = RunData.load(TrainConfig(**common, subtrips_resample="epoch"), dtype=torch.float32)
    t = len(fresh.train)
    assert len(fresh.piece_sets) == 3 and len(fresh.train_ds) == t + sum(fresh.piece_sets)
    assert "fresh every epoch" in fresh.describe()
    seen = []
    for e in range(4):
        idx = np.sort(np.concatenate(fresh.epoch_batches(16, 3, e)))
        start = t + sum(fresh.piece_sets[:e % 3])
        want = np.concatenate([np.arange(t), np.arange(start, start + fresh.piece_sets[e % 3])])
        np.testing.assert_array_equal(idx, want)
        seen.append(idx)
    np.testing.assert_array_equal(seen[3], seen[0])
    # set 0 of the fresh run is the once run's pieces
    n0 = fresh.piece_sets[0]
    assert len(once.train_ds) == t + n0 and not once.piece_sets
    np.testing.assert_array_equal(np.sort(np.concatenate(once.epoch_batches(16, 3, 1))), np.arange(t + n0))
    a, b = once.train_ds.batch(np.arange(t + n0)), fresh.train_ds.batch(np.arange(t + n0))
    assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("lng", "time_gap", "dist", "time", "time_id"))
