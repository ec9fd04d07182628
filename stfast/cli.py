"""Command line: `stfast train | evaluate | predict | bench modes | report | data convert`."""
from __future__ import annotations

import argparse
import csv
import logging
import os
import sys
from pathlib import Path

FORMATS = ("auto", "synthetic", "deeptte", "geolife", "didi", "csv")
SPLITS = ("all", "train", "val", "test")  # as stfast.train.trained.SPLITS (not imported: --help stays fast)


def _add_data_args(p: argparse.ArgumentParser, required: bool = False, from_checkpoint: bool = False) -> None:
    """The data flags. ``from_checkpoint`` (evaluate, predict): the preprocessing flags default to the
    checkpoint's settings, and an explicit value that differs from them is refused."""
    ck = " (default: the checkpoint's; a different value is refused)" if from_checkpoint else ""
    default = ("the data the checkpoint was trained on" if from_checkpoint else
               None if required else "the synthetic city")
    p.add_argument("--data", required=required,
                   help="file or folder of trajectories" + (f" (default: {default})" if default else ""))
    p.add_argument("--format", default=None if from_checkpoint else "auto", choices=FORMATS,
                   help="input format (auto: recognized by content)" + (
                       "; default: auto with --data, else the checkpoint's" if from_checkpoint else ""))
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="bad records: stop with an error naming file and line, or skip and count them")
    p.add_argument("--modes", default=None if from_checkpoint else "",
                   help="GeoLife transport modes to keep, e.g. car,taxi,bus (empty: all)" + ck)
    p.add_argument("--min-spacing-km", type=float, default=None if from_checkpoint else 0.2,
                   help="raw traces: resample to points at least this far apart (0: keep every point)" + ck)
    p.add_argument("--gap-min", type=float, default=None if from_checkpoint else 20.0,
                   help="raw traces: split trips at time gaps above this (minutes)" + ck)
    p.add_argument("--tz", default=None,
                   help="time zone of local time (time of day, weekday, date), an IANA name such as Europe/Lisbon; "
                        "default: Asia/Shanghai for GeoLife, DeepTTE JSON and DiDi GAIA, and for a point CSV the "
                        "UTC offset its timestamps carry, else UTC" + ck)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show (None, a switch) or its
    help text already says what the default is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, "", argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    ap = argparse.ArgumentParser(prog="stfast", description="Fast training of DeepTTE travel-time models.",
                                 formatter_class=fmt)
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train DeepTTE (default data: the synthetic city)", formatter_class=fmt)
    _add_data_args(t)
    t.add_argument("--n-synthetic", type=int, default=20000, help="trips of the synthetic city")
    t.add_argument("--epochs", type=int, default=10, help="passes over the training split")
    t.add_argument("--batch-size", type=int, default=64, help="global batch: trips per optimizer step")
    t.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate per optimizer step")
    t.add_argument("--weight-decay", type=float, default=0.0, help="Adam weight decay (L2)")
    t.add_argument("--lr-schedule", default="constant", choices=("constant", "cosine"),
                   help="cosine: lr × ½(1 + cos(π·epoch/epochs)) from epoch to epoch (Loshchilov & Hutter 2017)")
    t.add_argument("--ema-decay", type=float, default=None,
                   help="validate, checkpoint and test an exponential moving average of the weights, updated "
                        "after every optimizer step with this decay per micro-batch (decay^k at k accumulation "
                        "steps; Polyak & Juditsky 1992), e.g. 0.9")
    t.add_argument("--alpha", type=float, default=0.3, help="weight of the local loss")
    t.add_argument("--compat", default="fixed", choices=("fixed", "original"),
                   help="original: reproduce faults 1-3 of the original DeepTTE")
    t.add_argument("--head", default="paper", choices=("paper", "prior"),
                   help="paper: DeepTTE's normalized-time head; prior: correction to distance / mean speed")
    t.add_argument("--loss", default="mape", choices=("mape", "log", "mae"), help="loss of the entire estimate")
    t.add_argument("--dropout", type=float, default=0.0, help="dropout probability in the estimators")
    t.add_argument("--driver-dim", type=int, default=16, help="driver embedding size (0: no driver id)")
    t.add_argument("--time-bin-min", type=int, default=1, help="departure-time embedding bin in minutes")
    t.add_argument("--kernels", default="fused", choices=("fused", "reference"),
                   help="fused: stfast's native ops; reference: plain PyTorch (same parameters)")
    t.add_argument("--patience", type=int, default=None, help="early stop after N epochs without improvement")
    t.add_argument("--nproc", type=int, default=1, help="data-parallel processes (torch.distributed)")
    t.add_argument("--comm", default="torch", choices=("torch", "nccl"),
                   help="gradient-sync communicator: torch.distributed, or stfast's C++ NCCL communicator")
    t.add_argument("--slicer", default=None, choices=("balanced", "equal", "sorted"),
                   help="how a global batch is cut into per-rank shards: balanced (cost model; default with "
                        "--nproc > 1), equal (equal counts, random), sorted (sorted by length, dealt round-robin)")
    t.add_argument("--threads", type=int, default=None, help="torch threads per process")
    t.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    t.add_argument("--dtype", default="float32", choices=("float32", "float64"), help="parameter and batch dtype")
    t.add_argument("--seed", type=int, default=0, help="seed of the model's initialisation and batch order")
    t.add_argument("--data-seed", type=int, default=None,
                   help="seed of the synthetic city and of the random split (default: --seed)")
    t.add_argument("--ensemble", type=int, default=1,
                   help="train N models (seeds SEED..SEED+N-1, same data and split) into OUT/seed<k> and "
                        "score their mean prediction")
    t.add_argument("--split", default="0.7/0.15/0.15", help="seeded random train/val/test fractions")
    t.add_argument("--split-by", default="random", choices=("random", "date"),
                   help="date: last day test, the day before validation, the rest training")
    t.add_argument("--split-days", default=None, help="explicit TRAIN/VAL/TEST days of month, e.g. 24-28/29/30")
    t.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    t.add_argument("--out", default="runs/latest", help="output folder: one run per folder (must be empty or new)")
    t.add_argument("--resume", action="store_true", help="continue from OUT/last.pt (or checkpoint.pt)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run in a non-empty --out (its metrics, checkpoints, plots are deleted first)")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    # ---- gradient accumulation (stfast.accum)
    t.add_argument("--accumulation", default=None,
                   help="micro-batches per optimizer step: K or fixed:K, goodput (Pollux-style) or rl (the agent); "
                        "default rl when --nproc > 1, else 1. --batch-size is then the global micro-batch")
    t.add_argument("--accum-window", type=int, default=10, help="optimizer steps between decisions on k")
    t.add_argument("--lr-scaling", default="sqrt", choices=("sqrt", "linear", "none"),
                   help="learning rate × √k (Adam, default), × k (SGD) or unchanged when k grows")
    t.add_argument("--noise-scale", default=None, choices=("adam", "plain"),
                   help="gradient noise scale the accumulation schedulers read: adam (preconditioned by Adam's v̂, "
                        "Pollux; the default under Adam) or plain (B_simple)")
    t.add_argument("--time-budget", type=float, default=None, help="stop after this many seconds of training")
    # ---- reliability (stfast.train.guards)
    t.add_argument("--checkpoint-every", type=int, default=None,
                   help="also write last.pt every N optimizer steps (resume mid-epoch after a crash)")
    t.add_argument("--max-bad-steps", type=int, default=5,
                   help="stop after N optimizer steps in a row with a non-finite loss or gradient (each is skipped)")
    t.add_argument("--timeout-s", type=float, default=300.0,
                   help="timeout of every torch.distributed collective: a dead or hung rank ends the job")
    # ---- component parallelism (stfast.parallel.components)
    t.add_argument("--parallel", default="dp", choices=("dp", "cp", "dp+cp"),
                   help="dp: data parallel; cp: DeepTTE's components concurrently (1 process) or as 2 pipeline "
                        "stages (--nproc 2); dp+cp: --nproc/2 data-parallel replicas of 2 stages")
    t.add_argument("--micro-batches", type=int, default=None,
                   help="GPipe micro-batches per batch with --parallel cp/dp+cp (default 4 with 2 stages, else 1)")
    t.add_argument("--cp-plan", default="components", choices=("components", "layers"),
                   help="--parallel cp/dp+cp graph and cut: components (attr + geo-conv + LSTM | estimators) or "
                        "layers (the LSTM per layer: attr + geo-conv + layer 0 | layer 1 + estimators)")

    for name, hlp in (("evaluate", "score a checkpoint on data"), ("predict", "write predicted travel times")):
        e = sub.add_parser(name, help=hlp, formatter_class=fmt)
        e.add_argument("--checkpoint", required=True, nargs="+",
                       help="checkpoint.pt; several (e.g. seeds) are averaged as an ensemble")
        _add_data_args(e, from_checkpoint=True)
        e.add_argument("--split", default="all", choices=SPLITS,
                       help="all trips of --data, or the training run's train/val/test split of them (the data "
                            "must be the run's: same trips, checked by fingerprint)")
        e.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
        if name == "predict":
            e.add_argument("--out", required=True,
                           help="CSV of predictions (one row per trip: its trip_id and segment); the trips "
                                "preprocessing dropped go to OUT's name with .dropped.csv, with their reason")

    b = sub.add_parser("bench", help="benchmarks on your data and hardware", formatter_class=fmt)
    bsub = b.add_subparsers(dest="bench_command", required=True)
    m = bsub.add_parser("modes", help="every parallel mode under one wall-clock budget: modes.json/.md/.png", formatter_class=fmt)
    m.add_argument("--data", default=None, help="trajectories (default: the synthetic city)")
    m.add_argument("--format", default="auto", choices=FORMATS)
    m.add_argument("--n-synthetic", type=int, default=3000, help="trips of the synthetic city")
    m.add_argument("--nproc", type=int, default=2, help="processes of the data-parallel modes")
    m.add_argument("--threads", type=int, default=None,
                   help="threads per process of the multi-process modes (default: cores / --nproc); a "
                        "single-process mode gets --nproc × this (equal hardware)")
    m.add_argument("--batch-size", type=int, default=64, help="global (micro-)batch")
    m.add_argument("--budget-s", type=float, default=60.0, help="training wall-clock budget per run (s)")
    m.add_argument("--target-mape", type=float, default=None,
                   help="target validation MAPE in %% (default: what the baseline mode reaches)")
    m.add_argument("--seeds", type=int, default=1, help="seeds per mode (0..N-1)")
    m.add_argument("--only", action="append", default=None,
                   help="run only the modes whose name contains this text (repeatable)")
    m.add_argument("--reuse", action="store_true",
                   help="keep runs that finished before in --out (their summary.json), run only the rest")
    m.add_argument("--out", required=True)
    r = sub.add_parser("report", help="render a training run as report.png and report.html", formatter_class=fmt)
    r.add_argument("run_dir", help="the --out folder of a stfast train run")
    r.add_argument("--out", default=None, help="where to write (default: RUN_DIR)")
    d = sub.add_parser("data", help="data tools")
    dsub = d.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser("convert", help="read, preprocess and write DeepTTE JSON lines", formatter_class=fmt)
    _add_data_args(c, required=True)
    c.add_argument("--out", required=True, help="DeepTTE JSON-lines file to write")
    return ap


