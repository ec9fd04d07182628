"""The ratio table the README quotes, from pytest-benchmark's JSON:

    pytest benchmarks/ --benchmark-only --benchmark-json bench.json
    python benchmarks/ratios.py bench.json [--markdown]

For each kernel benchmark, the median time of the baseline implementation divided by stfast's, per case
(the other parameters: shape, batch, input layout, forward / forward+backward, device) — a ratio above 1
means stfast is faster. The medians come from one pytest run, so the implementations were timed under the
same machine conditions (the kernel scripts' `--json` modes interleave them more tightly still)."""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

# benchmark function -> (parameter naming the implementation, stfast's value, baselines)
COMPARISONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "test_geo_conv": ("impl", "fused", ("eager", "compile")),
    "test_lstm": ("impl", "stfast", ("torch", "torch_autocast")),
    "test_deeptte_train_step": ("kernels", "fused", ("reference",)),
}


def ratio_rows(report: dict) -> list[dict]:
    """Rows {benchmark, case, baseline, stfast_ms, baseline_ms, ratio} from a pytest-benchmark JSON
    report (dict with "benchmarks": [{"name", "params", "stats": {"median" (s)}}]). Cases missing
    either side (e.g. a skipped CUDA benchmark) are left out. Raises ValueError on a report without
    the "benchmarks" list."""
    if not isinstance(report.get("benchmarks"), list):
        raise ValueError("not a pytest-benchmark JSON report: no 'benchmarks' list")  # noqa: TRY004 (bad content)
    medians: dict[tuple, dict[str, float]] = defaultdict(dict)
    for b in report["benchmarks"]:
        fn = b["name"].split("[")[0]
        if fn not in COMPARISONS:
            continue
        key_param = COMPARISONS[fn][0]
        params = dict(b.get("params") or {})
        impl = params.pop(key_param, None)
        case = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
        medians[(fn, case)][impl] = float(b["stats"]["median"])
    rows = []
    for (fn, case), m in sorted(medians.items()):
        _, ours, baselines = COMPARISONS[fn]
        if ours not in m:
            continue
        for base in baselines:
            if base in m:
                rows.append({"benchmark": fn, "case": case, "baseline": base, "stfast_ms": 1e3 * m[ours],
                             "baseline_ms": 1e3 * m[base], "ratio": m[base] / m[ours]})
    return rows


def format_table(rows: list[dict], markdown: bool = False) -> str:
    head = ("benchmark", "case", "baseline", "stfast (ms)", "baseline (ms)", "baseline / stfast")
    cells = [(r["benchmark"], r["case"], r["baseline"], f"{r['stfast_ms']:.3f}", f"{r['baseline_ms']:.3f}",
              f"{r['ratio']:.2f}×") for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells])
    widths = [max(len(x[i]) for x in [head, *cells]) for i in range(len(head))]
    return "\n".join("  ".join(x[i].ljust(widths[i]) for i in range(len(head))) for x in [head, *cells])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="the file written by pytest --benchmark-json")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table (for README)")
    a = ap.parse_args(argv)
    try:
        rows = ratio_rows(json.loads(Path(a.json).read_text()))
    except (OSError, ValueError, KeyError) as e:
        print(f"ratios: {a.json}: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"ratios: {a.json} holds no stfast-vs-baseline pairs ({', '.join(COMPARISONS)})", file=sys.stderr)
        return 1
    print(format_table(rows, a.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
