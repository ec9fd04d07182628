"""Continuing a run: which checkpoint it continues from (:func:`resume_checkpoint`: on ``--resume``, or
after a torchrun restart), what last.pt and checkpoint.pt hold (:func:`trainer_state`; the keys are pinned
by tests/test_training_curve.py) and putting a Trainer back where a checkpoint was (:func:`restore`).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .. import __version__
from . import checkpoint as ckpt
from . import guards
from .resume_options import _candidates, fill_from_checkpoint  # noqa: F401  (fill_from_checkpoint: its old home)

log = logging.getLogger("stfast.train")


def resume_checkpoint(cfg) -> tuple[dict | None, Path | None]:
    """The checkpoint a run continues from, and its path: on ``--resume``, or when torchrun restarted
    the job (TORCHELASTIC_RESTART_COUNT > 0) and a checkpoint exists; else (None, None). The first
    intact one of last.pt, last.prev.pt, checkpoint.pt in ``cfg.out`` (a corrupt one is skipped with a
    warning naming it), checked against this version and model configuration (guards.check_resume).
    Raises FileNotFoundError (--resume without a checkpoint) or ValueError (mismatch, all corrupt)."""
    out = Path(cfg.out)
    names = _candidates(out)
    restarted = guards.restart_count() > 0 and any(p.is_file() for p in names)
    if not (cfg.resume or restarted):
        return None, None
    try:
        state, path = ckpt.load_first(names)
    except FileNotFoundError:
        raise FileNotFoundError(f"--resume: no last.pt or checkpoint.pt in {out}") from None
    guards.check_resume(state, cfg, path)
    return state, path


def resume_state(cfg, run_log, say) -> tuple[dict | None, Path | None]:
    """:func:`resume_checkpoint`, and for a job restarted by torchrun: a fresh run log when it was restarted
    before any checkpoint, else the message that it resumes (``say``: rank 0's print)."""
    state, path = resume_checkpoint(cfg)
    if state is None and guards.restart_count() > 0:
        run_log.discard()
    elif state is not None and not cfg.resume:
        say(f"restarted by torchrun (restart {guards.restart_count()}): resuming")
    return state, path


def trainer_state(tr) -> dict:
    """The checkpoint of Trainer ``tr``: version, the data's part (RunData.state_dict), the model's
    configuration and weights, optimizer, moving average, RNG streams, position, configuration,
    accumulation controller, the epoch's loss sums so far, the run log's length and the slicer's cost model."""
    return {"stfast_version": __version__, **tr.data.state_dict(), "model_config": tr.model.cfg.to_dict(),
            "model_state": tr.model.state_dict(), "optimizer_state": tr.opt.state_dict(),
            "ema_state": tr.ema.state_dict() if tr.ema is not None else None, "rng": ckpt.rng_state(),
            "epoch": tr.epoch, "epoch_batch": tr.epoch_batch, "step": tr.step, "best_val_mape": tr.best,
            # --data absolute, so that `evaluate --split test` finds the run's data from any folder
            "train_config": dict(tr.cfg.to_dict(), data=tr.cfg.data and os.path.abspath(tr.cfg.data)),
            "accumulation": tr.accum.state_dict(),
            # reliability: the epoch's loss sums so far (mid-epoch checkpoints) and the run log's length
            "epoch_progress": tr.epoch_progress, "metrics_bytes": tr.log.size(),
            "slicer_cost_model": tr.steps.slicer_state(),
            "gemm_plan": tr.gemm_plan,  # rank 0's coefficients, restored on --resume
            # --init-from: the checkpoint this run started from (stfast.train.warm_start); None: from scratch
            "parent": getattr(tr, "parent", None)}


def restore(tr, state: dict, path: Path) -> None:
    """Trainer ``tr`` back to checkpoint ``state`` (read from ``path``): the accumulation controller, weights,
    optimizer (its learning rate too), moving average, position and RNG streams; mid-epoch, the epoch's loss
    sums so far (rank 0's sum is in the checkpoint; the epoch's loss is summed over ranks at its end); the run
    log cut back to what it held when the checkpoint was written (rows written after it would be again).
    The data and the slicer's cost model are restored where they are built (RunData.load, steps.prepare)."""
    if "accumulation" in state:
        tr.accum.load_state_dict(state["accumulation"])
    tr.model.load_state_dict(state["model_state"])
    tr.opt.load_state_dict(state["optimizer_state"])
    if tr.ema is not None and state.get("ema_state") is not None and not _restart_average(tr, state):
        tr.ema.load_state_dict(state["ema_state"])
    tr.epoch, tr.step, tr.best = state["epoch"], state["step"], state["best_val_mape"]
    tr.epoch_batch = state.get("epoch_batch", 0)
    ckpt.set_rng_state(state["rng"])
    loss_sum, n_done = state.get("epoch_progress", (0.0, 0)) if tr.epoch_batch else (0.0, 0)
    tr.epoch_progress = (loss_sum if tr.info.is_main else 0.0, n_done)
    tr.log.cut_back(state.get("metrics_bytes"))
    tr.say(f"resumed from {path} at epoch {tr.epoch}, step {tr.step}")


def _restart_average(tr, state: dict) -> bool:
    """Whether the run continued from ``state`` starts its --swa-start average afresh: the run's first averaged
    epoch moved (``--resume --epochs N`` extends a finished run, and ⌊fraction · epochs⌋ moves with N) and the
    run has not yet reached the new one, so a fresh N-epoch run's average is rebuilt exactly. When it moved to
    an epoch already passed, the average kept is not a fresh run's: a warning says so."""
    from .swa import OFF, TailAverage, swa_start_epoch

    saved = state.get("train_config", {})
    if not isinstance(tr.ema, TailAverage) or saved.get("swa_start") in (None, OFF) or not saved.get("epochs"):
        return False
    was, now = swa_start_epoch(float(saved["swa_start"]), int(saved["epochs"])), tr.ema.start
    if was == now:
        return False
    epoch, batch = state["epoch"], state.get("epoch_batch", 0)
    if epoch < was and (epoch > now or (epoch == now and batch > 0)):  # passed the new start, averaged nothing yet
        tr.say(f"the weight average starts now, in epoch {epoch + 1} of {tr.cfg.epochs}: a fresh run of --epochs "
               f"{tr.cfg.epochs} starts it at epoch {now + 1}, which this run passed before its own start (epoch "
               f"{was + 1} of {saved['epochs']})")
        return True
    if epoch < now or (epoch == now and batch == 0):
        tr.say(f"the weight average starts at epoch {now + 1} of {tr.cfg.epochs} (it started at {was + 1} of "
               f"{saved['epochs']}): it starts afresh there, as in a fresh run")
        return True
    log.warning("--resume: the weight average began at epoch %d of %d; a fresh run of --epochs %d begins it at "
                "epoch %d, which this run has passed: it continues the average it holds", was + 1,
                int(saved["epochs"]), tr.cfg.epochs, now + 1)
    return False