def _modes(s: str | None) -> tuple | None:
    return None if s is None else tuple(m.strip() for m in s.split(",") if m.strip())


def _data_options(a) -> dict:
    """The data flags as TrainConfig fields (None: not given, for evaluate/predict)."""
    from .train.config import check_data_options

    opts = {"modes": _modes(a.modes), "min_spacing_km": a.min_spacing_km,
            "gap_s": None if a.gap_min is None else 60 * a.gap_min, "tz": a.tz}
    check_data_options(opts["min_spacing_km"], opts["gap_s"], opts["tz"])
    return opts


def cmd_train(a) -> int:
    from .parallel.data_parallel import launch, launched_by_torchrun
    from .train.config import TrainConfig
    from .train.trainer import train

    cfg = TrainConfig(data=a.data, format=a.format, n_synthetic=a.n_synthetic, on_error=a.on_error,
                      **_data_options(a), epochs=a.epochs, batch_size=a.batch_size, lr=a.lr,
                      weight_decay=a.weight_decay, lr_schedule=a.lr_schedule, ema_decay=a.ema_decay, alpha=a.alpha, compat=a.compat, head=a.head, loss=a.loss, dropout=a.dropout,
                      driver_dim=a.driver_dim, time_bin_min=a.time_bin_min, kernels=a.kernels, patience=a.patience, seed=a.seed,
                      data_seed=a.data_seed, ensemble=a.ensemble, split=a.split,
                      split_by=a.split_by, split_days=a.split_days, device=a.device, dtype=a.dtype,
                      nproc=a.nproc, comm=a.comm, slicer=a.slicer, threads=a.threads, max_steps=a.max_steps, out=a.out,
                      resume=a.resume, overwrite=a.overwrite,
                      progress=False if a.no_progress else None, accumulation=a.accumulation,
                      accum_window=a.accum_window, lr_scaling=a.lr_scaling, noise_scale=a.noise_scale, time_budget_s=a.time_budget,
                      checkpoint_every=a.checkpoint_every, max_bad_steps=a.max_bad_steps, timeout_s=a.timeout_s,
                      parallel=a.parallel, micro_batches=a.micro_batches, cp_plan=a.cp_plan)
    cfg.validate()
    if a.nproc > 1 and not launched_by_torchrun():
        from .train.trainer import preflight

        preflight(cfg)  # inconsistent arguments fail here, once, before any process starts
        return launch(a.nproc, sys.argv[1:])
    if cfg.ensemble > 1:
        from .train.ensemble import train_ensemble

        train_ensemble(cfg)
    else:
        train(cfg)
    return 0


