"""`stfast report RUN_DIR`: report.png and a self-contained report.html from a run's metrics."""
import json

import numpy as np
import pytest

from stfast.cli import main
from stfast.train.report import render
from stfast.train.run_log import read_rows


def _run_dir(tmp_path, windows=True, slicer=True):
    tmp_path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    rows = [{"type": "epoch", "epoch": e, "step": 10 * e, "train_loss": float(rng.uniform(0.1, 0.5)),
             "val_mape": float(rng.uniform(0.1, 0.4)), "samples_per_s": float(rng.uniform(50, 90)),
             "wall_s": 5.0 * e} for e in range(1, 4)]
    if windows:
        rows += [{"type": "window", "window": w, "k": int(2 ** (w % 3)), "noise_scale": float(rng.uniform(10, 500)),
                  "wall_s": 2.0 * w, "step": 5 * w, "accumulation": "rl"} for w in range(1, 6)]
    if slicer:
        rows += [{"type": "step", "slicer": "balanced", "step": s, "compute_s": rng.uniform(0.1, 0.2, 2).tolist(),
                  "idle_s": rng.uniform(0, 0.02, 2).tolist(), "imbalance_measured": float(rng.uniform(1, 1.1)),
                  "imbalance_predicted": float(rng.uniform(1, 1.05)),
                  "cost_coef": rng.uniform(0, 1e-3, 4).tolist()} for s in range(1, 20)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"test_mape": 0.2345678, "n_test": 13, "dropped": {}}))
    return tmp_path


@pytest.mark.parametrize("windows,slicer", [(True, True), (False, False)])
def test_render_writes_png_and_self_contained_html(tmp_path, windows, slicer):
    d = _run_dir(tmp_path, windows, slicer)
    kinds = read_rows(d)
    assert [len(kinds[k]) for k in ("epoch", "window", "step")] == [3, 5 if windows else 0, 19 if slicer else 0]
    png, page = render(d)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "data:image/png;base64," in text and "0.234568" in text and "n_test" in text
    assert "src='http" not in text  # nothing fetched from elsewhere


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
    assert "no metrics" in capsys.readouterr().err


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
