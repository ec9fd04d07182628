"""Guards of a training run: what keeps a long run on a shared cluster from losing work or hanging.

* :func:`check_resume` — a ``--resume`` checkpoint must come from this stfast version and the same
  model configuration (the differing fields are named), checked before any data is read.
* :func:`check_resume_data` — ``--resume`` on other data (its fingerprint differs) is refused.
* :func:`check_out_dir` — one run per folder: a non-empty ``--out`` is refused without ``--resume``
  (``--overwrite`` clears it first); :func:`lock_out_dir` — and one process writing into it at a time.
* :func:`check_world_size` — more ranks than training trips is rejected before the model is built.
* :class:`StopSignals` — SIGTERM/SIGINT ask the run to finish its current step, write ``last.pt`` and
  exit 0 (a second signal acts as usual: the process ends at once).
* :class:`BadStepGuard` — an optimizer step with a non-finite loss or gradient is skipped and logged;
  ``max_bad`` of them in a row stop the run (:class:`TrainingDiverged`), the last checkpoint untouched.
* :func:`describe_collective_failure` — when a collective fails (a rank died, or stopped answering
  within ``--timeout-s``), the survivors meet in the rendezvous store and name the ranks that did not.
* :func:`restart_count` — torchrun's restart counter (``TORCHELASTIC_RESTART_COUNT``): a restarted
  job resumes from its last checkpoint without ``--resume``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import numpy as np
import torch

from .. import __version__
from .._plural import counted
from ..parallel import data_parallel as dp

log = logging.getLogger("stfast.train")


class TrainingDiverged(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


class RankFailure(RuntimeError):
    """A collective failed because another rank died or stopped answering."""


def model_options(cfg) -> dict:
    """The DeepTTEConfig keyword arguments a TrainConfig sets (its :data:`~stfast.train.config.MODEL_OPTIONS`)."""
    from .config import MODEL_OPTIONS

    return {k: getattr(cfg, k) for k in MODEL_OPTIONS}


def check_resume(state: dict, cfg, path) -> None:
    """Raise ValueError (one line, naming the differing fields) when the checkpoint ``state`` read from
    ``path`` was written by another stfast version, for another model configuration or precision."""
    ver = state.get("stfast_version")
    if ver != __version__:
        raise ValueError(f"--resume: {path} was written by stfast {ver}, this is stfast {__version__}")
    from ..models.deeptte import DeepTTEConfig
    from .config import TrainConfig, flag, show

    want = model_options(cfg)
    # an option added since the checkpoint was written (e.g. week) had its default then
    saved = {f.name: f.default for f in dataclasses.fields(DeepTTEConfig) if f.name in want} | state.get("model_config", {})
    diff = [f"{flag(k)} {show(k, saved.get(k))} in the checkpoint, {show(k, v)} now" for k, v in want.items()
            if saved.get(k) != v]
    from .precision import of_train_config

    saved_precision = of_train_config(state.get("train_config", {}))
    if saved_precision != cfg.precision:
        diff.append(f"--precision {saved_precision} in the checkpoint, {cfg.precision} now")
    if diff:
        raise ValueError(f"--resume: {path} is from another model configuration: " + "; ".join(diff))

    saved_cfg = TrainConfig.from_dict(state.get("train_config", {}))
    old, new = saved_cfg.data_options(), cfg.data_options()
    diff = [f"{flag(k)} {show(k, old[k])} in the checkpoint, {show(k, new[k])} now" for k in old if old[k] != new[k]]
    for k, field in (("split", "split"), ("split_by", "split_by"), ("split_days", "split_days"),
                     ("split_seed", "data_seed")):  # split_seed: data_seed, else seed
        if getattr(saved_cfg, k) != getattr(cfg, k):
            diff.append(f"{flag(field)} {getattr(saved_cfg, k)} in the checkpoint, {getattr(cfg, k)} now")
    if diff:
        raise ValueError(f"--resume: {path} was trained on other trips or splits: " + "; ".join(diff))


def check_resume_data(state: dict, fingerprint: str, n_trips: int, cfg, path) -> None:
    """Raise ValueError (one line) when the data read now is not the data the checkpoint ``state`` (from
    ``path``) was trained on: their fingerprints (:func:`stfast.data.fingerprint.trips_fingerprint`) differ."""
    saved = state.get("data_fingerprint")
    if saved is not None and saved != fingerprint:
        was = state.get("train_config", {}).get("data") or "the synthetic city"
        now = f"--data {cfg.data}" if cfg.data else "without --data, the synthetic city"
        raise ValueError(f"--resume: {path} was trained on other data ({was}, {counted(state.get('n_trips', '?'), 'trip')}, "
                         f"fingerprint {saved[:12]}); {now} gives {counted(n_trips, 'trip')}, fingerprint "
                         f"{fingerprint[:12]}: give the run's --data, or train into a new --out")


#: the run folder's lock (``lock_out_dir``): held by the process writing into the folder (rank 0)
LOCK_FILE = ".stfast.lock"
_held: dict[str, list] = {}  # this process's locks: real path -> [open lock file, holders, created the folder]


def lock_out_dir(out) -> str:
    """Claim ``out`` (created if absent) for this process: an exclusive ``flock`` on ``out/.stfast.lock``,
    so that a second run started into the same folder while one writes there is refused instead of
    interleaving its metrics and checkpoints with the first's. Re-entrant within a process (a Trainer made
    again in the same process, e.g. by an environment's reset, shares the hold). Returns the key to give to
    :func:`unlock_out_dir`. Raises ValueError naming the holder's pid when another process holds it, or when
    ``out`` is a file."""
    import fcntl
    from pathlib import Path

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder (one run per folder)")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(out)
    if key in _held:
        _held[key][1] += 1
        return key
    for attempt in range(50):
        f = open(out / LOCK_FILE, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise ValueError(f"--out {out} is in use by another stfast run (pid {holder}): wait for it to end, or "
                             "choose another --out") from None
        if _is_lock_file(f, out) or attempt == 49:  # (a file system whose inodes cannot tell: as it is)
            break
        f.close()  # its holder ended and removed the file between our open and our lock: lock the one there now
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held[key] = [f, 1, created]
    return key


def _is_lock_file(f, out) -> bool:
    """Whether the open file ``f`` is still ``out``'s lock file (not one its holder removed when it ended)."""
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(os.path.join(out, LOCK_FILE)))
    except OSError:
        return False