def _predict(a):
    """Trips of ``--data`` (read and preprocessed as the checkpoints' training run did; ``--split`` of
    them) and their predicted travel times [T] (s): the mean over the ``--checkpoint``s (one checkpoint:
    its model; several, e.g. seeds of one configuration: an ensemble, which must agree on preprocessing)."""
    from .train.ensemble import predict_ensemble
    from .train.trained import load_model

    models = [load_model(p, a.device) for p in a.checkpoint]
    given = _data_options(a)
    for m in models[1:]:  # an ensemble is read one way: every member must have been trained on it
        m.resolve_data_options(**models[0].data_options())
    trips = models[0].load_trips(a.data, a.format, a.on_error, **given)
    trips = models[0].split(trips, a.split)
    return trips, predict_ensemble(models, trips, a.device, progress=sys.stderr.isatty())


def cmd_evaluate(a) -> int:
    from .train.metrics import errors

    trips, pred = _predict(a)
    m = errors(pred, trips.time)
    what = "" if len(a.checkpoint) == 1 else f" (mean of {len(a.checkpoint)} models)"
    split = "" if a.split == "all" else f" of the {a.split} split"
    print(f"{len(trips)} trips{split}{what}  MAPE {100 * m['mape']:.2f} %  MAE {m['mae']:.1f} s  RMSE {m['rmse']:.1f} s")
    return 0


