"""One training run rendered for people: ``report.png`` (matplotlib) and a self-contained ``report.html``.

Reads what the trainer writes in the run folder: ``metrics.jsonl`` (epoch rows: ``epoch``, ``step``,
``train_loss``, ``val_mape``, ``samples_per_s``, ``wall_s``; accumulation window rows: ``window``, ``k``,
``noise_scale``, ``comm_s``, ...; slicer step rows: ``slicer`` with per-rank compute and idle times and the
fitted cost coefficients) and ``summary.json``. Panels without data (for example no accumulation windows
in a run with a fixed k) are left out.
"""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path


def read_rows(run_dir: str | Path) -> dict[str, list[dict]]:
    """The rows of ``run_dir/metrics.jsonl`` by kind: ``epochs``, ``windows``, ``slicer``.
    Raises FileNotFoundError naming the file, ValueError naming the line of a row that is not JSON."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a training run folder?)")
    kinds: dict[str, list[dict]] = {"epochs": [], "windows": [], "slicer": []}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {n}: not a JSON object ({e.msg})") from None
        if "window" in row:
            kinds["windows"].append(row)
        elif "slicer" in row:
            kinds["slicer"].append(row)
        elif "epoch" in row:
            kinds["epochs"].append(row)
    return kinds


def _panels(rows: dict[str, list[dict]]) -> list:
    """(title, draw(ax)) for every panel that has data."""
    ep, win, sl = rows["epochs"], rows["windows"], rows["slicer"]
    out = []
    if ep:
        def loss_mape(ax, x):
            ax.plot([r[x] for r in ep], [100 * r["val_mape"] for r in ep], "o-", label="validation MAPE (%)")
            ax.set(xlabel="wall time (s)" if x == "wall_s" else "optimizer step", ylabel="MAPE (%)")
            ax2 = ax.twinx()
            ax2.plot([r[x] for r in ep], [r["train_loss"] for r in ep], "s--", color="tab:red", label="training loss")
            ax2.set_ylabel("training loss")
            ax.legend(loc="upper right", fontsize=7)
        out.append(("validation MAPE and loss against wall time", lambda ax: loss_mape(ax, "wall_s")))
        out.append(("validation MAPE and loss against steps", lambda ax: loss_mape(ax, "step")))
        out.append(("throughput per epoch", lambda ax: (
            ax.plot([r["epoch"] for r in ep], [r["samples_per_s"] for r in ep], "o-"),
            ax.set(xlabel="epoch", ylabel="trips / s"))))
    if win:
        def ks(ax):
            ax.step([r["wall_s"] for r in win], [r["k"] for r in win], where="post", label="k (accumulation steps)")
            ax.set(xlabel="wall time (s)", ylabel="k", yscale="log", title=win[0].get("accumulation", ""))
            if any(r.get("noise_scale") for r in win):
                ax2 = ax.twinx()
                ax2.plot([r["wall_s"] for r in win], [r.get("noise_scale") or float("nan") for r in win],
                         ".", color="tab:green", label="gradient noise scale")
                ax2.set(ylabel="noise scale (trips)", yscale="log")
        out.append(("accumulation steps chosen per window", ks))
    if sl:
        def load(ax):
            world = len(sl[0]["compute_s"])
            steps = [r["step"] for r in sl]
            for rank in range(world):
                ax.plot(steps, [1000 * r["compute_s"][rank] for r in sl], lw=0.8, label=f"rank {rank} compute")
                ax.plot(steps, [1000 * r["idle_s"][rank] for r in sl], lw=0.8, ls=":", label=f"rank {rank} idle")
            ax.set(xlabel="optimizer step", ylabel="ms")
            ax.legend(fontsize=6)
        out.append(("per-rank compute and idle time", load))
        out.append(("imbalance (max / mean compute time)", lambda ax: (
            ax.plot([r["step"] for r in sl], [r["imbalance_measured"] or float("nan") for r in sl], lw=0.8,
                    label="measured"),
            ax.plot([r["step"] for r in sl], [r["imbalance_predicted"] or float("nan") for r in sl], lw=0.8,
                    label="predicted"),
            ax.set(xlabel="optimizer step", ylabel="max / mean"), ax.legend(fontsize=7))))
        if any(r.get("cost_coef") for r in sl):
            def coef(ax):
                fitted = [r for r in sl if r.get("cost_coef")]
                names = ("a (s)", "b (s/trip)", "c (s/point)", "d (s/(trip·L_max))", "e (s/step of L_max)")
                for j, name in enumerate(names[:len(fitted[0]["cost_coef"])]):
                    ax.plot([r["step"] for r in fitted], [r["cost_coef"][j] for r in fitted], label=name)
                ax.set(xlabel="optimizer step", yscale="symlog", ylabel="coefficient")
                ax.legend(fontsize=6)
            out.append(("fitted cost model t = a + b·n + c·Σlen + d·n·L_max + e·L_max", coef))
    return out


def render(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.png`` and ``report.html`` (the PNG embedded, plus the run's summary) into ``out_dir``
    (default: ``run_dir``); returns both paths. Raises FileNotFoundError/ValueError (see read_rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    panels = _panels(read_rows(run_dir))
    if not panels:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no rows to plot")
    cols = 2
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(11, 3.6 * nrows), squeeze=False)
    for ax, (title, draw) in zip(axes.flat, panels):
        draw(ax)
        ax.set_title(title, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"stfast run {run_dir.resolve().name}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    png = out_dir / "report.png"
    _write_atomic(png, buf.getvalue())
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
            f"{base64.b64encode(buf.getvalue()).decode()}'>{table}</body></html>")
    page_path = out_dir / "report.html"
    _write_atomic(page_path, page.encode())
    return png, page_path


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
