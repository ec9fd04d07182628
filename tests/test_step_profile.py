"""benchmarks/step_profile.py: operators grouped as the docs' profile table reads them; a real run's groups add
up to the steps' wall time; its FLOPs (stfast.ops.flops) land in the group that runs them, beside the GEMM
libraries' own rates."""
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


@pytest.mark.parametrize("op, group", [
    ("stfast.lstm_forward", "gemm"), ("stfast.lstm_backward", "gemm"), ("stfast.gemm_mm", "gemm"), ("aten.mm", "gemm"),
    ("aten.addmm", "gemm"), ("aten.mkldnn_rnn_layer", "onednn_rnn"), ("aten.mkldnn_rnn_layer_backward", "onednn_rnn"),
    ("stfast.geo_conv_forward", "fused_ops"), ("stfast.geo_conv_backward", "fused_ops"),
    ("aten.convolution", "other_ops")])
def test_counted_flops_fall_in_the_group_that_runs_them(op, group):
    """The fused LSTM's products run inside stfast::lstm_* calls in the gemm group's operators, so its FLOPs count
    there; the reference's LSTM (oneDNN's RNN) is one operator of onednn_rnn."""
    assert step_profile.flop_group(op) == group


@pytest.mark.parametrize("kernels, busy", [("fused", "gemm"), ("reference", "onednn_rnn")])
def test_a_run_is_split_into_groups_that_add_up_to_its_steps(kernels, busy):
    r = step_profile.profile_run(["train", "--n-synthetic", "300", "--epochs", "1", "--batch-size", "32",
                                  "--threads", "1", "--kernels", kernels, "--preset", "paper"])
    assert r["steps"] >= 5 and r["wall_s"] > 0 and r["trips_per_s"] > 0, r
    total = sum(r["seconds"].values())
    assert total == pytest.approx(r["wall_s"], rel=0.02), r  # self times inside the steps + the steps' own time
    assert r["seconds"][busy] > 0.1 * r["wall_s"], r  # the LSTM's products are a large share, whichever runs them
    assert all(v >= 0 for v in r["seconds"].values()), r
    # FLOPs: the counted first step's (not among the profiled steps), its LSTM in the busy group; scaled to the
    # profiled steps by their LSTM positions; rates of the steps, of the busy group, and of the libraries
    counted = r["counted_step"]
    assert counted["positions"] > 0 and counted["precision"] == "32" and counted["hidden_size"] == 128, counted
    assert counted["flops"][busy] > 0.8 * sum(counted["flops"].values()), counted
    assert counted["flops"]["optimizer"] == counted["flops"]["outside_ops"] == 0, counted
    steps_per_counted = sum(r["flops"].values()) / sum(counted["flops"].values())
    assert 0.5 * r["steps"] < steps_per_counted < 2 * r["steps"], (steps_per_counted, r["steps"])
    assert r["step_gflops"] == pytest.approx(r["step_gflop"] * r["steps"] / r["wall_s"]), r
    assert r["group_gflops"][busy] == pytest.approx(r["flops"][busy] / r["seconds"][busy] / 1e9), r
    assert set(r["library_gflops"]) == {"float32->float32"}, r["library_gflops"]
    for use, u in r["library_gflops"]["float32->float32"].items():
        assert u["rates"]["aten"] > 0 and u["chosen"] in ("aten", "onednn", "brgemm"), (use, u)