def unlock_out_dir(key: str) -> None:
    """Release one hold of :func:`lock_out_dir`; the last one removes the lock file and unlocks, so a run that
    ended (finished, failed or stopped) leaves no ``.stfast.lock``. A folder the lock created and that holds
    nothing else (the run failed before writing) is removed again, so bad input leaves no folder."""
    from pathlib import Path

    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    f, _, created = entry
    out = Path(key)
    with contextlib.suppress(OSError):  # the folder may be gone already (removed by its owner)
        if _is_lock_file(f, out):  # removed while locked: a run that opened it meanwhile retries (lock_out_dir)
            (out / LOCK_FILE).unlink()
        if created and not any(out.iterdir()):
            out.rmdir()
    f.close()  # closing the file releases the flock


#: what a training run writes into its folder (``check_out_dir`` clears these with ``--overwrite``)
RUN_FILES = ("metrics.jsonl", "summary.json", "checkpoint.pt", "last.pt", "last.prev.pt", "learning_curve.png",
             "learning_curves.png", "report.png", "report.html", "test_predictions.csv")


def check_out_dir(cfg) -> None:
    """One run per folder. Without ``--resume`` (or a torchrun restart) ``cfg.out`` must be empty or
    absent: a non-empty one is refused (ValueError naming what it holds), unless ``cfg.overwrite``, which
    first removes the run files stfast writes (:data:`RUN_FILES`, ensemble members' ``seed<k>/`` folders
    and temp files of an interrupted write); other files are kept, and named."""
    import shutil
    from pathlib import Path

    out = Path(cfg.out)
    if cfg.resume or restart_count() > 0 or not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    held = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)
    if not held:
        return
    if not cfg.overwrite:
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        raise ValueError(f"--out {out} is not empty ({shown}): continue that run with --resume, replace it "
                         f"with --overwrite, or choose another --out")
    for p in out.iterdir():
        ours = (p.name in RUN_FILES or p.name.startswith((".summary.json.tmp", ".tmp_", ".last.pt.tmp",
                                                          ".checkpoint.pt.tmp", ".test_predictions.csv.tmp"))
                or (p.is_dir() and p.name.startswith("seed") and p.name[4:].isdigit()))
        if ours:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    kept = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)
    if kept:
        logging.getLogger("stfast.train").warning("--overwrite: kept %s in %s (not files of a stfast run)",
                                                  ", ".join(kept), out)


