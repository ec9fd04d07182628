"""The CLI end to end on small real and random data: train, evaluate, predict, data convert."""
import csv
import json
import logging
import re

import numpy as np
import pytest

import stfast
from conftest import one_line_error, random_trips
from stfast.cli import dropped_path, given_dests, main
from stfast.data.coverage import OutsideTrainingArea
from stfast.data.readers import read_deeptte_jsonl
from stfast.train.trained import load_model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    data = d / "trips.jsonl"
    random_trips(90, seed=31, max_len=20).to_jsonl(data)
    rc = main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "32", "--out", str(d / "run"),
               "--no-progress", "--threads", "1"])
    assert rc == 0
    return d, data


def test_train_prints_and_writes_summary(trained, capsys):
    d, _ = trained
    s = json.load(open(d / "run" / "summary.json"))
    assert 0 < s["test_mape"] < 10 and (s["n_train"], s["n_val"], s["n_test"]) == (63, 14, 13)


def test_evaluate_without_data_scores_the_runs_test_split(trained, capsys):
    """Issue 62 item 5: `stfast evaluate --checkpoint C` alone scores the run's own test split, the figure
    summary.json calls test_mape (before: all 90 trips, 63 of them trained on, with no word of it); --split all
    on the run's own data says that the training split is among them."""
    d, _ = trained
    ck = str(d / "run" / "checkpoint.pt")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ck]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("13 trips of the test split"), line
    s = json.load(open(d / "run" / "summary.json"))
    assert float(line.split("MAPE")[1].split("%")[0]) == pytest.approx(100 * s["test_mape"], abs=0.01)
    assert main(["evaluate", "--checkpoint", ck, "--split", "all"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("90 trips") and "the run's own data: all trips, its training split among them" in line


def test_the_epoch_line_says_which_epoch_became_the_checkpoint(tmp_path, capsys):
    """Issue 62 item 5: an epoch whose weights became checkpoint.pt says so in words (before: a bare `*`, read as
    "improved"; with --select last every epoch's weights become it)."""
    data = tmp_path / "t.jsonl"
    random_trips(60, seed=3, max_len=20).to_jsonl(data)
    for select, kept in (("best", None), ("last", 2)):
        capsys.readouterr()
        assert main(["train", "--data", str(data), "--epochs", "2", "--batch-size", "32", "--out",
                     str(tmp_path / select), "--no-progress", "--threads", "1", "--select", select]) == 0
        lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("epoch")]
        assert len(lines) == 2 and not any(ln.rstrip().endswith("*") for ln in lines), lines
        marked = [ln for ln in lines if ln.endswith("  → checkpoint.pt")]
        assert marked and (kept is None or len(marked) == kept), lines


def test_evaluate_and_predict_agree(trained, capsys):
    d, data = trained
    assert main(["evaluate", "--checkpoint", str(d / "run" / "checkpoint.pt"), "--data", str(data)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    mape = float(line.split("MAPE")[1].split("%")[0])
    out = d / "preds.csv"
    assert main(["predict", "--checkpoint", str(d / "run" / "checkpoint.pt"), "--data", str(data),
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 90
    true = np.array([float(r["true_time_s"]) for r in rows])
    pred = np.array([float(r["pred_time_s"]) for r in rows])
    assert 100 * np.mean(np.abs(pred - true) / true) == pytest.approx(mape, abs=0.01)


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_evaluate_and_predict_use_the_threads_given(trained, tmp_path, command, monkeypatch):
    """--threads sets torch's threads for the forward passes (issue 53: scoring uses every thread given)."""
    import torch

    d, data = trained
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(n))
    out = ["--out", str(tmp_path / "p.csv")] if command == "predict" else []
    assert main([command, "--checkpoint", str(d / "run" / "checkpoint.pt"), "--data", str(data), "--threads", "3",
                 *out]) == 0
    assert seen == [3]


@pytest.mark.parametrize("command", ["evaluate", "predict", "train"])
@pytest.mark.parametrize("threads, words", [("0", "--threads must be ≥ 1, got 0"),
                                            ("-1", "--threads must be ≥ 1, got -1"),
                                            ("99999", "--threads must be at most 4 per core")])
def test_bad_threads_are_one_line_and_write_nothing(trained, tmp_path, capsys, command, threads, words):
    """--threads 0 / -1 / 99999 of predict and evaluate are refused as train's are (before: 0 ran at torch's
    default, -1 a RuntimeError traceback, 99999 a segfault; train's 99999 libgomp's "Out of memory", exit 1)."""
    d, data = trained
    out = {"predict": ["--out", str(tmp_path / "p.csv")], "train": ["--out", str(tmp_path / "r")]}.get(command, [])
    src = ["--checkpoint", str(d / "run" / "checkpoint.pt")] if command != "train" else []
    rc = main([command, *src, "--data", str(data), "--threads", threads, *out])
    assert words in one_line_error(capsys, rc)
    assert list(tmp_path.iterdir()) == []


def test_data_convert_round_trips(trained, tmp_path):
    _, data = trained
    out = tmp_path / "conv.jsonl"
    assert main(["data", "convert", "--data", str(data), "--out", str(out)]) == 0
    a, b = read_deeptte_jsonl(data), read_deeptte_jsonl(out)
    assert len(a) == len(b) == 90 and np.array_equal(a.time_gap, b.time_gap) and list(a.driver) == list(b.driver)


@pytest.mark.parametrize("out", ["store", "trips.jsonl"])
def test_data_convert_imports_neither_torch_nor_the_model_layers(tmp_path, shared_data, out):
    """`stfast data convert` (the CLI's main, in a fresh interpreter) reads, preprocesses and writes without torch,
    the native ops extension or any layer above data (stfast._prep, the data layer's scans, links no torch): ~1.5 s
    and ~600 MiB less before it reads a byte."""
    import subprocess
    import sys

    raw = shared_data / "geolife_sample" / "Data" / "010"
    code = f"""
import sys
from stfast.cli import main
rc = main(["data", "convert", "--data", {str(raw)!r}, "--out", {str(tmp_path / out)!r}, "--gap-min", "10"])
above = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "stfast") and not m.startswith(
    ("stfast.data", "stfast.cli", "stfast._options", "stfast._lazy", "stfast._prep", "stfast._plural",
     "stfast._native")) and m != "stfast")
print(rc, above)
"""
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert got.stdout.strip().splitlines()[-1] == "0 []", got.stderr
    assert (tmp_path / out).exists()


def test_bad_input_gives_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    rec = random_trips(2, seed=1).record(0)
    good = json.dumps(rec)
    del rec["time_gap"]
    bad.write_text(good + "\n" + json.dumps(rec) + "\n")
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "time_gap" in err


def test_several_checkpoints_are_averaged(trained, tmp_path, capsys):
    d, data = trained
    second = tmp_path / "run2"
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "32", "--seed", "7",
                 "--out", str(second), "--no-progress", "--threads", "1"]) == 0
    cks = [str(d / "run" / "checkpoint.pt"), str(second / "checkpoint.pt")]
    outs = []
    for i, ck in enumerate([cks[:1], cks[1:], cks]):
        out = tmp_path / f"p{i}.csv"
        assert main(["predict", "--checkpoint", *ck, "--data", str(data), "--out", str(out)]) == 0
        outs.append(np.array([float(r["pred_time_s"]) for r in csv.DictReader(open(out))]))
    assert np.abs(outs[0] - outs[1]).max() > 1.0  # two different models
    np.testing.assert_allclose(outs[2], (outs[0] + outs[1]) / 2, atol=0.06)  # CSV keeps 0.1 s
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", *cks, "--data", str(data)]) == 0
    assert "mean of 2 models" in capsys.readouterr().out


def test_an_ensemble_scored_on_a_split_needs_one_split(trained, tmp_path, capsys):
    """--split test over checkpoints whose runs drew different splits (another --seed, no common --data-seed)
    is refused, naming both: one member trained on trips of the other's test split, and the score would
    depend on the checkpoints' order. Runs sharing --data-seed share the split and are averaged."""
    d, data = trained
    common = ["train", "--data", str(data), "--epochs", "1", "--batch-size", "32", "--no-progress", "--threads", "1"]
    other, same = tmp_path / "other", tmp_path / "same"
    assert main(common + ["--seed", "7", "--out", str(other)]) == 0
    assert main(common + ["--seed", "7", "--data-seed", "0", "--out", str(same)]) == 0
    first = str(d / "run" / "checkpoint.pt")
    capsys.readouterr()
    for cks in ([first, str(other / "checkpoint.pt")], [str(other / "checkpoint.pt"), first]):
        assert main(["evaluate", "--checkpoint", *cks, "--data", str(data), "--split", "test"]) == 2
        err = capsys.readouterr().err
        assert "another test split" in err and "--data-seed" in err and cks[1] in err
    assert main(["evaluate", "--checkpoint", first, str(same / "checkpoint.pt"), "--data", str(data),
                 "--split", "test"]) == 0
    assert "13 trips of the test split (mean of 2 models)" in capsys.readouterr().out


def test_deeptte_records_shorter_than_the_kernel_are_dropped_and_counted(trained, tmp_path):
    """DeepTTE JSON records are used as written, but one of 1 or 2 points has no geo-conv output: it stopped
    the whole prediction ("trip 0 of the batch has 1 points"). Now dropped as too_short and listed with the
    others predict accounts for; the rest are predicted."""
    d, data = trained
    recs = [json.loads(line) for line in open(data).read().splitlines()[:5]]
    for r, n in zip(recs, (1, 2)):
        for key in ("lngs", "lats", "states", "time_gap", "dist_gap"):
            r[key] = r[key][:n]
        r["time"], r["dist"] = max(r["time_gap"][-1], 1.0), max(r["dist_gap"][-1], 0.01)
    short = tmp_path / "short.jsonl"
    short.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(d / "run" / "checkpoint.pt"), "--data", str(short),
                 "--out", str(out)]) == 0
    assert len(list(csv.DictReader(open(out)))) == 3
    dropped = list(csv.DictReader(open(tmp_path / "p.dropped.csv")))
    assert [r["reason"] for r in dropped] == ["too_short", "too_short"]


