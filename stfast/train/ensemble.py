"""Trained models from checkpoints, and the ensemble of several (for example seeds of one configuration).

A seed ensemble averages the predicted travel times of models trained with different seeds; on small
data (1,000 trips) it removes most of the seed-to-seed spread of a single model (see README, "Accuracy").
"""
from __future__ import annotations

import os

import numpy as np

from ..data.dataset import DriverVocab, NormStats, TripDataset
from ..data.trips import Trips
from ..models.deeptte import DeepTTE, DeepTTEConfig
from . import checkpoint as ckpt


def load_model(path: str | os.PathLike, device: str = "cpu") -> tuple[DeepTTE, DriverVocab]:
    """The DeepTTE model saved in checkpoint ``path`` (in the dtype it was trained in, eval mode) and its
    driver vocabulary. Raises FileNotFoundError / ValueError (see checkpoint.load)."""
    state = ckpt.load(path, device)
    model = DeepTTE(DeepTTEConfig.from_dict(state["model_config"]), NormStats.from_dict(state["norm_stats"]))
    dtype = state["model_state"]["entire.out.weight"].dtype  # float32 or float64, as trained
    model.to(device, dtype).load_state_dict(state["model_state"])
    return model.eval(), DriverVocab.from_list(state["drivers"])


def predict_ensemble(paths, trips: Trips, device: str = "cpu", progress: bool = False) -> np.ndarray:
    """Predicted travel times [T] (s, float64) of ``trips``: the mean over the models of the checkpoints
    ``paths`` (one path: that model's predictions). Raises ValueError when ``paths`` is empty."""
    from .trainer import predict

    paths = list(paths)
    if not paths:
        raise ValueError("predict_ensemble: no checkpoints given")
    preds = []
    for path in paths:
        model, vocab = load_model(path, device)
        ds = TripDataset(trips, vocab, next(model.parameters()).dtype)
        preds.append(predict(model, ds, device=device, progress=progress))
    return np.mean(preds, axis=0)
