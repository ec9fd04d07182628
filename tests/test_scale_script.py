"""benchmarks/scale.py runs end to end on small sizes (the 100k–1M figures are in the README)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "scale.py"


def test_scale_script_small(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--trips", "300", "600", "--out", str(tmp_path),
                        "--world-size", "4"], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    builds = [x for x in rows if x["stage"] == "build"]
    epochs = [x for x in rows if x["stage"] == "load+epoch"]
    assert [x["trips"] for x in builds] == [x["trips"] for x in epochs] and len(builds) == 2
    assert all(x["global_batches"] == -(-x["trips"] // 64) and x["peak_mib"] > 0 for x in epochs)
    assert (tmp_path / "trips_600" / "meta.json").is_file()
    assert "KiB/trip" in r.stdout


def test_scale_script_conversion_small(tmp_path):
    """--points / --jsonl-trips: generated raw files converted to stores beside the plain loops, and the plot."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--trips", "--points", "20000", "--jsonl-trips", "200",
                        "--out", str(tmp_path), "--plot", str(tmp_path / "scale.png")],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [(x["format"], x["n"]) for x in rows] == [("didi", 20000), ("csv", 20000), ("deeptte", 200)]
    assert [x["loop"] for x in rows] == ["csv", "csv", "json"]
    assert all(x["trips"] > 0 and x["convert_s"] > 0 and x["loop_s"] > 0 and x["peak_mib"] > 0 for x in rows)
    assert rows[0]["trips"] == rows[1]["trips"]  # the same trips, sorted (DiDi) or shuffled (CSV)
    assert rows[2]["trips"] == 200 and rows[2]["read_s"] > 0
    assert (tmp_path / "scale.png").stat().st_size > 0


@pytest.mark.slow
def test_scale_script_training_small(tmp_path):
    """--train-trips: a store of synthetic trips written in chunks, `stfast train --nproc 2` from it with the ranks'
    memory polled, `stfast predict --split test` on the run (its MAPE is the run's test MAPE), and the table."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--trips", "--train-trips", "3000", "--train-steps", "5",
                        "--train-batch-size", "32", "--test-trips", "150", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    store = next(x for x in rows if x["stage"] == "store")
    (t,) = [x for x in rows if x["stage"] == "train"]
    assert store["trips"] == 3000 and (tmp_path / "store_3000" / "manifest.json").is_file()
    assert t["steps"] == 5 and t["n_test"] == 150 and 0 < t["data_s"] < t["step_s"] and 0 < t["data_share"] < 1
    assert sorted(t["ranks"]) == ["0", "1"] and all(m["VmHWM"] >= m["RssAnon"] > 0 for m in t["ranks"].values())
    assert t["predict_mape"] == pytest.approx(t["test_mape"], abs=1e-3)  # the CSV rounds the times
    assert "Pss_File" in r.stdout and "data %" in r.stdout


def test_scale_script_setup_small(tmp_path):
    """--setup-trips: the time to the last step of a short default run on a store: uncached (derives and keeps), the
    first after convert's derive step (its seconds: setup_s), the next; the store's own row has setup_s too."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--trips", "--setup-trips", "300", "--setup-steps", "2",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"stage": "setup"')]
    assert [x["cache"] for x in rows] == ["uncached", "first", "next"] and all(x["to_last_step_s"] > 0 for x in rows)
    assert [x["setup_s"] is None for x in rows] == [True, False, True] and rows[1]["setup_s"] > 0
    assert all(x["subtrips"] is None for x in rows)  # the default run's --subtrips, not forced
    (store,) = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith('{"stage": "store"')]
    assert store["setup_s"] > 0
    kept = {p.name.split("-")[0] for p in (tmp_path / "store_300" / "derived").iterdir()}
    assert {"norm_stats", "subtrips", "route_profile"} <= kept


def test_scale_script_real_shaped_records_small(tmp_path, shared_data):
    """--real-jsonl-trips / --didi-short-points: the real sample's records repeated and DiDi lines with short ids,
    converted beside their loops, with the whole command timed (process start included)."""
    r = subprocess.run([sys.executable, str(SCRIPT), "--trips", "--real-jsonl-trips", "1500", "--didi-short-points",
                        "3000", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert [(x["input"], x["format"]) for x in rows] == [("real", "deeptte"), ("didishort", "didi")]
    assert [x["loop"] for x in rows] == ["json", "csv"]  # the real records against json.loads, as the issue asks
    assert rows[0]["trips"] == 1500 and all(x["cmd_s"] > x["convert_s"] > 0 and x["loop_s"] > 0 for x in rows)
    assert all(x["cmd_cpu_s"] > 0 and x["cmd_cpu_ratio"] > 0 for x in rows)
    first = (tmp_path / "real_1500.jsonl").open().readline()
    assert first == (shared_data / "chengdu_deeptte_sample" / "test").open().readline()
    assert (tmp_path / "gps_didishort_3000").read_text().split(",")[1] == "0"
