"""`stfast bench modes`: the same model, data, seeds and wall-clock budget under each parallel mode.

The experiment of Lv et al. (WASA 2021) on the user's data and hardware: every mode is one
`stfast train` run per seed (a subprocess, so each gets a clean process group), stopped by
``--time-budget``. Every mode gets the same hardware: the bench's cores are --nproc × --threads (threads
per process of the multi-process modes; default: the machine's cores over --nproc), and a single-process
mode runs with all of them as torch threads (see :func:`hardware`). The one row that does not — the fused
kernels on one thread — says so in its name and in the table's "processes × threads" column, which every
row has. Per mode the table gives the median (min–max over seeds) of: training throughput
(trips/s), time to the target validation MAPE (s; validation runs at epoch ends) on the wall clock and on
the paced clock (stfast.bench.pace: each window at its mode's median pace over the seeds, validation
excluded, which removes the machine's speed drift between runs; the seeds run interleaved, every mode's
first, then every mode's second, so a drift over the bench falls on all modes alike), test MAPE / MAE / RMSE
of the best checkpoint, the measured imbalance across ranks (max/mean compute time, slicer rows) and the
communication share of a step (accumulation window rows). The target MAPE, unless given, is the median
best validation MAPE that the baseline mode (single process, reference kernels; with ``--only``, the
first mode run) reaches in the budget (see :func:`default_target` when it finishes no epoch).
``--reuse`` keeps the runs that finished before in OUT and runs only the rest.

Writes OUT/modes.json (every run's numbers), OUT/modes.md (the table) and OUT/modes.png (throughput per
mode; validation MAPE against wall time).
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..data.cores import usable_cores
from ..train import plots
from ..train.run_log import read_rows
from .pace import pace_by_key, paced_curve


@dataclass
class Mode:
    """One row of the comparison: ``flags`` added to `stfast train`; ``nproc`` 0 means the bench's --nproc."""

    name: str
    flags: list[str]
    nproc: int = 0
    group: str = ""  # rows of one group (fixed k) are also summarised by the best in hindsight
    threads: int = 0  # torch threads per process; 0: equal hardware (the bench's cores over the processes)

    @property
    def slug(self) -> str:
        """The mode's run folder under --out, from its name (so --reuse finds it when modes are added)."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


DEFAULT_MODE = "stfast default (fused + balanced slicer + k = 2)"


def default_modes(fixed_k=(2, 4)) -> list[Mode]:
    acc1 = ["--accumulation", "1"]
    modes = [
        Mode("single process, reference kernels", ["--kernels", "reference", *acc1], nproc=1),
        Mode("single process, fused kernels", ["--kernels", "fused", *acc1], nproc=1),
        # what this table compared before issue 22 (one thread against --nproc ranks × 1 thread): kept to show
        # what the extra threads give one process, and labelled, since it has fewer cores than every other row
        Mode("single process, fused kernels, one thread (unequal hardware)", ["--kernels", "fused", *acc1],
             nproc=1, threads=1),
        Mode("data parallel, equal shards", ["--slicer", "equal", *acc1]),
        Mode("data parallel, balanced slicer", ["--slicer", "balanced", *acc1]),
        Mode("component parallel", ["--parallel", "cp", *acc1]),
        Mode("component parallel, cut between the LSTM layers", ["--parallel", "cp", "--cp-plan", "layers", *acc1]),
        Mode("data parallel + component parallel", ["--parallel", "dp+cp", *acc1]),
    ]
    modes += [Mode(f"data parallel + accumulation k={k}", ["--accumulation", f"fixed:{k}"], group="fixed")
              for k in fixed_k]
    modes += [
        Mode("data parallel + goodput accumulation", ["--accumulation", "goodput"]),
        Mode("data parallel + RL accumulation", ["--accumulation", "rl"]),
        Mode(DEFAULT_MODE, ["--kernels", "fused", "--slicer", "balanced"]),  # and the default accumulation
    ]
    return modes


def bench_cores(a) -> int:
    """The cores every mode gets: --nproc × --threads (threads per process of the multi-process modes;
    default: the machine's cores over --nproc, as `stfast train` gives each rank, at least 1)."""
    return a.nproc * (a.threads or max(1, usable_cores() // a.nproc))


def hardware(mode: Mode, a) -> tuple[int, int]:
    """(processes, torch threads per process) of ``mode`` under the bench's options ``a``: equal hardware,
    processes × threads = bench_cores(a) (a single process gets every core as a thread), unless the mode
    fixes its threads (then its row is labelled unequal)."""
    procs = mode.nproc or a.nproc
    return procs, mode.threads or max(1, bench_cores(a) // procs)


def _train_args(mode: Mode, seed: int, a, out: Path) -> list[str]:
    """The `stfast train` arguments of one run of ``mode``."""
    nproc, threads = hardware(mode, a)
    # --preset paper: the modes are compared on the paper's model on any data (the real-data preset's weight
    # average starts at half of --epochs, which a time budget of 100,000 epochs never reaches)
    args = ["--preset", "paper", "--seed", str(seed), "--data-seed", "0", "--epochs", "100000",
            "--time-budget", str(a.budget_s), "--nproc", str(nproc), "--threads", str(threads), "--out", str(out),
            "--no-progress", "--batch-size", str(a.batch_size), *mode.flags]
    if getattr(a, "precision", None):  # every mode in it (stfast.train.precision)
        args += ["--precision", a.precision]
    return args + (["--data", a.data, "--format", a.format] if a.data else ["--n-synthetic", str(a.n_synthetic)])


def configuration(mode: Mode, a):
    """The TrainConfig that ``mode``'s runs train under (seed 0, no --out), with the defaults that `stfast train`
    resolves at run time filled in (--accumulation by the world size, TrainConfig.slicer_method): two modes with equal
    configurations are one mode, run once. (The stfast default is one of the other modes' configurations: run
    twice, the same configuration differed by 1.17× in median time to target on three seeds, docs/bench_modes.md.)"""
    import argparse
    from dataclasses import replace

    from ..accum.schedulers import parse_spec
    from ..train.config import TrainConfig, add_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)  # flags as `stfast train` takes them: spelled in full
    add_arguments(parser)  # `stfast train`'s flags
    cfg = TrainConfig.from_args(parser.parse_args(_train_args(mode, 0, a, Path("-"))))
    return replace(cfg, accumulation=parse_spec(cfg.accumulation, cfg.nproc), slicer=cfg.slicer_method)


def _run(mode: Mode, seed: int, a, out: Path) -> dict:
    if getattr(a, "reuse", False) and (out / "summary.json").is_file():
        return _measure(out)  # finished before (same folder): measured again, not rerun
    cmd = [sys.executable, "-m", "stfast.cli", "train", *_train_args(mode, seed, a, out)]
    log = out.parent / f"{out.name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONSAFEPATH="1")  # the installed stfast, not a source tree in the cwd
    with open(log, "w") as f:
        rc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT, env=env,
                            timeout=3 * a.budget_s + 600).returncode
    if rc != 0:
        tail = log.read_text().splitlines()[-5:]
        raise RuntimeError(f"mode {mode.name!r} seed {seed} failed (rc {rc}); log {log}:\n" + "\n".join(tail))
    return _measure(out)


def _measure(out: Path) -> dict:
    """The numbers of one finished run folder."""
    s = json.loads((out / "summary.json").read_text())
    rows = read_rows(out)
    ep, win, sl = rows["epoch"], rows["window"], rows["step"]
    # throughput and communication share over the training steps only (validation excluded)
    busy = sum(r["window_s"] for r in win)
    sps = sum(r["trips"] for r in win) / busy if busy else None
    if sps is None and ep:
        sps = statistics.median(r["samples_per_s"] for r in ep)
    return {
        "curve": [(r["wall_s"], r["val_mape"]) for r in ep],
        "samples_per_s": sps,
        "test_mape": s["test_mape"], "test_mae": s["test_mae"], "test_rmse": s["test_rmse"],
        "best_val_mape": s.get("best_val_mape"), "steps": s.get("steps"),
        "imbalance": statistics.mean(m) if (m := [r["imbalance_measured"] for r in sl
                                                  if r.get("imbalance_measured")]) else None,
        "comm_share": sum(r["comm_s"] for r in win) / busy if busy else None,
        # (last optimizer step, k, trips, window s) per accumulation window and (step, MAPE) per validation: what
        # the paced clock re-times (paced_curves)
        "windows": [(r["step"], r["k"], r["trips"], r["window_s"]) for r in win],
        "step_curve": [(r["step"], r["val_mape"]) for r in ep],
    }


def _med(vals, scale=1.0, fmt="{:.1f}"):
    vals = [scale * v for v in vals if v is not None]
    if not vals:
        return "–"
    m = fmt.format(statistics.median(vals))
    return m if len(vals) == 1 else f"{m} ({fmt.format(min(vals))}–{fmt.format(max(vals))})"


def time_to_target(curve, target: float | None) -> float | None:
    """Wall time (s) of the first validation at or below ``target`` (fraction); None if never reached
    (or no target)."""
    if target is None:
        return None
    return next((t for t, m in curve if m <= target), None)


def median_time_to_target(curves: list, target: float | None) -> float:
    """Median over seeds of the time to target (s) of their validation ``curves``, a seed that never reached
    it counting as infinite (so the median is inf when half or more did not)."""
    return statistics.median(math.inf if (t := time_to_target(c, target)) is None else t for c in curves)


def paced_curves(runs: list[dict]) -> list:
    """The validation curves of one mode's runs on the paced clock (stfast.bench.pace): each accumulation
    window timed at the mode's median trips/s at its k over all its seeds, validation excluded, which removes
    this machine's speed drift between runs (a run without windows: its wall clock)."""
    pace = pace_by_key(w for r in runs for w in r.get("windows", ()))
    return [paced_curve(r["step_curve"], r["windows"], pace) if r.get("windows") else r["curve"] for r in runs]


def _equal_hardware(res: dict, cores: int | None) -> bool:
    """Whether a mode's processes × threads are the bench's cores (True when either is not recorded)."""
    procs, threads = res.get("nproc"), res.get("threads")
    return cores is None or procs is None or threads is None or procs * threads == cores


def _hardware_cell(res: dict, cores: int | None) -> str:
    procs, threads = res.get("nproc"), res.get("threads")
    if procs is None or threads is None:
        return "–"
    cell = f"{procs} × {threads}"
    return cell if _equal_hardware(res, cores) else f"{cell} (unequal: {procs * threads} of {cores} cores)"


def table(results: dict, target: float, cores: int | None = None) -> str:
    """The markdown table of ``results`` (run_modes' per-mode dicts) against ``target`` (fraction). cores:
    the bench's cores (bench_cores); a row with another processes × threads is labelled unequal and left out
    of the closing comparison of the fastest mode to target with the stfast default."""
    head = "No target validation MAPE (no mode finished an epoch)." if target is None else \
        f"Target validation MAPE: {100 * target:.2f} %."
    hw = "" if cores is None else f" Equal hardware: {cores} cores per mode (processes × torch threads)."
    lines = [f"{head} Medians over seeds (min–max).{hw}", "",
             "| mode | processes × threads | trips/s | time to target (s) | paced clock (s) | test MAPE | test MAE (s) "
             "| test RMSE (s) | imbalance | comm. share |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, res in results.items():
        if "skipped" in res:
            lines.append(f"| {name} | {res['skipped']} | | | | | | | | |")
            continue
        runs = res["runs"]
        if "same_as" in res:
            name = f"{name} (= {res['same_as']}: the same configuration and runs)"
        tt, pt = (_ttt_cell([time_to_target(c, target) for c in curves])
                  for curves in ([r["curve"] for r in runs], paced_curves(runs)))
        lines.append(f"| {name} | {_hardware_cell(res, cores)} | {_med([r['samples_per_s'] for r in runs])} | {tt} | {pt} | "
                     f"{_med([r['test_mape'] for r in runs], 100, '{:.2f}')} % | {_med([r['test_mae'] for r in runs])} | "
                     f"{_med([r['test_rmse'] for r in runs])} | {_med([r['imbalance'] for r in runs], fmt='{:.3f}')} | "
                     f"{_med([r['comm_share'] for r in runs], 100)} % |")
    fixed = {n: r for n, r in results.items() if r.get("group") == "fixed" and "runs" in r}
    if fixed:
        best = min(fixed, key=lambda n: statistics.median(r["test_mape"] for r in fixed[n]["runs"]))
        lines += ["", f"Best fixed k in hindsight (lowest median test MAPE): {best}."]
    equal_hw = {n: r for n, r in results.items() if "runs" in r and _equal_hardware(r, cores)}
    clocks = (("", lambda runs: [r["curve"] for r in runs]),
              (" on the paced clock (each mode's windows at its median pace)", paced_curves))
    for clock, curves_of in clocks if target is not None else ():
        equal = {n: median_time_to_target(curves_of(r["runs"]), target) for n, r in equal_hw.items()}
        if (line := _fastest_line(results, equal, clock)) is not None:
            lines += ["", line]
    return "\n".join(lines)


def _ttt_cell(ttt: list) -> str:
    reached = [t for t in ttt if t is not None]
    return _med(reached) + ("" if len(reached) == len(ttt) else f" [{len(ttt) - len(reached)} not reached]")


def _fastest_line(results: dict, equal: dict, clock: str) -> str | None:
    """The closing comparison: the fastest mode to target on equal hardware ({mode: median time to target}) and
    the stfast default's ratio to it; None when no mode reached the target."""
    if not equal or min(equal.values()) == math.inf:
        return None
    fastest = min(equal, key=equal.get)
    line = (f"Fastest to target on equal hardware{clock} (median over seeds, a seed not reaching it counted as "
            f"never): {fastest}, {equal[fastest]:.1f} s.")
    if DEFAULT_MODE in equal:
        d = equal[DEFAULT_MODE]
        same = results[DEFAULT_MODE].get("same_as")
        name = DEFAULT_MODE + (f" (= {same})" if same else "")
        line += (f" {name}: {d:.1f} s, {d / equal[fastest]:.2f}× the fastest." if d < math.inf
                 else f" {name}: not reached in half or more of the seeds.")
    return line


def default_target(results: dict, baseline: str) -> float | None:
    """The target validation MAPE (fraction) when none is given: the median best validation MAPE of the
    ``baseline`` mode's runs; if the baseline failed or finished no epoch in the budget, the loosest
    (largest) median best validation MAPE of the modes that did, so that every such mode can reach it;
    None when no mode finished an epoch (the table then has no time to target)."""
    def best(name):
        vals = [r["best_val_mape"] for r in results[name].get("runs", []) if r["best_val_mape"] is not None]
        return statistics.median(vals) if vals else None

    if (t := best(baseline)) is not None:
        return t
    others = {n: b for n in results if (b := best(n)) is not None}
    if not others:
        print("stfast bench: no mode finished an epoch in --budget-s: no target, no time to target", file=sys.stderr)
        return None
    name = max(others, key=others.get)
    print(f"stfast bench: {baseline!r} finished no epoch in --budget-s; the target is the loosest of the other "
          f"modes' best validation MAPE ({name!r})", file=sys.stderr)
    return others[name]


def run_modes(a) -> dict:
    """Run every available mode for every seed; write modes.json/.md/.png into ``a.out``."""
    _check_args(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    modes = [m for m in default_modes() if not a.only or any(o in m.name for o in a.only)]
    # a mode with its own threads is labelled unequal hardware; where the bench's cores equal its processes ×
    # threads (--nproc 1 --threads 1) it is another run of the same configuration under a wrong label: left out
    modes = [m for m in modes if not (m.threads and math.prod(hardware(m, a)) == bench_cores(a))] or modes
    if not modes:
        raise ValueError(f"--only {a.only}: no mode matches; modes: {[m.name for m in default_modes()]}")
    baseline = modes[0].name  # the reference for the default target: the first mode that runs
    configs: dict = {}
    same_as: dict = {}  # a mode whose configuration an earlier mode has: that mode's runs, not a second sample
    for mode in modes:
        cfg = configuration(mode, a)
        if (same := next((n for n, c in configs.items() if c == cfg), None)) is not None:
            same_as[mode.name] = same
        else:
            configs[mode.name] = cfg
    own = [m for m in modes if m.name not in same_as]
    runs: dict = {m.name: [] for m in own}
    failed: dict = {}
    # seed-major, as benchmarks/accumulation.py: every mode's first seed, then every mode's second, ..., so a
    # drift of the machine's speed over the bench falls on all modes alike
    for seed in a.seeds_list:
        for i, mode in enumerate(own):
            if mode.name in failed:
                continue
            print(f"[{i + 1}/{len(own)}] {mode.name}, seed {seed} ...", flush=True)
            try:
                runs[mode.name].append(_run(mode, seed, a, out / mode.slug / f"seed{seed}"))
            except RuntimeError as e:  # a failing mode is reported in its row; the other modes still run
                print(f"stfast bench: {e}", file=sys.stderr, flush=True)
                failed[mode.name] = out / mode.slug  # its logs
    for mode in modes:
        if mode.name in same_as:
            src = same_as[mode.name]
            if src in failed:  # the same configuration failed under the other name
                results[mode.name] = {"skipped": f"FAILED (the configuration of {src}; see {failed[src]})"}
                continue
            print(f"{mode.name}: the configuration of {src!r}, its runs", flush=True)
            results[mode.name] = dict(results[src], group=mode.group, same_as=src)
        elif mode.name in failed:
            results[mode.name] = {"skipped": f"FAILED (see {failed[mode.name]})"}
        else:
            procs, threads = hardware(mode, a)
            results[mode.name] = {"flags": mode.flags, "nproc": procs, "threads": threads, "group": mode.group,
                                  "runs": runs[mode.name]}
    target = a.target_mape / 100 if a.target_mape else default_target(results, baseline)
    cores = bench_cores(a)
    md = table(results, target, cores)
    (out / "modes.json").write_text(json.dumps({"target_mape": target, "budget_s": a.budget_s, "nproc": a.nproc,
                                                "cores": cores, "seeds": a.seeds_list, "modes": results}, indent=1))
    (out / "modes.md").write_text(md + "\n")
    plots.bench_modes(results, target, out / "modes.png")
    print(md)
    print(f"wrote modes.json, modes.md, modes.png in {out}")
    if all("skipped" in r for r in results.values()):
        raise RuntimeError(f"every mode failed (their logs are in {out}): nothing was measured")
    return results


def _check_args(a) -> None:
    """What every mode's run would refuse, refused once before any runs (ValueError naming the flag): the
    budget, target and training options (by TrainConfig's own rules), and ``--out``: a new or empty folder,
    or, with ``--reuse``, one that a bench run wrote (its finished runs are kept). Without --reuse a bench
    folder would have its modes.json overwritten by rows whose runs all failed ("not empty")."""
    from dataclasses import replace

    from ..train.config import TrainConfig

    if not (math.isfinite(a.budget_s) and a.budget_s > 0):
        raise ValueError(f"--budget-s must be a number of seconds > 0, got {a.budget_s}")
    if a.target_mape is not None and not (0 < a.target_mape < 100):
        raise ValueError(f"--target-mape must be a MAPE in % in (0, 100), got {a.target_mape:g}")
    cfg = TrainConfig(data=a.data, format=a.format, n_synthetic=a.n_synthetic, nproc=a.nproc, threads=a.threads,
                      out=str(a.out), preset="paper", precision=getattr(a, "precision", None))
    if a.batch_size is not None:
        cfg = replace(cfg, batch_size=a.batch_size)
    cfg.validate()
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    ours = {m.slug for m in default_modes()} | {"modes.json", "modes.md", "modes.png"}
    if held and not a.reuse:
        raise ValueError(f"--out {out} is not empty ({', '.join(held[:5])}): give --reuse to keep the runs a bench "
                         "left there, or choose another --out")
    if held and not set(held) <= ours:
        other = sorted(set(held) - ours)
        raise ValueError(f"--out {out} holds files a bench run does not write ({', '.join(other[:5])}): choose "
                         "another --out")
