"""Command line: `stfast train | evaluate | predict | serve | bench modes | report | data convert`."""
from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys
from pathlib import Path

from ._plural import counted


def _add_data_args(p: argparse.ArgumentParser, required: bool = False, from_checkpoint: bool = False) -> None:
    """The data flags, as TrainConfig declares them. ``from_checkpoint`` (evaluate, predict): the
    preprocessing flags default to the checkpoint's settings, and an explicit value that differs from them
    is refused."""
    from ._options import add_arguments, options
    from .data.options import PREPROCESS_OPTIONS, DataOptions

    over: dict = {"data": {"required": True, "help": "file or folder of trajectories"}} if required else {}
    if from_checkpoint:
        help = {k: opt.help for k, opt in options(DataOptions).items()}
        ck = " (default: the checkpoint's; a different value is refused)"
        over = {"data": {"help": "file or folder of trajectories (default: the data the checkpoint was trained on)"},
                "format": {"default": None,
                           "help": help["format"] + "; default: auto with --data, else the checkpoint's"},
                "on_error": {"default": None,
                             "help": help["on_error"] + "; default: the checkpoint's without --data, else raise"},
                "columns": {"help": help["columns"] + "; without --data: the checkpoint's"},
                **{k: {"default": None, "help": help[k] + ck} for k in PREPROCESS_OPTIONS}}
    add_arguments(p, DataOptions, None, over)  # the flags TrainConfig takes from DataOptions


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none to show (None, a switch) or its
    help text already says what the default is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, False, "", argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


def _preset_help() -> dict:
    """add_arguments overrides of `stfast train`: each option a --preset fills shows both presets' values."""
    from ._options import options
    from .train.config import TrainConfig, show
    from .train.presets import FIELDS, help_suffix

    decl = options(TrainConfig)
    return {k: {"help": decl[k].help + help_suffix(k, lambda v, k=k: show(k, v))} for k in FIELDS}


def _train_args(t: argparse.ArgumentParser) -> None:
    from .train.config import add_arguments

    add_arguments(t, overrides=_preset_help())  # every TrainConfig field is a flag


def _checkpoint_args(e: argparse.ArgumentParser, predict: bool) -> None:
    from .train.config import add_arguments
    from .train.trained import SPLITS

    e.add_argument("--checkpoint", required=True, nargs="+",
                   help="checkpoint.pt; several (e.g. seeds) are averaged as an ensemble")
    _add_data_args(e, from_checkpoint=True)
    e.add_argument("--split", default=None, choices=SPLITS,
                   help="all trips of --data, or the training run's train/val/test split of them (the data "
                        "must be the run's: same trips, checked by fingerprint); default: all with --data"
                        + (", else all of the run's own data" if predict else
                           ", else the run's own test split (its other trips were trained on)"))
    add_arguments(e, ["allow_outside", "device", "threads", "precision"], {  # --allow-outside: a warm start's rule too
        "allow_outside": {"help": "score the data even when most of its trips lie outside the model's training area "
                                  "(refused without it; a few outside trips are scored, counted and flagged in any "
                                  "case)"},
        "threads": {"help": "torch threads of the forward passes (default: torch's, one per core)"},
        "precision": {"help": "what the model computes in: 32, 64 or bf16-mixed (default: the checkpoint's, its run's "
                              "--precision)"}})
    if predict:
        e.add_argument("--out", required=True,
                       help="CSV of predictions (one row per trip: its trip_id and segment); the trips "
                            "preprocessing dropped go to OUT's name with .dropped.csv, with their reason")


