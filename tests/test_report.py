"""`stfast report RUN_DIR`: report.png and a self-contained report.html from a run's metrics."""
import json

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import random_trips
from stfast.cli import main
from stfast.train import report, run_predictions
from stfast.train.report import render
from stfast.train.run_log import read_rows


SUMMARY = {"test_mape": 0.2345678, "test_mae": 301.25, "test_rmse": 455.5,
           "baseline_const_speed_mape": 0.2885, "baseline_const_speed_mae": 364.4, "baseline_const_speed_rmse": 520.0,
           "baseline_const_speed_val_mape": 0.327, "baseline_mean_time_mape": 0.9, "baseline_mean_time_mae": 600.0,
           "baseline_mean_time_rmse": 800.0, "baseline_mean_time_val_mape": 1.2, "best_val_mape": 0.21, "epochs": 3,
           "steps": 30, "n_train": 70, "n_val": 14, "n_test": 13, "world_size": 2,
           "dropped": {"stay_point": 12, "too_short": 2}, "stfast_version": "0.1.0"}


def _run_dir(tmp_path, windows=True, slicer=True, k_moves=True, preds=True):
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    rows = [{"type": "epoch", "epoch": e, "step": 10 * e, "train_loss": float(rng.uniform(0.1, 0.5)),
             "val_mape": float(rng.uniform(0.1, 0.4)), "samples_per_s": float(rng.uniform(50, 90)),
             "wall_s": 5.0 * e} for e in range(1, 4)]
    if windows:
        rows += [{"type": "window", "window": w, "k": int(2 ** (w % 3)) if k_moves else 1,
                  "noise_scale": float(rng.uniform(10, 500)), "wall_s": 2.0 * w, "step": 5 * w, "accumulation": "rl"}
                 for w in range(1, 6)]
    if slicer:
        rows += [{"type": "step", "slicer": "balanced", "step": s, "compute_s": rng.uniform(0.1, 0.2, 2).tolist(),
                  "idle_s": rng.uniform(0, 0.02, 2).tolist(), "imbalance_measured": float(rng.uniform(1, 1.1)),
                  "imbalance_predicted": float(rng.uniform(1, 1.05)),
                  "cost_coef": rng.uniform(0, 1e-3, 4).tolist()} for s in range(1, 20)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    if preds:
        n = 150
        km = rng.uniform(0.5, 12, n)
        true = km * 120 * rng.uniform(0.7, 1.4, n)
        trips = SimpleNamespace(trip_id=[f"t{i}" for i in range(n)], segment=np.zeros(n, int), driver=["d"] * n,
                                lengths=np.full(n, 9), dist=km, week_id=np.full(n, 5),
                                time_id=rng.integers(0, 1440, n), time=true)
        run_predictions.write(tmp_path, trips, true * rng.uniform(0.8, 1.2, n),
                               {"const_speed": km * 125.0, "mean_time": np.full(n, true.mean())})
    return tmp_path


def _figure(d):
    from stfast.train import report_figure

    return report_figure.figure(read_rows(d), json.loads((d / "summary.json").read_text()), run_predictions.read(d),
                                "t")


def _titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_title()]