def test_out_that_is_a_file_and_a_random_split_beside_a_date_split_are_refused(trained, tmp_path, capsys):
    _, data = trained
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["train", "--data", str(data), "--epochs", "1", "--out", str(afile)]) == 2
    assert f"--out {afile} is a file" in capsys.readouterr().err
    assert afile.read_text() == "x"
    out = tmp_path / "r"
    assert main(["train", "--data", str(data), "--split", "0.8/0.1/0.1", "--split-days", "24-28/29/30",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--split 0.8/0.1/0.1" in err and "--split-days" in err and not out.exists()
    assert main(["train", "--data", str(data), "--split-days", "24-28/29/31", "--out", str(out)]) == 2
    assert "the test split is empty: no trip falls on day(s) [31]" in capsys.readouterr().err


def test_an_ensemble_of_models_trained_on_other_trips_is_refused(trained, tmp_path, capsys):
    d, data = trained
    other = tmp_path / "other.jsonl"
    random_trips(60, seed=5, max_len=20).to_jsonl(other)
    assert main(["train", "--data", str(other), "--epochs", "1", "--batch-size", "32", "--out", str(tmp_path / "o"),
                 "--no-progress", "--threads", "1"]) == 0
    cks = [str(d / "run" / "checkpoint.pt"), str(tmp_path / "o" / "checkpoint.pt")]
    capsys.readouterr()
    for order in (cks, cks[::-1]):
        assert main(["evaluate", "--checkpoint", *order]) == 2
        err = capsys.readouterr().err
        assert "trained on other trips" in err and order[1] in err and order[0] in err


def test_a_run_trained_with_on_error_skip_is_evaluated_on_its_own_data(tmp_path, capsys):
    data = tmp_path / "two_bad.jsonl"
    lines = [json.dumps(r) for r in random_trips(80, seed=9, max_len=20).records()]
    lines[9] = "{not json"
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--on-error", "skip", "--epochs", "1", "--batch-size", "32",
                 "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    test_mape = json.load(open(out / "summary.json"))["test_mape"]
    capsys.readouterr()
    # no --data: the run's own data, read as it was (skipping the bad line); the same test score
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--split", "test"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert float(line.split("MAPE")[1].split("%")[0]) == pytest.approx(100 * test_mape, abs=0.006)
    # other data given explicitly: strict unless asked
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(data)]) == 2
    assert f"{data}:10" in capsys.readouterr().err