def _serve_args(v: argparse.ArgumentParser) -> None:
    from .train.config import add_arguments

    v.add_argument("--checkpoint", required=True, help="checkpoint.pt of a stfast train run")
    v.add_argument("--host", default="127.0.0.1", help="address to listen on (any other than loopback exposes the "
                                                        "service to the network)")
    v.add_argument("--port", type=int, default=8000, help="TCP port")
    v.add_argument("--max-batch", type=int, default=64, help="routes per forward pass (1: one request per pass)")
    v.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="the longest a request waits for others to share its forward pass (ms)")
    v.add_argument("--max-body-kb", type=int, default=1024, help="request body limit (KiB; larger: 413)")
    v.add_argument("--rate-limit", type=float, default=0.0,
                   help="work per second per client address, in requests of up to 1,000 route points (after "
                        "densification; a larger request counts points/1,000; past it: 429); 0: no limit")
    v.add_argument("--max-route-points", type=int, default=10_000, help="points per route after densification (413)")
    v.add_argument("--max-request-points", type=int, default=20_000, help="points per request after densification")
    v.add_argument("--max-batch-points", type=int, default=20_000, help="points per forward pass")
    v.add_argument("--forwarded-allow-ips", default=None,
                   help="comma-separated addresses of reverse proxies whose X-Forwarded-For/-Proto are trusted "
                        "(default: none; '*' trusts every peer)")
    v.add_argument("--token-file", default=None,
                   help="file whose first line is a bearer token (≥ 16 characters) that every path but /healthz "
                        "and the page needs (401 without it)")
    v.add_argument("--allowed-host", action="append", default=[],
                   help="a name the Host header may give (requests naming another: 421); repeatable. On a loopback "
                        "--host, the loopback names are allowed already; elsewhere, without it, any name is")
    v.add_argument("--cors-origin", action="append", default=[],
                   help="a browser origin (https://host[:port]) allowed to call the API cross-site; repeatable")
    v.add_argument("--header-timeout-s", type=float, default=10.0, help="request line and headers must arrive within")
    v.add_argument("--body-timeout-s", type=float, default=30.0, help="a request body must arrive within (408)")
    v.add_argument("--idle-timeout-s", type=float, default=30.0, help="idle keep-alive connections close after")
    v.add_argument("--max-connections", type=int, default=1000, help="open connections (more: 503)")
    v.add_argument("--max-connections-per-client", type=int, default=None,
                   help="open connections from one client address (more: 503; default: a quarter of "
                        "--max-connections); the --forwarded-allow-ips proxies are not capped")
    v.add_argument("--write-timeout-s", type=float, default=30.0,
                   help="a client that does not read its answers is dropped after its socket's buffer stayed full "
                        "this long")
    v.add_argument("--drain-s", type=float, default=30.0,
                   help="on SIGTERM, how long requests in flight may take to be answered")
    v.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="the service's log on stderr (the ready line and the access log are info)")
    v.add_argument("--watch", action="store_true",
                   help="reload --checkpoint whenever the file changes (its status looked at every second); SIGHUP "
                        "reloads it in any case, and POST /admin/reload with --token-file. A new model is checked "
                        "first (file, preprocessing, area, a smoke prediction); a refused one is logged and the "
                        "running one keeps answering")
    v.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="no access log (by default one line per request: client address, method, path, status, "
                        "latency, batch size)")
    add_arguments(v, ["device", "threads", "precision"], {
        "threads": {"help": "torch threads of the forward passes (default: torch's, one per core)"},
        "precision": {"help": "what the model computes in: 32, 64 or bf16-mixed (default: the checkpoint's, its "
                              "run's --precision)"}})


def _compare_args(c: argparse.ArgumentParser) -> None:
    from ._options import add_arguments as add_declared
    from .data.options import DataOptions
    from .train.config import add_arguments

    c.add_argument("candidate", help="checkpoint.pt of the new model")
    c.add_argument("incumbent", help="checkpoint.pt of the model it would replace")
    add_declared(c, DataOptions, ["data", "format", "on_error", "columns"],
                 {"data": {"required": True, "help": "recent trips to score both on (file or folder)"}})
    c.add_argument("--min-gain", type=float, default=0.0,
                   help="MAPE points the candidate must gain at the low end of the 95 %% interval (default: 0, "
                        "better at all)")
    c.add_argument("--promote", default=None, metavar="PATH",
                   help="when the candidate is better, copy it over PATH atomically (the served model file)")
    c.add_argument("--bootstrap-seed", type=int, default=0, help="seed of the bootstrap resampling of trips")
    add_arguments(c, ["allow_outside", "device", "threads"], {"allow_outside": {
        "help": "score the data even when most of its trips lie outside a model's training area"}})


def _bench_args(b: argparse.ArgumentParser) -> None:
    from .train.config import add_arguments

    bsub = b.add_subparsers(dest="bench_command", required=True)
    m = bsub.add_parser("modes", help="every parallel mode under one wall-clock budget: modes.json/.md/.png",
                        formatter_class=_HelpFormatter)
    add_arguments(m, ["data", "format", "n_synthetic", "nproc", "threads", "batch_size", "precision"], {
        "data": {"help": "trajectories (default: the synthetic city)"},
        "n_synthetic": {"default": 3000},
        "nproc": {"default": 2, "help": "processes of the data-parallel modes"},
        "threads": {"help": "threads per process of the multi-process modes (default: cores / --nproc); a "
                            "single-process mode gets --nproc × this (equal hardware)"},
        "batch_size": {"help": "global (micro-)batch"},
        "precision": {"help": "every mode's --precision (default: 32)"}})
    m.add_argument("--budget-s", type=float, default=60.0, help="training wall-clock budget per run (s)")
    m.add_argument("--target-mape", type=float, default=None,
                   help="target validation MAPE in %% (default: what the baseline mode reaches)")
    m.add_argument("--seeds", type=int, default=1, help="seeds per mode (0..N-1)")
    m.add_argument("--only", action="append", default=None,
                   help="run only the modes whose name contains this text (repeatable)")
    m.add_argument("--reuse", action="store_true",
                   help="keep runs that finished before in --out (their summary.json), run only the rest")
    m.add_argument("--out", required=True)


