"""benchmarks/step_profile.py: operators grouped as the docs' profile table reads them; a real run's groups add
up to the steps' wall time."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import step_profile


@pytest.mark.parametrize("name, group", [
    ("aten::mm", "gemm"), ("aten::addmm_", "gemm"), ("aten::addmm", "gemm"), ("stfast::onednn_matmul", "gemm"), ("aten::mkldnn_rnn_layer", "onednn_rnn"),
    ("aten::mkldnn_rnn_layer_backward", "onednn_rnn"), ("stfast::lstm_forward", "fused_ops"),
    ("stfast::geo_conv_backward", "fused_ops"), ("aten::_foreach_addcdiv_", "optimizer"), ("aten::mul", "other_ops"),
    ("aten::fill_", "other_ops"), ("GeneratedBackwardFor_stfast_lstm_forward_default", "fused_ops"),
    ("GeneratedBackwardFor_stfast_lstm_forward_defaultBackward", "other_ops")])
def test_operators_fall_in_their_group(name, group):
    assert step_profile.group_of(name) == group


@pytest.mark.parametrize("kernels, busy", [("fused", "gemm"), ("reference", "onednn_rnn")])
def test_a_run_is_split_into_groups_that_add_up_to_its_steps(kernels, busy):
    r = step_profile.profile_run(["train", "--n-synthetic", "300", "--epochs", "1", "--batch-size", "32",
                                  "--threads", "1", "--kernels", kernels, "--preset", "paper"])
    assert r["steps"] >= 5 and r["wall_s"] > 0 and r["trips_per_s"] > 0, r
    total = sum(r["seconds"].values())
    assert total == pytest.approx(r["wall_s"], rel=0.02), r  # self times inside the steps + the steps' own time
    assert r["seconds"][busy] > 0.1 * r["wall_s"], r  # the LSTM's products are a large share, whichever runs them
    assert all(v >= 0 for v in r["seconds"].values()), r