def test_max_steps_within_the_first_epoch_keeps_the_checkpoint_it_scores(trained, tmp_path, capsys, caplog):
    _, data = trained
    out = tmp_path / "ms"
    caplog.set_level(logging.INFO, logger="stfast")
    assert main(["train", "--data", str(data), "--max-steps", "1", "--batch-size", "32", "--out", str(out),
                 "--no-progress", "--threads", "1"]) == 0
    test_mape = json.load(open(out / "summary.json"))["test_mape"]
    assert (out / "checkpoint.pt").is_file()
    assert "stopped after 1 step (--max-steps)" in capsys.readouterr().out
    # no epoch ended, so there is no learning curve, said as such; the report has the final evaluation, as after
    # a --time-budget stop (before: no report here, though the --time-budget run wrote one)
    assert not [r for r in caplog.records if "could not write the report" in r.getMessage()]
    assert any("no epoch ended before the run stopped, so no learning curve" in r.getMessage()
               for r in caplog.records)
    assert not (out / "learning_curve.png").exists() and not (out / "metrics.jsonl").exists()
    assert (out / "report.png").is_file() and f"{100 * test_mape:.2f} %" in (out / "report.html").read_text()
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--split", "test"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert float(line.split("MAPE")[1].split("%")[0]) == pytest.approx(100 * test_mape, abs=0.006)


