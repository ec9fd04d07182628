"""Smoke run of benchmarks/noise_scale_units.py (the full measurement: see its docstring).

    pytest benchmarks/bench_noise_scale_units.py --benchmark-disable
"""
from __future__ import annotations

import json
import math

import noise_scale_units


def test_noise_scale_units_smoke(tmp_path):
    out = tmp_path / "rows.json"
    noise_scale_units.main(["--steps", "3", "--batch-size", "8", "--train-steps", "3", "--phases", "2",
                            "--n-synthetic", "60", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["adam_steps"] for r in rows] == [0, 3]
    # the preconditioned estimate needs Adam's second moments: from the first measured step's Adam step on
    assert all("exact_adam_preconditioned" in r for r in rows)
    for r in rows:
        for v in r.values():
            if isinstance(v, dict):
                assert v["trace"] > 0 and math.isfinite(v["g2"]) and math.isfinite(v["b_simple"])
        # the same per-trip gradients weighted by Adam's 1/(√v̂ + ε): a different trace unless the weights were lost
        assert not math.isclose(r["exact_adam_preconditioned"]["trace"], r["exact"]["trace"], rel_tol=1e-3)
