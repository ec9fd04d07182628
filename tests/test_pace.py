"""The paced clock (stfast.bench.pace): runs timed at each key's median pace instead of the wall clock."""
import pytest

from stfast.bench.pace import pace_by_key, paced_curve


def _windows(key, window_s, trips=100, steps=4):
    """Windows of ``trips`` trips and ``steps`` optimizer steps under ``key``, lasting ``window_s`` each."""
    return [((i + 1) * steps, key, trips, w) for i, w in enumerate(window_s)]


def test_pace_is_the_median_trips_per_second_of_each_key():
    fast, slow, k2 = _windows(1, [1.0, 1.0, 1.0]), _windows(1, [2.0, 4.0]), _windows(2, [0.5, 0.25, 0.0])
    assert pace_by_key(fast + slow + k2) == {1: 100.0, 2: 300.0}  # 100,100,100,50,25; 200,400 (a 0 s window left out)


def test_a_run_slowed_by_the_machine_lands_on_the_same_paced_times_as_an_unslowed_one():
    steady, slowed = _windows(1, [1.0, 1.0, 1.0, 1.0]), _windows(1, [3.0, 3.0, 1.0, 1.0])
    pace = pace_by_key(steady + slowed)
    assert pace == {1: 100.0}
    # validations after steps 10 and 16 (mid-window 3, and the end of window 4): the same on both runs
    for run in (steady, slowed):
        curve = paced_curve([(10, 0.3), (16, 0.2)], run, pace)
        assert [t for t, _ in curve] == pytest.approx([2.5, 4.0]) and [v for _, v in curve] == [0.3, 0.2]


def test_each_key_keeps_its_own_pace_and_points_after_the_last_window_continue_at_its_rate():
    mixed = [(4, 1, 100, 1.0), (6, 4, 100, 0.5)]  # 4 steps at k = 1, then 2 steps at k = 4
    pace = {1: 50.0, 4: 400.0}  # k = 1 ran fast here, k = 4 slow, against their medians elsewhere
    curve = paced_curve([(4, 0.5), (5, 0.4), (6, 0.3), (8, 0.2)], mixed, pace)
    # 2 s for the k = 1 window, 0.25 s for the k = 4 one (0.125 s a step, also after it)
    assert [t for t, _ in curve] == pytest.approx([2.0, 2.125, 2.25, 2.5]) and [v for _, v in curve] == [0.5, 0.4, 0.3, 0.2]
    # a key without a pace (every window of it 0 s long elsewhere) keeps its own wall time
    assert paced_curve([(6, 0.3)], mixed, {1: 50.0})[0][0] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="windows"):
        paced_curve([(3, 0.2)], [], pace)