def _report_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("run_dir", help="the --out folder of a stfast train run")
    r.add_argument("--out", default=None, help="where to write (default: RUN_DIR)")


def _data_args(d: argparse.ArgumentParser) -> None:
    dsub = d.add_subparsers(dest="data_command", required=True)
    c = dsub.add_parser("convert", help="read and preprocess trajectories into a trips store (a folder of "
                        "memory-mapped columns that --data takes) or DeepTTE JSON lines",
                        formatter_class=_HelpFormatter)
    _add_data_args(c, required=True)
    from ._options import add_arguments
    from .data.options import TripFilterOptions

    add_arguments(c, TripFilterOptions)  # convert's alone: a store keeps them, and train takes the store
    c.add_argument("--out", required=True, help="the trips store (folder) to write; a name ending in .jsonl: "
                   "DeepTTE JSON lines")
    v = dsub.add_parser("verify", help="check every file of a trips store against the checksums and values recorded "
                        "at conversion, and its kept derived values (damaged ones are removed, to be computed again)",
                        formatter_class=_HelpFormatter)
    v.add_argument("store", help="the trips store (folder)")


COMMANDS = {
    "train": ("train DeepTTE (default data: the synthetic city)", _train_args),
    "evaluate": ("score a checkpoint on data", lambda p: _checkpoint_args(p, predict=False)),
    "predict": ("write predicted travel times", lambda p: _checkpoint_args(p, predict=True)),
    "compare": ("score two checkpoints on the same trips; exit 0 when the first is better", _compare_args),
    "serve": ("HTTP service: the ETA of planned routes (needs the stfast[serve] extra)", _serve_args),
    "bench": ("benchmarks on your data and hardware", _bench_args),
    "report": ("render a training run as report.png and report.html", _report_args),
    "data": ("data tools", _data_args),
}
"""Each command: its help and the function that adds its options (and subcommands)."""


