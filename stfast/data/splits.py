"""Train/validation/test splits of a trip set: seeded random fractions or by day of month."""
from __future__ import annotations

import numpy as np

DEFAULT_SPLIT = "0.7/0.15/0.15"  # --split: train/val/test fractions


def parse_fractions(spec: str) -> tuple[float, float, float]:
    """``"0.7/0.15/0.15"`` → (0.7, 0.15, 0.15). Raises ValueError unless three non-negative parts sum to 1."""
    try:
        parts = tuple(float(p) for p in spec.split("/"))
    except ValueError:
        raise ValueError(f"--split {spec!r}: expected three numbers like 0.7/0.15/0.15") from None
    if len(parts) != 3 or min(parts) < 0 or abs(sum(parts) - 1.0) > 1e-6 or parts[0] == 0:
        raise ValueError(f"--split {spec!r}: expected train/val/test fractions summing to 1, train > 0")
    return parts  # type: ignore[return-value]


def split_random(n: int, fractions: tuple[float, float, float], seed: int) -> tuple[np.ndarray, ...]:
    """Seeded random split of range(n) into (train, val, test) index arrays [n_*] int64."""
    perm = np.random.default_rng(seed).permutation(n)
    n_tr = int(round(fractions[0] * n))
    n_va = int(round(fractions[1] * n))
    return perm[:n_tr], perm[n_tr:n_tr + n_va], perm[n_tr + n_va:]


def _parse_days(part: str) -> set[int]:
    days: set[int] = set()
    for tok in part.split(","):
        tok = tok.strip()
        if "-" in tok:
            a, b = tok.split("-", 1)
            days.update(range(int(a), int(b) + 1))
        elif tok:
            days.add(int(tok))
    return days


def parse_days(spec: str) -> tuple[set[int], set[int], set[int]]:
    """``"24-28/29/30"`` → ({24..28}, {29}, {30}). Raises ValueError on malformed or overlapping days."""
    parts = spec.split("/")
    try:
        if len(parts) != 3:
            raise ValueError
        days = tuple(_parse_days(p) for p in parts)
    except ValueError:
        raise ValueError(f"--split-days {spec!r}: expected TRAIN/VAL/TEST day lists like 24-28/29/30") from None
    if not days[0] or days[0] & days[1] or days[0] & days[2] or days[1] & days[2]:
        raise ValueError(f"--split-days {spec!r}: day sets must be non-empty (train) and disjoint")
    return days  # type: ignore[return-value]


def split_by_days(date_id: np.ndarray, days: tuple[set[int], set[int], set[int]]) -> tuple[np.ndarray, ...]:
    """Indices of trips whose ``date_id`` falls in each day set. Raises ValueError if train is empty."""
    out = tuple(np.flatnonzero(np.isin(date_id, sorted(d))) for d in days)
    if len(out[0]) == 0:
        raise ValueError(f"the training split is empty: no trip falls on day(s) {sorted(days[0])} "
                         f"({data_days(date_id)}); change --split-days")
    return out


def data_days(date_id: np.ndarray) -> str:
    """The days of month the trips fall on (``date_id`` [T]), as a refusal of a day split names them."""
    return f"the data's days of month: {sorted(set(int(d) for d in date_id))}"


def default_date_split(date_id: np.ndarray) -> tuple[set[int], set[int], set[int]]:
    """``--split-by date`` without explicit days: the last day is test, the one before validation,
    the rest training. Raises ValueError with fewer than three distinct days."""
    uniq = sorted(set(int(d) for d in date_id))
    if len(uniq) < 3:
        raise ValueError(f"--split-by date needs at least 3 distinct days, the data has {len(uniq)} "
                         f"({data_days(date_id)}); give --split-days TRAIN/VAL/TEST, or a random --split")
    return set(uniq[:-2]), {uniq[-2]}, {uniq[-1]}
