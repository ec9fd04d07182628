"""The training loop: data → splits → DeepTTE → data-parallel steps → metrics, checkpoints, summary.

Runs as one process or as one rank of a torch.distributed job (torchrun or `stfast train --nproc`).
Every rank builds the same trips, splits and global batches from the seed, takes its equal-count
shard of each global batch, and sums gradients exactly (see stfast.parallel.data_parallel).
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel

from .. import __version__
from ..accum.controller import AccumulationController
from ..accum.goodput import lr_scale
from ..accum.noise import noise_parameters, squared_norm
from ..accum.schedulers import FixedScheduler, make_scheduler, parse_spec
from ..data.dataset import DriverVocab, NormStats, TripDataset
from ..data.fingerprint import trips_fingerprint
from ..data.load import load_trips
from ..data.splits import (
    default_date_split,
    parse_days,
    parse_fractions,
    split_by_days,
    split_random,
)
from ..data.trips import Trips
from ..models.deeptte import DeepTTE, DeepTTEConfig, combine_loss, loss_parts
from ..parallel import data_parallel as dp
from ..parallel.comm import GradientSync, make_communicator
from ..parallel.slicer import (
    BalancedBatchSampler,
    LinearCostModel,
    imbalance,
    profile_shards,
)
from . import checkpoint as ckpt
from . import guards
from .config import TrainConfig
from .metrics import ConstantSpeedBaseline, MeanTimeBaseline, errors

log = logging.getLogger("stfast.train")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
MIN_SPLIT_WARN = 30  # warn when a split holds fewer trips than this
LENGTH_SORT_CHUNK = 100  # batches sorted by length inside chunks of this many (as the original)
SLICER_REFIT_EVERY = 5  # steps between refits of the slicer's cost model


def load_config_trips(cfg: TrainConfig, preprocess_config=None) -> Trips:
    """The trips ``cfg`` names (file or synthetic city), read and preprocessed (with
    ``preprocess_config``, a PreprocessConfig, when given: a checkpoint's). Raises ValueError when
    preprocessing dropped every trip (see :func:`require_trips`)."""
    trips = load_trips(cfg.data, cfg.format, on_error=cfg.on_error, modes=set(cfg.modes) or None,
                       min_spacing_km=cfg.min_spacing_km, gap_s=cfg.gap_s, tz=cfg.tz, n_synthetic=cfg.n_synthetic,
                       seed=cfg.split_seed, preprocess_config=preprocess_config)
    return require_trips(trips, cfg.data or "the synthetic city")


def require_trips(trips: Trips, source: str) -> Trips:
    """``trips`` if it holds any; else ValueError saying that nothing survived reading and preprocessing
    of ``source``, with the counts of what was dropped and why."""
    if len(trips) == 0:
        drops = ", ".join(f"{k} {v}" for k, v in sorted(trips.dropped.items())) or "nothing was dropped: no input trips"
        raise ValueError(f"{source}: reading and preprocessing left no trip (dropped: {drops}); check --format, "
                         "--modes, --min-spacing-km and --gap-min")
    return trips


def resume_checkpoint(cfg: TrainConfig) -> tuple[dict | None, Path | None]:
    """The checkpoint a run continues from, and its path: on ``--resume``, or when torchrun restarted
    the job (TORCHELASTIC_RESTART_COUNT > 0) and a checkpoint exists; else (None, None). The first
    intact one of last.pt, last.prev.pt, checkpoint.pt in ``cfg.out`` (a corrupt one is skipped with a
    warning naming it), checked against this version and model configuration (guards.check_resume).
    Raises FileNotFoundError (--resume without a checkpoint) or ValueError (mismatch, all corrupt)."""
    out = Path(cfg.out)
    names = [out / "last.pt", ckpt.previous_path(out / "last.pt"), out / "checkpoint.pt"]
    restarted = guards.restart_count() > 0 and any(p.is_file() for p in names)
    if not (cfg.resume or restarted):
        return None, None
    try:
        state, path = ckpt.load_first(names)
    except FileNotFoundError:
        raise FileNotFoundError(f"--resume: no last.pt or checkpoint.pt in {out}") from None
    guards.check_resume(state, cfg, path)
    return state, path


def split_trips(trips: Trips, cfg: TrainConfig) -> tuple[Trips, Trips, Trips]:
    """Train/validation/test trips by the configured rule. Raises ValueError on an empty split."""
    if cfg.split_days or cfg.split_by == "date":
        days = parse_days(cfg.split_days) if cfg.split_days else default_date_split(trips.date_id)
        idx = split_by_days(trips.date_id, days)
    else:
        idx = split_random(len(trips), parse_fractions(cfg.split), cfg.split_seed)
    parts = tuple(trips.subset(i) for i in idx)
    for name, p in zip(("training", "validation", "test"), parts):
        if len(p) == 0:
            raise ValueError(f"the {name} split is empty ({len(trips)} trips); change --split/--split-days")
        if len(p) < MIN_SPLIT_WARN:
            log.warning("the %s split has only %d trips: its metrics are noisy", name, len(p))
    return parts  # type: ignore[return-value]


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Global batches of one epoch: a seeded shuffle, sorted by length inside chunks of
    LENGTH_SORT_CHUNK batches (less padding), batch order shuffled. The same on every rank; the last
    batch may be smaller."""
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    chunk = batch_size * LENGTH_SORT_CHUNK
    batches = []
    for s in range(0, len(perm), chunk):
        part = perm[s:s + chunk]
        part = part[np.argsort(lengths[part], kind="stable")]
        batches += [part[i:i + batch_size] for i in range(0, len(part), batch_size)]
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def _progress(iterable, enabled: bool, **kw):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, **kw)


