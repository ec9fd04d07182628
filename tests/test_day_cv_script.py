"""benchmarks/day_cv.py (leave-one-day-out choice of training flags) runs end to end on two folds of the
Chengdu sample, one epoch each: every fold trains on the other days, and the table's scores and pick follow
from the runs' validation errors and constant speed as the docstring's rule says."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "day_cv.py"


def test_day_cv_two_folds(shared_data, tmp_path):
    data = shared_data / "chengdu_deeptte_sample" / "test"
    r = subprocess.run([sys.executable, str(SCRIPT), "--data", str(data), "--days", "27-29", "--test-days", "30",
                        "--seeds", "0", "--candidates", "h64_e12", "m2h64_e12", "--time-ref", "h64_e12",
                        "--max-time", "100", "--extra", "--epochs 1", "--incumbent", "m2h64_e12", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads((tmp_path / "day_cv.json").read_text())
    rows, cs = out["runs"], out["constant_speed"]
    names = ("h64_e12", "m2h64_e12")
    assert {(x["candidate"], x["day"]) for x in rows} == {(c, d) for c in names for d in (27, 28, 29)}
    for x in rows:
        run = tmp_path / x["candidate"] / f"day{x['day']}" / "seed0"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["n_train"] == 400 and summary["n_val"] == 200 and summary["epochs"] == 1  # two other days
        c = cs[str(x["day"])]
        assert x["score"] == (x["val_mape"] / c["mape"] + x["val_mae"] / c["mae"]) / 2
    for name, t in out["table"].items():
        assert t["score"] == statistics.fmean(x["score"] for x in rows if x["candidate"] == name)
    tab = out["table"]
    for name, t in tab.items():  # paired over the three folds against the incumbent
        diff = [t["per_fold"][d] - tab["m2h64_e12"]["per_fold"][d] for d in ("27", "28", "29")]
        assert t["vs_incumbent"] == statistics.fmean(diff)
        assert t["vs_incumbent_se"] == statistics.stdev(diff) / 3 ** 0.5
    low = min(tab, key=lambda n: tab[n]["score"])
    beats = tab[low]["vs_incumbent"] < -tab[low]["vs_incumbent_se"]
    assert out["pick"] == (low if beats else "m2h64_e12")
    assert (tmp_path / "day_cv_curves.png").stat().st_size > 0
    assert f"**{out['pick']}** (pick)" in (tmp_path / "day_cv.md").read_text()
