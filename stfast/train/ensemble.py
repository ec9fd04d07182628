"""Trained models from checkpoints, and the ensemble of several (for example seeds of one configuration).

A seed ensemble averages the predicted travel times of models trained with different seeds; on small
data (1,000 trips) it removes most of the seed-to-seed spread of a single model (see README, "Accuracy").
"""
from __future__ import annotations

import numpy as np

from ..data.trips import Trips
from .trained import TrainedModel, load_model


def predict_ensemble(models, trips: Trips, device: str = "cpu", progress: bool = False,
                     allow_outside: bool = False) -> np.ndarray:
    """Predicted travel times [T] (s, float64) of ``trips``: the mean over ``models`` (checkpoint paths or
    loaded :class:`~stfast.train.trained.TrainedModel`s; one: that model's predictions). Raises
    ValueError when ``models`` is empty, OutsideTrainingArea as :meth:`TrainedModel.predict` does unless
    ``allow_outside``."""
    models = list(models)
    if not models:
        raise ValueError("predict_ensemble: no checkpoints given")
    preds = [(m if isinstance(m, TrainedModel) else load_model(m, device)).predict(trips, progress=progress,
                                                                                allow_outside=allow_outside)
             for m in models]
    return np.mean(preds, axis=0)


def train_ensemble(cfg) -> dict:
    """Train ``cfg.ensemble`` models with seeds ``cfg.seed + k`` on the same data and split (``cfg.split_seed``)
    into ``cfg.out/seed<seed>``, then score their mean prediction on the validation and test splits.

    Writes ``cfg.out/summary.json`` (the ensemble's and every member's metrics, both baselines) and
    ``cfg.out/learning_curves.png`` (every member's validation MAPE per epoch). With ``cfg.resume``,
    members that already finished their ``cfg.epochs`` (summary.json present) are kept, an interrupted one
    continues, and a finished one continues to a larger ``--epochs``.
    Returns the summary dict (MAPE as a fraction, MAE/RMSE in seconds); a member stopped by SIGINT/SIGTERM
    ends the ensemble there, returning that member's ``{"stopped_by": ...}`` (--resume continues it).
    """
    import json
    from dataclasses import replace
    from pathlib import Path

    from . import guards, plots
    from .metrics import errors, format_summary
    from .run_log import read_rows, write_summary
    from .trainer import train

    out = Path(cfg.out)
    guards.check_out_dir(cfg)  # one ensemble per folder (its members' folders are checked as runs)
    members, dirs = [], []
    for k in range(cfg.ensemble):
        seed = cfg.seed + k
        mcfg = replace(cfg, seed=seed, data_seed=cfg.split_seed, ensemble=1, out=str(out / f"seed{seed}"),
                       overwrite=False)
        done = Path(mcfg.out) / "summary.json"
        print(f"ensemble member {k + 1}/{cfg.ensemble}: seed {seed} → {mcfg.out}", flush=True)
        kept = json.loads(done.read_text()) if cfg.resume and done.is_file() else None
        # a finished member is kept unless --epochs now asks for more (then it resumes, as a single run does)
        result = kept if kept is not None and kept.get("epochs", 0) >= cfg.epochs else train(mcfg, keyboard_interrupt=False)
        if "stopped_by" in result:  # SIGINT/SIGTERM: the rest waits for --resume
            return result
        members.append(result)
        dirs.append(Path(mcfg.out))
    models = [load_model(d / "checkpoint.pt", cfg.device) for d in dirs]
    trips = models[0].load_trips()  # the members' data (one split seed), read and split as they read it
    val, test = models[0].split(trips, "val"), models[0].split(trips, "test")
    # the run's own splits are scored as they are (a split's strays outside the training area included)
    v = errors(predict_ensemble(models, val, allow_outside=True), val.time)
    t = errors(predict_ensemble(models, test, allow_outside=True), test.time)
    summary = {k: members[0][k] for k in members[0] if k.startswith(("baseline_", "n_"))}
    summary.update({"test_mape": t["mape"], "test_mae": t["mae"], "test_rmse": t["rmse"],
                    "val_mape": v["mape"], "val_mae": v["mae"], "val_rmse": v["rmse"],
                    "ensemble": cfg.ensemble, "seeds": [cfg.seed + k for k in range(cfg.ensemble)],
                    "members": [{m: s[m] for m in ("test_mape", "test_mae", "test_rmse", "best_val_mape")}
                                for s in members]})
    out.mkdir(parents=True, exist_ok=True)
    write_summary(out, summary)
    plots.ensemble_curves({d.name: read_rows(d)["epoch"] for d in dirs}, summary, out / "learning_curves.png")
    print(f"\nensemble of {cfg.ensemble} models (seeds {summary['seeds'][0]}–{summary['seeds'][-1]}); "
          f"validation MAPE {100 * v['mape']:.2f} %\n" + format_summary(summary)
          + f"\nwrote summary.json, learning_curves.png in {out}", flush=True)
    return summary

