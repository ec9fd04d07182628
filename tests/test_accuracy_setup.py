"""Issue 3's experimental set-up, pinned: the Chengdu date split and the prior-based head."""
import numpy as np
import pytest
import torch

from conftest import random_trips
from stfast.data.dataset import DriverVocab, NormStats, TripDataset
from stfast.data.readers import read_deeptte_jsonl
from stfast.models.deeptte import DeepTTE, DeepTTEConfig
from stfast.train.config import TrainConfig
from stfast.train.metrics import ConstantSpeedBaseline, errors
from stfast.train.run_data import split_trips


def test_chengdu_date_split_is_1000_200_200(shared_data):
    trips = read_deeptte_jsonl(shared_data / "chengdu_deeptte_sample" / "test")
    tr, va, te = split_trips(trips, TrainConfig(split_days="24-28/29/30"))
    assert (len(tr), len(va), len(te)) == (1000, 200, 200)
    assert set(tr.date_id) == {24, 25, 26, 27, 28} and set(va.date_id) == {29} and set(te.date_id) == {30}
    same = split_trips(trips, TrainConfig(split_by="date"))  # default: last day test, the day before val
    assert [len(p) for p in same] == [1000, 200, 200]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_untrained_prior_head_scores_the_constant_speed_baseline(dtype):
    train, test = random_trips(200, seed=41), random_trips(60, seed=42)
    vocab = DriverVocab(train.driver)
    torch.manual_seed(0)
    model = DeepTTE(DeepTTEConfig(n_drivers=len(vocab), head="prior"), NormStats.from_trips(train)).to(dtype)
    model.eval()
    pred = model(TripDataset(test, vocab, dtype).batch(np.arange(60))).time.double().detach().numpy()
    base = ConstantSpeedBaseline().fit(train.dist, train.time).predict(test.dist)
    np.testing.assert_allclose(pred, base, rtol=1e-6 if dtype == torch.float32 else 1e-12)
    assert errors(pred, test.time)["mape"] == pytest.approx(errors(base, test.time)["mape"], rel=1e-5)
    # the paper's head does not start there
    paper = DeepTTE(DeepTTEConfig(n_drivers=len(vocab)), NormStats.from_trips(train)).to(dtype).eval()
    p2 = paper(TripDataset(test, vocab, dtype).batch(np.arange(60))).time.double().detach().numpy()
    assert np.max(np.abs(p2 - base) / base) > 0.05


def test_model_options_are_validated():
    with pytest.raises(ValueError, match="head"):
        DeepTTEConfig(n_drivers=3, head="nope")
    with pytest.raises(ValueError, match="loss"):
        DeepTTEConfig(n_drivers=3, loss="nope")


def test_no_driver_embedding_option():
    trips = random_trips(10, seed=43)
    model = DeepTTE(DeepTTEConfig(n_drivers=5, driver_dim=0), NormStats.from_trips(trips))
    assert model.attr.driver is None and not any("attr.driver" in n for n, _ in model.named_parameters())
    out = model(TripDataset(trips, DriverVocab([]), torch.float32).batch(np.arange(10)))
    assert out.time.shape == (10,)