def _moved(trips_path, to_path, n, d_lng=12.33, d_lat=9.24):
    """The first ``n`` trips of ``trips_path`` moved by (d_lng, d_lat) degrees (Chengdu → Beijing), as JSON lines."""
    recs = [json.loads(line) for line in open(trips_path).read().splitlines()[:n]]
    for r in recs:
        r["lngs"] = [x + d_lng for x in r["lngs"]]
        r["lats"] = [y + d_lat for y in r["lats"]]
    to_path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return to_path


def test_data_outside_the_training_area_is_refused_unless_allowed(trained, tmp_path, capsys):
    """Issue 52, item 1: a model scored trips of a city it never saw (MAPE 108 %, exit 0). Now data whose
    trips lie mostly outside the training area is refused in one line naming how many, the model's area, the
    data's and --allow-outside; with it they are scored and counted; nothing is written by a refusal."""
    d, data = trained
    ck = str(d / "run" / "checkpoint.pt")
    far = _moved(data, tmp_path / "beijing.jsonl", 20)
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ck, "--data", str(far)]) == 2
    err = one_line_error(capsys, 2)
    assert "20 of 20 trips (100 %) lie outside the training area" in err and "--allow-outside" in err
    assert re.search(r"its training points: lng 10[34]\.\d+\.\.104\.\d+, lat 30\.", err)  # the model's area
    assert re.search(r"the data's points: lng 11[67]\.\d+\.\.116\.\d+, lat 39\.", err)  # and the data's
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", ck, "--data", str(far), "--out", str(out)]) == 2
    assert "--allow-outside" in one_line_error(capsys, 2) and not out.exists() and not dropped_path(out).exists()
    assert main(["evaluate", "--checkpoint", ck, "--data", str(far), "--allow-outside"]) == 0
    assert "20 trips  MAPE" in capsys.readouterr().out
    model = load_model(ck)
    far_trips = model.load_trips(far)
    assert stfast.OutsideTrainingArea is OutsideTrainingArea  # public, beside load_model
    with pytest.raises(OutsideTrainingArea, match="allow_outside=True") as ei:
        model.predict(far_trips)
    assert (ei.value.n_outside, ei.value.n_trips) == (20, 20)
    assert model.predict(far_trips, allow_outside=True).shape == (20,)


def test_one_trip_is_said_in_the_singular(trained, tmp_path, capsys):
    """evaluate, predict and data convert of a file of one trip say "1 trip" (before: "1 trips")."""
    d, data = trained
    ck = str(d / "run" / "checkpoint.pt")
    one = tmp_path / "one.jsonl"
    one.write_text(open(data).readline())
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ck, "--data", str(one)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("1 trip  MAPE")
    assert main(["predict", "--checkpoint", ck, "--data", str(one), "--out", str(tmp_path / "p.csv")]) == 0
    assert "wrote 1 prediction to " in capsys.readouterr().out
    assert main(["data", "convert", "--data", str(one), "--out", str(tmp_path / "conv.jsonl")]) == 0
    assert re.search(r"wrote 1 trip \(\d+ points\)", capsys.readouterr().out)