@torch.no_grad()
def predict(model: DeepTTE, ds: TripDataset, batch_size: int = 256, info: dp.DistInfo = dp.DistInfo(),
            device="cpu", progress: bool = False) -> np.ndarray:
    """Predicted travel times [T] (s, float64) of every trip of ``ds``; under data parallelism each
    rank predicts its share and the result is summed over ranks (every rank gets all T)."""
    was = model.training
    model.eval()
    out = np.zeros(len(ds), dtype=np.float64)
    order = np.argsort(ds.lengths, kind="stable")
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    mine = batches[info.rank::info.world_size]
    for idx in _progress(mine, progress, desc="evaluate", leave=False, unit="batch"):
        out[idx] = model(ds.batch(idx).to(device)).time.double().cpu().numpy()
    model.train(was)
    return dp.all_reduce_sum(out, info)


def evaluate(model, ds, info=dp.DistInfo(), device="cpu", progress=False) -> dict:
    """MAPE (fraction), MAE and RMSE (s) over the whole split."""
    pred = predict(model, ds, info=info, device=device, progress=progress)
    return errors(pred, ds.trips.time)


class Trainer:
    """Trains DeepTTE per a :class:`TrainConfig`, writing into ``cfg.out``:

    metrics.jsonl, one JSON object per line, its "type" one of: "epoch" (losses, validation metrics,
    throughput), "window" (an accumulation window: k, noise scale, throughput, communication share),
    "step" (under data parallelism: the slicer's shard sizes, predicted and measured imbalance, idle
    seconds per rank, cost model) and "bad_step" (a skipped non-finite step);
    summary.json, checkpoint.pt (best validation MAPE) and
    last.pt (the latest epoch or step, what ``--resume`` continues from). Both are written atomically.
    """

    def __init__(self, cfg: TrainConfig):
        cfg.validate()
        self.cfg = cfg
        self.info = dp.init_from_env(cfg.device, timeout_s=cfg.timeout_s)
        if cfg.threads or self.info.distributed:
            torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // self.info.world_size))
        self.device = torch.device(cfg.device if not cfg.device.startswith("cuda") or not self.info.distributed
                                   else f"cuda:{self.info.local_rank}")
        self.dtype = DTYPES[cfg.dtype]
        self.out = Path(cfg.out)
        self.show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
        self.show = self.show and self.info.is_main

    def say(self, msg: str) -> None:
        if self.info.is_main:
            print(msg, flush=True)

    # ---------------------------------------------------------------- set-up
    def setup(self) -> None:
        cfg = self.cfg
        self._check_out_dir()
        resume = self._resume_state()  # before any data is read: a mismatched checkpoint fails fast
        trips = load_config_trips(cfg)
        self.dropped = dict(trips.dropped)
        self.n_trips, self.data_fingerprint = len(trips), trips_fingerprint(trips)
        self.preprocess_config, self.tz = trips.preprocess_config, trips.tz  # as used (tz resolved)
        if resume is not None:
            guards.check_resume_data(resume, self.data_fingerprint, self.n_trips, cfg, self._resume_path)
        self.train_trips, self.val_trips, self.test_trips = split_trips(trips, cfg)
        guards.check_world_size(len(self.train_trips), self.info.world_size)
        if resume is not None:
            self.stats = NormStats.from_dict(resume["norm_stats"])
            self.vocab = DriverVocab.from_list(resume["drivers"])
            mcfg = DeepTTEConfig.from_dict(resume["model_config"])
        else:
            self.vocab = DriverVocab(self.train_trips.driver)
            mcfg = DeepTTEConfig(n_drivers=len(self.vocab), **guards.model_options(cfg))
            self.stats = NormStats.from_trips(self.train_trips, mcfg.kernel_size)
        self.train_ds, self.val_ds, self.test_ds = (TripDataset(t, self.vocab, self.dtype) for t in
                                                    (self.train_trips, self.val_trips, self.test_trips))
        torch.manual_seed(cfg.seed)
        self.model = DeepTTE(mcfg, self.stats).to(self.device, self.dtype)
        # fused: one kernel for all parameters (measured on this 2-core CPU: 0.45 ms a step against 3.5 ms
        # for the default per-parameter loop, ~6 % of a k = 1 step); the same update up to rounding
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
        # --ema-decay: the weights' exponential moving average (Polyak & Juditsky 1992), what validation,
        # checkpoint.pt and the test score use; it smooths the epoch-to-epoch jumps of a small data set.
        # The decay is per global micro-batch: a step of k accumulation steps decays the average by
        # decay^k, so it spans the same 1/(1 − decay) micro-batches of trips, hence the same stretch of
        # an epoch, whatever k (a fixed decay per step would average k times as many trips at k).
        self.ema = (AveragedModel(self.model, multi_avg_fn=lambda avg, new, n: torch._foreach_lerp_(
                        avg, new, 1.0 - cfg.ema_decay ** self.accum.k))
                    if cfg.ema_decay is not None else None)
        # gradient sync (stfast.parallel.comm): buckets summed over ranks while the backward runs;
        # backward passes inside self.grad_sync.no_sync() (accumulation micro-steps) do not communicate
        self.grad_sync = (GradientSync(self.model.parameters(), make_communicator(cfg.comm, self.device))
                          if self.info.distributed else None)
        self.epoch, self.step, self.best = 0, 0, math.inf
        self.epoch_batch = 0  # batches of self.epoch already done (set when stopped at max_steps)
        self._setup_components()
        self._setup_accumulation(resume)
        if resume is not None:
            self.model.load_state_dict(resume["model_state"])
            self.opt.load_state_dict(resume["optimizer_state"])
            if self.ema is not None and resume.get("ema_state") is not None:
                self.ema.load_state_dict(resume["ema_state"])
            self.epoch, self.step, self.best = resume["epoch"], resume["step"], resume["best_val_mape"]
            self.epoch_batch = resume.get("epoch_batch", 0)
            ckpt.set_rng_state(resume["rng"])
            self._resume_progress(resume)
            self.say(f"resumed from {self._resume_path} at epoch {self.epoch}, step {self.step}")
        self.say(f"stfast {__version__}: {len(trips)} trips → train {len(self.train_trips)}, "
                 f"val {len(self.val_trips)}, test {len(self.test_trips)}; "
                 f"{sum(p.numel() for p in self.model.parameters()):,} parameters; "
                 f"world size {self.info.world_size}, device {self.device}, {cfg.dtype}")
        if self.dropped:
            self.say("dropped: " + ", ".join(f"{k} {v}" for k, v in sorted(self.dropped.items())))
        self._setup_slicer(resume)

    # ---------------------------------------------------------------- load-balancing slicer
    def _setup_slicer(self, resume: dict | None = None) -> None:
        """Under data parallelism each global batch is cut by a BalancedBatchSampler (the same cut on
        every rank); one process trains on whole batches. The cost model comes from the checkpoint on
        --resume, otherwise from a warm-up profile (_slicer_profile)."""
        cfg, self.slicer = self.cfg, None
        if self.info.distributed and cfg.parallel == "dp":  # component-parallel stages shard by replica
            self.slicer = BalancedBatchSampler(
                self.train_ds.lengths, cfg.batch_size, self.info.world_size, self.info.rank, cfg.seed,
                method=cfg.slicer or "balanced",
                batches=lambda e: epoch_batches(self.train_ds.lengths, cfg.batch_size, cfg.seed, e))
            if resume is not None and resume.get("slicer_cost_model") is not None:
                self.slicer.cost_model.load_state_dict(resume["slicer_cost_model"])
                how = "restored from the checkpoint"
            else:
                how = self._slicer_profile()
            self.say(f"slicer: {self.slicer.method}; cost model {how}: "
                     + ", ".join(f"{k} {v:.3g}" for k, v in self.slicer.cost_model.to_dict().items()))

    def _slicer_profile(self) -> str:
        """Warm-up profile: every rank times forward + backward of its share of profile_shards (sizes
        and length mixes that separate the cost model's terms), the times are all-gathered, the model
        is fitted on them and rank 0's coefficients broadcast. The model's parameters, gradients and
        the RNG streams are left as they were (dropout draws happen under a forked RNG)."""
        model, info = self.slicer.cost_model, self.info
        shards = profile_shards(self.train_ds.lengths, self.cfg.batch_size, info.world_size, self.cfg.seed)
        mine = shards[info.rank::info.world_size]
        n_trips = self.cfg.batch_size
        k = self.model.cfg.kernel_size
        devices = [self.device] if self.device.type == "cuda" else []
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=devices), self.grad_sync.no_sync():
            seconds = []
            for j, idx in enumerate([mine[0]] + mine):  # the first run warms up (allocator, first calls)
                t = time.perf_counter()
                b = self.train_ds.batch(idx).to(self.device)
                n_local = int(np.maximum(self.train_ds.lengths[idx] - k + 1, 0).sum())
                combine_loss(loss_parts(self.model, self.model(b), b), self.model.cfg.alpha, n_trips, n_local,
                             True).backward()
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                if j > 0:
                    seconds.append(time.perf_counter() - t)
        self.model.zero_grad(set_to_none=True)
        gathered = dp.all_gather_floats(np.asarray(seconds, dtype=np.float64), info)  # [W, shards per rank]
        # one observation group: the profile takes a second or two, too short for the machine's speed to
        # drift, and its few shards must pin all five coefficients (per-round factors would absorb them)
        w, n = info.world_size, gathered.shape[1]
        model.observe([self.train_ds.lengths[shards[r + j * w]] for r in range(w) for j in range(n)],
                      gathered.reshape(-1))
        if isinstance(model, LinearCostModel) and model.fit():
            model.coefficients = dp.broadcast_floats(model.coefficients, info)
            return f"fitted on a warm-up profile of {len(shards)} shards ({time.perf_counter() - t0:.1f} s)"
        return "the prior (the warm-up profile gave no fit)"

    def _slicer_step(self, shards: list[list[np.ndarray]], compute_s: list[float], t_start: float) -> None:
        """After a step of micro-batches whose every rank's trip indices were ``shards`` [micro-step][rank]
        (as cut for the step: the slicer caches only the last micro-batch's cut): gather every rank's
        measured forward + backward seconds of each micro-batch, feed each micro-batch's shards and times
        to the cost model (refit every SLICER_REFIT_EVERY steps, coefficients taken from rank 0 so that
        all ranks keep cutting identically), and append one metrics row (rank 0; per rank, sums over the
        micro-batches)."""
        gathered = dp.all_gather_floats(np.asarray(compute_s, dtype=np.float64), self.info)  # [W, k]
        step_s = time.perf_counter() - t_start
        model = self.slicer.cost_model
        predicted = np.zeros(self.info.world_size)
        lens_per_micro = [[self.train_ds.lengths[sh] for sh in parts] for parts in shards]
        for j, lens_j in enumerate(lens_per_micro):
            predicted += [model.predict(ln) for ln in lens_j]
            model.observe(lens_j, gathered[:, j])
        times = gathered.sum(axis=1)
        lens = [np.concatenate(per_rank) for per_rank in zip(*lens_per_micro)]
        predicted = predicted.tolist()
        if self.step % SLICER_REFIT_EVERY == 0:
            model.fit()
            model.coefficients = dp.broadcast_floats(model.coefficients, self.info)
        if not self.info.is_main:
            return
        rec = {"type": "step", "step": self.step, "epoch": self.epoch, "slicer": self.slicer.method,
               "shard_trips": [len(ln) for ln in lens], "shard_points": [int(ln.sum()) for ln in lens],
               "imbalance_predicted": imbalance(predicted) if max(predicted) > 0 else None,
               "imbalance_measured": imbalance(times) if times.max() > 0 else None,
               "compute_s": times.tolist(), "idle_s": (times.max() - times).tolist(), "step_s": step_s,
               "cost_coef": model.coefficients.tolist(), "cost_fit_error": model.fit_error}
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _setup_components(self) -> None:
        """--parallel cp / dp+cp (stfast.parallel.components): one process runs DeepTTE's independent
        components concurrently (CUDA streams; CPU threads); several run replicas of 2 stages (ranks
        2r, 2r+1: attr + geo-conv + LSTM | estimators; with --cp-plan layers attr + geo-conv + the first
        half of the LSTM's layers | the rest + estimators) exchanging activations over their cp group, on
        the replica's shard. Every rank keeps the whole model: gradients are summed over the WORLD
        (a stage's parameters have gradients only on its ranks, so this is the sum over replicas), which
        keeps every copy equal for evaluation, checkpoints and --resume."""
        self.executor, self.layout, self.data_info = None, None, self.info
        if self.cfg.parallel == "dp":
            return
        from ..parallel.comm import TorchCommunicator
        from ..parallel.components import (
            ComponentExecutor,
            ComponentPlan,
            ParallelLayout,
        )
        from .config import CP_STAGES

        layers = self.cfg.cp_plan == "layers"  # the LSTM per layer: the cut halves the critical path
        graph = self.model.component_graph(split_lstm_layers=layers)
        cut = f"lstm_l{max(1, self.model.cfg.num_layers // 2) - 1}" if layers else "lstm"
        if not self.info.distributed:
            plan = ComponentPlan.concurrent(graph, self.device)
            self.executor = ComponentExecutor(plan, self.cfg.micro_batches or 1, threads=self.device.type == "cpu")
        else:
            self.layout = ParallelLayout.build(CP_STAGES)
            self.data_info = self.layout.data_info
            plan = ComponentPlan.split_after(graph, cut, [self.device] * CP_STAGES)
            self.executor = ComponentExecutor(plan, self.cfg.micro_batches or 4, place_modules=False,
                                              comm=TorchCommunicator(self.layout.cp_group))
        self.say(f"component parallel: {plan}, {self.executor.micro_batches} micro-batches"
                 + (f", {self.layout.dp} replicas × {CP_STAGES} stages" if self.layout else ""))

    def _setup_accumulation(self, resume) -> None:
        """The accumulation scheduler (built on rank 0; the others follow its broadcast k) and the
        controller of windows and noise statistics; restored from the checkpoint on --resume."""
        spec = parse_spec(self.cfg.accumulation, self.info.world_size)
        if self.info.is_main or spec != "rl":
            # a resumed agent's state (its pre-training transitions too) is in the checkpoint: no pre-training
            sched = make_scheduler(spec, seed=self.cfg.seed, pretrained=resume is None or "accumulation" not in resume)
        else:
            sched = FixedScheduler(1)  # rank 0's agent decides; k0 = 1 like the RL scheduler's
        self.accum_spec = spec
        self.accum = AccumulationController(sched, noise_parameters(self.model), self.info, self.cfg.batch_size,
                                            self.cfg.accum_window, self.opt, self.cfg.noise_scale)
        if resume is not None and "accumulation" in resume:
            self.accum.load_state_dict(resume["accumulation"])
        self._set_lr()

    @property
    def eval_model(self) -> DeepTTE:
        """The model that validation, checkpoint.pt and the test score use: the weights' moving average
        under --ema-decay, else the trained model itself."""
        return self.model if self.ema is None else self.ema.module

    def _set_lr(self) -> None:
        """Learning rate for the current effective batch k·B (cfg.lr_scaling; see accum.goodput.lr_scale)
        and epoch (cfg.lr_schedule "cosine": × ½(1 + cos(π·epoch/epochs)), Loshchilov & Hutter 2017, SGDR
        without restarts). A function of (k, epoch) only, so --resume restores it exactly."""
        decay = 0.5 * (1.0 + math.cos(math.pi * self.epoch / self.cfg.epochs)) if self.cfg.lr_schedule == "cosine" else 1.0
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.lr * lr_scale(self.accum.k, self.cfg.lr_scaling) * decay

    def _check_out_dir(self) -> None:
        """One run per folder (guards.check_out_dir), decided by rank 0 (which clears it under --overwrite)
        and agreed by all ranks, so that none starts while rank 0 refuses."""
        err = None
        if self.info.is_main:
            try:
                guards.check_out_dir(self.cfg)
            except ValueError as e:
                err = e
        if self.info.distributed:
            refused = dp.all_reduce_sum(np.array([0.0 if err is None else 1.0]), self.info)[0] > 0
            if refused and err is None:
                err = ValueError(f"--out {self.cfg.out} was refused by rank 0 (see its error)")
        if err is not None:
            raise err

    def _resume_state(self):
        self._epoch_progress = (0.0, 0)
        state, self._resume_path = resume_checkpoint(self.cfg)
        if state is None and guards.restart_count() > 0 and self.info.is_main:
            (self.out / "metrics.jsonl").unlink(missing_ok=True)  # restarted before any checkpoint: afresh
        if state is not None and not self.cfg.resume:
            self.say(f"restarted by torchrun (restart {guards.restart_count()}): resuming")
        return state

    def _resume_progress(self, resume: dict) -> None:
        """Mid-epoch resume: the epoch's loss sums so far; metrics.jsonl cut back to what it held when
        the checkpoint was written (rows written after it would be written again)."""
        loss_sum, n_done = resume.get("epoch_progress", (0.0, 0)) if self.epoch_batch else (0.0, 0)
        # rank 0's sum is in the checkpoint; the epoch's loss is summed over ranks at its end
        self._epoch_progress = (loss_sum if self.info.is_main else 0.0, n_done)
        size = resume.get("metrics_bytes")
        m = self.out / "metrics.jsonl"
        if self.info.is_main and size is not None and m.is_file() and m.stat().st_size > size:
            with open(m, "r+b") as f:
                f.truncate(size)

    # ---------------------------------------------------------------- state
    def state(self) -> dict:
        return {
            "stfast_version": __version__,
            "model_config": self.model.cfg.to_dict(),
            "norm_stats": self.stats.to_dict(),
            "drivers": self.vocab.to_list(),
            "model_state": self.model.state_dict(),
            "optimizer_state": self.opt.state_dict(),
            "ema_state": self.ema.state_dict() if self.ema is not None else None,
            "rng": ckpt.rng_state(),
            "epoch": self.epoch,
            "epoch_batch": self.epoch_batch,
            "step": self.step,
            "best_val_mape": self.best,
            # --data absolute, so that `evaluate --split test` finds the run's data from any folder
            "train_config": dict(self.cfg.to_dict(), data=self.cfg.data and os.path.abspath(self.cfg.data)),
            # the data: a --resume or `evaluate --split` on other trips is refused (guards.check_resume_data)
            "data_fingerprint": self.data_fingerprint,
            "n_trips": self.n_trips,
            # every preprocessing setting as used (None: DeepTTE records, not preprocessed) and the time zone
            "preprocess_config": None if self.preprocess_config is None else self.preprocess_config.to_dict(),
            "tz": self.tz,
            "accumulation": self.accum.state_dict(),
            # reliability: the epoch's loss sums so far (mid-epoch checkpoints) and metrics.jsonl's length
            "epoch_progress": self._epoch_progress,
            "metrics_bytes": (self.out / "metrics.jsonl").stat().st_size if (self.out / "metrics.jsonl").is_file() else 0,
            # the slicer's cost model (rank 0's coefficients, which every rank uses), restored on --resume
            "slicer_cost_model": (self.slicer.cost_model.state_dict() if self.slicer is not None
                                  and isinstance(self.slicer.cost_model, LinearCostModel) else None),
        }

    # ---------------------------------------------------------------- training
    def train_step(self, gb, use_local: bool) -> float:
        """One optimizer step on global batch ``gb`` ([B] trip indices), or on a list of k global
        micro-batches accumulated into one step: micro-steps 1..k−1 only backpropagate, the k-th is
        followed by the one gradient all-reduce of the step. Every loss is divided by the trip and
        local-point counts of ALL micro-batches over ALL ranks, so the accumulated gradient is the
        mean over all their trips whatever the shard sizes. Returns this rank's part of the loss."""
        t0 = time.perf_counter()
        micro = [gb] if isinstance(gb, np.ndarray) else list(gb)
        k = self.model.cfg.kernel_size
        n_trips = sum(len(m) for m in micro)
        n_local = int(sum(np.maximum(self.train_ds.lengths[m] - k + 1, 0).sum() for m in micro))
        self.opt.zero_grad(set_to_none=True)
        self.accum.begin_step()
        loss_val = 0.0
        compute = []  # this rank's forward + backward seconds per micro-batch (the slicer's cost model)
        cut = []  # the slicer's shards of every rank [micro-step][rank], reused by _slicer_step
        for i, m in enumerate(micro):
            # micro-steps 1..k-1 accumulate locally; the last one's backward starts the bucketed sync
            last = i == len(micro) - 1
            # the component executor backpropagates per component and micro-batch (a parameter's gradient
            # becomes ready several times): its buckets are all started by finish()
            quiet = (self.grad_sync.no_sync() if self.grad_sync is not None and (not last or self.executor)
                     else contextlib.nullcontext())
            t_micro = time.perf_counter()
            with quiet:
                if self.slicer is None:
                    shard = dp.equal_shard(m, self.data_info)
                else:
                    cut.append(self.slicer.shards(m))
                    shard = cut[-1][self.slicer.rank]
                if len(shard):
                    b = self.train_ds.batch(shard).to(self.device)
                    if self.executor is not None:
                        res = self.executor.forward_backward(b, lambda out, mb: combine_loss(
                            loss_parts(self.model, out, mb), self.model.cfg.alpha, n_trips, n_local, use_local))
                        loss_val += res.loss or 0.0  # None on stage-0 ranks: the loss lives on the last stage
                    else:
                        parts = loss_parts(self.model, self.model(b), b)
                        loss = combine_loss(parts, self.model.cfg.alpha, n_trips, n_local, use_local)
                        loss.backward()
                        loss_val += float(loss.detach())
            if self.slicer is not None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the slicer's timing needs the kernels finished
            compute.append(time.perf_counter() - t_micro)
            self.accum.after_micro_step(len(shard), n_trips, last)
        t_sync = time.perf_counter()
        extra = self.accum.extra(loss_val)
        if self.layout is not None and self.layout.stage > 0:
            # a unit's gradient is split over its replica's stages: the |g_u|² parts add up in the sum,
            # its size and count must be counted once (stage 0's)
            extra[1:3] = 0.0
        reduced = self.grad_sync.finish(extra) if self.grad_sync is not None else extra
        t_sync = time.perf_counter() - t_sync
        # a non-finite loss or gradient (the same on every rank after the sync): no update (guards)
        grad_sq = squared_norm(p.grad for p in self.model.parameters())
        self.bad_step = guards.BadStepGuard.problem(float(reduced[-1]), grad_sq)
        if self.bad_step is not None:
            self.opt.zero_grad(set_to_none=True)
            return loss_val
        self.opt.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        self.step += 1
        self.accum.end_step(reduced, n_trips, time.perf_counter() - t0, t_sync, sum(compute))
        if self.slicer is not None:
            self._slicer_step(cut, compute, t0)
        return loss_val

    def _end_window(self, epoch_done: float) -> bool:
        """Close an accumulation window: the scheduler's next k (and the learning rate for it), the
        window's row in metrics.jsonl; True when the time budget is spent."""
        cfg = self.cfg
        elapsed = self.accum.elapsed()
        used = [epoch_done / cfg.epochs]
        if cfg.max_steps:
            used.append(self.step / cfg.max_steps)
        if cfg.time_budget_s:
            used.append(elapsed / cfg.time_budget_s)
        out_of_time = cfg.time_budget_s is not None and elapsed >= cfg.time_budget_s
        stop, row = self.accum.end_window(max(used), out_of_time)
        self._set_lr()
        if row is not None:
            row = {"type": "window", **row, "step": self.step, "wall_s": elapsed, "accumulation": self.accum_spec}
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
        return stop

    def _step_limit(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

    def fit(self) -> dict:
        """Train (see the class doc). SIGTERM/SIGINT stop after the current step with last.pt written;
        a failed collective is reported naming the ranks that stopped responding (guards)."""
        with guards.StopSignals() as self.signals:
            try:
                return self._fit()
            except (RuntimeError, OSError) as e:
                if not self.info.distributed or isinstance(e, (guards.TrainingDiverged, guards.RankFailure)):
                    raise
                raise guards.RankFailure(guards.describe_collective_failure(
                    e, self.info.rank, self.info.world_size, self.step, self.cfg.timeout_s)) from e

    def _after_step(self, bi: int, loss: float, loss_sum: float, n_done: int) -> bool:
        """Reliability after each optimizer step (guards): log a skipped non-finite step (and stop
        after --max-bad-steps in a row), write last.pt every --checkpoint-every steps, and agree over
        all ranks whether a stop signal arrived. True: stop now (last.pt is written by the caller)."""
        where = f"at epoch {self.epoch + 1}, batch {bi}"
        if self.bad_step is not None and self.info.is_main:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"type": "bad_step", "bad_step": self.step + 1, "at_epoch": self.epoch, "at_batch": bi,
                                    "reason": self.bad_step, "loss": loss}) + "\n")
            log.warning("skipped optimizer step %d %s: %s", self.step + 1, where, self.bad_step)
        self.guard.record(self.bad_step, where)
        self.epoch_batch, self._epoch_progress = bi, (loss_sum, n_done)
        every = self.cfg.checkpoint_every
        if every and self.bad_step is None and self.step % every == 0 and self.info.is_main:
            ckpt.save_atomic(self.state(), self.out / "last.pt", keep_previous=True)
        # one small all-reduce agrees on both: a stop signal on any rank, and --time-budget spent by rank 0's
        # clock (checked every step, not only at window ends: a window of large k can run long)
        budget = self.cfg.time_budget_s
        spent = budget is not None and self.info.is_main and self.accum.elapsed() >= budget
        flag = np.array([1.0 if self.signals.received else 0.0, 1.0 if spent else 0.0])
        if self.info.distributed:
            flag = dp.all_reduce_sum(flag, self.info)
        self.budget_spent = bool(flag[1] > 0)
        return bool(flag[0] > 0)

    def _fit(self) -> dict:
        cfg = self.cfg
        self.setup()
        self.guard, self.bad_step, self.budget_spent = guards.BadStepGuard(cfg.max_bad_steps), None, False
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        t_start = time.perf_counter()
        self.accum.start_clock()
        stopped = False
        stale = 0  # epochs since the best validation MAPE (early stopping)
        out_of_time = False
        while self.epoch < cfg.epochs and not stopped and not self._step_limit() and not out_of_time:
            self.model.train()  # fault 3 fixed: back to training mode every epoch
            self._set_lr()  # the epoch's learning rate (cfg.lr_schedule)
            use_local = cfg.compat != "original" or self.epoch == 0
            batches = epoch_batches(self.train_ds.lengths, cfg.batch_size, cfg.seed, self.epoch)
            t0, loss_sum, n_done, trips_done = time.perf_counter(), 0.0, 0, 0
            if self.epoch_batch:  # resumed mid-epoch: the epoch's sums so far
                loss_sum, n_done = self._epoch_progress
            bar = _progress(None, self.show, total=len(batches), initial=self.epoch_batch,
                            desc=f"epoch {self.epoch + 1}/{cfg.epochs}", unit="batch", leave=False)
            bi = self.epoch_batch
            self.accum.restart_step_clock()  # the last epoch's validation is not a step's time
            while bi < len(batches):
                group = batches[bi:bi + self.accum.k]  # k micro-batches per optimizer step
                loss = self.train_step(group[0] if len(group) == 1 else group, use_local)
                bi += len(group)
                if self.bad_step is None:
                    loss_sum += loss
                    n_done += 1
                trips_done += sum(len(g) for g in group)
                if self.show:
                    bar.update(len(group))
                if self._after_step(bi, loss, loss_sum, n_done):  # a stop signal (guards)
                    stopped = True
                    break
                if self.accum.window_due() or self.budget_spent:  # a partial last window when out of time
                    out_of_time = self._end_window(self.epoch + bi / len(batches))
                if self._step_limit() or out_of_time:
                    self.epoch_batch = bi
                    stopped = self.epoch_batch < len(batches)
                    break
            if self.show:
                bar.close()
            if stopped:
                break
            self.epoch_batch, self._epoch_progress = 0, (0.0, 0)
            wall = time.perf_counter() - t0
            train_loss = float(dp.all_reduce_sum(np.array([loss_sum]), self.info)[0]) / max(n_done, 1)
            val = evaluate(self.eval_model, self.val_ds, self.info, self.device, self.show)
            self.model.train()
            self.epoch += 1
            rec = {"type": "epoch", "epoch": self.epoch, "step": self.step, "train_loss": train_loss, "val_mape": val["mape"],
                   "val_mae": val["mae"], "val_rmse": val["rmse"], "samples_per_s": trips_done / wall,
                   "lr": self.opt.param_groups[0]["lr"],
                   "wall_s": time.perf_counter() - t_start}
            improved = val["mape"] < self.best
            if improved:
                self.best = val["mape"]
            stale = 0 if improved else stale + 1
            if self.info.is_main:
                with open(self.out / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(rec) + "\n")
                st = self.state()
                if improved:  # the weights validated: the average under --ema-decay
                    ckpt.save_atomic(dict(st, model_state=self.eval_model.state_dict()), self.out / "checkpoint.pt")
                ckpt.save_atomic(st, self.out / "last.pt", keep_previous=True)
            self.say(f"epoch {self.epoch:3d}  loss {train_loss:.4f}  val MAPE {100 * val['mape']:.2f} %  "
                     f"MAE {val['mae']:.1f} s  RMSE {val['rmse']:.1f} s  {rec['samples_per_s']:.0f} trips/s"
                     + ("  *" if improved else ""))
            if cfg.patience is not None and stale >= cfg.patience:
                self.say(f"early stop: no better validation MAPE for {stale} epochs")
                break
        if stopped:
            if self.info.is_main:
                ckpt.save_atomic(self.state(), self.out / "last.pt", keep_previous=True)
            why = self.signals.received or ("--time-budget" if out_of_time else "--max-steps")
            self.say(f"stopped after {self.step} steps ({why}); state in {self.out / 'last.pt'}"
                     + ("; continue with --resume" if self.signals.received else ""))
            if self.signals.received:  # exit promptly: no test evaluation (a scheduler's grace period is short)
                return {"stopped_by": self.signals.received, "steps": self.step, "epochs": self.epoch}
        return self.finish()

    def finish(self) -> dict:
        """Score the best checkpoint (or the current model) and both baselines on the test split."""
        best = self.out / "checkpoint.pt"
        if self.info.distributed:
            torch.distributed.barrier()
        if best.is_file():
            self.model.load_state_dict(ckpt.load(best, self.device)["model_state"])
        test = evaluate(self.model if best.is_file() else self.eval_model, self.test_ds, self.info, self.device,
                        self.show)
        tr, te = self.train_trips, self.test_trips
        cs = errors(ConstantSpeedBaseline().fit(tr.dist, tr.time).predict(te.dist), te.time)
        mt = errors(MeanTimeBaseline().fit(tr.dist, tr.time).predict(te.dist), te.time)
        va = self.val_trips  # baselines on the validation split too, for the learning curve
        cs_val = errors(ConstantSpeedBaseline().fit(tr.dist, tr.time).predict(va.dist), va.time)
        mt_val = errors(MeanTimeBaseline().fit(tr.dist, tr.time).predict(va.dist), va.time)
        summary = {
            "test_mape": test["mape"], "test_mae": test["mae"], "test_rmse": test["rmse"],
            "baseline_const_speed_mape": cs["mape"], "baseline_const_speed_mae": cs["mae"],
            "baseline_const_speed_rmse": cs["rmse"],
            "baseline_mean_time_mape": mt["mape"], "baseline_mean_time_mae": mt["mae"],
            "baseline_mean_time_rmse": mt["rmse"],
            "baseline_const_speed_val_mape": cs_val["mape"], "baseline_mean_time_val_mape": mt_val["mape"],
            "best_val_mape": self.best if math.isfinite(self.best) else None, "epochs": self.epoch, "steps": self.step,
            "n_train": len(tr), "n_val": len(self.val_trips), "n_test": len(te),
            "dropped": self.dropped, "world_size": self.info.world_size, "stfast_version": __version__,
        }
        if self.info.is_main:
            tmp = self.out / ".summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            os.replace(tmp, self.out / "summary.json")
            plot_learning_curve(self.out / "metrics.jsonl", self.out / "learning_curve.png", summary)
            self._write_report()
            written = [n for n in ("summary.json", "metrics.jsonl", "learning_curve.png", "report.html", "checkpoint.pt",
                                   "last.pt")
                       if (self.out / n).exists()]
            self.say("\n" + format_summary(summary) + f"\nwrote {', '.join(written)} in {self.out}")
        return summary

    def _write_report(self) -> None:
        """report.png + report.html (stfast.train.report); a plotting failure is logged, never fatal to a
        finished run."""
        from .report import render

        try:
            render(self.out)
        except (ValueError, OSError, RuntimeError) as e:
            log.warning("could not write the report in %s: %s", self.out, e)


