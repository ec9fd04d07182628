"""The training loop: data → splits → DeepTTE → data-parallel steps → metrics, checkpoints, summary.

Runs as one process or as one rank of a torch.distributed job (torchrun or `stfast train --nproc`).
Every rank builds the same trips, splits and global batches from the seed, takes its shard of each
global batch, and sums gradients exactly (see stfast.parallel.data_parallel). The loop calls the
capabilities' hooks in order: the parallel mode's step executor (stfast.train.steps), the accumulation
controller (k, windows, the learning rate for k), gradient sync, the run log and the guards.
"""
from __future__ import annotations

import logging
import math
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import torch

from .. import __version__
from .._plural import counted
from ..accum.controller import AccumulationController
from ..data.cores import usable_cores
from ..accum.noise import noise_parameters, squared_norm
from ..accum.schedulers import parse_spec
from ..models import members
from ..models.deeptte import DeepTTE, local_count, training_loss
from ..parallel import data_parallel as dp
from ..parallel.comm import GradientSync, make_communicator
from . import checkpoint as ckpt
from . import compiled, gemm_plan, guards, steps, swa, warm_start
from .config import TrainConfig
from .precision import cpu_bf16_note, weight_casts
from .resume import restore, resume_state, trainer_state
from .finish import finish
from .run_data import RunData, epoch_batches, evaluate, preflight, progress_bar
from .run_log import RunLog
from .steps import StepLoss

