"""Numbers a user can trust (issue 21): evaluate and predict preprocess as training did, one run per
folder, --resume only on the same data, errors that name the flag, and a public way to load a model."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import one_line_error as _one_line_error
from conftest import random_trips

import stfast
from stfast.cli import build_parser, main
from stfast.data.synthetic import generate_city
from stfast.train import checkpoint as ckpt
from stfast.train.metrics import errors

FAST = ["--epochs", "1", "--batch-size", "16", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "trips.jsonl"
    random_trips(100, seed=5, max_len=20).to_jsonl(path)
    return str(path)


@pytest.fixture(scope="module")
def city(tmp_path_factory):
    """Raw traces of 150 synthetic trips written as a point CSV and as DiDi GAIA rows."""
    d = tmp_path_factory.mktemp("raw")
    tr = generate_city(150, seed=4)
    trip = np.repeat(np.arange(len(tr)), tr.lengths)
    csv_path, didi_path = d / "points.csv", d / "gps_20161101"
    with open(csv_path, "w") as f:
        f.write("trip_id,timestamp,lng,lat,driver_id\n")
        for i, t, x, y in zip(trip, tr.t, tr.lng, tr.lat):
            f.write(f"trip-{i},{int(t)},{x:.6f},{y:.6f},{tr.driver[i]}\n")
    with open(didi_path, "w") as f:
        for i, t, x, y in zip(trip, tr.t, tr.lng, tr.lat):
            f.write(f"{tr.driver[i]},order{i},{int(t)},{x:.6f},{y:.6f}\n")
    return {"csv": str(csv_path), "didi": str(didi_path)}


# ---------------------------------------------------------------- acceptance: every reader format
def _formats(city, jsonl, shared):
    return {
        "synthetic": (["--n-synthetic", "160", "--data-seed", "9"], ["--gap-min", "15"]),
        "deeptte": (["--data", jsonl, "--format", "deeptte"], ["--min-spacing-km", "0"]),
        "csv": (["--data", city["csv"], "--format", "csv"], ["--min-spacing-km", "0.3", "--gap-min", "10"]),
        "didi": (["--data", city["didi"], "--format", "didi"], ["--min-spacing-km", "0", "--tz", "Asia/Tokyo"]),
        "geolife": (["--data", str(shared / "geolife_sample"), "--format", "geolife"],
                    ["--min-spacing-km", "0.1", "--gap-min", "30"]),
    }


@pytest.mark.parametrize("fmt", ["synthetic", "deeptte", "csv", "didi", "geolife"])
def test_evaluate_on_the_runs_test_split_gives_exactly_its_test_metrics(fmt, city, jsonl, shared_data, tmp_path,
                                                                       capsys):
    data, flags = _formats(city, jsonl, shared_data)[fmt]
    out = tmp_path / "run"
    assert main(["train", *data, *flags, *FAST, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    capsys.readouterr()
    # the CLI: no preprocessing flag given, the checkpoint's are used; --data as in training
    ck = str(out / "checkpoint.pt")
    extra = data if fmt != "synthetic" else []
    assert main(["evaluate", "--checkpoint", ck, *extra, "--split", "test"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"{summary['n_test']} trips of the test split")
    assert f"MAPE {100 * summary['test_mape']:.2f} %" in line and f"MAE {summary['test_mae']:.1f} s" in line
    # the Python API, exactly
    m = stfast.load_model(ck)
    test = m.split(m.load_trips(), "test")
    got = errors(m.predict(test), test.time)
    assert (got["mape"], got["mae"], got["rmse"]) == (summary["test_mape"], summary["test_mae"], summary["test_rmse"])


# ---------------------------------------------------------------- item 1: the checkpoint's preprocessing
def test_evaluate_uses_the_checkpoints_preprocessing_and_refuses_another(city, tmp_path, capsys):
    out = tmp_path / "r1"
    assert main(["train", "--data", city["csv"], "--min-spacing-km", "0", *FAST, "--out", str(out)]) == 0
    ck = str(out / "checkpoint.pt")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ck, "--data", city["csv"]]) == 0
    implicit = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["evaluate", "--checkpoint", ck, "--data", city["csv"], "--min-spacing-km", "0"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == implicit  # same trips, same numbers
    err = _one_line_error(capsys, main(["evaluate", "--checkpoint", ck, "--data", city["csv"],
                                        "--min-spacing-km", "0.2"]))
    assert "--min-spacing-km 0.2 differs from" in err and "checkpoint.pt's 0" in err
    err = _one_line_error(capsys, main(["predict", "--checkpoint", ck, "--data", city["csv"], "--gap-min", "5",
                                        "--out", str(tmp_path / "p.csv")]))
    assert "--gap-min 5 differs from" in err and "'s 20" in err
    assert not (tmp_path / "p.csv").exists()


# ---------------------------------------------------------------- item 2: one run per folder
def test_a_non_empty_out_is_refused_without_resume_or_overwrite(jsonl, tmp_path, capsys):
    out = tmp_path / "r2"
    assert main(["train", "--data", jsonl, *FAST, "--out", str(out)]) == 0
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    err = _one_line_error(capsys, main(["train", "--data", jsonl, *FAST, "--seed", "5", "--out", str(out)]))
    assert f"--out {out} is not empty" in err and "--resume" in err and "--overwrite" in err
    assert (out / "metrics.jsonl").read_text() == before
    (out / "notes.txt").write_text("mine")
    assert main(["train", "--data", jsonl, *FAST, "--seed", "5", "--overwrite", "--out", str(out)]) == 0
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["type"] == "epoch"] == [1]  # the old run's rows are gone
    assert (out / "notes.txt").read_text() == "mine"  # not a run file: kept
    assert ckpt.load(out / "last.pt")["train_config"]["seed"] == 5
    err = _one_line_error(capsys, main(["train", "--data", jsonl, *FAST, "--max-steps", "0", "--out",
                                        str(tmp_path / "r0")]))
    assert "--max-steps must be ≥ 1, got 0" in err


# ---------------------------------------------------------------- item 3: predictions keep their trip ids
def test_predictions_carry_trip_ids_and_list_the_dropped_trips(city, tmp_path, capsys):
    import csv

    out = tmp_path / "r3"
    assert main(["train", "--data", city["csv"], *FAST, "--out", str(out)]) == 0
    pred = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(out / "checkpoint.pt"), "--data", city["csv"],
                 "--out", str(pred)]) == 0
    rows = list(csv.DictReader(open(pred)))
    dropped = list(csv.DictReader(open(tmp_path / "p.dropped.csv")))
    ids = {f"trip-{i}" for i in range(150)}
    got = {r["trip_id"] for r in rows} | {r["trip_id"] for r in dropped}
    assert got == ids  # every input trip is accounted for, by its own id
    assert all(r["reason"] for r in dropped)
    keys = [(r["trip_id"], r["segment"]) for r in rows]
    assert len(keys) == len(set(keys))
    m = stfast.load_model(out / "checkpoint.pt")
    trips = m.load_trips(city["csv"])
    assert [r["trip_id"] for r in rows] == list(trips.trip_id)
    np.testing.assert_allclose([float(r["pred_time_s"]) for r in rows], m.predict(trips), atol=0.051)


# ---------------------------------------------------------------- item 4: --resume on other data
def test_resume_on_other_data_is_refused(jsonl, tmp_path, capsys):
    out = tmp_path / "r5"
    assert main(["train", "--data", jsonl, *FAST, "--out", str(out)]) == 0
    other = tmp_path / "other.jsonl"
    random_trips(100, seed=6, max_len=20).to_jsonl(other)
    capsys.readouterr()
    err = _one_line_error(capsys, main(["train", "--data", str(other), *FAST, "--epochs", "2", "--resume",
                                        "--out", str(out)]))
    assert "was trained on other data" in err and "fingerprint" in err
    err = _one_line_error(capsys, main(["train", "--data", jsonl, *FAST, "--epochs", "2", "--gap-min", "9",
                                        "--resume", "--out", str(out)]))
    assert "--gap-min 20 in the checkpoint, 9 now" in err
    assert ckpt.load(out / "last.pt")["epoch"] == 1  # nothing trained on the other data
    assert main(["train", "--data", jsonl, *FAST, "--epochs", "2", "--resume", "--out", str(out)]) == 0


# ---------------------------------------------------------------- item 8: Ctrl-C under --nproc 2
def test_ctrl_c_under_nproc_2_stops_cleanly_and_exits_130(jsonl, tmp_path):
    out = tmp_path / "r8"
    cmd = [sys.executable, "-m", "stfast.cli", "train", "--data", jsonl, "--nproc", "2", "--epochs", "30",
           "--batch-size", "8", "--threads", "1", "--no-progress", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONSAFEPATH="1")
    # its own process group, as a terminal's foreground job: Ctrl-C signals every process in it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while not (out / "last.pt").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGINT)  # one Ctrl-C delivered twice (as `timeout` does): still one clean stop
    stdout, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGINT, stdout[-3000:]  # stopped, not finished
    assert "continue with --resume" in stdout and "distributed run failed" not in stdout, stdout[-3000:]


# ---------------------------------------------------------------- item 9: clear errors, no tracebacks
@pytest.mark.parametrize("flags, words", [
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["--threads", "-2"], "--threads must be ≥ 1, got -2"),
    (["--threads", "0"], "--threads must be ≥ 1, got 0"),
    (["--gap-min", "-1"], "--gap-min must be > 0 minutes, got -1"),
    (["--min-spacing-km", "-0.5"], "--min-spacing-km must be ≥ 0"),
    (["--tz", "Mars/Olympus"], "--tz: unknown time zone 'Mars/Olympus'"),
    (["--time-bin-min", "0"], "--time-bin-min must be in 1..1440 minutes, got 0"),
    (["--weight-decay", "-1"], "--weight-decay must be ≥ 0, got -1"),
])
def test_bad_flags_give_one_line_naming_the_flag(jsonl, tmp_path, capsys, flags, words):
    err = _one_line_error(capsys, main(["train", "--data", jsonl, *flags, "--out", str(tmp_path / "r")]))
    assert words in err
    assert not (tmp_path / "r").exists()


def test_evaluate_and_predict_errors(jsonl, tmp_path, capsys):
    not_ckpt = tmp_path / "model.pt"
    import torch

    torch.save({"weights": torch.ones(3)}, not_ckpt)
    err = _one_line_error(capsys, main(["evaluate", "--checkpoint", str(not_ckpt), "--data", jsonl]))
    assert f"{not_ckpt} is not a stfast checkpoint" in err
    out = tmp_path / "r9"
    assert main(["train", "--data", jsonl, *FAST, "--out", str(out)]) == 0
    capsys.readouterr()
    folder = tmp_path / "preds"
    folder.mkdir()
    err = _one_line_error(capsys, main(["predict", "--checkpoint", str(out / "checkpoint.pt"), "--data", jsonl,
                                        "--out", str(folder)]))
    assert "is a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "preds", "r9"]  # no temp file left
    err = _one_line_error(capsys, main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--data", jsonl,
                                        "--device", "tpu"]))
    assert "--device must be" in err
    err = _one_line_error(capsys, main(["evaluate", "--checkpoint", str(out)]))
    assert f"{out} is a folder: give the checkpoint file, e.g. {out / 'checkpoint.pt'}" in err


def test_the_runs_data_is_found_from_any_folder(jsonl, tmp_path, capsys, monkeypatch):
    import shutil

    local = tmp_path / "trips.jsonl"
    shutil.copy(jsonl, local)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", "trips.jsonl", *FAST, "--out", "run"]) == 0  # a relative --data
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    monkeypatch.chdir("/")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "run" / "checkpoint.pt"), "--split", "test"]) == 0
    assert f"MAPE {100 * summary['test_mape']:.2f} %" in capsys.readouterr().out


def test_preprocessing_that_drops_every_trip_is_an_error(city, tmp_path, capsys):
    for cmd in (["train", "--out", str(tmp_path / "r")], ["data", "convert", "--out", str(tmp_path / "c.jsonl")]):
        rc = main([*cmd, "--data", city["csv"], "--gap-min", "0.001"])  # every point its own trip
        err = _one_line_error(capsys, rc)
        assert "left no trip" in err and "too_short" in err
    assert not (tmp_path / "c.jsonl").exists()


def test_help_shows_defaults():
    ap = build_parser()
    sub = ap._subparsers._group_actions[0].choices
    text = sub["train"].format_help()
    assert "(default: 64)" in text and "(default: runs/latest)" in text
    assert "Asia/Shanghai" in sub["predict"].format_help()


# ---------------------------------------------------------------- item 10: loading a model in Python
def test_load_model_returns_a_model_ready_to_predict(jsonl, tmp_path):
    out = tmp_path / "r10"
    assert main(["train", "--data", jsonl, *FAST, "--out", str(out)]) == 0
    m = stfast.load_model(out / "checkpoint.pt")
    assert not m.model.training and len(m.drivers) > 1 and m.norm_stats.time_std > 0
    # issue 62: its repr is one short line (what model, trained on what), not the modules, config and coverage
    text = repr(m)
    assert text == str(m) and "\n" not in text and len(text) < 400, text
    assert text.startswith("TrainedModel(DeepTTE, ") and f"trained on {jsonl} (" in text and "1 epoch," in text
    assert f"{sum(p.numel() for p in m.model.parameters()):,} parameters" in text and str(out) in text
    trips = m.load_trips(jsonl)
    pred = m.predict(trips)
    assert pred.shape == (len(trips),) and pred.dtype == np.float64 and np.all(pred > 0)
    with pytest.raises(FileNotFoundError):
        stfast.load_model(tmp_path / "missing.pt")


# ---------------------------------------------------------------- item 5: --tz
def test_tz_flag_reaches_the_calendar_ids_and_the_checkpoint(city, tmp_path, capsys):
    conv = tmp_path / "new_york.jsonl"
    assert main(["data", "convert", "--data", city["csv"], "--tz", "America/New_York", "--out", str(conv)]) == 0
    assert main(["data", "convert", "--data", city["csv"], "--out", str(tmp_path / "utc.jsonl")]) == 0
    lis = [json.loads(r)["timeID"] for r in conv.read_text().splitlines()]
    utc = [json.loads(r)["timeID"] for r in (tmp_path / "utc.jsonl").read_text().splitlines()]
    # New York is UTC-5 (winter) or UTC-4 (summer); the CSV's timestamps are plain Unix seconds (UTC)
    shift = {(a - b) % 1440 for a, b in zip(lis, utc)}
    assert shift and shift <= {1440 - 300, 1440 - 240}
    out = tmp_path / "r"
    assert main(["train", "--data", city["csv"], "--tz", "Europe/Lisbon", *FAST, "--out", str(out)]) == 0
    m = stfast.load_model(out / "checkpoint.pt")
    assert m.tz == "Europe/Lisbon" and m.preprocess["tz"] == "Europe/Lisbon"
    capsys.readouterr()
    err = _one_line_error(capsys, main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--data",
                                        city["csv"], "--tz", "Asia/Shanghai"]))
    assert "--tz Asia/Shanghai differs from" in err and "Europe/Lisbon" in err
