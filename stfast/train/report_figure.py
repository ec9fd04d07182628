"""The figure of ``stfast report`` (report.png, embedded in report.html): what people judge a travel-time
model by, then how the training went. Panels, two a row, each only when the run has its data:

1. the test split's MAPE, MAE and RMSE of DeepTTE beside the constant-speed and mean-travel-time baselines
   (summary.json);
2. validation MAPE per epoch against both baselines' validation MAPE (the run log's epoch rows);
3. predicted against actual travel time of the test trips, with constant speed's and the diagonal;
4. MAPE by trip length and 5. by hour of departure, of the model and both baselines, the trips of each bin
   under its name (test_predictions.csv, stfast.train.run_predictions);
6. training loss and throughput per epoch;
7. the accumulation steps k per window and the gradient noise scale, only when k changed during the run;
8. under data parallelism with the slicer: per-rank compute and idle time, imbalance, the cost model.

Every line is in a legend or named by its axis. A baseline far above the model (mean travel time often is)
is drawn at the top edge with its value written, so that it does not flatten the model's curve.
"""
from __future__ import annotations

import io

import numpy as np

from .._plural import counted
from .metrics import BASELINES, summary_rows
from .plots import pyplot

MODEL = "DeepTTE"
COLOR = {MODEL: "tab:blue", "const_speed": "tab:orange", "mean_time": "tab:gray"}
STYLE = {"const_speed": "--", "mean_time": ":"}
MAX_SCATTER = 4000  # test trips drawn in the predicted-against-actual panel (a fixed sample beyond)