def _legend_labels(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize("windows,slicer", [(True, True), (False, False)])
def test_render_writes_png_and_self_contained_html(tmp_path, windows, slicer):
    d = _run_dir(tmp_path, windows, slicer)
    kinds = read_rows(d)
    assert [len(kinds[k]) for k in ("epoch", "window", "step")] == [3, 5 if windows else 0, 19 if slicer else 0]
    png, page = render(d)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "data:image/png;base64," in text
    assert "src='http" not in text  # nothing fetched from elsewhere


def test_report_panels_judge_the_model_against_the_baselines(tmp_path):
    """Issue 52 item 7: test metrics beside both baselines, the validation curve against them, predicted
    against actual, error by trip length and by hour of day, every line labelled, no panel twice (before:
    the same curve against wall time and against steps, a legend naming only "validation MAPE")."""
    import matplotlib.pyplot as plt

    fig = _figure(_run_dir(tmp_path / "run"))
    try:
        titles = _titles(fig)
        assert len(titles) == len(set(titles))  # no panel twice
        for want in ("test split (13 trips): MAPE, MAE, RMSE", "validation MAPE per epoch against the baselines",
                     "predicted against actual, test split (150 trips)", "MAPE by trip length, test split",
                     "MAPE by hour of departure, test split", "training loss and throughput per epoch",
                     "accumulation steps per window (rl)", "per-rank compute and idle time"):
            assert want in titles, (want, titles)
        labels = _legend_labels(fig)
        for want in ("DeepTTE validation MAPE", "constant speed (validation): 32.7 %",
                     "mean travel time (validation): 120.0 %, above the axis", "perfect prediction",
                     "training loss", "throughput (trips/s, right axis)", "k (micro-batches per optimizer step)",
                     "gradient noise scale (trips, right axis)"):
            assert want in labels, (want, labels)
        assert labels.count("constant speed") >= 3 and labels.count("DeepTTE") >= 3  # scatter, length, hour
        for ax in fig.axes:  # every drawn line and point set is named in a legend
            named = {t.get_text() for t in ax.get_legend().get_texts()} if ax.get_legend() else set(labels)
            for artist in [*ax.lines, *ax.collections]:
                assert not artist.get_label().startswith("_") and artist.get_label() in named, (ax.get_title(),
                                                                                                artist.get_label())
        metrics = [ax for ax in fig.axes if ax.get_title().startswith("test split")][0]
        assert [t.get_text() for t in metrics.get_yticklabels()] == ["DeepTTE", "constant speed", "mean travel time"]
        assert any("23.5 %   MAE 301 s   RMSE 456 s" in t.get_text() for t in metrics.texts)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("windows", [False, True])
def test_no_accumulation_panel_when_k_did_not_move(tmp_path, windows):
    import matplotlib.pyplot as plt

    fig = _figure(_run_dir(tmp_path, windows=windows, slicer=False, k_moves=False))
    try:
        assert not [t for t in _titles(fig) if "accumulation" in t]
        assert not [t for t in _titles(fig) if "rank" in t]  # one process: no slicer panels either
    finally:
        plt.close(fig)


def test_a_run_without_test_predictions_gets_the_curves_and_the_metrics(tmp_path):
    import matplotlib.pyplot as plt

    fig = _figure(_run_dir(tmp_path, windows=False, slicer=False, preds=False))
    try:
        titles = _titles(fig)
        assert len(titles) == 3 and not [t for t in titles if "predicted" in t or " by " in t], titles
    finally:
        plt.close(fig)


def test_html_shows_the_metrics_in_percent_beside_the_baselines(tmp_path):
    _, page = render(_run_dir(tmp_path))
    text = page.read_text()
    for want in ("<td>DeepTTE (stfast)</td><td>23.46 %</td><td>301.2 s</td><td>455.5 s</td>",
                 "<td>constant speed</td><td>28.85 %</td><td>364.4 s</td>", "<td>mean travel time</td><td>90.00 %</td>",
                 "Test split (13 trips)", "21.00 %",
                 "dropped 12 points (stay_point 12); dropped 2 trips (too_short 2)"):
        assert want in text, want
    assert "0.234568" not in text and "n_test" not in text and "test_mape" not in text  # no raw key/value table


def test_one_trip_is_said_in_the_singular(tmp_path):
    """A test split of one trip: "test split (1 trip)" in the summary table, the page and the figure (before:
    "1 trips" in each), and "dropped 1 trip"."""
    import matplotlib.pyplot as plt

    from stfast.train.metrics import format_summary

    d = _run_dir(tmp_path, windows=False, slicer=False, preds=False)
    one = {**SUMMARY, "n_test": 1, "dropped": {"too_short": 1}}
    (d / "summary.json").write_text(json.dumps(one))
    head = format_summary(one).splitlines()[0]
    assert head.startswith("test split (1 trip) ") and head.index("MAPE") == 27  # over the rows' values, as for 13
    assert format_summary(SUMMARY).splitlines()[0].index("MAPE") == 27
    _, page = render(d)
    text = page.read_text()
    for want in ("Test split (1 trip)<", "dropped 1 trip (too_short 1)"):
        assert want in text, want
    assert report._title("r", one).endswith("on 1 test trip")  # report.png's heading
    fig = _figure(d)
    try:
        assert "test split (1 trip): MAPE, MAE, RMSE" in _titles(fig)
    finally:
        plt.close(fig)


def test_a_run_writes_its_test_predictions_and_the_report_reads_them(tmp_path, capsys):
    data = tmp_path / "trips.jsonl"
    random_trips(90, seed=31, max_len=20).to_jsonl(data)
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--epochs", "1", "--batch-size", "32", "--out", str(out),
                 "--no-progress", "--threads", "1"]) == 0
    s = json.loads((out / "summary.json").read_text())
    p = run_predictions.read(out)
    assert len(p["true_time_s"]) == s["n_test"]
    ape = np.abs(p["pred_time_s"] - p["true_time_s"]) / p["true_time_s"]
    assert np.mean(ape) == pytest.approx(s["test_mape"], rel=1e-3)
    const = np.abs(p["const_speed_s"] - p["true_time_s"]) / p["true_time_s"]
    assert np.mean(const) == pytest.approx(s["baseline_const_speed_mape"], rel=1e-3)
    assert {"test_predictions.csv", "report.png", "report.html"} <= {f.name for f in out.iterdir()}
    assert "test_predictions.csv" in capsys.readouterr().out  # named among the files written


