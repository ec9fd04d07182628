"""The load-balancing data-parallel slicer (Lv et al., WASA 2021, contribution 1): each global batch
of trips is cut into one shard per rank so that every rank finishes its forward + backward at the
same time, predicted by a cost model fitted online to measured per-rank times.

Cost model: a shard S of n trips with lengths l_i (points) takes

    t(S) = a + b·n + c·Σ l_i + d·n·L_max + e·L_max        seconds,  L_max = max l_i

(Σlen: geo-conv and projections on packed points; n·L_max: work on the padded [n, L_max] batch;
L_max: the packed LSTM's sequential steps, each with a fixed cost). Coefficients are fitted by
non-negative (scipy's Lawson–Hanson NNLS), Huber-weighted least squares (IRLS) on a window of
observations; the prior before any fit is Σlen + n·L_max. :class:`BalancedBatchSampler` owns the
calibration: it fits the model first on a warm-up profile (:func:`profile_shards`, ``calibrate``), since
the on-line observations of balanced shards alone barely separate the terms, then refits it from the
measured step times (``observe_step``). Any callable ``cost(lengths [n]) -> seconds`` can stand in for the model.

Partitioners live in C++ (csrc/slicer/partition.{h,cpp}, module ``stfast._slicer``): LPT greedy,
Karmarkar–Karp differencing, sorted contiguous split, local-search refinement under the full model.
All are deterministic, so every rank computes the same partition from the same batch and model
without communication. Gradients stay exact under unequal shards when each rank divides its shard's
loss SUM by the GLOBAL batch's count and gradients are summed (stfast.parallel.data_parallel).
"""
from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from scipy.optimize import nnls

try:
    from .. import _slicer
except ImportError as e:  # pragma: no cover - only a broken build gets here
    raise ImportError(f"stfast's native slicer module stfast._slicer is missing ({e}); rebuild stfast: "
                      "pip install --no-build-isolation -e .") from e

COEFFICIENTS = ("a", "b", "c", "d", "e")  # intercept, per trip, per point, per padded point, per LSTM step
PRIOR = (0.0, 0.0, 1.0, 1.0, 0.0)  # Σlen + n·L_max (arbitrary units) until timings arrive
METHODS = ("balanced", "equal", "sorted", "lpt", "kk", "contiguous")
DEFAULT_MAX_ITERS = 2000  # local-search changes per partition (each lowers the slowest shard)
REFIT_EVERY = 5  # optimizer steps between refits of the cost model from measured step times

CostFunction = Callable[[np.ndarray], float]


def shard_features(lengths: np.ndarray) -> np.ndarray:
    """Features [5] float64 of one shard with trip lengths ``lengths`` [n]: (1, n, Σlen, n·L_max, L_max);
    all zeros for an empty shard (an idle rank computes nothing)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if len(lengths) == 0:
        return np.zeros(5)
    n, lmax = float(len(lengths)), float(lengths.max())
    return np.array([1.0, n, float(lengths.sum()), n * lmax, lmax])


def imbalance(times: Sequence[float]) -> float:
    """max / mean of per-rank times (1.0 = perfectly balanced). Raises ValueError on an empty or
    all-zero input."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0 or not t.mean() > 0:
        raise ValueError(f"imbalance needs positive times, got {t.tolist()}")
    return float(t.max() / t.mean())