def test_a_few_trips_outside_are_scored_counted_and_flagged(trained, tmp_path, capsys):
    d, data = trained
    ck = str(d / "run" / "checkpoint.pt")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(open(data).read() + _moved(data, tmp_path / "far.jsonl", 3).read_text())
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", ck, "--data", str(mixed)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", ck, "--data", str(mixed), "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    flags = [r["outside_area"] for r in rows]
    # the 3 moved trips, and the few of the data's own scattered random points that no training point is near
    k = flags.count("1")
    assert flags[-3:] == ["1"] * 3 and 3 <= k < 20
    assert line.startswith("93 trips  MAPE") and f"({k} outside the training area, scored; MAPE" in line
    assert f"on the other {93 - k})" in line
    assert f"93 predictions ({k} outside the training area: outside_area 1)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, usage, hint", [
    (["train", "--epcohs", "2"], "usage: stfast train", "unrecognized arguments: --epcohs 2; --epcohs: did you mean --epochs?"),
    (["train", "--epoch", "1"], "usage: stfast train", "--epoch: did you mean --epochs?"),  # no prefix matching
    (["evaluate", "--checkpiont", "c.pt"], "usage: stfast evaluate",
     "required: --checkpoint; --checkpiont: did you mean --checkpoint?"),
    (["data", "convert", "--data", "x", "--out", "y", "--gap-mni", "3"], "usage: stfast data convert",
     "--gap-mni: did you mean --gap-min?"),
    (["trian", "--epochs", "1"], "usage: stfast ", "invalid choice: 'trian' (choose from 'train', "),
    (["trian", "--epochs", "1"], "usage: stfast ", "; did you mean train?"),
    (["evaluate", "--checkpoint", "c.pt", "--split", "tset"], "usage: stfast evaluate", "; did you mean test?"),
])
def test_an_unknown_flag_is_refused_under_its_commands_usage_with_the_closest_flag(argv, usage, hint, tmp_path,
                                                                                   capsys, monkeypatch):
    """Issue 52: `--epcohs 2` was refused under the top-level usage without a suggestion, and `--epoch 1` was taken
    as --epochs (argparse's prefix matching); abbreviations are off in every parser. Issue 62: the refusal and its
    "did you mean" are one line, naming the command whose --help lists the flags (before: after 33 usage lines)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ei:
        main(argv)
    err = capsys.readouterr().err
    # issue 62: one line with the fix in it and where --help lists the flags, no usage block before it
    prog = usage.removeprefix("usage: ").strip()
    assert ei.value.code == 2 and err.startswith("stfast: error: ") and hint in err, err
    assert len(err.strip().splitlines()) == 1 and f"`{prog} --help` lists them" in err, err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        given_dests(["train", "--batch", "32"])  # --batch is not --batch-size
    assert given_dests(["train", "--batch-size=32", "--epochs", "2"]) == {"command", "batch_size", "epochs"}


def test_a_split_days_refusal_lists_the_datas_days(trained, tmp_path, capsys):
    _, data = trained
    out = tmp_path / "r"
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--split-days", "1-5/6/7", "--out", str(out)]) == 2
    err = one_line_error(capsys, 2)
    assert "no trip falls on day(s) [1, 2, 3, 4, 5]" in err and "the data's days of month: [24, 25, 26, 27, 28, 29, 30]" in err
    assert not out.exists()


def test_trips_of_drivers_the_model_never_saw_are_counted(trained, tmp_path, capsys):
    """The model's world includes its drivers: trips of a driver the training split did not hold get the row
    reserved for unseen drivers; evaluate says how many (the data are scored: that row is the model's answer)."""
    d, data = trained
    recs = [json.loads(line) for line in open(data).read().splitlines()]
    for r in recs[:4]:
        r["driverID"] = "a driver no training trip had"
    other = tmp_path / "other_drivers.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["train", "--data", str(data), "--driver-dim", "4", "--max-steps", "1", "--batch-size", "32",
                 "--out", str(tmp_path / "drv"), "--no-progress", "--threads", "1"]) == 0
    capsys.readouterr()
    for ck, data_, said in ((d / "run" / "checkpoint.pt", other, False),  # its run reads no driver (--driver-dim 0)
                            (tmp_path / "drv" / "checkpoint.pt", data, False),
                            (tmp_path / "drv" / "checkpoint.pt", other, True)):
        assert main(["evaluate", "--checkpoint", str(ck), "--data", str(data_)]) == 0
        assert ("4 by drivers the model did not train on" in capsys.readouterr().out) == said


