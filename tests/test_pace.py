"""The paced clock (stfast.bench.pace): runs timed at each key's median pace instead of the wall clock."""
import pytest

from stfast.bench.pace import pace_by_key, paced_curve


def _windows(key, window_s, trips=100):
    """Windows of ``trips`` trips under ``key`` lasting ``window_s`` each, back to back from 0 s."""
    out, t = [], 0.0
    for w in window_s:
        t += w
        out.append((t, key, trips, w))
    return out


def test_pace_is_the_median_trips_per_second_of_each_key():
    fast, slow, k2 = _windows(1, [1.0, 1.0, 1.0]), _windows(1, [2.0, 4.0]), _windows(2, [0.5, 0.25, 0.0])
    assert pace_by_key(fast + slow + k2) == {1: 100.0, 2: 300.0}  # 100,100,100,50,25; 200,400 (a 0 s window left out)


def test_a_run_slowed_by_the_machine_lands_on_the_same_paced_times_as_an_unslowed_one():
    steady, slowed = _windows(1, [1.0, 1.0, 1.0, 1.0]), _windows(1, [3.0, 3.0, 1.0, 1.0])
    pace = pace_by_key(steady + slowed)
    assert pace == {1: 100.0}
    # validations 0.2 s after windows 2 and 4 (in the window after, and after the last window)
    steady_c = paced_curve([(2.2, 0.3), (4.2, 0.2)], steady, pace)
    slowed_c = paced_curve([(6.2, 0.3), (8.2, 0.2)], slowed, pace)
    assert [t for t, _ in steady_c] == pytest.approx([2.2, 4.2]) and [t for t, _ in slowed_c] == pytest.approx([2.2, 4.2])
    assert [v for _, v in slowed_c] == [0.3, 0.2]


def test_each_key_keeps_its_own_pace_and_a_curve_without_windows_is_unchanged():
    mixed = [(1.0, 1, 100, 1.0), (1.5, 4, 100, 0.5)]  # one window at k = 1, then one at k = 4
    pace = {1: 50.0, 4: 400.0}  # k = 1 ran fast here, k = 4 slow, against their medians elsewhere
    curve = paced_curve([(1.0, 0.5), (1.25, 0.4), (1.5, 0.3)], mixed, pace)
    assert [t for t, _ in curve] == pytest.approx([2.0, 2.125, 2.25]) and [v for _, v in curve] == [0.5, 0.4, 0.3]
    assert paced_curve([(3.0, 0.2)], [], pace) == [(3.0, 0.2)]
    with pytest.raises(KeyError):
        paced_curve([(1.0, 0.5)], mixed, {1: 50.0})