def check_world_size(n_train: int, world_size: int) -> None:
    """Raise ValueError when there are more ranks than training trips (some would never see data)."""
    if world_size > n_train:
        raise ValueError(f"--nproc {world_size} is larger than the {n_train} training trips; "
                         f"use at most {n_train} processes")


def restart_count() -> int:
    """How often torchrun restarted this job (0 when not under torchrun or on the first attempt)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


class StopSignals:
    """Context manager: while active, SIGTERM and SIGINT set :attr:`received` (the signal's name)
    instead of ending the process; a second one restores the previous handler and re-raises it.
    Only the main thread can install handlers; elsewhere it does nothing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, announce: bool = True):
        self.received: str | None = None
        self.announce = announce  # False: record the signal silently (a run that has already finished)
        self._old: dict = {}

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is not None:  # second signal: the usual behaviour
            self.__exit__(None, None, None)
            signal.raise_signal(signum)
            return
        self.received = name
        if self.announce:
            print(f"stfast: {name} received: finishing the current step, then writing last.pt "
                  f"(send it again to stop at once)", flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}


class BadStepGuard:
    """Counts optimizer steps with a non-finite loss or gradient; ``max_bad`` in a row raise
    :class:`TrainingDiverged`.

    Every rank decides from the all-reduced loss and gradients, so all ranks skip the same steps."""

    def __init__(self, max_bad: int):
        self.max_bad = max_bad
        self.in_a_row = 0
        self.total = 0

    @staticmethod
    def problem(reduced_loss: float, grad_sq: float) -> str | None:
        """Why this step must be skipped (``"non-finite loss"`` / ``"non-finite gradient"``) or None.
        ``reduced_loss``: the loss summed over ranks; ``grad_sq``: |g|² of the gradient after the sync,
        accumulated in float64 (:func:`stfast.accum.noise.squared_norm`), non-finite exactly when an
        element is — one number instead of a check per parameter."""
        if not math.isfinite(reduced_loss):
            return "non-finite loss"
        if not math.isfinite(grad_sq):
            return "non-finite gradient"
        return None

    def record(self, problem: str | None, where: str) -> None:
        """Count a step; raise TrainingDiverged after ``max_bad`` bad ones in a row."""
        if problem is None:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        self.total += 1
        if self.in_a_row >= self.max_bad:
            raise TrainingDiverged(f"{self.in_a_row} optimizer steps in a row had a {problem} (the last {where}); "
                                   f"stopped (--max-bad-steps {self.max_bad}); the last good checkpoint is kept")


def describe_collective_failure(err: BaseException, rank: int, world_size: int, step: int,
                                timeout_s: float, wait_s: float = 5.0) -> str:
    """One line for a failed collective on ``rank``: the ranks that did not check in to the
    rendezvous store within ``wait_s`` (the dead or hung ones), or why they could not be found."""
    who = "unknown"
    try:
        store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                           is_master=False, timeout=timedelta(seconds=wait_s))
        prefix = f"stfast/alive/{restart_count()}/"
        store.set(prefix + str(rank), "1")
        deadline = time.monotonic() + wait_s
        missing = [r for r in range(world_size) if r != rank]
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([prefix + str(r)])]
            time.sleep(0.1)
        who = ", ".join(map(str, missing)) if missing else "none (all ranks are alive)"
    except (RuntimeError, OSError, KeyError, ValueError) as e:  # the store lives in torchrun's agent (or rank 0): it may be gone too
        who = f"unknown (rendezvous store unreachable: {type(e).__name__})"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"rank {rank} of {world_size}: a collective failed at step {step} (timeout {timeout_s:g} s); "
            f"rank(s) not responding: {who}; cause: {first}")


@contextlib.contextmanager
def naming_rank_failures(info, timeout_s: float, step: Callable[[], int]):
    """Context manager: a failed collective of a distributed run (RuntimeError, OSError) is raised as
    RankFailure naming the ranks that stopped responding (describe_collective_failure; ``step()``: the
    optimizer step it happened at); TrainingDiverged, RankFailure and one-process errors pass unchanged."""
    try:
        yield
    except (RuntimeError, OSError) as e:
        if not info.distributed or isinstance(e, (TrainingDiverged, RankFailure)):
            raise
        raise RankFailure(describe_collective_failure(e, info.rank, info.world_size, step(), timeout_s)) from e