@pytest.mark.parametrize("mine", ["file", "folder"])
def test_predict_refuses_a_users_file_at_its_dropped_path(trained, tmp_path, capsys, mine):
    """``predict --out p.csv`` also writes p.dropped.csv: a user's file there was overwritten without a word, a
    folder there failed after p.csv was written, naming a hidden temporary file. Now both are refused first, in
    one line naming the path, and nothing is written."""
    d, data = trained
    out, dropped = tmp_path / "p.csv", dropped_path(tmp_path / "p.csv")
    if mine == "file":
        dropped.write_text("my own notes\n")
    else:
        dropped.mkdir()
    rc = main(["predict", "--checkpoint", str(d / "run" / "checkpoint.pt"), "--data", str(data), "--out", str(out)])
    assert f"{dropped} exists and is not the list of dropped trips" in one_line_error(capsys, rc)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["p.dropped.csv"]
    assert mine == "folder" or dropped.read_text() == "my own notes\n"


def _full_disk(monkeypatch):
    import errno

    import stfast.train.run_predictions as rp

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rp.os, "fsync", full)


def test_predict_on_a_full_disk_is_one_line(trained, tmp_path, capsys, monkeypatch):
    """An OS error writing the predictions (here a full disk) was an ``OSError [Errno 28]`` traceback; now one
    line with the path and what to do, and nothing written."""
    d, data = trained
    out = tmp_path / "p.csv"
    _full_disk(monkeypatch)
    rc = main(["predict", "--checkpoint", str(d / "run" / "checkpoint.pt"), "--data", str(data), "--out", str(out)])
    err = one_line_error(capsys, rc)
    assert f"cannot write {out}: No space left on device; the disk is full" in err
    assert list(tmp_path.iterdir()) == []


def test_a_runs_test_predictions_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    """write_columns also writes a run's test_predictions.csv at its end: a full disk there was an ``OSError``
    traceback after training (``stfast train --out`` on a nearly full tmpfs); now ValueError, one line naming the
    file (the CLI: ``stfast: error:``), the previous file intact."""
    from stfast.train.run_predictions import write_columns

    path = tmp_path / "test_predictions.csv"
    path.write_text("before\n")
    _full_disk(monkeypatch)
    with pytest.raises(ValueError, match=f"cannot write {path}: No space left on device; the disk is full"):
        write_columns(path, {"trip_id": (np.arange(3), None)})
    assert path.read_text() == "before\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_predict_into_a_symlink_writes_its_file(trained, tmp_path, capsys):
    """``--out link.csv``, a symbolic link to an earlier predictions CSV: the link was replaced by a new file and
    the file it pointed to kept the old predictions. Now the link is followed (as a store's --out is)."""
    d, data = trained
    ck = str(d / "run" / "checkpoint.pt")
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "p.csv"
    assert main(["predict", "--checkpoint", ck, "--data", str(data), "--out", str(target), "--split", "test"]) == 0
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert main(["predict", "--checkpoint", ck, "--data", str(data), "--out", str(link), "--split", "all"]) == 0
    assert link.is_symlink() and len(target.read_text().splitlines()) == 1 + 90