class _Parser(argparse.ArgumentParser):
    """stfast's parsers (the subcommands' too: argparse makes them of the top-level parser's class): a flag is
    taken only as spelled in full (``--epoch`` is not ``--epochs``), and an unknown one is refused under the usage
    of the (sub)command it was given to, with the closest flag of that command."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    _argv: list = []  # the words being parsed (an error of a subcommand's parser names their misspelt flags)

    def parse_args(self, args=None, namespace=None):
        _Parser._argv = list(sys.argv[1:] if args is None else args)
        a, extras = self.parse_known_args(args, namespace)
        if extras:
            self._chosen(a).error(f"unrecognized arguments: {' '.join(extras)}")
        words = [w.split("=", 1)[0] for w in _Parser._argv]
        for act in self._chosen(a)._actions:  # --compile --no-compile: refused, not the last one winning
            given = list(dict.fromkeys(w for w in words if w in act.option_strings))
            if isinstance(act, argparse.BooleanOptionalAction) and len(given) > 1:
                self.error(f"argument {given[1]}: not allowed with argument {given[0]}")
        return a

    def error(self, message):
        """argparse's error (this parser's usage, exit 2); where a word given is close to one of this parser's flags,
        commands or choices, one line instead: the error and "did you mean ..." (a misspelt --checkpoint is named
        beside "--checkpoint is required" too), then where --help lists them (issue 62: the hint came after 33 lines
        of usage). A
        flag's value refused (argparse's "argument --epochs: invalid int value: 'x'") or two flags that exclude
        each other: one line, ``stfast: error:`` and the message naming the flag, without the usage block."""
        if re.match(r"argument [^:]+: (invalid .* value: |not allowed with argument )", message):
            self.exit(2, f"stfast: error: {message}\n")
        flags = [s for act in self._actions for s in act.option_strings if s not in ("-h", "--help")]
        hints = []
        for word in dict.fromkeys(w.split("=", 1)[0] for w in _Parser._argv if w.startswith("--")):
            near = [] if word in flags else difflib.get_close_matches(word, flags, n=1)
            if near:
                hints.append(f"{word}: did you mean {near[0]}?")
        bad = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)  # a misspelt command or value
        if bad:
            near = difflib.get_close_matches(bad[1], re.findall(r"'([^']*)'", bad[2]), n=1)
            hints += [f"did you mean {near[0]}?"] if near else []
        if hints:  # a misspelling: the error and its fix on one line, not after the command's whole usage block
            self.exit(2, f"stfast: error: {message}; {'; '.join(hints)} (`{self.prog} --help` lists them)\n")
        super().error(message)

    def _chosen(self, a) -> argparse.ArgumentParser:
        """The deepest (sub)command parser that ``a``'s values chose (``stfast data convert``: convert's)."""
        p = self
        while True:
            sub = next((act for act in p._actions if isinstance(act, argparse._SubParsersAction)), None)
            name = None if sub is None else getattr(a, sub.dest, None)
            if name not in (sub.choices if sub is not None else {}):
                return p
            p = sub.choices[name]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with ``command`` (the name of one) only that command's options are added, the
    others keep their name and help: a command imports only the layers it uses (``data convert``: no torch)."""
    ap = _Parser(prog="stfast", description="Fast training of DeepTTE travel-time models.",
                 formatter_class=_HelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, (hlp, add) in COMMANDS.items():
        p = sub.add_parser(name, help=hlp, formatter_class=_HelpFormatter)
        if command in (None, name):
            add(p)
    return ap


def _command(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), when it is one; else None."""
    word = next((w for w in argv if not w.startswith("-")), None)
    return word if word in COMMANDS else None


def given_dests(argv: list[str]) -> set[str]:
    """The argparse destinations of the options given on the command line ``argv`` (as ``--flag=value`` too;
    flags are never abbreviated, :class:`_Parser`), whatever their value: ``argv`` parsed again by a parser
    without defaults."""
    ap = build_parser(_command(argv))
    parsers = [ap]
    while parsers:
        for act in parsers.pop()._actions:
            if isinstance(act, argparse._SubParsersAction):
                parsers.extend(act.choices.values())
            else:
                act.default = argparse.SUPPRESS
    return set(vars(ap.parse_args(argv)))


def _check_store_flags(a, given: set[str]) -> None:
    """``train`` / ``data convert`` with ``--data`` a trips store: each preprocessing flag given on the
    command line (its default value included; convert's trip filters too) must be the store's setting. Raises ValueError naming the flag
    and both values (the store cannot be preprocessed again; a flag that is not given takes the store's)."""
    from .data.store import is_store

    if a.command not in ("train", "data") or not getattr(a, "data", None) or not is_store(a.data):
        return
    from ._options import dest, flag
    from ._options import show as _show
    from .data.load import store_settings
    from .data.options import DataOptions, TripFilterOptions, preprocess_options_from_args, trip_filters_from_args
    from .data.tz import check_tz

    asked = [(DataOptions, k, v) for k, v in preprocess_options_from_args(a).items()]
    if a.command == "data":  # convert's trip filters (None: not given)
        asked += [(TripFilterOptions, k, v) for k, v in trip_filters_from_args(a).items()]
    have = store_settings(a.data)
    for cls, k, v in asked:
        if dest(cls, k) not in given:
            continue
        f = flag(cls, k)

        def show(k, v, cls=cls):
            return _show(cls, k, v)

        if k not in have:
            raise ValueError(f"{f} does not apply to {a.data}, a trips store of DeepTTE records (which are not "
                             "preprocessed); omit it")
        v = {"modes": lambda: tuple(sorted(v)), "tz": lambda: check_tz(v)}.get(k, lambda: float(v))()
        if v != have[k]:
            why = "calendar ids were computed in" if k == "tz" else "trips were preprocessed with"
            raise ValueError(f"{f} {show(k, v)} differs from the trips store {a.data}'s {f} {show(k, have[k])}: "
                             f"its {why} {f} {show(k, have[k])}; omit {f}, or convert the raw data again with "
                             f"{f} {show(k, v)}")


def cmd_train(a) -> int:
    from .parallel.data_parallel import launch, launched_by_torchrun
    from .train.config import TrainConfig
    from .train.trainer import train

    cfg = TrainConfig.from_args(a)
    cfg.validate()
    if a.nproc > 1 and not launched_by_torchrun():
        from .train.trainer import preflight

        preflight(cfg)  # inconsistent arguments fail here, once, before any process starts
        return launch(a.nproc, sys.argv[1:])
    if cfg.ensemble > 1:
        from .train.ensemble import train_ensemble

        result = train_ensemble(cfg)
    else:
        result = train(cfg, keyboard_interrupt=False)
    # SIGINT/SIGTERM: last.pt is written, the run is not finished (a rank exits 0: its launcher reports it)
    if "stopped_by" in result and not launched_by_torchrun():
        import signal

        return 128 + signal.Signals[result["stopped_by"]].value
    return 0


def _predict(a):
    """Trips of ``--data`` (read and preprocessed as the checkpoints' training run did; ``--split`` of
    them), their predicted travel times [T] (s): the mean over the ``--checkpoint``s (one checkpoint:
    its model; several, e.g. seeds of one configuration: an ensemble, which must agree on preprocessing), and
    which of them lie outside the training area ([T] bool; mostly outside: refused without --allow-outside,
    :func:`stfast.data.coverage.check_inside`) and which have a driver the model did not train on ([T] bool)."""
    from .data.coverage import check_inside
    from .train.config import data_options_from_args
    from .train.ensemble import predict_ensemble
    from .train.trained import load_model

    _set_threads(a)
    models = [load_model(p, a.device, a.precision) for p in a.checkpoint]
    for m in models[1:]:  # an ensemble averages models of one training data (seeds of one configuration)
        f0, f = models[0].data_fingerprint, m.data_fingerprint
        if f0 is not None and f is not None and f != f0:
            raise ValueError(f"--checkpoint {m.path} was trained on other trips than {models[0].path} (data "
                             f"fingerprint {f[:12]}, not {f0[:12]}): an ensemble's members must share their "
                             "training data")
    given = data_options_from_args(a)
    for m in models[1:]:  # an ensemble is read one way: every member must have been trained on it
        m.resolve_data_options(**models[0].data_options())
    trips = models[0].load_trips(a.data, a.format, a.on_error, a.columns, **given)
    parts = [m.split(trips, a.split) for m in models]
    for m, part in zip(models[1:], parts[1:]):
        _same_split(a.split, models[0], parts[0], m, part)
    outside = models[0].outside(parts[0])  # members share their training data, hence their area
    if not a.allow_outside:
        check_inside(models[0].training_area(), outside, parts[0], str(models[0].path), "--allow-outside")
    import time

    import torch

    t0 = time.perf_counter()
    pred = predict_ensemble(models, parts[0], a.device, progress=sys.stderr.isatty(), allow_outside=True)
    dt = time.perf_counter() - t0
    logging.getLogger("stfast").info("scored %s in %.1f s (%.0f trips/s, %s)", counted(len(parts[0]), "trip"), dt,
                                     len(parts[0]) / max(dt, 1e-9), counted(torch.get_num_threads(), "thread"))
    return parts[0], pred, outside, models[0].unseen_drivers(parts[0])


def _set_threads(a) -> None:
    """torch's threads for the forward passes of predict / evaluate / serve: ``--threads`` when given, checked as
    ``stfast train``'s (ValueError naming the flag: one line, exit 2, before anything is read or written)."""
    if a.threads is None:
        return
    from ._options import check_value
    from .train.config import TrainConfig

    check_value(TrainConfig, "threads", a.threads)
    import torch

    torch.set_num_threads(a.threads)


def _same_split(which: str, m0, part0, m, part) -> None:
    """Members of an ensemble scored on one of their runs' splits must share that split: a member whose run
    drew another (another --seed without a common --data-seed) trained on trips of the first's test split,
    and the ensemble's score would change with the checkpoints' order. Raises ValueError naming both."""
    key0 = set(zip(part0.trip_id.tolist(), part0.segment.tolist()))
    key = set(zip(part.trip_id.tolist(), part.segment.tolist()))
    if key0 != key:
        raise ValueError(f"--split {which}: {m.path} has another {which} split than {m0.path} ({len(key)} and "
                         f"{len(key0)} trips, {len(key & key0)} shared), so some member trained on trips the "
                         "other scores; train the members with one --data-seed (as --ensemble does), "
                         "or score them with --split all")


def cmd_evaluate(a) -> int:
    from .train.metrics import errors

    if a.split is None:  # the run's own data: its test split, not trips it trained on (a test figure, honestly)
        a.split = "all" if a.data is not None else "test"
    trips, pred, outside, unseen_drivers = _predict(a)
    m = errors(pred, trips.time)
    what = "" if len(a.checkpoint) == 1 else f" (mean of {len(a.checkpoint)} models)"
    split = "" if a.split == "all" else f" of the {a.split} split"
    k = int(outside.sum())
    notes = []
    if k:  # counted, and the score without them beside it
        inside = f"; MAPE {100 * errors(pred[~outside], trips.time[~outside])['mape']:.2f} % on the other " \
                 f"{len(trips) - k}" if k < len(trips) else ""
        notes.append(f"{k} outside the training area, scored{inside}")
    unseen = int(unseen_drivers.sum())
    if unseen:
        notes.append(f"{unseen} by drivers the model did not train on")
    if a.split in ("all", "train") and a.data is None:  # say so: not a test figure
        notes.append("the run's own data: " + ("all trips, its training split among them" if a.split == "all"
                                                else "the trips it trained on"))
    print(f"{counted(len(trips), 'trip')}{split}{what}  MAPE {100 * m['mape']:.2f} %  MAE {m['mae']:.1f} s  "
          f"RMSE {m['rmse']:.1f} s"
          + (f"  ({'; '.join(notes)})" if notes else ""))
    return 0


PREDICTIONS_HEADER = ("trip_id", "segment", "driver", "n_points", "dist_km", "true_time_s", "pred_time_s")
"""The first columns of ``stfast predict``'s CSV (then ``outside_area``, 1: a trip with a point outside the
training area)."""
DROPPED_HEADER = ("trip_id", "segment", "reason")
"""The columns of the trips preprocessing dropped, which ``stfast predict`` writes beside its CSV."""


def cmd_compare(a) -> int:
    """Exit 0: the candidate is better by --min-gain (and promoted with --promote); 1: it is not; 2: bad input."""
    from .data.coverage import check_inside
    from .train.compare import compare, promote
    from .train.trained import load_model

    _set_threads(a)
    if a.min_gain < 0 or a.min_gain >= 100:
        raise ValueError(f"--min-gain must be in [0, 100) MAPE points, got {a.min_gain:g}")
    cand, inc = load_model(a.candidate, a.device), load_model(a.incumbent, a.device)
    if cand.data_options() != inc.data_options():  # both must see the same trips, preprocessed one way
        diff = {k: (v, inc.data_options()[k]) for k, v in cand.data_options().items() if v != inc.data_options()[k]}
        raise ValueError(f"{a.candidate} preprocesses trips otherwise than {a.incumbent} (" + ", ".join(
            f"{k} {c!r} against {i!r}" for k, (c, i) in diff.items()) + "): they would not score the same trips")
    trips = inc.load_trips(a.data, a.format, a.on_error, a.columns)
    if not a.allow_outside:
        for m, path in ((cand, a.candidate), (inc, a.incumbent)):
            check_inside(m.training_area(), m.outside(trips), trips, str(path), "--allow-outside")
    result = compare(cand.predict(trips), inc.predict(trips), trips.time, a.min_gain / 100.0, a.bootstrap_seed)
    for line in result.lines((f"candidate {a.candidate}", f"incumbent {a.incumbent}")):
        print(line)
    if result.better and a.promote is not None:
        promote(a.candidate, a.promote)
        print(f"promoted: {a.promote} is now {a.candidate}")
    return 0 if result.better else 1


def cmd_predict(a) -> int:
    if a.split is None:
        a.split = "all"
    out = Path(a.out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: give the CSV file to write, e.g. {out / 'predictions.csv'}")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"--out {out}: no folder {out.parent}")
    dropped = dropped_path(out)
    for path, header, what in ((out, PREDICTIONS_HEADER, "a predictions CSV"),
                               (dropped, DROPPED_HEADER, "the list of dropped trips")):
        if path.is_dir() or (path.exists() and not _starts_with(path, header)):  # a user's file would be lost
            raise ValueError(f"--out {out}{'' if path == out else f': {path}'} exists and is not {what} of stfast "
                             "predict (a file of yours would be lost): choose a new file "
                             f"name, e.g. {out.with_name('predictions.csv')}")
    tr, pred, outside, _ = _predict(a)
    import numpy as np

    from .train.run_predictions import trip_columns, write_columns

    write_columns(out, {**trip_columns(tr, pred), "outside_area": (outside.astype("int8"), None)})
    drops = list(zip(*tr.dropped_trips)) or [()] * len(DROPPED_HEADER)
    write_columns(dropped, {h: (np.asarray(c, dtype=object), None) for h, c in zip(DROPPED_HEADER, drops)})
    k = int(outside.sum())
    flagged = f" ({k} outside the training area: outside_area 1)" if k else ""
    print(f"wrote {counted(len(tr), 'prediction')}{flagged} to {out}; {counted(len(tr.dropped_trips), 'trip')} (input "
          f"trajectories or segments of them) dropped in preprocessing, with their reason, to {dropped}")
    return 0


def _starts_with(path: Path, header: tuple, strip: bool = False) -> bool:
    """Whether ``path`` starts with ``header`` (comma-joined): a CSV that ``stfast predict`` wrote, which a new run
    may replace. ``strip``: after leading white space."""
    try:
        with open(path, "rb") as f:
            head = f.read(200).decode("utf-8", errors="replace")
    except OSError:
        return False
    return (head.lstrip() if strip else head).startswith(",".join(header))


def dropped_path(predictions: Path) -> Path:
    """``preds.csv`` → ``preds.dropped.csv``: where ``stfast predict`` lists the trips preprocessing dropped."""
    return predictions.with_name(f"{predictions.stem}.dropped.csv")


def cmd_data_verify(a) -> int:
    import time

    from .data.derived import verify_derived
    from .data.store import verify_store

    t0 = time.perf_counter()
    n, size = verify_store(a.store)
    ok, bad = verify_derived(a.store)
    for e in bad:
        print(f"stfast: warning: {e}; removed, to be computed again when needed", file=sys.stderr)
    print(f"{a.store}: {n} files intact ({size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s); derived values: "
          f"{ok} intact, {len(bad)} damaged and removed")
    return 0


def _check_jsonl_out(out: Path) -> None:
    """Refuse ``--out out`` (a .jsonl) before anything is read when it cannot be written or would replace what is
    not DeepTTE JSON lines (a folder, a file of the user's): ValueError naming it and what to do."""
    from .data.durable import refuse_under_a_file

    refuse_under_a_file(out)
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: a name ending in .jsonl is the file of DeepTTE JSON lines to write; "
                         "choose a new file name (or a name without .jsonl for a trips store)")
    if out.is_file() and out.stat().st_size and not _starts_with(out, ("{",), strip=True):
        raise ValueError(f"--out {out} exists and is not DeepTTE JSON lines (a file of yours would be lost): choose a "
                         "new file name")


def cmd_data_convert(a) -> int:
    from .data.options import preprocess_options_from_args, trip_filters_from_args

    opts = preprocess_options_from_args(a)
    kw = dict(on_error=a.on_error, modes=set(opts["modes"]) or None, min_spacing_km=opts["min_spacing_km"],
              gap_s=opts["gap_s"], tz=opts["tz"], **trip_filters_from_args(a))
    store = not str(a.out).endswith(".jsonl")
    from .data.readers.columns import mapped

    with mapped(a.columns):  # --columns: a CSV of another layout
        trips, what = _convert(a, kw, store)
    _said_converted(a, trips, what, store)
    return 0


def _convert(a, kw: dict, store: bool):
    """The trips of ``stfast data convert`` written to --out (DeepTTE JSON lines or a trips store) and what they
    were written as."""
    from .data.load import load_trips, require_trips

    if not store:
        from .data.durable import os_error_line

        _check_jsonl_out(Path(a.out))
        trips = require_trips(load_trips(a.data, a.format, **kw), a.data)
        try:
            trips.to_jsonl(a.out)
        except OSError as e:  # read-only, full disk, permissions: one line with the path
            raise ValueError(os_error_line(e, f"cannot write {a.out}")) from None
        what = "DeepTTE JSON lines"
    else:  # a trips store: streamed in bounded memory from DiDi / point CSV
        from .data.convert import convert_to_store

        trips = convert_to_store(a.data, a.out, a.format, **kw)
        what = f"a trips store (fingerprint {trips.fingerprint[:12]})"
    return trips, what


def _said_converted(a, trips, what: str, store: bool) -> None:
    """convert's report: what it wrote, what preprocessing dropped, and the default run's values it derived."""
    from .data.drops import describe

    # said before deriving: the derive step's warnings (a value not kept) follow the line of what they are about
    print(f"wrote {counted(len(trips), 'trip', spec=',')} ({counted(trips.n_points, 'point', spec=',')}) to {a.out} as "
          f"{what}; {describe(trips.dropped, trips.n_points)}", flush=True)
    if store:
        from .data.derived import not_kept
        from .data.setup import derive_default

        with not_kept() as missed:
            setup_s = derive_default(trips)  # the first default `stfast train` then computes nothing
        if setup_s is not None:
            done = f"derived the default run's split, statistics, sub-trips and route profile in {setup_s:.2f} s"
            if missed:
                done += (f", but could not keep {', '.join(missed)} (see the warnings above): each `stfast "
                         f"train` on {a.out} computes them again")
            print(done)


def cmd_bench(a) -> int:
    from .bench.modes import run_modes

    if a.seeds < 1 or a.budget_s <= 0 or a.nproc < 1:
        raise ValueError(f"--seeds and --nproc must be ≥ 1 and --budget-s > 0 (got {a.seeds}, {a.nproc}, {a.budget_s})")
    a.seeds_list = list(range(a.seeds))
    if a.data is not None:  # every mode would fail on it, one after another: said once, before any runs
        from .data.readers import detect_format
        from .data.store import is_store

        if a.format == "auto" and not is_store(a.data):
            detect_format(a.data)  # names the path, or what the data is not
        elif not Path(a.data).exists():
            raise FileNotFoundError(f"--data {a.data}: no such file or folder")
    try:
        run_modes(a)
    except RuntimeError as e:  # every mode failed: the table says so, the exit status too
        print(f"stfast bench: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_serve(a) -> int:
    if a.max_batch < 1 or a.max_wait_ms < 0 or a.max_body_kb < 1 or a.rate_limit < 0 or not 0 < a.port < 65536:
        raise ValueError(f"--max-batch and --max-body-kb must be ≥ 1, --max-wait-ms and --rate-limit ≥ 0, --port "
                         f"in 1..65535 (got {a.max_batch}, {a.max_body_kb}, {a.max_wait_ms}, {a.rate_limit}, {a.port})")
    if a.token_file is not None:
        _check_token_file(Path(a.token_file))
    try:
        from .serve.app import serve
    except ImportError as e:
        raise ValueError(f"stfast serve needs FastAPI, uvicorn and orjson ({e}): pip install 'stfast[serve]'") from None
    _set_threads(a)
    if min(a.max_route_points, a.max_connections, a.max_connections_per_client or 1) < 1 or min(
            a.header_timeout_s, a.body_timeout_s, a.idle_timeout_s, a.write_timeout_s, a.drain_s) <= 0:
        raise ValueError("--max-route-points, --max-connections and --max-connections-per-client must be ≥ 1, the "
                         "timeouts and --drain-s > 0")
    serve(a.checkpoint, a.host, a.port, a.max_batch, a.max_wait_ms, a.max_body_kb * 1024, a.rate_limit, a.device,
          forwarded_allow_ips=a.forwarded_allow_ips, token_file=a.token_file, cors_origins=tuple(a.cors_origin),
          max_route_points=a.max_route_points, max_request_points=a.max_request_points,
          max_batch_points=a.max_batch_points, header_timeout_s=a.header_timeout_s, body_timeout_s=a.body_timeout_s,
          idle_timeout_s=a.idle_timeout_s, max_connections=a.max_connections,
          max_connections_per_client=a.max_connections_per_client, write_timeout_s=a.write_timeout_s, drain_s=a.drain_s,
          precision=a.precision, allowed_hosts=tuple(a.allowed_host), log_level=a.log_level,
          access_log=a.access_log, watch=a.watch)
    return 0


def _check_token_file(path: Path) -> None:
    """``--token-file`` must be a text file whose first line holds the token: said before anything loads or
    binds. Raises ValueError / FileNotFoundError naming the file."""
    if not path.exists():
        raise FileNotFoundError(f"--token-file {path}: no such file")
    if not path.is_file():
        raise ValueError(f"--token-file {path} is a folder: give the file whose first line is the token")
    try:
        with open(path, encoding="utf-8") as f:
            f.readline()
    except UnicodeDecodeError:
        raise ValueError(f"--token-file {path} is not a text file: give the file whose first line is the "
                         "token") from None


def cmd_report(a) -> int:
    from .data.store import is_store
    from .train.report import render

    if a.out is not None and Path(a.out).is_file():
        raise ValueError(f"--out {a.out} is a file: give the folder to write report.png and report.html into")
    if a.out is not None and is_store(a.out):
        raise ValueError(f"--out {a.out} is a trips store: give another folder for report.png and report.html")

    png, page = render(a.run_dir, a.out)
    print(f"wrote {png} and {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = build_parser(_command(argv)).parse_args(argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(level=logging.INFO if rank0 else logging.WARNING, format="stfast: %(message)s")
    from .data.errors import TrajectoryFormatError

    cmds = {"train": cmd_train, "evaluate": cmd_evaluate, "predict": cmd_predict, "report": cmd_report,
            "bench": cmd_bench, "serve": cmd_serve, "compare": cmd_compare}
    fn = {"convert": cmd_data_convert, "verify": cmd_data_verify}[a.data_command] if a.command == "data" \
        else cmds[a.command]
    failed: tuple = ()  # the errors of a run that failed (not of its arguments): none where nothing trains
    if a.command not in ("data", "report"):
        from .parallel.data_parallel import JoinFailure
        from .train.guards import RankFailure, TrainingDiverged

        failed = (TrainingDiverged, RankFailure, JoinFailure)
    try:
        _check_store_flags(a, given_dests(argv))
        rc = fn(a)
    except (TrajectoryFormatError, ValueError, FileNotFoundError) as e:
        print(f"stfast: error: {e}", file=sys.stderr)
        rc = 2
    except (NotADirectoryError, IsADirectoryError, PermissionError) as e:  # a path given: under a file, not ours
        print(f"stfast: error: {_os_error(e)}", file=sys.stderr)
        rc = 2
    except failed as e:
        print(f"stfast: error: {e}", file=sys.stderr)
        rc = 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_RANK" in os.environ:
        _exit_rank(rc)
    return rc


def _os_error(e: OSError) -> str:
    """A path error in one line: what, where, and for a path under a file, which file is in the way."""
    path = Path(str(e.filename))
    in_way = next((p for p in path.parents if p.is_file()), None)
    return f"{e.strerror}: {e.filename}" + (f" ({in_way} is a file, not a folder)" if in_way is not None else "")


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
