"""Seed ensembles: `stfast train --ensemble N` trains N seeds on one split and scores their mean."""
import json

import numpy as np
import pytest
from conftest import random_trips

from stfast.cli import main
from stfast.data.dataset import TripDataset
from stfast.data.readers import read_deeptte_jsonl
from stfast.train.config import TrainConfig
from stfast.train.ensemble import load_model, predict_ensemble
from stfast.train.metrics import errors
from stfast.train.run_data import predict, split_trips


def test_ensemble_trains_members_on_one_split_and_scores_their_mean(tmp_path):
    data = tmp_path / "trips.jsonl"
    random_trips(80, seed=5, max_len=15).to_jsonl(data)
    out = tmp_path / "ens"
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "16", "--seed", "3",
                 "--ensemble", "2", "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["seeds"] == [3, 4] and len(s["members"]) == 2 and (out / "learning_curves.png").stat().st_size > 0
    # one split for both members (seeded by --seed 3 of the ensemble, not by each member's seed)
    m3, m4 = (json.loads((out / f"seed{k}" / "summary.json").read_text()) for k in (3, 4))
    assert m3["baseline_const_speed_mape"] == m4["baseline_const_speed_mape"]
    _, _, test = split_trips(read_deeptte_jsonl(data), TrainConfig(seed=3))
    ckpts = [out / f"seed{k}" / "checkpoint.pt" for k in (3, 4)]
    singles = []
    for c in ckpts:
        m = load_model(c)
        singles.append(predict(m.model, TripDataset(test, m.drivers)))
    assert not np.allclose(singles[0], singles[1])  # two different models
    mean = predict_ensemble(ckpts, test)
    np.testing.assert_allclose(mean, (singles[0] + singles[1]) / 2, rtol=1e-12)
    assert s["test_mape"] == pytest.approx(errors(mean, test.time)["mape"], rel=1e-12)
    # --resume with more --epochs extends the finished members (it kept them at 1 epoch, silently)
    assert main(["train", "--data", str(data), "--epochs", "2", "--batch-size", "16", "--seed", "3",
                 "--ensemble", "2", "--out", str(out), "--no-progress", "--threads", "1", "--resume"]) == 0
    for k in (3, 4):
        assert json.loads((out / f"seed{k}" / "summary.json").read_text())["epochs"] == 2


def test_ensemble_rejects_nproc_and_zero(tmp_path, capsys):
    assert main(["train", "--ensemble", "2", "--nproc", "2", "--out", str(tmp_path)]) == 2
    assert "--ensemble" in capsys.readouterr().err
    assert main(["train", "--ensemble", "0", "--out", str(tmp_path)]) == 2