def agree_out_dir(cfg, info) -> str | None:
    """One run per folder, decided by rank 0 and agreed by all ranks of ``info`` (a DistInfo), so that none
    starts while rank 0 refuses: rank 0 locks the folder (:func:`lock_out_dir`; no other run may write there
    meanwhile) and checks it (:func:`check_out_dir`, which clears it under --overwrite). Returns rank 0's lock
    key (None on other ranks), for :func:`unlock_out_dir` when the run ends. Raises ValueError."""
    err, key = None, None
    if info.is_main:
        try:
            if not cfg.overwrite:  # refused before the lock: a refusal leaves no lock file in the folder
                check_out_dir(cfg)
            key = lock_out_dir(cfg.out)
            check_out_dir(cfg)
        except ValueError as e:
            err = e
            if key is not None:
                unlock_out_dir(key)
                key = None
    if info.distributed:
        refused = dp.all_reduce_sum(np.array([0.0 if err is None else 1.0]), info)[0] > 0
        if refused and err is None:
            err = ValueError(f"--out {cfg.out} was refused by rank 0 (see its error)")
    if err is not None:  # only rank 0 decides, and it released its lock when it refused
        raise err
    return key


class RunGuards:
    """Reliability after each optimizer step of a run over the ranks of ``info`` (a DistInfo): a skipped
    non-finite step is logged (a "bad_step" row in ``run_log``, a warning) and counted (BadStepGuard: stop
    after ``max_bad`` in a row), and all ranks agree in one small all-reduce whether to stop: a stop signal
    (``signals``, entered by the caller around the loop) on any rank, or ``time_budget_s`` spent by rank 0's
    clock (checked every step, not only at window ends: a window of large k can run long)."""

    def __init__(self, info, max_bad: int, time_budget_s: float | None, run_log):
        self.info, self.time_budget_s, self.run_log = info, time_budget_s, run_log
        self.signals, self.bad = StopSignals(), BadStepGuard(max_bad)
        self.budget_spent = False  # agreed after each step

    def after_step(self, skipped: str | None, loss: float, step: int, epoch: int, batch: int, elapsed_s: float) -> bool:
        """After optimizer step ``step`` + 1 (``skipped``: why it was skipped, or None) at ``batch`` of
        ``epoch`` (0-based), ``elapsed_s`` seconds of training. True: a stop signal arrived (stop now).
        Raises TrainingDiverged after too many bad steps in a row."""
        where = f"at epoch {epoch + 1}, batch {batch}"
        if skipped is not None and self.info.is_main:
            self.run_log.append("bad_step", {"bad_step": step + 1, "at_epoch": epoch + 1, "at_batch": batch,
                                             "reason": skipped, "loss": loss})
            log.warning("skipped optimizer step %d %s: %s", step + 1, where, skipped)
        self.bad.record(skipped, where)
        spent = self.time_budget_s is not None and self.info.is_main and elapsed_s >= self.time_budget_s
        stop, self.budget_spent = agree_stop(self.info, self.signals, spent)
        return stop


def agree_stop(info, signals: StopSignals, budget_spent: bool) -> tuple[bool, bool]:
    """One small all-reduce over the ranks of ``info``: (a stop signal arrived on any rank, ``budget_spent``
    on any rank: rank 0's clock decides --time-budget)."""
    flag = np.array([1.0 if signals.received else 0.0, 1.0 if budget_spent else 0.0])
    if info.distributed:
        flag = dp.all_reduce_sum(flag, info)
    return bool(flag[0] > 0), bool(flag[1] > 0)


def end_window(tr, epoch_done: float) -> bool:
    """Close Trainer ``tr``'s accumulation window (the controller sets the next k and its learning rate); its row in
    the run log. True when the time budget is spent."""
    cfg, elapsed = tr.cfg, tr.accum.elapsed()
    used = [epoch_done / cfg.epochs, *([tr.step / cfg.max_steps] if cfg.max_steps else []),
            *([elapsed / cfg.time_budget_s] if cfg.time_budget_s else [])]
    out_of_time = cfg.time_budget_s is not None and elapsed >= cfg.time_budget_s
    stop, row = tr.accum.end_window(max(used), out_of_time)
    if row is not None:
        tr.log.append("window", {**row, "step": tr.step, "wall_s": elapsed, "accumulation": tr.accum_spec})
    return stop
