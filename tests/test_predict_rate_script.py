"""benchmarks/predict_rate.py runs end to end on a small file: the three rates and both ratios."""
import json
import subprocess
import sys
from pathlib import Path

from conftest import random_trips

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "predict_rate.py"


def test_predict_rate_script_small(tmp_path):
    data = tmp_path / "trips.jsonl"
    random_trips(160, seed=5, max_len=16).to_jsonl(data)
    r = subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--steps", "40", "--epochs", "40",
                        "--out", str(tmp_path / "rate")], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert len(rows) == 1 and rows[0]["threads"] == 1 and rows[0]["windows"] >= 1
    assert all(rows[0][k] > 0 for k in ("train_trips_per_s", "final_eval_trips_per_s", "predict_trips_per_s"))
    assert rows[0]["n_test"] == len((tmp_path / "rate" / "pred_t1.csv").read_text().splitlines()) - 1
    assert "predict/train" in r.stdout
