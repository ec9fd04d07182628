"""End-to-end runs: DeepTTE learns the synthetic city; GeoLife labels filter trips."""
import json

import numpy as np
import pytest

from stfast.data.load import load_trips
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer


@pytest.mark.slow
def test_deeptte_beats_constant_speed_on_synthetic_city_by_30_percent(tmp_path):
    s = Trainer(TrainConfig(data=None, n_synthetic=4000, epochs=2, batch_size=64, seed=1, out=str(tmp_path),
                            progress=False)).fit()
    assert s["test_mape"] <= 0.7 * s["baseline_const_speed_mape"], s
    assert s["test_mape"] < s["baseline_mean_time_mape"]
    assert json.load(open(tmp_path / "summary.json"))["test_mape"] == s["test_mape"]


def test_geolife_modes_keep_only_labelled_trips(shared_data):
    root = shared_data / "geolife_sample"
    everything = load_trips(str(root))
    bus = load_trips(str(root), modes={"bus"})
    assert 0 < len(bus) < len(everything)
    assert set(bus.driver) == {"010"}  # only user 010 has labels in the sample
    assert bus.dropped["mode_filtered"] > 0
    assert np.all(bus.time > 0) and np.all(bus.lengths >= 3)