def plot_learning_curve(metrics_path: Path, png_path: Path, summary: dict) -> None:
    """Validation MAPE and training loss per epoch, with both baselines' validation MAPE as lines."""
    if not metrics_path.is_file():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_path) as f:
        rows = [r for r in map(json.loads, f) if "val_mape" in r]  # epoch rows, not the slicer's step rows
    ep = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].plot(ep, [100 * r["val_mape"] for r in rows], "o-", label="DeepTTE validation")
    ax[0].axhline(100 * summary["baseline_const_speed_val_mape"], color="tab:orange", ls="--", label="constant speed")
    ax[0].axhline(100 * summary["baseline_mean_time_val_mape"], color="tab:gray", ls=":", label="mean travel time")
    ax[0].set(xlabel="epoch", ylabel="MAPE (%)", title="validation MAPE")
    ax[0].legend()
    ax[1].plot(ep, [r["train_loss"] for r in rows], "o-")
    ax[1].set(xlabel="epoch", ylabel="loss", title="training loss")
    fig.tight_layout()
    tmp = png_path.with_name(".tmp_" + png_path.name)
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    os.replace(tmp, png_path)


def format_summary(s: dict) -> str:
    rows = [("DeepTTE (stfast)", s["test_mape"], s["test_mae"], s["test_rmse"]),
            ("constant speed", s["baseline_const_speed_mape"], s["baseline_const_speed_mae"],
             s["baseline_const_speed_rmse"]),
            ("mean travel time", s["baseline_mean_time_mape"], s["baseline_mean_time_mae"],
             s["baseline_mean_time_rmse"])]
    lines = [f"test split ({s['n_test']} trips)      MAPE       MAE      RMSE"]
    lines += [f"  {n:<24}{100 * a:7.2f} %{b:8.1f} s{c:8.1f} s" for n, a, b, c in rows]
    return "\n".join(lines)


def preflight(cfg: TrainConfig) -> None:
    """What the ranks would reject, checked once in the launching process (``stfast train --nproc``)
    before any rank starts: the --out folder (one run per folder; cleared here under --overwrite), the
    --resume checkpoint (version, model configuration, data), then more ranks than training trips (this
    reads and splits the data once more). Raises ValueError / FileNotFoundError."""
    cfg.validate()
    guards.check_out_dir(cfg)
    state, path = resume_checkpoint(cfg)
    trips = load_config_trips(cfg)
    if state is not None:
        guards.check_resume_data(state, trips_fingerprint(trips), len(trips), cfg, path)
    guards.check_world_size(len(split_trips(trips, cfg)[0]), cfg.nproc)


def train(cfg: TrainConfig) -> dict:
    """Train per ``cfg`` in this process (a rank of a job when torchrun's variables are set)."""
    finished = False
    try:
        result = Trainer(cfg).fit()
        finished = True
        return result
    finally:
        with guards.StopSignals(announce=False):  # the run is over: a late Ctrl-C does not fail it
            dp.shutdown(wait_for_peers=finished)
