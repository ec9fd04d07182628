"""Several DeepTTE members trained together in one run (stfast.models.members, `stfast train --members K`):
each member's gradient is exactly its own loss's, a prediction is the members' mean, the checkpoint loads
back as the same ensemble, and the options that cannot hold several models refuse it by flag."""
import json

import numpy as np
import pytest
import torch

from conftest import random_trips
from stfast.cli import main
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.models import members
from stfast.models.deeptte import DeepTTE, DeepTTEConfig, training_loss
from stfast.train import presets
from stfast.train.config import TrainConfig
from stfast.train.run_data import predict
from stfast.train.trained import load_model


def _batch(seed=11, n=12):
    trips = random_trips(n, seed=seed, max_len=30)
    vocab = DriverVocab(sorted(set(trips.driver)))
    return trips, vocab, TripDataset(trips, vocab, torch.float64).batch(np.arange(n))


@pytest.mark.parametrize("loss, kernels", [("mape", "fused"), ("log", "reference")])
def test_each_member_gets_exactly_its_own_losss_gradient(loss, kernels):
    """Float64: the members' summed loss gives every member the gradient that member's loss gives it alone,
    and the forward's time / local_time are the members' means; the members start from different weights."""
    trips, vocab, b = _batch()
    cfg = DeepTTEConfig(n_drivers=len(vocab) + 1, hidden_size=16, members=3, loss=loss, kernels=kernels, dropout=0.0)
    torch.manual_seed(5)
    model = members.build(cfg, NormStats.from_trips(trips)).double()
    assert isinstance(model, members.DeepTTEMembers) and len(model.members) == 3
    w = [m.spatio_temporal.lstm.weight_ih_l0 for m in model.members]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])
    out = model(b)
    n_local = int(out.mask.sum())
    training_loss(model, out, b, len(b), n_local).backward()
    for m in model.members:
        solo = DeepTTE(m.cfg, NormStats.from_trips(trips)).double()
        solo.load_state_dict(m.state_dict())
        o = solo(b)
        training_loss(solo, o, b, len(b), n_local).backward()
        for (name, p), q in zip(m.named_parameters(), solo.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-10, atol=1e-12), name
    times = torch.stack([m(b).time for m in model.members])
    assert torch.allclose(out.time, times.mean(0), rtol=1e-12)
    assert torch.allclose(out.local_time, torch.stack([m(b).local_time for m in model.members]).mean(0), rtol=1e-12)


def test_one_member_is_plain_deeptte_and_the_classes_refuse_the_other_count(monkeypatch):
    trips, vocab, _ = _batch()
    stats = NormStats.from_trips(trips)
    assert type(members.build(DeepTTEConfig(n_drivers=3), stats)) is DeepTTE
    with pytest.raises(ValueError, match="DeepTTE is one model, the config asks for members=2"):
        DeepTTE(DeepTTEConfig(n_drivers=3, members=2), stats)
    with pytest.raises(ValueError, match="DeepTTEMembers needs members >= 2, got 1"):
        members.DeepTTEMembers(DeepTTEConfig(n_drivers=3), stats)
    with pytest.raises(ValueError, match="members must be ≥ 1, got 0"):
        DeepTTEConfig(n_drivers=3, members=0)
    with pytest.raises(ValueError, match=r"--members 2 trains several whole models; --parallel cp places"):
        TrainConfig(members=2, parallel="cp").validate()
    monkeypatch.setitem(presets.PRESETS["real"], "members", 2)  # a preset of several members …
    assert TrainConfig(data="x.jsonl").members == 2
    assert TrainConfig(data="x.jsonl", parallel="cp").members == 1  # … gives one under cp when not given
    with pytest.raises(ValueError, match="component parallelism"):
        members.build(DeepTTEConfig(n_drivers=3, members=2), stats).component_graph()


def test_members_train_and_their_checkpoint_predicts_their_mean(tmp_path, capsys):
    """`stfast train --members 2`: checkpoint.pt loads back as the two members (evaluate scores what the run
    tested), its prediction is the members' mean, and `stfast predict` writes it."""
    data = tmp_path / "trips.jsonl"
    random_trips(90, seed=26, max_len=25).to_jsonl(data)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--format", "deeptte", "--out", str(out), "--epochs", "2",
                 "--batch-size", "16", "--threads", "1", "--no-progress", "--members", "2", "--hidden-size", "16"]) == 0
    assert "parameters: 2 members of width 16; world size 1" in capsys.readouterr().out  # the start-up line
    s = json.loads((out / "summary.json").read_text())
    m = load_model(out / "checkpoint.pt")
    assert isinstance(m.model, members.DeepTTEMembers) and m.model.cfg.hidden_size == 16
    trips = m.split(m.load_trips(), "test")
    ds = TripDataset(trips, m.drivers, m.dtype)
    each = np.stack([predict(member, ds) for member in m.model.members])
    assert not np.allclose(each[0], each[1])
    np.testing.assert_allclose(m.predict(trips), each.mean(0), rtol=1e-6)
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--split", "test"]) == 0
    assert f"MAPE {100 * s['test_mape']:.2f} %" in capsys.readouterr().out