__all__ = ["DTYPES", "Trainer", "epoch_batches", "preflight", "train"]  # stfast.cli imports these
log = logging.getLogger("stfast.train")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class Trainer:
    """Trains DeepTTE per a :class:`TrainConfig`, writing into ``cfg.out``: metrics.jsonl (the run log,
    stfast.train.run_log: epoch, window, step and bad_step rows), summary.json, checkpoint.pt (best
    validation MAPE) and last.pt (the latest epoch or step, what ``--resume`` continues from; both atomic).
    Construction sets everything up (reads the data, builds the model, restores a checkpoint on --resume);
    ``fit()`` trains; ``train_step()`` is one optimizer step (used by fit and the live RL environment).
    ``resume_hint``: how the line of a run stopped by a signal tells to continue it (the CLI's ``--resume``;
    :func:`train` names :data:`RESUME_IN_PYTHON`)."""

    def __init__(self, cfg: TrainConfig, resume_hint: str = "--resume"):
        cfg.validate()
        self.cfg = cfg
        self.resume_hint = resume_hint
        self.info = dp.init_from_env(cfg.device, timeout_s=cfg.timeout_s)
        if cfg.threads or self.info.distributed:
            torch.set_num_threads(cfg.threads or max(1, usable_cores() // self.info.world_size))
        self.device = torch.device(cfg.device if not cfg.device.startswith("cuda") or not self.info.distributed
                                   else f"cuda:{self.info.local_rank}")
        self.dtype = DTYPES[cfg.dtype]
        self.out = Path(cfg.out)
        self.show = (cfg.progress if cfg.progress is not None else sys.stderr.isatty()) and self.info.is_main
        self.log = RunLog(self.out, enabled=self.info.is_main)
        self.guards = guards.RunGuards(self.info, cfg.max_bad_steps, cfg.time_budget_s, self.log)
        self.epoch, self.step, self.best, self.t_start = 0, 0, math.inf, time.perf_counter()
        self.epoch_batch, self.epoch_progress = 0, (0.0, 0)  # of self.epoch: batches done, (loss sum, steps)
        self.compile_s: float | None = None  # --compile: seconds of the compilation before the first epoch
        with guards.naming_rank_failures(self.info, cfg.timeout_s, lambda: self.step):
            key = guards.agree_out_dir(cfg, self.info)  # rank 0 holds the folder's lock until release_out_dir
            self.release_out_dir = weakref.finalize(self, guards.unlock_out_dir, key) if key else (lambda: None)
            try:
                self._build(cfg)
            except BaseException:
                self.release_out_dir()  # a run refused here (bad data, a mismatched --resume) leaves no folder
                raise

    def _build(self, cfg: TrainConfig) -> None:
        """The run's state after its folder is claimed: the resumed checkpoint, data, model, optimizer,
        accumulation and the parallel step."""
        compiled.refuse_unsupported(cfg, self.device, self.info)
        resume, resume_path = resume_state(cfg, self.log, self.say)  # before the data: a mismatch fails fast
        # the CPU GEMM library per dtype pair: probed once (rank 0) for a new run, the recorded one on --resume
        self.gemm_plan = gemm_plan.for_run(resume, cfg.precision, self.device, self.info)
        # --init-from (not a resumed run): the parent checkpoint, checked, its data and weights carried (warm_start)
        parent = warm_start.load_parent(cfg) if resume is None and cfg.init_from else None
        self.data = RunData.load(cfg, self.dtype, self.info.world_size, resume, resume_path, parent)
        torch.manual_seed(cfg.seed)
        self.model = members.build(self.data.model_config, self.data.stats).to(self.device, self.dtype)
        # the lineage recorded in the checkpoints and summary.json: the parent's, or the resumed run's own
        self.parent = warm_start.init_model(self, parent) if parent is not None else (resume or {}).get("parent")
        # fused: one kernel for all parameters (0.45 ms a step, not 3.5 ms, on this 2-core CPU); same update
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
        # --swa-start / --ema-decay: an average of the weights (stfast.train.swa), what validation,
        # checkpoint.pt and the test score use; updated after every optimizer step
        self.ema = swa.build(cfg, self.model, k=lambda: self.accum.k, epoch=lambda: self.epoch)
        self.grad_sync = (GradientSync(self.model.parameters(), make_communicator(cfg.comm, self.device))
                          if self.info.distributed else None)
        ds = self.data.train_ds
        self.steps = steps.for_mode(cfg, self.model, lambda idx: ds.batch(idx).to(self.device), self.info,
                                    self.grad_sync, self.device, ds.lengths,
                                    lambda e: self.data.epoch_batches(cfg.batch_size, cfg.seed, e))
        if (line := self.steps.describe()) is not None:
            self.say(line)
        self.accum_spec = parse_spec(cfg.accumulation, self.info.world_size)
        self.accum = AccumulationController.for_spec(
            self.accum_spec, cfg.seed, noise_parameters(self.model), cfg.batch_size, cfg.accum_window, self.opt,
            cfg.noise_scale, reduce=lambda a: dp.all_reduce_sum(a, self.info), world_size=self.info.world_size,
            rank=self.info.rank, lr=cfg.lr, lr_scaling=cfg.lr_scaling, k0=cfg.accum_start,
            pretrained=resume is None or "accumulation" not in resume)  # a resumed agent is in the checkpoint
        self.accum.apply_lr(self.cfg.lr_factor(self.epoch))
        if resume is not None:
            restore(self, resume, resume_path)
        self.say(f"stfast {__version__}: {self.data.describe()}; {members.describe(self.model)}; "
                 f"world size {self.info.world_size}, device {self.device}, precision {cfg.precision}")
        if cfg.precision == "bf16-mixed" and (note := cpu_bf16_note(self.device)) is not None:
            self.say(note)
        if any(self.data.dropped.values()):  # said once per run (preprocessing logs only its totals)
            self.say(self.data.dropped_text())
        if (line := self.steps.prepare(resume)) is not None:  # the slicer's cost model
            self.say(line)

    def say(self, msg: str) -> None:
        if self.info.is_main:
            print(msg, flush=True)

    @property
    def eval_model(self) -> DeepTTE:
        """What validation, checkpoint.pt and the test score use (swa.eval_model: the weights' average, if any)."""
        return swa.eval_model(self.model, self.ema)

    def state(self) -> dict:
        """What last.pt and checkpoint.pt hold (stfast.train.resume.trainer_state)."""
        return trainer_state(self)

    def train_step(self, gb, use_local: bool) -> StepLoss:
        """One optimizer step on global batch ``gb`` ([B] trip indices), or on a list of k global micro-batches
        accumulated into one step: micro-steps 1..k−1 only backpropagate, the k-th is followed by the one
        gradient all-reduce of the step. Every loss is divided by the trip and local-point counts of ALL
        micro-batches over ALL ranks (models.deeptte.training_loss), so the accumulated gradient is the mean
        over all their trips whatever the shard sizes. Returns this rank's part of the loss, with why the
        step was skipped (a non-finite loss or gradient, the same on every rank after the sync) or None."""
        t0 = time.perf_counter()
        micro = [gb] if isinstance(gb, np.ndarray) else list(gb)
        n_trips = sum(len(m) for m in micro)
        loss_fn = self._loss_fn(micro, use_local)
        self.opt.zero_grad(set_to_none=True)
        self.accum.begin_step()
        self.steps.begin_step()
        loss, compute = 0.0, []  # this rank's forward + backward seconds per micro-batch
        # bf16-mixed: the micro-batches' forwards share one bfloat16 cast of each weight (precision.weight_casts)
        with weight_casts(self.cfg.precision, self.device, self.model.parameters()):
            for i, m in enumerate(micro):
                last = i == len(micro) - 1
                t = time.perf_counter()
                n_shard, part = self.steps.micro_step(m, last, loss_fn)
                loss += part
                compute.append(time.perf_counter() - t)
                self.accum.after_micro_step(n_shard, n_trips, last)
        t_sync = time.perf_counter()
        extra = self.steps.statistics(self.accum.extra(loss))
        reduced = self.grad_sync.finish(extra) if self.grad_sync is not None else extra
        t_sync = time.perf_counter() - t_sync
        grad_sq = squared_norm(p.grad for p in self.model.parameters())
        skipped = guards.BadStepGuard.problem(float(reduced[-1]), grad_sq)
        if skipped is not None:
            self.opt.zero_grad(set_to_none=True)
            return StepLoss(loss, skipped)
        self.opt.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        self.step += 1
        self.accum.end_step(reduced, n_trips, time.perf_counter() - t0, t_sync, sum(compute))
        if (row := self.steps.end_step(self.step, compute, t0)) is not None:
            self.log.append("step", {"step": self.step, "epoch": self.epoch + 1, **row})  # the epoch in progress
        return StepLoss(loss)

    def _loss_fn(self, micro: list[np.ndarray], use_local: bool):
        """The loss of one optimizer step's micro-batches ``micro`` ([b] trip indices each): (model output, its
        batch) → the shard's part of the mean over all their trips and local points (training_loss)."""
        lengths, kernel = self.data.train_ds.lengths, self.model.cfg.kernel_size
        n_trips, n_local = sum(len(m) for m in micro), sum(local_count(lengths[m], kernel) for m in micro)
        return lambda out, b: training_loss(self.model, out, b, n_trips, n_local, use_local)

    def fit(self) -> dict:
        """Train (see the class doc) and return the run's summary (:meth:`finish`). SIGTERM/SIGINT stop after the
        current step with last.pt written and return ``{"stopped_by": "SIGINT" or "SIGTERM", "steps", "epochs",
        "message"}`` (the line said: the step, last.pt, ``resume_hint``), without the test evaluation; a failed
        collective is reported naming the ranks that stopped responding (guards)."""
        with self.guards.signals, guards.naming_rank_failures(self.info, self.cfg.timeout_s, lambda: self.step):
            return self._fit()

    def _fit(self) -> dict:
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        self.t_start = time.perf_counter()
        if self.cfg.compile and self.epoch < self.cfg.epochs and not self.cfg.steps_reached(self.step):
            self.compile_s = compiled.compile_run(self)  # (a resumed run with no step left compiles nothing)
        self.accum.start_clock()
        stopped = out_of_time = False
        stale = 0  # epochs since the best validation MAPE (early stopping)
        while self.epoch < self.cfg.epochs and not stopped and not self.cfg.steps_reached(self.step) and not out_of_time:
            stopped, out_of_time, improved = self._train_epoch()
            stale = 0 if improved else stale + 1
            if not stopped and self.cfg.patience is not None and stale >= self.cfg.patience:
                self.say(f"early stop: no better validation MAPE for {stale} epochs")
                break
        if stopped:
            ckpt.save_last(self)
            why = self.guards.signals.received or ("--time-budget" if out_of_time else "--max-steps")
            line = (f"stopped after {counted(self.step, 'step')} ({why}); state in {self.out / 'last.pt'}"
                    + (f"; continue with {self.resume_hint}" if self.guards.signals.received else ""))
            self.say(line)
            if self.guards.signals.received:  # exit promptly: no test evaluation (a scheduler's grace period is short)
                return {"stopped_by": self.guards.signals.received, "steps": self.step, "epochs": self.epoch,
                        "message": line}
        return self.finish()

    def _train_epoch(self) -> tuple[bool, bool, bool]:
        """The rest of the current epoch's steps, then (unless stopped) its validation, run-log row and
        checkpoints. Returns (stopped mid-epoch, out of --time-budget, validation MAPE improved)."""
        cfg = self.cfg
        self.model.train()  # fault 3 fixed: back to training mode every epoch
        self.accum.apply_lr(self.cfg.lr_factor(self.epoch))  # the epoch's learning rate (cfg.lr_schedule)
        use_local = cfg.compat != "original" or self.epoch == 0
        batches = self.data.epoch_batches(cfg.batch_size, cfg.seed, self.epoch)
        t0, trips_done, bi = time.perf_counter(), 0, self.epoch_batch
        loss_sum, n_done = self.epoch_progress if self.epoch_batch else (0.0, 0)  # resumed mid-epoch: its sums
        bar = progress_bar(None, self.show, total=len(batches), initial=bi, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                           unit="batch", leave=False)
        self.accum.restart_step_clock()  # the last epoch's validation is not a step's time
        stopped = out_of_time = False
        while bi < len(batches):
            group = batches[bi:bi + self.accum.k]  # k micro-batches per optimizer step
            loss = self.train_step(group[0] if len(group) == 1 else group, use_local)
            bi += len(group)
            if loss.skipped is None:
                loss_sum, n_done = loss_sum + loss, n_done + 1
            trips_done += sum(len(g) for g in group)
            bar.update(len(group))
            if self._after_step(bi, loss, loss_sum, n_done):  # a stop signal (guards)
                stopped = True
                break
            if self.accum.window_due() or self.guards.budget_spent:  # a partial last window when out of time
                out_of_time = guards.end_window(self, self.epoch + bi / len(batches))
            if self.cfg.steps_reached(self.step) or out_of_time:
                self.epoch_batch, stopped = bi, bi < len(batches)
                break
        bar.close()
        if stopped:
            return True, out_of_time, False
        self.epoch_batch, self.epoch_progress = 0, (0.0, 0)
        return False, out_of_time, self._end_epoch(loss_sum, n_done, trips_done / (time.perf_counter() - t0))

    def _end_epoch(self, loss_sum: float, n_done: int, samples_per_s: float) -> bool:
        """Validation, the epoch's row, checkpoint.pt when it is kept (--select: the best validation MAPE so far,
        or every epoch) and last.pt. True: kept (best_val_mape is the kept weights' validation MAPE)."""
        train_loss = float(dp.all_reduce_sum(np.array([loss_sum]), self.info)[0]) / max(n_done, 1)
        val = evaluate(self.eval_model, self.data.val_ds, self.info, self.device, self.show, self.cfg.precision)
        self.model.train()
        self.epoch += 1
        self.log.append("epoch", {"epoch": self.epoch, "step": self.step, "train_loss": train_loss,
                                  "val_mape": val["mape"], "val_mae": val["mae"], "val_rmse": val["rmse"],
                                  "samples_per_s": samples_per_s, "lr": self.opt.param_groups[0]["lr"],
                                  "wall_s": time.perf_counter() - self.t_start})
        improved = swa.keeps(self.cfg.select, val["mape"], self.best)
        self.best = val["mape"] if improved else self.best
        ckpt.save_last(self, best=improved)
        self.say(f"epoch {self.epoch:3d}  loss {train_loss:.4f}  val MAPE {100 * val['mape']:.2f} %  "
                 f"MAE {val['mae']:.1f} s  RMSE {val['rmse']:.1f} s  {samples_per_s:.0f} trips/s"
                 + ("  → checkpoint.pt" if improved else ""))  # said in words: these weights are the run's now
        return improved

    def _after_step(self, bi: int, loss: StepLoss, loss_sum: float, n_done: int) -> bool:
        """The guards after each step (True: a stop signal, stop now; last.pt is written by the caller), and
        last.pt every --checkpoint-every steps."""
        stop = self.guards.after_step(loss.skipped, float(loss), self.step, self.epoch, bi, self.accum.elapsed())
        self.epoch_batch, self.epoch_progress = bi, (loss_sum, n_done)
        every = self.cfg.checkpoint_every
        if every and loss.skipped is None and self.step % every == 0:
            ckpt.save_last(self)
        return stop

    def finish(self) -> dict:
        """Score checkpoint.pt and both baselines on the test split (stfast.train.finish)."""
        return finish(self)


RESUME_IN_PYTHON = "TrainConfig(..., resume=True)"  # what continues a run stopped inside train()


def train(cfg: TrainConfig, *, keyboard_interrupt: bool = True) -> dict:
    """Train per ``cfg`` in this process (a rank of a job when torchrun's variables are set), writing into
    ``cfg.out`` (see :class:`Trainer`), and return the run's summary (summary.json's dict: MAPE as a fraction,
    MAE and RMSE in seconds, both baselines).

    Ctrl-C (SIGINT) and SIGTERM: the first ends the run after the current optimizer step with last.pt written
    (what the CLI saves; a second one stops at once). Then SIGINT raises :class:`KeyboardInterrupt`, as Ctrl-C
    does anywhere in Python, its message naming the step, last.pt and ``TrainConfig(..., resume=True)``, which
    continues the run; SIGTERM (a scheduler's request to stop) returns ``{"stopped_by": "SIGTERM", "steps": S,
    "epochs": E, "message": ...}``. ``keyboard_interrupt=False`` (``stfast train``, whose exit code is then
    128 + the signal's number): SIGINT returns such a dict too, its message naming ``--resume``.

    Raises: KeyboardInterrupt (above); ValueError for an invalid ``cfg`` (naming the option's flag) or data
    the run refuses; :class:`stfast.train.guards.TrainingDiverged` after ``max_bad_steps`` non-finite steps in
    a row."""
    result = _run(cfg, RESUME_IN_PYTHON if keyboard_interrupt else "--resume")
    if keyboard_interrupt and result.get("stopped_by") == "SIGINT":  # after the process group is left
        raise KeyboardInterrupt(result["message"])
    return result


def _run(cfg: TrainConfig, resume_hint: str) -> dict:
    """:func:`train`'s run: a Trainer's fit, then its out folder, gradient hooks and process group released."""
    finished, tr = False, None
    try:
        tr = Trainer(cfg, resume_hint)
        result = tr.fit()
        finished = True
        return result
    finally:
        if tr is not None:
            tr.release_out_dir()  # the folder is free for the next run (a --resume, even in this process)
            if tr.grad_sync is not None:  # its hooks on the parameters keep it, its buckets and the model alive
                tr.grad_sync.remove()
        # the trainer holds the gradient buckets and model tensors that Gloo's works refer to: dropped here, so
        # shutdown() releases them before the process group, with the interpreter alive (see dp.shutdown)
        tr = None
        with guards.StopSignals(announce=False):  # the run is over: a late Ctrl-C does not fail it
            dp.shutdown(wait_for_peers=finished)
