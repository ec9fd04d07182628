"""Smoke run of benchmarks/accumulation.py's simulated cluster (the full script: see its docstring).

    pytest benchmarks/bench_accumulation.py --benchmark-disable
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from accumulation import cluster_config, run_sim, sim_table

from stfast.accum.agent import Agent
from stfast.accum.window import DEFAULT_CHOICES
from stfast.train import plots


def test_simulated_cluster_policies(benchmark, tmp_path):
    cfg = cluster_config()
    assert cfg.comm_share(1) >= 0.3  # the configuration the script reports on is communication-bound
    agent = Agent(5, seed=0)  # untrained: the smoke run checks the plumbing, not the agent
    res = benchmark.pedantic(run_sim, args=(cfg, range(1000, 1001), agent), rounds=1, iterations=1)
    table, summ = sim_table(res)
    assert table.count("\n") == 1 + len(res)
    # the oracle makes the most progress and reaches the target before k = 1 does
    assert all(p <= 1 + 1e-9 for name in res for p in summ[name]["progress_over_optimal"])
    assert all(math.isfinite(t) and t < 1 for t in summ["oracle"]["ttt_over_k1"])
    plots.accumulation_k(res, None, tmp_path / "k.png", DEFAULT_CHOICES)
    assert (tmp_path / "k.png").stat().st_size > 0
    benchmark.extra_info["table"] = table


def test_live_time_to_target_interpolates_and_pairs_seeds():
    from accumulation import paired_ratios, time_to

    curve = [(2.0, 0.30), (4.0, 0.20), (6.0, 0.10)]
    assert time_to(curve, 0.15) == 5.0  # halfway between the validations at 4 s and 6 s
    assert time_to(curve, 0.35) == 2.0 and time_to(curve, 0.05) == math.inf
    summ = {"1": {"ttt_s": [10.0, 12.0, math.inf, 13.0]}, "2": {"ttt_s": [11.0, 13.0, 14.0, 20.0]},
            "goodput": {"ttt_s": [10.0, 12.0, 15.0, math.inf]}, "rl": {"ttt_s": [11.0, 12.0, 16.0, math.inf]}}
    lines = paired_ratios(summ)
    assert summ["best_fixed"] == "1"  # median 12.5 s against 13.5 s
    # reached where k = 1 did not: 0; not reached where it did: ∞ (not left out); neither: left out (nan)
    assert summ["rl"]["ttt_over_1"] == [1.1, 1.0, 0.0, math.inf]
    assert summ["rl"]["ttt_over_goodput"][:3] == [1.1, 1.0, 16 / 15] and math.isnan(summ["rl"]["ttt_over_goodput"][3])
    assert len(lines) == 3


def test_live_table_reads_a_run_folder(tmp_path):
    """read_run + live_table on a hand-written run: time to target, throughput and overhead per step."""
    import json

    from accumulation import live_table, read_run

    rows = [{"type": "epoch", "epoch": 1, "step": 4, "wall_s": 2.0, "val_mape": 0.30},
            {"type": "epoch", "epoch": 2, "step": 8, "wall_s": 4.0, "val_mape": 0.20},
            {"type": "window", "window": 1, "k": 1, "steps": 4, "trips": 128, "comm_s": 0.1, "overhead_s": 0.2, "window_s": 1.0,
             "wall_s": 1.0, "step": 4},
            {"type": "window", "window": 2, "k": 2, "steps": 4, "trips": 256, "comm_s": 0.1, "overhead_s": 0.2, "window_s": 3.0,
             "wall_s": 4.0, "step": 8}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 8, "epochs": 2, "test_mape": 0.21,
                                                       "best_val_mape": 0.20}))
    run = read_run(tmp_path)
    assert run["windows"] == [(4, 1, 128, 1.0), (8, 2, 256, 3.0)] and run["step_curve"] == [(4, 0.30), (8, 0.20)]
    table, summ = live_table({"1": [run], "rl": [run]}, factor=1.25)  # target 0.25: crossed at 3 s
    assert summ["target_val_mape"] == [0.25] and summ["rl"]["ttt_s"] == [3.0] and summ["rl"]["epochs_to_target"] == [1.5]
    assert summ["rl"]["trips_per_s"] == 384 / 4.0 and summ["rl"]["overhead_ms_per_step"] == 1e3 * 0.4 / 8
    assert summ["rl"]["comm_share"] == 0.2 / 4.0 and summ["rl"]["comm_share_k1"] == 0.1
    assert "| rl | 3 | 3.0 | 2 |" in table and "| 96 | 50 |" in table


def test_paced_clock_removes_machine_drift_and_keeps_each_ks_pace():
    """Two seeds of one arm, the same trips and validations, the second on a machine running 2× slower for its
    first two windows: on the paced clock their times to target agree; an arm at k = 2 keeps its own, faster pace."""
    from accumulation import live_table, pace_per_k, paced_runs

    def run(k, window_s):  # four windows of 4 steps and 100 trips at k, validations after steps 8 and 16
        ends = np.cumsum(window_s)
        return {"windows": [(4 * (i + 1), k, 100, w) for i, w in enumerate(window_s)],
                "curve": [(float(ends[1]) + 0.1, 0.30), (float(ends[3]) + 0.1, 0.20)],
                "step_curve": [(8, 0.30), (16, 0.20)],
                "epoch_curve": [(1, 0.30), (2, 0.20)], "comm_s": 0.0, "window_s": float(ends[-1]), "comm_s_k1": 0.0,
                "window_s_k1": 0.0, "trips": 400, "overhead_s": 0.0, "window_steps": 16, "steps": 16, "epochs": 2,
                "test_mape": 0.2, "best_val_mape": 0.2, "k": [(float(e), k) for e in ends]}

    runs = {"1": [run(1, [1.0, 1.0, 1.0, 1.0]), run(1, [2.0, 2.0, 1.0, 1.0])],
            "2": [run(2, [0.5, 0.5, 0.5, 0.5]), run(2, [0.5, 0.5, 0.5, 0.5])]}
    assert pace_per_k(runs) == {1: 100.0, 2: 200.0}  # median of 100, 100, 100, 100, 50, 50, 100, 100 trips/s
    paced = paced_runs(runs)
    assert [t for t, _ in paced["1"][0]["curve"]] == pytest.approx([2.0, 4.0])
    assert [t for t, _ in paced["1"][1]["curve"]] == pytest.approx([2.0, 4.0])  # wall 4.1 and 6.1 s
    assert [t for t, _ in paced["2"][0]["curve"]] == pytest.approx([1.0, 2.0])  # its own pace
    _, summ = live_table(paced, factor=1.0)  # target 0.20 per seed: the second validation
    assert summ["1"]["ttt_s"] == pytest.approx([4.0, 4.0]) and summ["2"]["ttt_s"] == pytest.approx([2.0, 2.0])
    _, wall = live_table(runs, factor=1.0)
    assert wall["1"]["ttt_s"] == pytest.approx([4.1, 6.1])


def test_calibration_recovers_the_noise_scale_and_the_estimate_bias():
    """Fixed-k arms whose epochs to any target stretch by 1/E(kB) for φ = 2 micro-batches, and whose B_adam
    estimates grow as k^0.5 from 0.2 B at k = 1: calibrate() finds φ_eff = 2 B, bias 0.1, α = 0.5."""
    from accumulation import calibrate, fit_noise_scale, pollux_efficiency

    assert fit_noise_scale({2: pollux_efficiency(2.0, 2), 4: pollux_efficiency(2.0, 4)}) == pytest.approx(2.0, rel=0.05)
    assert fit_noise_scale({2: 1.0, 4: 1.02}) == 2.0 ** 12  # no measurable loss at any k: the grid's end
    # an arm that never reached the target (E recorded as 0) bounds E, it does not measure it: left out
    assert fit_noise_scale({2: pollux_efficiency(2.0, 2), 8: 0.0}) == pytest.approx(2.0, rel=0.05)

    def arm(k):
        stretch = 1 / pollux_efficiency(2.0, k)
        epochs = np.arange(1, int(12 * stretch) + 1)
        est = 0.2 * 32 * k ** 0.5
        return [{"epoch_curve": [(e, 0.5 - 0.04 * e / stretch) for e in epochs],
                 "curve": [(float(e), 0.5 - 0.04 * e / stretch) for e in epochs],
                 "noise": [(float(i), k, est, est / 10) for i in range(10)], "micro_batch": 32}]

    cal = calibrate({"city": {str(k): arm(k) for k in (1, 2, 4, 8)}})
    c = cal["city"]
    assert c["phi_eff_over_b"] == pytest.approx(2.0, rel=0.05)
    assert c["bias_k1"] == pytest.approx(0.1, rel=0.05) and c["k_exponent"] == pytest.approx(0.5, abs=1e-6)
    lo, hi = cal["noise_calibration"]["bias_range"]
    assert lo < 0.1 < hi
