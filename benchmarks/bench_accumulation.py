"""Smoke run of benchmarks/accumulation.py's simulated cluster (the full script: see its docstring).

    pytest benchmarks/bench_accumulation.py --benchmark-disable
"""
from __future__ import annotations

import math

from accumulation import cluster_config, plot_k, run_sim, sim_table

from stfast.accum.agent import Agent


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
    plot_k(res, None, tmp_path / "k.png")
    assert (tmp_path / "k.png").stat().st_size > 0
    benchmark.extra_info["table"] = table
