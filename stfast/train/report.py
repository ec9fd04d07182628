"""One training run rendered for people: ``report.png`` (matplotlib) and a self-contained ``report.html``.

Reads what the trainer writes in the run folder: the run log ``metrics.jsonl`` by row type
(stfast.train.run_log: epoch, window and slicer step rows) and ``summary.json``; the figure is drawn by
stfast.train.plots.report_png. Panels without data (for example no accumulation windows in a run with a
fixed k) are left out.
"""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from .plots import report_png
from .run_log import FILE, read_rows


def render(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.html`` (the PNG embedded, plus the run's summary) into ``out_dir``
    (default: ``run_dir``); returns both paths. Raises FileNotFoundError/ValueError (see run_log.read_rows),
    ValueError when the run log has no row to plot."""
    run_dir = Path(run_dir)
    if run_dir.is_file():  # a checkpoint or log given for its run folder: name the folder to give instead
        raise ValueError(f"{run_dir} is a file; stfast report takes a run folder (the --out of stfast train), "
                         f"e.g. {run_dir.parent}")
    out_dir = Path(out_dir) if out_dir else run_dir
    image = report_png(read_rows(run_dir), f"stfast run {run_dir.resolve().name}")
    if image is None:
        raise ValueError(f"{run_dir / FILE}: no rows to plot")
    out_dir.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    png = out_dir / "report.png"
    _write_atomic(png, image)
    summary = run_dir / "summary.json"
    table = ""
    if summary.is_file():
        s = json.loads(summary.read_text())
        cells = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(_fmt(v))}</td></tr>"
                        for k, v in s.items() if not isinstance(v, (dict, list)))
        table = f"<h2>Summary</h2><table>{cells}</table>"
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>stfast run {html.escape(run_dir.name)}</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}td{padding:2px 12px}"
            "tr:nth-child(even){background:#f3f3f3}</style></head><body>"
            f"<h1>stfast run {html.escape(str(run_dir))}</h1>"
            f"<img alt='training report' style='width:100%' src='data:image/png;base64,"
            f"{base64.b64encode(image).decode()}'>{table}</body></html>")
    page_path = out_dir / "report.html"
    _write_atomic(page_path, page.encode())
    return png, page_path


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