class LinearCostModel:
    """t = a + b·n + c·Σlen + d·n·L_max + e·L_max seconds per shard, fitted online.

    ``observe`` adds measured shards (lengths, seconds) to a window of the last ``window``
    observations; ``fit`` refits the coefficients by Huber-weighted (δ = 1.345 robust σ, σ from the
    median absolute residual) iteratively reweighted non-negative least squares on column-scaled
    features, with residuals relative to the measured time (timing noise is multiplicative). Coefficients stay ≥ 0 so that a shard never gets cheaper by adding a trip.

    Shards observed in one ``observe`` call (the ranks' shards of one step) were timed at the same
    moment, so with ``per_step_scale`` (default) each such group gets its own speed factor φ
    (t ≈ φ·x·β, alternating least squares, geometric mean of φ over the groups = 1): the fit then
    learns the shards' relative costs, which is all the partition needs, without the machine's
    slow and fast periods. Measured on this 2-core VM: the same shard timed again varies by 7–26 %
    (thread CPU time), while 2 ranks computing identical shards at the same moment differ by ~5 %.

    Attributes: ``coefficients`` float64 [5] (a, b, c, d, e; seconds, s/trip, s/point, s/padded point,
    s/step); ``fit_error``: dict with ``rel_rmse`` (RMS of residual/measured over the window, outliers
    included), ``rel_median`` (median |residual|/measured),
    ``stderr`` (standard error of each coefficient, None where it sits at the bound 0) and ``n_obs``;
    None before the first fit.
    """

    def __init__(self, coefficients: Sequence[float] = PRIOR, window: int = 1024, min_obs: int = 10,
                 per_step_scale: bool = True):
        self.coefficients = self._check(coefficients)
        if window < 5 or min_obs < 5:
            raise ValueError(f"window and min_obs must be ≥ 5, got {window}, {min_obs}")
        self.window, self.min_obs, self.per_step_scale = window, min_obs, per_step_scale
        self._X: deque = deque(maxlen=window)
        self._y: deque = deque(maxlen=window)
        self._g: deque = deque(maxlen=window)  # group (observe call) of each observation; -1: no factor
        self._next_group = 0
        self._phi: dict[int, float] = {}  # each group's speed factor from the last fit: the next fit starts there
        self.fit_error: dict | None = None

    @staticmethod
    def _check(coefficients) -> np.ndarray:
        c = np.asarray(coefficients, dtype=np.float64)
        if c.shape != (5,) or not np.isfinite(c).all() or (c < 0).any() or not (c > 0).any():
            raise ValueError(f"coefficients must be 5 finite values ≥ 0, not all 0, got {np.asarray(coefficients).tolist()}")
        return c

    @property
    def as_tuple(self) -> tuple:
        return tuple(float(v) for v in self.coefficients)

    def predict(self, lengths: np.ndarray) -> float:
        """Predicted seconds of one shard with trip lengths ``lengths`` [n] (0 when empty)."""
        return float(shard_features(lengths) @ self.coefficients)

    __call__ = predict

    @property
    def n_obs(self) -> int:
        return len(self._y)

    def observe(self, shard_lengths: Sequence[np.ndarray], seconds: Sequence[float]) -> None:
        """Add one measurement per shard: its trips' lengths and its measured forward + backward
        seconds. Empty shards are skipped. Raises ValueError on mismatched sizes or a time < 0."""
        if len(shard_lengths) != len(seconds):
            raise ValueError(f"{len(shard_lengths)} shards but {len(seconds)} times")
        for t in seconds:
            if not np.isfinite(t) or t < 0:
                raise ValueError(f"measured seconds must be finite and ≥ 0, got {t}")
        kept = [(lens, t) for lens, t in zip(shard_lengths, seconds) if len(lens)]
        group = self._next_group if self.per_step_scale and len(kept) >= 2 else -1  # one shard: no ratio
        self._next_group += 1
        for lens, t in kept:
            self._X.append(shard_features(lens))
            self._y.append(float(t))
            self._g.append(group)

    def fit(self, iters: int = 50) -> bool:
        """Refit the coefficients on the window (when it holds ≥ min_obs observations). Returns
        whether a fit was made."""
        if self.n_obs < self.min_obs:
            return False
        X, y = np.array(self._X), np.array(self._y)
        # timing noise grows with the shard (it is multiplicative), so residuals are taken relative to
        # the measured time: rows divided by y, the target is 1
        v = 1.0 / np.maximum(y, 1e-9)
        scale = np.sqrt(((X * v[:, None]) ** 2).mean(axis=0))
        scale[scale == 0] = 1.0
        Z = X * v[:, None] / scale
        g = np.array(self._g, dtype=np.int64)
        grouped = g >= 0
        gid = np.unique(g[grouped], return_inverse=True)[1] if grouped.any() else np.zeros(0, dtype=np.int64)
        phi = np.ones(len(y))  # each observation's group speed factor: t ≈ φ·x·β
        # alternating β / φ converges slowly (linearly) and the window changes little between refits, so
        # each fit continues from the last one's factors
        phi[grouped] = [self._phi.get(int(k), 1.0) for k in g[grouped]]
        w = np.ones(len(y))
        beta = np.zeros(5)
        for _ in range(iters):
            sw = np.sqrt(w)
            new = nnls(Z * sw[:, None], sw / phi)[0]  # x·β/y ≈ 1/φ (Lawson–Hanson active set)
            q = Z @ new
            if grouped.any():  # φ of a group: argmin Σ w (φ q − 1)², then geometric mean 1 (β takes the scale)
                num = np.bincount(gid, (w * q)[grouped])
                den = np.bincount(gid, (w * q * q)[grouped])
                f = np.where(den > 0, num / np.maximum(den, 1e-300), 1.0)
                f = np.where(f > 0, f, 1.0)
                gm = float(np.exp(np.log(f).mean()))
                phi[grouped] = f[gid] / gm
                new = new * gm
                q = Z @ new
            r = phi * q - 1.0
            sigma = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 1e-9)
            w = np.minimum(1.0, 1.345 * sigma / np.maximum(np.abs(r), 1e-300))
            if np.allclose(new, beta, rtol=1e-4, atol=0):
                beta = new
                break
            beta = new
        if not (beta > 0).any():
            return False  # nothing explains the timings (all zero): keep the previous coefficients
        self.coefficients = beta / scale
        self._phi = dict(zip(g[grouped].tolist(), phi[grouped].tolist()))
        rel = phi * (X @ self.coefficients) * v - 1.0  # relative residual after the groups' factors
        active = np.flatnonzero(beta > 0)
        stderr: list = [None] * 5
        Xa = X[:, active] * (phi * v * np.sqrt(w))[:, None]  # the weighted design of the final IRLS step
        n_groups = int(gid.max()) + 1 if len(gid) else 0
        dof = max(len(y) - len(active) - n_groups, 1)
        s2 = float((w * rel ** 2).sum()) / dof
        try:
            cov = s2 * np.linalg.inv(Xa.T @ Xa)
            for j, k in enumerate(active):
                stderr[k] = float(np.sqrt(max(cov[j, j], 0.0)))
        except np.linalg.LinAlgError:
            pass
        self.fit_error = {"rel_rmse": float(np.sqrt(np.mean(rel ** 2))), "rel_median": float(np.median(np.abs(rel))),
                          "stderr": stderr, "n_obs": len(y),
                          "step_factor_spread": float(np.std(np.log(phi[grouped]))) if grouped.any() else 0.0}
        return True

    def to_dict(self) -> dict:
        return {k: float(v) for k, v in zip(COEFFICIENTS, self.coefficients)}

    def state_dict(self) -> dict:
        """Everything a checkpoint needs to continue where the model left off: coefficients [5], the
        window of observations (features [n_obs, 5], seconds [n_obs]) with their groups and the groups' last
        fitted speed factors, the fit error and the sizes."""
        return {"coefficients": self.coefficients.tolist(), "window": self.window, "min_obs": self.min_obs,
                "features": [x.tolist() for x in self._X], "seconds": list(self._y), "fit_error": self.fit_error,
                "groups": list(self._g), "next_group": self._next_group, "per_step_scale": self.per_step_scale,
                "group_factors": [[k, v] for k, v in self._phi.items()]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output. Raises ValueError on bad coefficients or observations."""
        coefficients = self._check(state["coefficients"])
        X = np.asarray(state["features"], dtype=np.float64).reshape(-1, 5)
        y = np.asarray(state["seconds"], dtype=np.float64)
        if len(X) != len(y) or not np.isfinite(X).all() or not np.isfinite(y).all() or (y < 0).any():
            raise ValueError(f"cost model state: {len(X)} feature rows but {len(y)} times, or non-finite / negative values")
        groups = [int(v) for v in state.get("groups", [-1] * len(y))]  # older checkpoints: no factors
        if len(groups) != len(y):
            raise ValueError(f"cost model state: {len(groups)} group ids for {len(y)} times")
        self.window, self.min_obs = int(state["window"]), int(state["min_obs"])
        self.per_step_scale = bool(state.get("per_step_scale", True))
        self.coefficients = coefficients
        self._X, self._y = deque(X, maxlen=self.window), deque(y.tolist(), maxlen=self.window)
        self._g = deque(groups, maxlen=self.window)
        self._next_group = int(state.get("next_group", max(groups, default=-1) + 1))
        self._phi = {int(k): float(v) for k, v in state.get("group_factors", [])}
        self.fit_error = state.get("fit_error")


def profile_shards(lengths: np.ndarray, global_batch_size: int, world_size: int, seed: int = 0,
                   min_shards: int = 12) -> list[np.ndarray]:
    """Trip indices of the shards to time before training (the warm-up profile), so that the cost
    model's first fit comes from measurements, not from the prior.

    The slicer's shards range from a few long trips to many short ones, and on-line observations of
    balanced shards are nearly collinear (each has about the same predicted time), which leaves the
    per-trip, per-point, per-padded-point and per-step terms unidentified. The profile spans them:
    sizes n on a geometric grid from 1 to min(B, 2·⌈B/W⌉), each as (i) n short trips (lengths below
    the median), (ii) n long trips (the longest 10 %), (iii) one long trip and n − 1 short ones (many
    padded points for few real ones). ``lengths`` [T] are the training trips' lengths (points); the
    result holds at least ``min_shards`` shards, a multiple of ``world_size`` (each rank times its
    share: shards r, r + W, ...). Deterministic in ``seed``. Raises ValueError on an empty ``lengths``
    or sizes < 1.
    """
    lengths = np.asarray(lengths)
    if len(lengths) == 0 or global_batch_size < 1 or world_size < 1:
        raise ValueError(f"profile_shards needs trips, global_batch_size ≥ 1 and world_size ≥ 1, got "
                         f"{len(lengths)} trips, {global_batch_size}, {world_size}")
    rng = np.random.default_rng([seed, 0x5EED])
    order = np.argsort(lengths, kind="stable")
    short = order[:max(len(order) // 2, 1)]
    long_ = order[-max(len(order) // 10, 1):]
    top = min(global_batch_size, 2 * -(-global_batch_size // world_size))
    sizes = np.unique(np.round(np.geomspace(1, max(top, 1), 4)).astype(int))
    designs = []
    for n in sizes:
        designs += [rng.choice(short, n), rng.choice(long_, n), np.r_[rng.choice(long_, 1), rng.choice(short, n - 1)]]
    count = max(min_shards, len(designs))
    count = -(-count // world_size) * world_size
    return [designs[k % len(designs)] if k < len(designs) else rng.choice(len(lengths), int(rng.choice(sizes)))
            for k in range(count)]


def partition(lengths: np.ndarray, world_size: int, method: str = "balanced",
              cost: LinearCostModel | CostFunction | None = None, seed: int = 0,
              max_iters: int = DEFAULT_MAX_ITERS) -> np.ndarray:
    """Shard id [B] int32 in [0, world_size) of each trip of a global batch with lengths [B] (points).

    Methods: ``balanced`` (LPT, Karmarkar–Karp, contiguous split and sorted-strided, the promising
    ones refined by local search under the model; the best wins), ``lpt`` (LPT greedy on Σlen only), ``kk`` (Karmarkar–Karp on
    Σlen), ``contiguous`` (sorted contiguous split under the model), ``sorted`` (sorted by length,
    dealt round-robin: equal counts), ``equal`` (equal counts in a random order seeded by ``seed``:
    what torch's DistributedSampler does).
    ``cost``: a :class:`LinearCostModel` (default: the prior), or any callable mapping a shard's
    lengths [n] to seconds; with a callable, ``balanced`` runs LPT and Karmarkar–Karp on the per-trip
    costs cost([l]) and keeps whichever (or sorted-strided) has the smallest max cost(shard).
    Every shard is non-empty when B ≥ world_size. Deterministic.
    Raises ValueError for an unknown method, world_size < 1 (or > 2^20 for the native methods), negative /
    non-finite lengths, or a batch whose predicted time in one shard exceeds 1e300.
    """
    lengths = np.ascontiguousarray(lengths, dtype=np.float64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D [B], got shape {lengths.shape}")
    if not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an int ≥ 1, got {world_size!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not np.isfinite(lengths).all() or (lengths < 0).any():
        raise ValueError("lengths must be finite and ≥ 0")
    B, W = len(lengths), int(world_size)
    if method == "equal":
        perm = np.random.default_rng([seed, zlib.crc32(lengths.tobytes()), B]).permutation(B)
        asg = np.empty(B, np.int32)
        asg[perm] = np.arange(B) % W
        return asg
    if method == "sorted":
        return _slicer.sorted_strided(lengths, W)
    if method == "lpt":
        return _slicer.lpt(lengths, W, (0.0, 0.0, 1.0, 0.0, 0.0))
    if method == "kk":
        return _slicer.karmarkar_karp(lengths, W)
    model = LinearCostModel() if cost is None else cost
    if isinstance(model, LinearCostModel):
        if method == "contiguous":
            return _slicer.contiguous(lengths, W, model.as_tuple)
        return _slicer.balanced(lengths, W, model.as_tuple, int(max_iters))
    if not callable(model):
        raise TypeError(f"cost must be a LinearCostModel or a callable of shard lengths, got {type(model).__name__}")
    weights = np.array([float(model(lengths[i:i + 1])) for i in range(B)], dtype=np.float64)
    if method == "contiguous":
        raise ValueError("method 'contiguous' needs a LinearCostModel (its split uses the model's structure)")
    kk = [_slicer.karmarkar_karp(weights, W)] if B * W <= _slicer.MAX_KARMARKAR_KARP_CELLS else []  # O(B·W) memory
    cands = [_slicer.lpt(weights, W, (0.0, 0.0, 1.0, 0.0, 0.0)), *kk, partition(lengths, W, "sorted")]
    worst = [max(float(model(lengths[c == s])) for s in range(W)) for c in cands]
    return cands[int(np.argmin(worst))]


def predicted_times(lengths: np.ndarray, assignment: np.ndarray, world_size: int,
                    cost: LinearCostModel | CostFunction | None = None) -> np.ndarray:
    """Predicted seconds [W] of each shard of ``assignment`` [B] (integer shard ids in [0, W)) under ``cost``.
    Raises ValueError for non-integer or out-of-range ids."""
    model = LinearCostModel() if cost is None else cost
    lengths = np.asarray(lengths, dtype=np.float64)
    assignment = np.asarray(assignment)
    if assignment.dtype.kind not in "iu":  # a float id would be truncated into another shard
        raise ValueError(f"assignment must hold integer shard ids, got dtype {assignment.dtype}")
    if assignment.size and (int(assignment.min()) < 0 or int(assignment.max()) >= world_size):
        raise ValueError(f"assignment holds shard ids {int(assignment.min())}..{int(assignment.max())}, "
                         f"outside 0..{world_size - 1}")
    if isinstance(model, LinearCostModel):
        return _slicer.shard_costs(lengths, assignment, world_size, model.as_tuple)
    return np.array([float(model(lengths[assignment == s])) for s in range(world_size)])


def step_time_lower_bound(lengths: np.ndarray, world_size: int, cost: LinearCostModel | None = None,
                          rel_tol: float = 1e-9) -> float:
    """A lower bound (seconds) on the slowest shard's predicted time of ANY partition of a global batch
    with trip lengths ``lengths`` [B] (points) into ``world_size`` shards, under a
    :class:`LinearCostModel` (default: the prior). ``max(predicted_times(...)) / bound`` says how far a
    partition can at most be from the optimum (1.0: provably optimal).

    Why it is tight where "mean shard time" is not: each shard's longest trip (its head, L_s) fixes
    what every other trip in it costs, b + c·l + d·L_s. Sort the heads L_1 ≥ … ≥ L_W (L_1 is the
    longest trip). The trips longer than L_{j+1} can only be in shards 1..j, and each costs at least
    b + c·l + d·(the smallest of L_1..L_j that is ≥ l), so for every j = 1..W

        j·T ≥ j·a + e·(L_1 + … + L_j) + Σ_{l > L_{j+1}} (b + c·l + d·head_j(l))      (L_{W+1} = 0).

    The bound is the smallest T for which some head sequence satisfies all W inequalities: bisection
    on T, each test a dynamic program over the distinct lengths (state: the last head; the least
    accumulated cost dominates, since every inequality only caps it). Head sequences that repeat a
    length more often than it occurs are allowed, which only lowers the bound. It is never below
    max(the longest trip alone, a + Σ(b + (c + d)·l) / W). O(W·K²·log(1/rel_tol)) for K distinct
    lengths: meant for analysis (benchmarks/slicer_imbalance.py), not for every step.
    Raises ValueError for world_size < 1 or negative / non-finite lengths.
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an int ≥ 1, got {world_size!r}")
    if lengths.ndim != 1 or not np.isfinite(lengths).all() or (lengths < 0).any():
        raise ValueError("lengths must be a 1-D array of finite values ≥ 0")
    if len(lengths) == 0:
        return 0.0
    a, b, c, d, e = (LinearCostModel() if cost is None else cost).coefficients
    v, cnt = np.unique(lengths, return_counts=True)  # distinct lengths, ascending
    K, W = len(v), min(int(world_size), len(lengths))  # more ranks than trips: the rest stay empty
    n_le = np.concatenate([[0], np.cumsum(cnt)])  # trips among the k shortest distinct lengths
    s_le = np.concatenate([[0.0], np.cumsum(cnt * v)])
    hi_k, lo_k = np.arange(K)[:, None], np.arange(K)[None, :]
    # trips in (v[lo], v[hi]], all headed by v[hi]: the cost of going from head v[hi] to a next head v[lo]
    n_in, s_in = n_le[hi_k + 1] - n_le[lo_k + 1], s_le[hi_k + 1] - s_le[lo_k + 1]
    between = np.where(lo_k <= hi_k, b * n_in + c * s_in + d * v[:, None] * n_in, np.inf)
    last = b * n_le[1:] + c * s_le[1:] + d * v * n_le[1:]  # the last shard: every trip ≤ its head

    def feasible(T: float) -> bool:
        acc = np.full(K, np.inf)  # least e·ΣL + trip costs so far, by the current head
        acc[K - 1] = e * v[K - 1]
        for j in range(1, W):
            cand = acc[:, None] + between  # shards 1..j hold every trip longer than the next head
            cand = np.where(cand <= j * (T - a), cand, np.inf)
            acc = cand.min(axis=0) + e * v
            if not np.isfinite(acc).any():
                return False
        return bool((acc + last <= W * (T - a)).any())

    lo = max(a + b + (c + d + e) * v[-1], a + (b * len(lengths) + (c + d) * s_le[-1]) / W)
    if feasible(lo):
        return float(lo)
    hi = a + b * len(lengths) + (c + d + e) * s_le[-1] + (c + d + e) * v[-1] * len(lengths)
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return float(lo)


def random_global_batches(n_trips: int, global_batch_size: int, seed: int, epoch: int,
                          drop_last: bool = False) -> list[np.ndarray]:
    """Global batches of trip indices for one epoch: a permutation seeded by (seed, epoch), cut into
    runs of ``global_batch_size``; the last one is smaller unless ``drop_last``."""
    perm = np.random.default_rng([seed, epoch]).permutation(n_trips)
    out = [perm[i:i + global_batch_size] for i in range(0, n_trips, global_batch_size)]
    if drop_last and out and len(out[-1]) < global_batch_size:
        out.pop()
    return out


class Shard(list):
    """One rank's part of one step's global batch, carrying the size of that global batch: a list of
    trip indices (python ints) as :class:`BalancedBatchSampler` yields it, or of the samples of those
    trips as :class:`ShardDataset` hands them to a DataLoader's ``collate_fn``.

    The size travels with the shard because nothing else is in step with it: a DataLoader draws from
    its batch sampler ahead of the batches it returns (prefetch) and its worker processes hold their
    own copies of the sampler, so state read off the sampler belongs to another step. A list subclass
    pickles with its attribute, so the size reaches worker processes unchanged.

    Attributes: ``global_size`` int ≥ len(self), trips in the step's global batch over all ranks:
    divide this rank's loss SUM by it and SUM gradients over ranks for the global batch's mean gradient.
    Raises ValueError when ``global_size`` is not an int ≥ the number of items.
    """

    __slots__ = ("global_size",)

    def __init__(self, items: Sequence, global_size: int):
        super().__init__(items)
        if isinstance(global_size, bool) or not isinstance(global_size, (int, np.integer)) or global_size < len(self):
            raise ValueError(f"global_size must be an int ≥ the shard's {len(self)} items, got {global_size!r}")
        self.global_size = int(global_size)

    def __repr__(self) -> str:
        return f"Shard({list.__repr__(self)}, global_size={self.global_size})"

    def __reduce__(self):  # every pickle protocol, and the copy module, rebuild it with its size
        return Shard, (list(self), self.global_size)


class ShardDataset:
    """A map-style dataset view that hands a DataLoader's ``collate_fn`` each shard's samples as a
    :class:`Shard`, with the ``global_size`` of the shard :class:`BalancedBatchSampler` yielded.

    ``ShardDataset(dataset)[i]`` is ``dataset[i]``; the DataLoader's batched fetch (``__getitems__``,
    torch ≥ 2.0, in the main process or a worker) returns ``Shard([dataset[i] for i in shard],
    shard.global_size)`` (through ``dataset.__getitems__`` when it has one). ``dataset``: any object
    with ``__getitem__`` and ``__len__`` (``range(T)`` gives the trip indices themselves).
    Raises TypeError when fetched with indices that are not a Shard (another batch sampler).
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def __getitems__(self, indices: Shard) -> Shard:
        if not isinstance(indices, Shard):
            raise TypeError(f"ShardDataset is fetched with the Shards of a BalancedBatchSampler (batch_sampler=); "
                            f"got {type(indices).__name__}")
        batched = getattr(self.dataset, "__getitems__", None)
        samples = batched(list(indices)) if batched else [self.dataset[i] for i in indices]
        return Shard(samples, indices.global_size)


class BalancedBatchSampler:
    """Yields this rank's :class:`Shard` for each optimizer step of an epoch: its trip indices [n_r]
    (python ints, in batch order) and ``global_size``, the trips of the step's global batch over all ranks.

    Every rank builds the same global batches from ``seed`` (and the epoch, see ``set_epoch``) and
    the same partition of each (deterministic, no communication), so all ranks run the same number of
    steps; the last, smaller global batch is a step like the others (when it holds fewer trips than
    ranks, some ranks get an empty shard and contribute zero gradients).

    Exact gradients under unequal shards: divide the shard's loss SUM by ``shard.global_size`` and SUM
    gradients over ranks (all-reduce with sum); that is the global batch's mean gradient. As a
    DataLoader ``batch_sampler``, wrap the dataset in :class:`ShardDataset`, whose batched fetch hands
    ``collate_fn`` the shard's samples as a Shard with the same ``global_size`` (with any
    ``num_workers``; the sampler itself runs ahead of the batches the loader returns)::

        def collate(samples):                          # a module-level function: workers pickle it
            return my_collate(samples), samples.global_size

        loader = DataLoader(ShardDataset(dataset), batch_sampler=sampler, collate_fn=collate, num_workers=2)
        for batch, global_size in loader:
            loss = loss_fn(model(batch), reduction="sum") / global_size
            loss.backward()                            # then all-reduce (sum) the gradients

    Args: ``lengths`` [T] trip lengths (points); ``global_batch_size`` trips per step over all ranks;
    ``world_size``, ``rank``; ``seed``; ``cost_model`` (LinearCostModel or a callable of shard lengths;
    default: the prior model); ``method`` (see :func:`partition`); ``batches``: optional callable
    epoch → list of global batches (index arrays) replacing the seeded random batching; ``drop_last``;
    ``all_gather`` (float64 [n] → [world_size, n], every rank's array) and ``broadcast`` (rank 0's float64
    array to all), the collectives of the calibration (``calibrate``, ``observe_step``); None: one process.
    Raises ValueError on sizes < 1 or a rank outside [0, world_size).
    """

    def __init__(self, lengths: np.ndarray, global_batch_size: int, world_size: int, rank: int, seed: int = 0,
                 cost_model: LinearCostModel | CostFunction | None = None, method: str = "balanced",
                 batches: Callable[[int], list[np.ndarray]] | None = None, drop_last: bool = False,
                 all_gather: Callable[[np.ndarray], np.ndarray] | None = None,
                 broadcast: Callable[[np.ndarray], np.ndarray] | None = None):
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be ≥ 1, got {global_batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size ≥ 1 and 0 ≤ rank < world_size, got {world_size}, {rank}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        self.lengths = np.asarray(lengths)
        self.global_batch_size, self.world_size, self.rank, self.seed = global_batch_size, world_size, rank, seed
        self.cost_model = LinearCostModel() if cost_model is None else cost_model
        self.method, self._batches, self.drop_last = method, batches, drop_last
        self.epoch = 0
        self._last: tuple | None = None  # (global batch bytes, coefficients, shards) of the last partition
        self._all_gather = all_gather or (lambda a: np.asarray(a, dtype=np.float64)[None])
        self._broadcast = broadcast or (lambda a: a)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_batches(self, epoch: int | None = None) -> list[np.ndarray]:
        e = self.epoch if epoch is None else epoch
        if self._batches is not None:
            return self._batches(e)
        return random_global_batches(len(self.lengths), self.global_batch_size, self.seed, e, self.drop_last)

    def __len__(self) -> int:
        return len(self.global_batches())

    def shards(self, global_batch: np.ndarray) -> list[np.ndarray]:
        """All ranks' trip indices [n_r] for ``global_batch`` [B] (trip indices), in batch order."""
        gb = np.asarray(global_batch, dtype=np.int64)
        coef = self.cost_model.as_tuple if isinstance(self.cost_model, LinearCostModel) else None
        key = (gb.tobytes(), coef)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        asg = partition(self.lengths[gb], self.world_size, self.method, self.cost_model, seed=self.seed)
        out = [gb[asg == r] for r in range(self.world_size)]
        self._last = (key, out)
        return out

    def shard(self, global_batch: np.ndarray) -> np.ndarray:
        """This rank's trip indices of ``global_batch``."""
        return self.shards(global_batch)[self.rank]

    def __iter__(self) -> Iterator[Shard]:
        for gb in self.global_batches():
            yield Shard(self.shard(gb).tolist(), len(gb))

    # ------------------------------------------------------------ calibration of the cost model
    def calibrate(self, time_shard: Callable[[np.ndarray], float]) -> str:
        """Warm-up profile: every rank runs ``time_shard(idx)`` (forward + backward of trip indices ``idx``
        [n] on this rank, its seconds) on its share of :func:`profile_shards` (sizes and length mixes that
        separate the cost model's terms; the first shard once more before, as a warm-up), the times are
        gathered, the model fitted on them and rank 0's coefficients broadcast. Returns how the model was
        set (for the log). A cost model that is not a LinearCostModel is left as it is."""
        if not isinstance(self.cost_model, LinearCostModel):
            return "a given cost function (not calibrated)"
        shards = profile_shards(self.lengths, self.global_batch_size, self.world_size, self.seed)
        mine = shards[self.rank::self.world_size]
        t0 = time.perf_counter()
        seconds = [time_shard(idx) for idx in [mine[0]] + mine][1:]  # the first run warms up
        gathered = self._all_gather(np.asarray(seconds, dtype=np.float64))  # [W, shards per rank]
        # one observation group: the profile takes a second or two, too short for the machine's speed to
        # drift, and its few shards must pin all five coefficients (per-round factors would absorb them)
        w, n = self.world_size, gathered.shape[1]
        model = self.cost_model
        model.observe([self.lengths[shards[r + j * w]] for r in range(w) for j in range(n)], gathered.reshape(-1))
        if model.fit():
            model.coefficients = self._broadcast(model.coefficients)
            return f"fitted on a warm-up profile of {len(shards)} shards ({time.perf_counter() - t0:.1f} s)"
        return "the prior (the warm-up profile gave no fit)"

    def observe_step(self, shards: list[list[np.ndarray]], compute_s: Sequence[float], step: int,
                     started: float) -> dict:
        """After an optimizer step whose micro-batches were cut into ``shards`` [micro-step][rank] (trip
        indices; ``shards()`` of each) and took this rank ``compute_s`` [micro-step] seconds of forward +
        backward: gather every rank's times, feed each micro-batch's shards and times to the cost model,
        refit every REFIT_EVERY steps (``step``: optimizer steps taken; rank 0's coefficients broadcast, so
        that every rank keeps cutting identically). ``started``: time.perf_counter() at the step's start.
        Returns the step's record (per rank, sums over the micro-batches): shard sizes, predicted and
        measured imbalance, compute and idle seconds, the step's seconds, the cost model."""
        gathered = self._all_gather(np.asarray(compute_s, dtype=np.float64))  # [W, k]
        step_s = time.perf_counter() - started
        model = self.cost_model
        linear = isinstance(model, LinearCostModel)
        predicted = np.zeros(self.world_size)
        lens_per_micro = [[self.lengths[sh] for sh in parts] for parts in shards]
        for j, lens_j in enumerate(lens_per_micro):
            predicted += [model.predict(ln) if linear else model(ln) for ln in lens_j]
            if linear:
                model.observe(lens_j, gathered[:, j])
        times = gathered.sum(axis=1)
        lens = [np.concatenate(per_rank) for per_rank in zip(*lens_per_micro)]
        predicted = predicted.tolist()
        if linear and step % REFIT_EVERY == 0:
            model.fit()
            model.coefficients = self._broadcast(model.coefficients)
        return {"slicer": self.method, "shard_trips": [len(ln) for ln in lens],
                "shard_points": [int(ln.sum()) for ln in lens],
                "imbalance_predicted": imbalance(predicted) if max(predicted) > 0 else None,
                "imbalance_measured": imbalance(times) if times.max() > 0 else None,
                "compute_s": times.tolist(), "idle_s": (times.max() - times).tolist(), "step_s": step_s,
                "cost_coef": model.coefficients.tolist() if linear else None,
                "cost_fit_error": model.fit_error if linear else None}