def test_bad_metrics_name_file_and_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        read_rows(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"type": "epoch", "epoch": 1, "step": 1}\n{"epoch": 2,\n')
    with pytest.raises(ValueError, match="line 2"):
        read_rows(tmp_path)


def test_cli_report(tmp_path, capsys):
    d = _run_dir(tmp_path / "run")
    out = tmp_path / "out"
    assert main(["report", str(d), "--out", str(out)]) == 0
    assert (out / "report.png").is_file() and (out / "report.html").is_file()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert f"{tmp_path / 'nothing'}: no such folder; stfast report takes a run folder" in capsys.readouterr().err


def test_cli_report_names_what_a_folder_without_a_run_is(tmp_path, capsys):
    """A folder with neither summary.json nor metrics.jsonl (a trips store, a typo's empty folder) said
    'FOLDER/metrics.jsonl: no metrics', though a run stopped before its first epoch has no metrics.jsonl."""
    from stfast.data.store import write_store
    from stfast.data.synthetic import synthetic_trips

    write_store(synthetic_trips(10, seed=1), tmp_path / "s.store")
    (tmp_path / "empty").mkdir()
    for name, what in (("s.store", "a trips store, not a run"), ("empty", "holds neither summary.json nor "
                                                                          "metrics.jsonl")):
        assert main(["report", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"stfast: error: {tmp_path / name}: {what}; stfast report takes a run folder (the --out of "
                       "stfast train)"], err
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == []


def test_cli_report_refuses_a_file_or_a_typo_and_writes_nothing(tmp_path, capsys):
    """Issue 52 item 2: a checkpoint given for its run folder, or a folder name with a typo, is one line on
    stderr and exit 2, with nothing created (before: FileExistsError's traceback; an empty folder left behind)."""
    d = _run_dir(tmp_path / "run")
    (d / "checkpoint.pt").write_bytes(b"not read")
    before = sorted(p.name for p in d.iterdir())
    assert main(["report", str(d / "checkpoint.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file" in err[0] and str(d) in err[0], err
    assert sorted(p.name for p in d.iterdir()) == before
    assert main(["report", str(tmp_path / "typo_run")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "typo_run").exists()


def test_a_partial_last_row_is_dropped_on_resume_and_left_out_when_read(tmp_path, caplog):
    """An interrupted write leaves metrics.jsonl ending mid-row, possibly below the size the checkpoint
    recorded: cut_back (what --resume calls) drops the partial row so that new rows are not glued to it, and
    read_rows (report, plots) leaves it out with a warning instead of refusing the whole log."""
    from stfast.train.run_log import RunLog

    rl = RunLog(tmp_path)
    for e in (1, 2, 3):
        rl.append("epoch", {"epoch": e, "val_mape": 0.1 * e})
    full = rl.size()
    data = rl.path.read_bytes()
    rl.path.write_bytes(data[:-15])  # the third row cut short, and the file below `full`
    assert [r["epoch"] for r in read_rows(tmp_path)["epoch"]] == [1, 2]
    assert "partial last row" in caplog.text
    rl.cut_back(full)
    rl.append("epoch", {"epoch": 3, "val_mape": 0.3})
    assert [r["epoch"] for r in read_rows(tmp_path)["epoch"]] == [1, 2, 3]
    assert "ends in a partial line" in caplog.text
    rl.path.write_bytes(data[:-15] + b"\n")  # a broken row that is not the last write: still an error
    rl.append("epoch", {"epoch": 4})
    with pytest.raises(ValueError, match="line 3: not a JSON object"):
        read_rows(tmp_path)


def test_the_scatter_says_how_many_trips_lie_beyond_its_axes():
    """Issue 62 item 5: the predicted-against-actual panel ends its axes at the 99.5 % quantile; the trips that
    leaves out are counted in its title (before: dropped from the picture without a word)."""
    import matplotlib.pyplot as plt

    from stfast.train import report_figure

    rng = np.random.default_rng(0)
    true = rng.uniform(300, 900, 400)
    true[:3] = [20_000, 30_000, 40_000]  # three trips far past the rest
    p = {"true_time_s": true, "pred_time_s": true * rng.uniform(0.8, 1.2, 400), "const_speed_s": true * 1.1,
         "mean_time_s": np.full(400, float(true.mean()))}
    fig, ax = plt.subplots()
    try:
        report_figure._scatter(ax, p)
        hi = ax.get_xlim()[1] * 60  # minutes on the axes
        beyond = int(np.sum((p["true_time_s"] > hi) | (p["pred_time_s"] > hi)))
        assert 1 <= beyond <= 3
        assert ax.get_title() == f"predicted against actual, test split (400 trips; {beyond} beyond the axes)"
        p = {k: v[3:] for k, v in p.items()}
        ax.clear()
        report_figure._scatter(ax, p)
        assert "beyond" not in ax.get_title()
    finally:
        plt.close(fig)
