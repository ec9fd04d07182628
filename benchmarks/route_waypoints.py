"""A planned route of a few waypoints against its recorded trace, on the held-out trips of a run.

For every trip of the run's test split: :meth:`TrainedModel.predict` of the record as is, the ETA of its recorded
points (``densify=False``; predict's number but for the distance, the haversine sum of the points where a DeepTTE
record carries its provider's), of the same points densified (``densify=True``), and of K waypoints
taken from them (the first, the last and K − 2 between, evenly by index), densified as a planned route is. Prints
and writes (``--out``: JSON and a Markdown table) per K the median and mean relative difference to the recorded
trace's ETA, the route length ratio, and each one's MAPE against the recorded travel time. The departure of a
DeepTTE record is rebuilt from its dateID and timeID (``--month``, default 2014-08: the Chengdu sample).

    python benchmarks/route_waypoints.py --checkpoint runs/chengdu/checkpoint.pt --out docs/serve_waypoints
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--waypoints", type=int, nargs="+", default=[3, 5, 10])
    ap.add_argument("--month", default="2014-08", help="year-month of the records' dateID")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    from stfast.data.routes import RouteError
    from stfast.train.trained import load_model

    m = load_model(a.checkpoint)
    test = m.split(m.load_trips(), "test")
    y, mo = map(int, a.month.split("-"))
    deps = [dt.datetime(y, mo, int(d), int(t) // 60, int(t) % 60) for d, t in zip(test.date_id, test.time_id)]
    pts = [np.stack([test.lng[test.points(i)], test.lat[test.points(i)]], 1) for i in range(len(test))]
    drivers = list(test.driver)
    truth = np.asarray(test.time, dtype=np.float64)

    def etas(routes, **kw):
        """ETA (s) and length (km) of each route; NaN where refused (a point outside the training area)."""
        eta, km = np.full(len(routes), np.nan), np.full(len(routes), np.nan)
        for i, r in enumerate(routes):
            try:
                tr = m.route_trips([r], [deps[i]], [drivers[i]], **kw.get("states", lambda i: {})(i),
                                   densify=kw.get("densify", True))
            except RouteError:
                continue
            eta[i], km[i] = m.predict(tr)[0], tr.dist[0]
        return eta, km

    recorded, _ = etas(pts, densify=False, states=lambda i: {"states": [test.state[test.points(i)]]})
    keep = np.isfinite(recorded)
    pred = m.predict(test)  # the records as they are: their provider's dist, not the haversine sum of their points
    rows = [{"route": "predict (the record as is)", "n": len(test), "mape": float(np.mean(np.abs(pred - truth) / truth)),
             "median_rel_diff": float(np.median((pred[keep] - recorded[keep]) / recorded[keep])),
             "mean_abs_rel_diff": float(np.mean(np.abs(pred[keep] - recorded[keep]) / recorded[keep]))},
            {"route": "recorded points, densify=False", "n": int(keep.sum()), "refused": int((~keep).sum()),
             "mape": float(np.mean(np.abs(recorded[keep] - truth[keep]) / truth[keep]))}]

    def run(name, routes):
        eta, km = etas(routes)
        ok = np.flatnonzero(np.isfinite(eta) & keep)
        d = (eta[ok] - recorded[ok]) / recorded[ok]
        rows.append({"route": name, "n": int(len(ok)), "refused": int(keep.sum() - len(ok)),
                     "median_rel_diff": float(np.median(d)), "mean_abs_rel_diff": float(np.mean(np.abs(d))),
                     "km_ratio": float(np.median(km[ok] / test.dist[ok])),
                     "mape": float(np.mean(np.abs(eta[ok] - truth[ok]) / truth[ok]))})

    run("recorded points, densified", pts)
    for k in a.waypoints:
        run(f"{k} waypoints, densified", [p[np.unique(np.linspace(0, len(p) - 1, k).round().astype(int))] for p in pts])
    lines = ["| route | trips | ETA vs recorded points: median / mean abs rel. diff | length ratio | MAPE vs recorded time |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        diff = f"{100 * r['median_rel_diff']:+.2f} % / {100 * r['mean_abs_rel_diff']:.2f} %" if "median_rel_diff" in r else "—"
        km = f"{r['km_ratio']:.3f}" if "km_ratio" in r else "1"
        n = f"{r['n']}" + (f" ({r['refused']} refused)" if r.get("refused") else "")
        lines.append(f"| {r['route']} | {n} | {diff} | {km} | {100 * r['mape']:.1f} % |")
    md = "\n".join(lines)
    print(md)
    if a.out:
        out = Path(a.out)
        out.with_suffix(".json").write_text(json.dumps({"rows": rows, "n_test": len(test)}, indent=1))
        out.with_suffix(".md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
