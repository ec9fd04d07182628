import numpy as np
import pytest

from stfast.data.splits import default_date_split, parse_days, parse_fractions, split_by_days, split_random


def test_random_split_is_seeded_disjoint_and_complete():
    a = split_random(100, (0.7, 0.15, 0.15), seed=4)
    assert [len(x) for x in a] == [70, 15, 15]
    assert sorted(np.concatenate(a).tolist()) == list(range(100))
    b = split_random(100, (0.7, 0.15, 0.15), seed=4)
    assert all((x == y).all() for x, y in zip(a, b))
    assert not (a[0] == split_random(100, (0.7, 0.15, 0.15), seed=5)[0]).all()


def test_day_split_by_explicit_days_and_default():
    date = np.array([24, 25, 26, 27, 28, 29, 30, 24, 30])
    days = parse_days("24-28/29/30")
    assert days == ({24, 25, 26, 27, 28}, {29}, {30})
    tr, va, te = split_by_days(date, days)
    assert tr.tolist() == [0, 1, 2, 3, 4, 7] and va.tolist() == [5] and te.tolist() == [6, 8]
    assert default_date_split(date) == days
    assert parse_days("1,3/5/7-8") == ({1, 3}, {5}, {7, 8})


@pytest.mark.parametrize("spec", ["0.7/0.3", "0.5/0.5/0.5", "a/b/c", "0/0.5/0.5"])
def test_bad_fractions_rejected(spec):
    with pytest.raises(ValueError, match="--split"):
        parse_fractions(spec)


@pytest.mark.parametrize("spec", ["24-28/29", "24-28/28/30", "x/1/2"])
def test_bad_days_rejected(spec):
    with pytest.raises(ValueError, match="--split-days"):
        parse_days(spec)


def test_every_day_split_refusal_lists_the_datas_days():
    """Issue 52: `--split-days 1-5/6/7` said "no trips fall on the training days [1, 2, 3, 4, 5]" without the
    days the data has (the test-split message listed them)."""
    date = np.array([24, 25, 30, 24])
    with pytest.raises(ValueError, match=r"no trip falls on day\(s\) \[1, 2\] \(the data's days of month: "
                                         r"\[24, 25, 30\]\); change --split-days"):
        split_by_days(date, parse_days("1-2/6/7"))
    with pytest.raises(ValueError, match=r"has 2 \(the data's days of month: \[24, 25\]\); give --split-days"):
        default_date_split(np.array([24, 25, 25]))
