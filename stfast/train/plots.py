"""Every figure stfast draws (matplotlib, Agg backend, imported only when a figure is drawn), from the rows
of run logs (stfast.train.run_log: {type: rows}) and summaries:

- :func:`learning_curve`: a run's validation MAPE and training loss per epoch (learning_curve.png);
- the figure of ``stfast report`` (report.png): stfast.train.report_figure;
- :func:`ensemble_curves`: every ensemble member's validation MAPE per epoch (learning_curves.png);
- :func:`bench_modes`: ``stfast bench modes``' throughput and validation curves per mode (modes.png);
- :func:`accumulation_k`: k over time, simulated and live (benchmarks/accumulation.py).

PNG files are written atomically (a temporary file, then renamed).
"""
from __future__ import annotations

import os
import statistics
from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, png: str | Path, dpi: int = 100) -> None:
    png = Path(png)
    tmp = png.with_name(".tmp_" + png.name)
    fig.savefig(tmp, format="png", dpi=dpi)
    pyplot().close(fig)
    os.replace(tmp, png)


def learning_curve(epochs: list[dict], summary: dict, png: str | Path) -> None:
    """Validation MAPE and training loss per epoch (``epochs``: the run log's epoch rows), with both
    baselines' validation MAPE (``summary``'s baseline_*_val_mape) as lines."""
    plt = pyplot()
    ep = [r["epoch"] for r in epochs]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].plot(ep, [100 * r["val_mape"] for r in epochs], "o-", label="DeepTTE validation")
    ax[0].axhline(100 * summary["baseline_const_speed_val_mape"], color="tab:orange", ls="--", label="constant speed")
    ax[0].axhline(100 * summary["baseline_mean_time_val_mape"], color="tab:gray", ls=":", label="mean travel time")
    ax[0].set(xlabel="epoch", ylabel="MAPE (%)", title="validation MAPE")
    ax[0].legend()
    ax[1].plot(ep, [r["train_loss"] for r in epochs], "o-")
    ax[1].set(xlabel="epoch", ylabel="loss", title="training loss")
    fig.tight_layout()
    _save(fig, png)


def ensemble_curves(members: dict[str, list[dict]], summary: dict, png: str | Path) -> None:
    """Validation MAPE per epoch of every member ({name: its epoch rows}), with the ensemble's
    (``summary["val_mape"]``) and constant speed's."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, rows in members.items():
        ax.plot([r["epoch"] for r in rows], [100 * r["val_mape"] for r in rows], alpha=0.6, label=name)
    ax.axhline(100 * summary["val_mape"], color="k", label="ensemble (best epochs)")
    ax.axhline(100 * summary["baseline_const_speed_val_mape"], color="tab:orange", ls="--", label="constant speed")
    ax.set(xlabel="epoch", ylabel="validation MAPE (%)", title=f"ensemble of {len(members)} seeds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, png)


def bench_modes(results: dict, target: float | None, png: str | Path) -> None:
    """Training throughput per mode (median over seeds) and the first seed's validation MAPE against wall
    time, with the target MAPE (fraction; None: no line). ``results``: stfast.bench.modes' per-mode dicts."""
    plt = pyplot()
    ran = {n: r for n, r in results.items() if "runs" in r}
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.8))
    names = list(ran)
    sps = [statistics.median(x["samples_per_s"] for x in ran[n]["runs"] if x["samples_per_s"]) for n in names]
    ax[0].barh(range(len(names)), sps)
    ax[0].set_yticks(range(len(names)), names, fontsize=7)
    ax[0].invert_yaxis()
    ax[0].set(xlabel="training throughput (trips/s)", title="throughput per mode (median over seeds)")
    for n in names:
        c = ran[n]["runs"][0]["curve"]
        ax[1].plot([t for t, _ in c], [100 * m for _, m in c], "o-", ms=3, label=n)
    if target is not None:
        ax[1].axhline(100 * target, color="k", ls="--", lw=0.8, label="target")
    ax[1].set(xlabel="wall time (s)", ylabel="validation MAPE (%)", title="validation MAPE (first seed)")
    if ax[1].get_legend_handles_labels()[0]:  # nothing to label when every mode failed
        ax[1].legend(fontsize=6)
    fig.tight_layout()
    _save(fig, png)


def accumulation_k(sim: dict, live: dict | None, png: str | Path, choices, best_fixed: dict | None = None) -> None:
    """k over time: the simulated cluster's first seed (``sim``: {oracle, goodput, rl: [rollout, ...]}) and,
    per live data set (``live``: {data set: {mode: [run, ...]}}, a run's "k" its (wall s, k) per window), the
    first seed's rl and goodput runs and the best fixed k (``best_fixed``: {data set: its mode});
    ``choices``: the k values marked on the axis."""
    plt = pyplot()
    n = 1 + (len(live) if live else 0)
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 3.6), squeeze=False)
    ax = axes[0][0]
    for name, style in (("oracle", ":"), ("goodput", "--"), ("rl", "-")):
        r = sim[name][0]
        ax.step(r["time_s"], r["k"], style, where="pre", label=name)
    ax.set(xlabel="simulated wall time (s)", ylabel="accumulation steps k", yscale="log", title="simulated cluster")
    ax.set_yticks(list(choices), [str(k) for k in choices])
    ax.legend()
    for ax, (name, runs) in zip(axes[0][1:], (live or {}).items()):
        best = (best_fixed or {}).get(name)
        adaptive = [(m, "--" if m.startswith("goodput") else "-") for m in runs if m.split("@")[0] in ("goodput", "rl")]
        for mode, style in (*adaptive, *([(best, ":")] if best else [])):
            if mode in runs:
                t, k = zip(*runs[mode][0]["k"])
                ax.step(t, k, style, where="pre", label=f"k = {mode} (best fixed)" if mode == best else mode)
        ax.set(xlabel="training wall time (s)", yscale="log", title=f"live, 2 Gloo ranks: {name}")
        ax.set_yticks(list(choices), [str(k) for k in choices])
        ax.legend()
    fig.tight_layout()
    _save(fig, png)
