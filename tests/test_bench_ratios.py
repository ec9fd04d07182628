"""benchmarks/ratios.py: pairs stfast with its baselines per case in a pytest-benchmark JSON report."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import ratios


def _bench(name, params, median):
    return {"name": f"{name}[{'-'.join(map(str, params.values()))}]", "params": params, "stats": {"median": median}}


def test_ratio_rows_pair_each_case_with_its_baselines(tmp_path):
    report = {"benchmarks": [
        _bench("test_lstm", {"shape": "chengdu", "batch": 64, "inp": "packed", "impl": "stfast"}, 0.010),
        _bench("test_lstm", {"shape": "chengdu", "batch": 64, "inp": "packed", "impl": "torch"}, 0.050),
        _bench("test_lstm", {"shape": "chengdu", "batch": 64, "inp": "padded", "impl": "stfast"}, 0.020),
        _bench("test_lstm", {"shape": "chengdu", "batch": 64, "inp": "padded", "impl": "torch"}, 0.015),
        _bench("test_geo_conv", {"shape": "geolife", "impl": "fused"}, 0.002),
        _bench("test_geo_conv", {"shape": "geolife", "impl": "eager"}, 0.006),  # compile missing: no row
        _bench("test_geo_conv", {"shape": "chengdu", "impl": "eager"}, 0.006),  # fused missing: no row
        _bench("test_partition_time", {"method": "lpt"}, 0.001),  # not a stfast-vs-baseline benchmark
    ]}
    rows = ratios.ratio_rows(report)
    got = {(r["benchmark"], r["case"], r["baseline"]): r["ratio"] for r in rows}
    assert got == pytest.approx({
        ("test_geo_conv", "shape=geolife", "eager"): 3.0,
        ("test_lstm", "batch=64, inp=packed, shape=chengdu", "torch"): 5.0,
        ("test_lstm", "batch=64, inp=padded, shape=chengdu", "torch"): 0.75,
    })
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    assert ratios.main([str(path), "--markdown"]) == 0


def test_ratio_rows_reject_other_json(tmp_path, capsys):
    with pytest.raises(ValueError, match="benchmarks"):
        ratios.ratio_rows({"results": []})
    path = tmp_path / "x.json"
    path.write_text("{}")
    assert ratios.main([str(path)]) == 2
    assert "x.json" in capsys.readouterr().err
