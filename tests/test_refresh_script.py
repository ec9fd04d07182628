"""benchmarks/refresh.py (issue 63 item 4) runs end to end on a short cycle: three policies per scored day, a
fine-tune that starts from yesterday's model, the table, the plot and the doc."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_a_short_refresh_cycle(shared_data, tmp_path):
    import refresh

    doc = tmp_path / "refresh"
    assert refresh.main(["--data", str(shared_data / "chengdu_deeptte_sample" / "test"), "--out", str(tmp_path / "r"),
                         "--doc", str(doc), "--epochs", "1", "--ft-epochs", "1", "--last-day", "27"]) == 0
    rows = json.loads((tmp_path / "r" / "refresh.json").read_text())
    scored = [r for r in rows if "policy" in r]
    assert [(r["new_day"], r["scored_day"], r["policy"]) for r in scored] == [(26, 27, p) for p in refresh.POLICIES]
    assert all(0 < r["mape"] < 1 for r in scored) and rows[-1]["first_days"] == [24, 25]
    ft = json.loads((tmp_path / "r" / "ft26" / "summary.json").read_text())
    assert ft["parent"]["sha256"]  # the fine-tune started from the first model (lineage)
    assert doc.with_suffix(".png").stat().st_size > 1000 and "| 26 | 27 | retrain |" in doc.with_suffix(".md").read_text()
    assert not (tmp_path / "r" / "days" / "day30.jsonl").exists()  # the sample's test day is never used