def test_a_run_resumed_before_its_first_epoch_ended_scores_the_weights_it_stopped_with(trained, tmp_path, capsys):
    # --max-steps 1, then --resume --max-steps 2, no epoch ended in either: the resumed run scored the checkpoint.pt
    # of the first (the weights after step 1) under a summary saying 2 steps; now the weights after step 2, as a
    # run of 2 steps in one go
    _, data = trained
    args = ["train", "--data", str(data), "--batch-size", "8", "--no-progress", "--threads", "1", "--out"]
    once, resumed = tmp_path / "once", tmp_path / "resumed"
    assert main([*args, str(once), "--max-steps", "2"]) == 0
    assert main([*args, str(resumed), "--max-steps", "1"]) == 0
    first = (resumed / "checkpoint.pt").read_bytes()
    assert main([*args, str(resumed), "--max-steps", "2", "--resume"]) == 0
    capsys.readouterr()
    got, want = (json.load(open(d / "summary.json")) for d in (resumed, once))
    assert (got["steps"], got["epochs"], want["epochs"]) == (2, 0, 0)
    assert (resumed / "checkpoint.pt").read_bytes() != first
    assert got["test_mape"] == pytest.approx(want["test_mape"], rel=1e-6), (got["test_mape"], want["test_mape"])


def test_one_trip_is_said_in_the_singular_in_errors_and_warnings(trained, tmp_path, capsys, caplog):
    """A file of one trip: training on it, a --min-points that drops it (before: "(1 trips)", "its 1 trips",
    "1 trips with fewer than"); nothing is written by the refusals."""
    _, data = trained
    one = tmp_path / "one.jsonl"
    one.write_text(open(data).readline())
    err = one_line_error(capsys, main(["train", "--data", str(one), "--out", str(tmp_path / "run")]))
    assert "the validation split is empty (1 trip); change --split" in err, err
    caplog.set_level(logging.WARNING, logger="stfast")
    err = one_line_error(capsys, main(["data", "convert", "--data", str(one), "--min-points", "1000",
                                       "--out", str(tmp_path / "s.jsonl")]))
    assert "left no trip: its one trip fails a trip filter: 1 (all) has fewer than --min-points 1000" in err, err
    assert "1 trip with fewer than 1000 points (min_points) dropped" in caplog.text, caplog.text
    far = _moved(data, tmp_path / "far.jsonl", 1)
    err = one_line_error(capsys, main(["evaluate", "--checkpoint", str(trained[0] / "run" / "checkpoint.pt"),
                                       "--data", str(far)]))
    assert "1 of 1 trip (100 %) lies outside the training area" in err, err
    far.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.jsonl"]


def test_convert_and_train_write_counts_with_thousands_separators(tmp_path, capsys):
    """'wrote 1001 trips (N points)' beside 'dropped 7,623 points of 8,245' on the same line; the training banner
    '1001 trips → train 700'. Now every count of these lines has its separator."""
    data = tmp_path / "trips.jsonl"
    random_trips(1001, seed=5, min_len=3, max_len=6).to_jsonl(data)
    assert main(["data", "convert", "--data", str(data), "--out", str(tmp_path / "t.store")]) == 0
    assert re.search(r"^wrote 1,001 trips \(\d,\d{3} points\)", capsys.readouterr().out, flags=re.M)
    assert main(["train", "--data", str(tmp_path / "t.store"), "--max-steps", "1", "--batch-size", "8",
                 "--subtrips", "0", "--threads", "1", "--no-progress", "--out", str(tmp_path / "run")]) == 0
    assert re.search(r"^stfast [\d.]+: 1,001 trips → train \d{3}, val \d{3}, test \d{3};", capsys.readouterr().out,
                     flags=re.M)


def test_data_a_models_trip_filters_leave_empty_is_named_as_the_models_settings(trained, tmp_path, capsys):
    """evaluate / predict on data whose every trip fails the trip filters said 'lower --min-points to keep any trip
    (flags of stfast data convert: convert with them and train on the store it writes)', as if the data were to be
    trained on; the filters are the model's: the line says so. Nothing is written."""
    d, _ = trained
    ck = d / "run" / "checkpoint.pt"
    short = tmp_path / "short.jsonl"
    random_trips(5, seed=2, min_len=2, max_len=2).to_jsonl(short)
    for cmd in (["evaluate"], ["predict", "--out", str(tmp_path / "p.csv")]):
        err = one_line_error(capsys, main([*cmd, "--checkpoint", str(ck), "--data", str(short)]))
        assert "5 (all) have fewer than --min-points 3 points (the most 2); these are the settings " \
               f"{ck} was trained with: give trips that pass them, or train a model on data converted with " \
               "--min-points lowered (flags of stfast data convert)." in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.jsonl"]