def _whole_numbers():
    """Ticks at whole numbers only (epochs)."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred - true) / true


def _top(*values) -> float:
    """The upper y limit: 25 % above the largest of ``values`` (the model's and constant speed's)."""
    finite = [float(v) for v in np.concatenate([np.ravel(v) for v in values]) if np.isfinite(v)]
    return 1.25 * max(finite) if finite else 1.0


def _legend(ax, *more_axes, **kw) -> None:
    """One legend for ``ax`` and its twin axes."""
    handles, labels = ax.get_legend_handles_labels()
    for other in more_axes:
        h, lab = other.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    ax.legend(handles, labels, fontsize=7, **kw)


def _test_metrics(ax, summary: dict) -> None:
    rows = summary_rows(summary)
    names = [n for n, *_ in rows]
    colors = [COLOR[MODEL]] + [COLOR[k] for k, name in BASELINES.items() if name in names]
    mape = [100 * m for _, m, _, _ in rows]
    y = np.arange(len(rows))
    ax.barh(y, mape, color=colors)
    ax.set_yticks(y, [n.replace(" (stfast)", "") for n in names])
    ax.invert_yaxis()
    top = _top(mape)
    ax.set_xlim(0, top * 1.6)
    for yi, (_, m, mae, rmse) in zip(y, rows):
        ax.text(100 * m + top * 0.02, yi, f"{100 * m:.1f} %   MAE {mae:.0f} s   RMSE {rmse:.0f} s", va="center",
                fontsize=8)
    ax.set(xlabel="test MAPE (%)", title=f"test split ({counted(summary.get('n_test', '?'), 'trip')}): MAPE, MAE, RMSE")


def _validation(ax, epochs: list[dict], summary: dict) -> None:
    ep = [r["epoch"] for r in epochs]
    curve = [100 * r["val_mape"] for r in epochs]
    ax.plot(ep, curve, "o-", color=COLOR[MODEL], ms=3, label=f"{MODEL} validation MAPE")
    base = {k: 100 * summary[f"baseline_{k}_val_mape"] for k in BASELINES if f"baseline_{k}_val_mape" in summary}
    top = _top(curve, [base.get("const_speed", np.nan)])
    for key, v in base.items():
        label = f"{BASELINES[key]} (validation): {v:.1f} %"
        if v > top:  # off the scale: at the top edge, its value in the legend
            label += ", above the axis"
        ax.axhline(min(v, top * 0.995), color=COLOR[key], ls=STYLE[key], label=label)
    ax.set_ylim(0, top)
    ax.set(xlabel="epoch", ylabel="validation MAPE (%)", title="validation MAPE per epoch against the baselines")
    ax.xaxis.set_major_locator(_whole_numbers())
    _legend(ax, loc="lower left")


def _scatter(ax, p: dict) -> None:
    n = len(p["true_time_s"])
    pick = np.arange(n)
    if n > MAX_SCATTER:
        pick = np.sort(np.random.default_rng(0).choice(n, MAX_SCATTER, replace=False))
    true, pred, const = (p[c][pick] / 60 for c in ("true_time_s", "pred_time_s", "const_speed_s"))
    ax.scatter(true, const, s=6, alpha=0.35, color=COLOR["const_speed"], label="constant speed")
    ax.scatter(true, pred, s=8, alpha=0.7, color=COLOR[MODEL], label=MODEL)
    hi = float(np.quantile(np.concatenate([true, pred]), 0.995)) * 1.05 if n else 1.0
    ax.axhline(float(p["mean_time_s"][0]) / 60 if n else 0, color=COLOR["mean_time"], ls=STYLE["mean_time"],
               label="mean travel time")
    ax.plot([0, hi], [0, hi], "k-", lw=0.8, label="perfect prediction")
    # the axes end at the 99.5 % quantile (a few extreme trips would squeeze the rest into a corner): say how many
    # trips that leaves out of the picture, rather than drop them without a word
    beyond = int(np.sum((true > hi) | (pred > hi))) if n else 0
    shown = f"{MAX_SCATTER:,} of {n:,} trips" if n > MAX_SCATTER else counted(n, "trip")
    ax.set(xlim=(0, hi), ylim=(0, hi), xlabel="actual travel time (min)", ylabel="predicted travel time (min)",
           title=f"predicted against actual, test split ({shown}"
                 + (f"; {beyond:,} beyond the axes" if beyond else "") + ")")
    _legend(ax, loc="upper left")


def _by_bins(ax, p: dict, bin_of: np.ndarray, n_bins: int, labels: list[str], xlabel: str, title: str) -> None:
    """MAPE (%) of the model and both baselines per bin (``bin_of``: [T] bin numbers 0..n_bins-1, ``labels``
    their names); bins without a trip are left out, the trips of each written under its name."""
    true = p["true_time_s"]
    count = np.bincount(bin_of, minlength=n_bins)
    used = np.flatnonzero(count)
    x = np.arange(len(used))
    mape = {}
    for key, col in ((MODEL, "pred_time_s"), ("const_speed", "const_speed_s"), ("mean_time", "mean_time_s")):
        s = np.bincount(bin_of, weights=_ape(p[col], true), minlength=n_bins)
        mape[key] = (100 * s / np.maximum(count, 1))[used]
    top = _top(mape[MODEL], mape["const_speed"])
    for key in (MODEL, "const_speed", "mean_time"):
        name = MODEL if key == MODEL else BASELINES[key]
        v = mape[key]
        over = v > top
        ax.plot(x, np.minimum(v, top * 0.97), "o" + ("-" if key == MODEL else STYLE[key]), color=COLOR[key], ms=4,
                label=name + (" (above the axis: value written)" if over.any() else ""))
        for xi, vi in zip(x[over], v[over]):
            ax.annotate(f"{vi:.0f} %", (xi, top * 0.97), textcoords="offset points", xytext=(0, -10), ha="center",
                        fontsize=6, color=COLOR[key])
    ax.set_ylim(0, top)
    ax.set_xticks(x, [f"{labels[i]}\n{counted(count[i], 'trip')}" for i in used], fontsize=7)
    ax.set(xlabel=xlabel, ylabel="MAPE (%)", title=title)
    ax.legend(fontsize=7, loc="best")


def _by_length(ax, p: dict) -> None:
    km = p["dist_km"]
    n_bins = int(min(6, max(1, len(km) // 25)))
    edges = np.unique(np.round(np.quantile(km, np.linspace(0, 1, n_bins + 1)), 1))
    if len(edges) < 2:
        edges = np.array([km.min(), km.max()])
    edges[0], edges[-1] = min(edges[0], km.min()), max(edges[-1], km.max())
    bin_of = np.clip(np.searchsorted(edges, km, side="right") - 1, 0, len(edges) - 2)
    labels = [f"{a:.1f}–{b:.1f}" for a, b in zip(edges[:-1], edges[1:])]
    _by_bins(ax, p, bin_of, len(edges) - 1, labels, "trip length (km)", "MAPE by trip length, test split")


def _by_hour(ax, p: dict) -> None:
    hour = (p["departure_min"] // 60).astype(np.int64) % 24
    width = next((w for w in (1, 2, 3, 4, 6) if len(hour) / (24 / w) >= 20), 6)  # ~20 trips a bin or more
    labels = [f"{h}–{h + width}" for h in range(0, 24, width)]
    _by_bins(ax, p, hour // width, 24 // width, labels, "hour of departure (local time)",
             "MAPE by hour of departure, test split")


def _training(ax, epochs: list[dict]) -> None:
    ep = [r["epoch"] for r in epochs]
    ax.plot(ep, [r["train_loss"] for r in epochs], "s-", ms=3, color="tab:red", label="training loss")
    ax.set(xlabel="epoch", ylabel="training loss", title="training loss and throughput per epoch")
    ax.xaxis.set_major_locator(_whole_numbers())
    ax2 = ax.twinx()
    ax2.plot(ep, [r["samples_per_s"] for r in epochs], "^--", ms=3, color="tab:green",
             label="throughput (trips/s, right axis)")
    ax2.set(ylabel="trips / s", ylim=(0, 1.8 * max(r["samples_per_s"] for r in epochs)))  # under the legend
    _legend(ax, ax2, loc="upper right")


def _accumulation(ax, win: list[dict]) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    t, ks = [r["wall_s"] for r in win], [r["k"] for r in win]
    ax.step(t, ks, where="post", color="tab:purple", label="k (micro-batches per optimizer step)")
    ax.set(xlabel="wall time (s)", ylabel="k", yscale="log",
           title=f"accumulation steps per window ({win[0].get('accumulation', '')})")
    ax.set_yticks(sorted(set(ks)), [str(k) for k in sorted(set(ks))])  # the k values taken, as whole numbers
    ax.yaxis.set_minor_locator(NullLocator())
    more = []
    if any(r.get("noise_scale") for r in win):
        ax2 = ax.twinx()
        ax2.plot(t, [r.get("noise_scale") or float("nan") for r in win], ".", color="tab:green",
                 label="gradient noise scale (trips, right axis)")
        ax2.set(ylabel="noise scale (trips)", yscale="log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax2.yaxis.set_major_formatter(plain)
        ax2.yaxis.set_minor_formatter(plain)
        more.append(ax2)
    _legend(ax, *more, loc="best")


def _slicer_panels(sl: list[dict]) -> list:
    def load(ax):
        steps = [r["step"] for r in sl]
        for rank in range(len(sl[0]["compute_s"])):
            ax.plot(steps, [1000 * r["compute_s"][rank] for r in sl], lw=0.8, label=f"rank {rank} compute")
            ax.plot(steps, [1000 * r["idle_s"][rank] for r in sl], lw=0.8, ls=":", label=f"rank {rank} idle")
        ax.set(xlabel="optimizer step", ylabel="ms", title="per-rank compute and idle time")
        ax.legend(fontsize=6)

    def imbalance(ax):
        steps = [r["step"] for r in sl]
        ax.plot(steps, [r["imbalance_measured"] or float("nan") for r in sl], lw=0.8, label="measured")
        ax.plot(steps, [r["imbalance_predicted"] or float("nan") for r in sl], lw=0.8, label="predicted")
        ax.set(xlabel="optimizer step", ylabel="max / mean", title="imbalance (max / mean compute time)")
        ax.legend(fontsize=7)

    def coef(ax):
        fitted = [r for r in sl if r.get("cost_coef")]
        names = ("a (s)", "b (s/trip)", "c (s/point)", "d (s/(trip·L_max))", "e (s/step of L_max)")
        for j, name in enumerate(names[:len(fitted[0]["cost_coef"])]):
            ax.plot([r["step"] for r in fitted], [r["cost_coef"][j] for r in fitted], label=name)
        ax.set(xlabel="optimizer step", yscale="symlog", ylabel="coefficient",
               title="fitted cost model t = a + b·n + c·Σlen + d·n·L_max + e·L_max")
        ax.legend(fontsize=6)

    return [load, imbalance] + ([coef] if any(r.get("cost_coef") for r in sl) else [])


def panels(rows: dict[str, list[dict]], summary: dict | None, preds: dict | None) -> list:
    """The report's panels that have data, in order: draw(ax) callables, each setting its axes' title.
    ``rows``: the run log by type (stfast.train.run_log.read_rows); ``summary``: summary.json or None;
    ``preds``: test_predictions.csv's columns (stfast.train.run_predictions.read) or None."""
    ep, win, sl = rows["epoch"], rows["window"], rows["step"]
    out = []
    if summary and "test_mape" in summary:
        out.append(lambda ax: _test_metrics(ax, summary))
    if ep:
        out.append(lambda ax: _validation(ax, ep, summary or {}))
    if preds is not None and len(preds["true_time_s"]):
        out += [lambda ax: _scatter(ax, preds), lambda ax: _by_length(ax, preds),
                lambda ax: _by_hour(ax, preds)]
    if ep:
        out.append(lambda ax: _training(ax, ep))
    if len({r["k"] for r in win}) > 1:  # a constant k says nothing a flat line would add
        out.append(lambda ax: _accumulation(ax, win))
    if sl:
        out += _slicer_panels(sl)
    return out


def figure(rows: dict[str, list[dict]], summary: dict | None, preds: dict | None, title: str):
    """The report as a matplotlib Figure (two panels a row, see :func:`panels`); None when no panel has data.
    The caller closes it (``matplotlib.pyplot.close``)."""
    drawn = panels(rows, summary, preds)
    if not drawn:
        return None
    plt = pyplot()
    cols = 2
    nrows = (len(drawn) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(13, 4.2 * nrows), squeeze=False)
    for ax, draw in zip(axes.flat, drawn):
        draw(ax)
        ax.title.set_fontsize(10)
    for ax in list(axes.flat)[len(drawn):]:
        fig.delaxes(ax)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / (4.2 * nrows)))  # 0.45 in above the panels for the title
    return fig


def png(rows: dict[str, list[dict]], summary: dict | None, preds: dict | None, title: str) -> bytes | None:
    """:func:`figure` as PNG bytes (90 dpi); None when no panel has data."""
    fig = figure(rows, summary, preds, title)
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    pyplot().close(fig)
    return buf.getvalue()
