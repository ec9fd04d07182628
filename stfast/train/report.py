"""One training run rendered for people: ``report.png`` (matplotlib) and a self-contained ``report.html``.

Reads what the trainer writes in the run folder: the run log ``metrics.jsonl`` by row type
(stfast.train.run_log: epoch, window and slicer step rows), ``summary.json`` and ``test_predictions.csv``
(stfast.train.run_predictions; a run from before it was written has no per-trip panels). The figure is
stfast.train.report_figure's. The page holds the test split's MAPE (%), MAE and RMSE (s) of the model and
both baselines, the run's facts in words and units, and the figure.
"""
from __future__ import annotations

import base64
import html
import json
import logging
from pathlib import Path

from .._plural import counted
from ..data.drops import describe as describe_dropped
from ..data.durable import write_bytes_atomic
from . import report_figure, run_predictions
from .metrics import summary_rows
from .run_log import FILE, TYPES, read_rows, write_summary

log = logging.getLogger("stfast.train")


def render(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.html`` (the test metrics beside the baselines, the run's facts, the PNG
    embedded) into ``out_dir`` (default: ``run_dir``); returns both paths. A run folder with summary.json and no
    metrics.jsonl (stopped before its first row) gets the test metrics alone. Raises FileNotFoundError/ValueError
    (see run_log.read_rows, run_predictions.read), ValueError when nothing is there to plot."""
    run_dir = Path(run_dir)
    if run_dir.is_file():  # a checkpoint or log given for its run folder: name the folder to give instead
        raise ValueError(f"{run_dir} is a file; stfast report takes a run folder (the --out of stfast train), "
                         f"e.g. {run_dir.parent}")
    if not (run_dir / "summary.json").is_file() and not (run_dir / FILE).is_file():  # nothing of a run to report
        from ..data.store import is_store

        what = ("no such folder" if not run_dir.is_dir() else "a trips store, not a run" if is_store(run_dir)
                else f"holds neither summary.json nor {FILE}")
        raise FileNotFoundError(f"{run_dir}: {what}; stfast report takes a run folder (the --out of stfast train)")
    out_dir = Path(out_dir) if out_dir else run_dir
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    # a run that stopped before its first log row (--max-steps within the first epoch) has a summary, no log
    rows = read_rows(run_dir) if summary is None or (run_dir / FILE).is_file() else {t: [] for t in TYPES}
    preds = run_predictions.read(run_dir)
    name = run_dir.resolve().name
    image = report_figure.png(rows, summary, preds, _title(name, summary))
    if image is None:
        raise ValueError(f"{run_dir / FILE}: no rows to plot")
    out_dir.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    png = out_dir / "report.png"
    write_bytes_atomic(png, image)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>stfast run {html.escape(name)}</title>"
            "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}td,th{padding:2px 12px;text-align:right}"
            "td:first-child,th:first-child{text-align:left}tr:nth-child(even){background:#f3f3f3}</style></head><body>"
            f"<h1>stfast run {html.escape(name)}</h1><p>{html.escape(str(run_dir))}</p>"
            f"{_metrics_table(summary)}{_facts(summary)}"
            f"<img alt='training report' style='width:100%' src='data:image/png;base64,"
            f"{base64.b64encode(image).decode()}'></body></html>")
    page_path = out_dir / "report.html"
    write_bytes_atomic(page_path, page.encode())
    return png, page_path


def _title(name: str, s: dict | None) -> str:
    if not s or "test_mape" not in s:
        return f"stfast run {name}"
    const = s.get("baseline_const_speed_mape")
    vs = f" (constant speed {100 * const:.1f} %)" if const is not None else ""
    n = counted(s.get('n_test', '?'), 'test trip')
    return f"stfast run {name}: test MAPE {100 * s['test_mape']:.1f} %{vs} on {n}"


def _metrics_table(s: dict | None) -> str:
    """The test split's MAPE / MAE / RMSE of the model and both baselines, MAPE in %."""
    if not s or "test_mape" not in s:
        return ""
    cells = "".join(f"<tr><td>{html.escape(n)}</td><td>{100 * m:.2f} %</td><td>{mae:.1f} s</td>"
                    f"<td>{rmse:.1f} s</td></tr>" for n, m, mae, rmse in summary_rows(s))
    return (f"<h2>Test split ({counted(s.get('n_test', '?'), 'trip')})</h2><table><tr><th></th><th>MAPE</th>"
            f"<th>MAE</th><th>RMSE</th></tr>{cells}</table>")


def _facts(s: dict | None) -> str:
    """The run in words: its length, splits, world size, best validation MAPE (%), what was dropped."""
    if not s:
        return ""
    facts = []
    if "epochs" in s:
        facts.append(("trained", f"{s['epochs']} epochs, {s.get('steps', '?')} optimizer steps, world size "
                                 f"{s.get('world_size', 1)}"))
    if "n_train" in s:
        facts.append(("trips", f"training {s['n_train']:,}, validation {s.get('n_val', 0):,}, "
                               f"test {s.get('n_test', 0):,}"))
    if s.get("best_val_mape") is not None:
        facts.append(("validation MAPE of checkpoint.pt", f"{100 * s['best_val_mape']:.2f} %"))
    for key, name in (("const_speed", "constant speed"), ("mean_time", "mean travel time")):
        if f"baseline_{key}_val_mape" in s:
            facts.append((f"validation MAPE of {name}", f"{100 * s[f'baseline_{key}_val_mape']:.2f} %"))
    if "dropped" in s:
        facts.append(("dropped in reading and preprocessing", describe_dropped(s["dropped"])))
    if s.get("parent"):
        facts.append(("parent checkpoint (warm start)", lineage_text(s["parent"])))
    if s.get("warm_start"):
        from .warm_start import describe

        facts.append(("carried from the parent", describe(s["warm_start"])))
    if "stfast_version" in s:
        facts.append(("stfast", s["stfast_version"]))
    cells = "".join(f"<tr><td>{html.escape(k)}</td><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
                    for k, v in facts)
    return f"<h2>Run</h2><table>{cells}</table>" if facts else ""


def lineage_text(parent: dict) -> str:
    """A run's ``parent`` (summary.json, stfast.train.warm_start) in words: the checkpoint and its fingerprint, then
    each earlier ancestor's (``… ← sha256 …``)."""
    text = f"{parent.get('path')} (sha256 {parent.get('sha256')})"
    up = parent.get("parent")
    while isinstance(up, dict):
        text += f" ← {up.get('path')} (sha256 {up.get('sha256')})"
        up = up.get("parent")
    return text


def write_outputs(out: Path, summary: dict) -> list[str]:
    """At the end of a run, in its folder ``out``: summary.json (atomically), learning_curve.png (the epoch rows and the
    baselines; only when an epoch ended) and report.png + report.html (stfast.train.report: the final
    evaluation's test metrics, with whatever the run log holds; a plotting failure is logged, never
    fatal to a finished run). Returns the names of the run's files now in the folder."""
    from . import plots

    write_summary(out, summary)
    # stopped (--max-steps, --time-budget) before its first epoch ended: no curve to draw, and no metrics.jsonl
    # at all before the first accumulation window ended; the test evaluation is still reported
    epochs = read_rows(out)["epoch"] if (out / FILE).is_file() else []
    if epochs:
        plots.learning_curve(epochs, summary, out / "learning_curve.png")
    else:
        log.info("%s: no epoch ended before the run stopped, so no learning curve; the report has the test "
                 "metrics", out)
    try:
        render(out)
    except (ValueError, OSError, RuntimeError) as e:
        log.warning("could not write the report in %s: %s", out, e)
    names = ("summary.json", FILE, "test_predictions.csv", "learning_curve.png", "report.png", "report.html",
             "checkpoint.pt", "last.pt", "last.prev.pt")
    return [n for n in names if (out / n).exists()]