def _write_csv(path: Path, header: list, rows) -> None:
    """Write a CSV atomically (temp file in the same folder, renamed into place; removed on failure)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def cmd_predict(a) -> int:
    out = Path(a.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: give the CSV file to write, e.g. {out / 'predictions.csv'}")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {out}: no folder {out.parent}")
    tr, pred = _predict(a)
    _write_csv(out, ["trip_id", "segment", "driver", "n_points", "dist_km", "true_time_s", "pred_time_s"],
               ([tr.trip_id[i], int(tr.segment[i]), tr.driver[i], int(tr.lengths[i]), f"{tr.dist[i]:.4f}",
                 f"{tr.time[i]:.1f}", f"{pred[i]:.1f}"] for i in range(len(tr))))
    dropped = dropped_path(out)
    _write_csv(dropped, ["trip_id", "segment", "reason"], tr.dropped_trips)
    print(f"wrote {len(tr)} predictions to {out}; {len(tr.dropped_trips)} trips (input trajectories or segments "
          f"of them) dropped in preprocessing, with their reason, to {dropped}")
    return 0


def dropped_path(predictions: Path) -> Path:
    """``preds.csv`` → ``preds.dropped.csv``: where ``stfast predict`` lists the trips preprocessing dropped."""
    return predictions.with_name(f"{predictions.stem}.dropped.csv")


def cmd_data_convert(a) -> int:
    from .data.load import load_trips
    from .train.trainer import require_trips

    opts = _data_options(a)
    trips = require_trips(load_trips(a.data, a.format, on_error=a.on_error, modes=set(opts["modes"]) or None,
                                     min_spacing_km=opts["min_spacing_km"], gap_s=opts["gap_s"], tz=opts["tz"]),
                           a.data)
    trips.to_jsonl(a.out)
    drops = ", ".join(f"{k} {v}" for k, v in sorted(trips.dropped.items())) or "nothing"
    print(f"wrote {len(trips)} trips ({trips.n_points} points) to {a.out}; dropped: {drops}")
    return 0


def cmd_bench(a) -> int:
    from .bench.modes import run_modes

    if a.seeds < 1 or a.budget_s <= 0 or a.nproc < 1:
        raise ValueError(f"--seeds and --nproc must be ≥ 1 and --budget-s > 0 (got {a.seeds}, {a.nproc}, {a.budget_s})")
    a.seeds_list = list(range(a.seeds))
    run_modes(a)
    return 0


def cmd_report(a) -> int:
    from .train.report import render

    png, page = render(a.run_dir, a.out)
    print(f"wrote {png} and {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(level=logging.INFO if rank0 else logging.WARNING, format="stfast: %(message)s")
    from .data.errors import TrajectoryFormatError

    cmds = {"train": cmd_train, "evaluate": cmd_evaluate, "predict": cmd_predict, "report": cmd_report,
            "bench": cmd_bench}
    fn = cmd_data_convert if a.command == "data" else cmds[a.command]
    from .train.guards import RankFailure, TrainingDiverged

    try:
        rc = fn(a)
    except (TrajectoryFormatError, ValueError, FileNotFoundError) as e:
        print(f"stfast: error: {e}", file=sys.stderr)
        rc = 2
    except (TrainingDiverged, RankFailure) as e:  # the run failed (not the arguments)
        print(f"stfast: error: {e}", file=sys.stderr)
        rc = 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ:
        _exit_rank(rc)
    return rc


def _exit_rank(rc: int) -> None:
    """End a torch.distributed rank process now, its files written and its process group left (dp.shutdown):
    at interpreter finalization Gloo's worker threads can still hold work objects whose release needs the
    GIL, and a rank was seen to abort there (SIGABRT, "terminate called without an active exception")
    after a finished run, failing the job (pytorch/pytorch#179291 describes the mechanism)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    sys.exit(main())
