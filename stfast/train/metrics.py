"""Travel-time error metrics over a whole split (not averaged per batch), the two baselines, and the test
summary's table."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._plural import counted


@dataclass
class ErrorSums:
    """Running sums from which MAPE, MAE and RMSE of a whole split follow exactly.

    ``ape`` Σ|ŷ − y|/y, ``ae`` Σ|ŷ − y| (s), ``se`` Σ(ŷ − y)² (s²), ``n`` trips.
    """

    ape: float = 0.0
    ae: float = 0.0
    se: float = 0.0
    n: int = 0

    def add(self, pred: np.ndarray, true: np.ndarray) -> None:
        """pred, true: [B] float travel times in seconds. Raises ValueError unless every true time is > 0
        (MAPE divides by it)."""
        pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
        if not np.all(true > 0):
            raise ValueError(f"true travel times must be > 0 s, got {float(np.min(true))} (MAPE divides by them)")
        err = pred - true
        self.ape += float(np.sum(np.abs(err) / true))
        self.ae += float(np.sum(np.abs(err)))
        self.se += float(np.sum(err * err))
        self.n += int(true.size)

    def as_array(self) -> np.ndarray:
        return np.array([self.ape, self.ae, self.se, self.n], dtype=np.float64)

    @classmethod
    def from_array(cls, a) -> "ErrorSums":
        return cls(float(a[0]), float(a[1]), float(a[2]), int(round(float(a[3]))))

    def metrics(self) -> dict:
        """{"mape": fraction (0.289 = 28.9 %), "mae": s, "rmse": s}; NaN when empty."""
        if self.n == 0:
            return {"mape": float("nan"), "mae": float("nan"), "rmse": float("nan")}
        return {"mape": self.ape / self.n, "mae": self.ae / self.n, "rmse": float(np.sqrt(self.se / self.n))}


def errors(pred, true) -> dict:
    """MAPE (fraction), MAE (s), RMSE (s) of predictions against true travel times, [T] arrays."""
    s = ErrorSums()
    s.add(pred, true)
    return s.metrics()


class ConstantSpeedBaseline:
    """ŷ = dist / v̂ with v̂ = Σ dist / Σ time over the training trips (km/s): the physics prior."""

    def fit(self, dist: np.ndarray, time: np.ndarray) -> "ConstantSpeedBaseline":
        self.speed_km_s = float(np.sum(dist) / np.sum(time))
        return self

    def predict(self, dist: np.ndarray) -> np.ndarray:
        return np.asarray(dist, np.float64) / self.speed_km_s


class MeanTimeBaseline:
    """ŷ = mean training travel time (s), whatever the trip."""

    def fit(self, dist: np.ndarray, time: np.ndarray) -> "MeanTimeBaseline":
        self.mean_s = float(np.mean(time))
        return self

    def predict(self, dist: np.ndarray) -> np.ndarray:
        return np.full(len(dist), self.mean_s, dtype=np.float64)


BASELINES = {"const_speed": "constant speed", "mean_time": "mean travel time"}  # summary key → name for people


def fit_baselines(train) -> dict:
    """Both baselines fitted on the ``train`` Trips (its ``dist`` km and ``time`` s): {"const_speed": ...,
    "mean_time": ...}, each with ``predict(dist) -> [T] s``."""
    return {"const_speed": ConstantSpeedBaseline().fit(train.dist, train.time),
            "mean_time": MeanTimeBaseline().fit(train.dist, train.time)}


def baseline_errors(train, val, test) -> dict:
    """Both baselines fitted on the ``train`` Trips: their test MAPE / MAE / RMSE and validation MAPE, as
    summary.json's baseline_* fields (MAPE a fraction, MAE and RMSE in s)."""
    fitted = fit_baselines(train)
    out = {f"baseline_{n}_{k}": v for n, f in fitted.items() for k, v in errors(f.predict(test.dist), test.time).items()}
    out.update({f"baseline_{n}_val_mape": errors(f.predict(val.dist), val.time)["mape"] for n, f in fitted.items()})
    return out


def summary_rows(s: dict) -> list[tuple[str, float, float, float]]:
    """(name, MAPE fraction, MAE s, RMSE s) on the test split of the model and each baseline summary.json
    ``s`` holds (a summary without baselines: the model's row only)."""
    rows = [("DeepTTE (stfast)", s["test_mape"], s["test_mae"], s["test_rmse"])]
    rows += [(name, s[f"baseline_{key}_mape"], s[f"baseline_{key}_mae"], s[f"baseline_{key}_rmse"])
             for key, name in BASELINES.items() if f"baseline_{key}_mape" in s]
    return rows


def format_summary(s: dict) -> str:
    """The test split's MAPE / MAE / RMSE of the model and both baselines, as a table for people."""
    head = f"test split ({counted(s['n_test'], 'trip')})"
    lines = [f"{head:<27}MAPE       MAE      RMSE"]  # the header padded alike for 1 trip or 10,000
    lines += [f"  {n:<24}{100 * a:7.2f} %{b:8.1f} s{c:8.1f} s" for n, a, b, c in summary_rows(s)]
    return "\n".join(lines)
