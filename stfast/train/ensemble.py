"""Trained models from checkpoints, and the ensemble of several (for example seeds of one configuration).

A seed ensemble averages the predicted travel times of models trained with different seeds; on small
data (1,000 trips) it removes most of the seed-to-seed spread of a single model (see README, "Accuracy").
"""
from __future__ import annotations

import numpy as np

from ..data.trips import Trips
from .trained import TrainedModel, load_model


def predict_ensemble(models, trips: Trips, device: str = "cpu", progress: bool = False) -> np.ndarray:
    """Predicted travel times [T] (s, float64) of ``trips``: the mean over ``models`` (checkpoint paths or
    loaded :class:`~stfast.train.trained.TrainedModel`s; one: that model's predictions). Raises
    ValueError when ``models`` is empty."""
    models = list(models)
    if not models:
        raise ValueError("predict_ensemble: no checkpoints given")
    preds = [(m if isinstance(m, TrainedModel) else load_model(m, device)).predict(trips, progress=progress)
             for m in models]
    return np.mean(preds, axis=0)


def train_ensemble(cfg) -> dict:
    """Train ``cfg.ensemble`` models with seeds ``cfg.seed + k`` on the same data and split (``cfg.split_seed``)
    into ``cfg.out/seed<seed>``, then score their mean prediction on the validation and test splits.

    Writes ``cfg.out/summary.json`` (the ensemble's and every member's metrics, both baselines) and
    ``cfg.out/learning_curves.png`` (every member's validation MAPE per epoch). With ``cfg.resume``,
    members that already finished (summary.json present) are kept and an interrupted one continues.
    Returns the summary dict (MAPE as a fraction, MAE/RMSE in seconds).
    """
    import json
    from dataclasses import replace
    from pathlib import Path

    from . import guards
    from .metrics import errors
    from .trainer import format_summary, load_config_trips, split_trips, train

    out = Path(cfg.out)
    guards.check_out_dir(cfg)  # one ensemble per folder (its members' folders are checked as runs)
    members, dirs = [], []
    for k in range(cfg.ensemble):
        seed = cfg.seed + k
        mcfg = replace(cfg, seed=seed, data_seed=cfg.split_seed, ensemble=1, out=str(out / f"seed{seed}"),
                       overwrite=False)
        done = Path(mcfg.out) / "summary.json"
        print(f"ensemble member {k + 1}/{cfg.ensemble}: seed {seed} → {mcfg.out}", flush=True)
        members.append(json.loads(done.read_text()) if cfg.resume and done.is_file() else train(mcfg))
        dirs.append(Path(mcfg.out))
    trips = load_config_trips(cfg)
    _, val, test = split_trips(trips, cfg)
    ckpts = [d / "checkpoint.pt" for d in dirs]
    v = errors(predict_ensemble(ckpts, val, cfg.device), val.time)
    t = errors(predict_ensemble(ckpts, test, cfg.device), test.time)
    summary = {k: members[0][k] for k in members[0] if k.startswith(("baseline_", "n_"))}
    summary.update({"test_mape": t["mape"], "test_mae": t["mae"], "test_rmse": t["rmse"],
                    "val_mape": v["mape"], "val_mae": v["mae"], "val_rmse": v["rmse"],
                    "ensemble": cfg.ensemble, "seeds": [cfg.seed + k for k in range(cfg.ensemble)],
                    "members": [{m: s[m] for m in ("test_mape", "test_mae", "test_rmse", "best_val_mape")}
                                for s in members]})
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(out / "summary.json")
    _plot_members(dirs, out / "learning_curves.png", summary)
    print(f"\nensemble of {cfg.ensemble} models (seeds {summary['seeds'][0]}–{summary['seeds'][-1]}); "
          f"validation MAPE {100 * v['mape']:.2f} %\n" + format_summary(summary)
          + f"\nwrote summary.json, learning_curves.png in {out}", flush=True)
    return summary


def _plot_members(dirs, png_path, summary: dict) -> None:
    """Validation MAPE per epoch of every member, with the ensemble's and constant speed's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import read_rows

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for d in dirs:
        rows = read_rows(d)["epochs"]
        ax.plot([r["epoch"] for r in rows], [100 * r["val_mape"] for r in rows], alpha=0.6, label=d.name)
    ax.axhline(100 * summary["val_mape"], color="k", label="ensemble (best epochs)")
    ax.axhline(100 * summary["baseline_const_speed_val_mape"], color="tab:orange", ls="--", label="constant speed")
    ax.set(xlabel="epoch", ylabel="validation MAPE (%)", title=f"ensemble of {len(dirs)} seeds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    tmp = png_path.with_name(".tmp_" + png_path.name)
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    tmp.replace(png_path)
