"""Configuration of one training run (what `stfast train` parses into).

Each field is declared once (:func:`stfast._options.option`): its flag, default, choices, range, unit
and help. The `stfast train` parser (:func:`add_arguments`), :meth:`TrainConfig.from_args` and the
single-field checks of :meth:`TrainConfig.validate` derive from the declarations; the model's options
are DeepTTEConfig's (:func:`stfast._options.same_option`). Units: the field's, given by ``unit``;
``gap_s`` is in seconds and its flag ``--gap-min`` in minutes (checkpoints store seconds).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from .. import _options
from ..data.cores import usable_cores
from .._options import OrWord, SwitchTo, option, same_option
from ..accum.noise import NOISE_KINDS
from ..data.options import PREPROCESS_OPTIONS, DataOptions, preprocess_options_from_args
from ..data.splits import DEFAULT_SPLIT
from ..models.deeptte import DeepTTEConfig
from . import compiled, presets, swa, warm_start
from . import precision as prec
from .resume_options import fill_from_checkpoint

PARALLEL_MODES = ("dp", "cp", "dp+cp")
CP_STAGES = 2  # DeepTTE across processes: attr + geo-conv + LSTM | attention + entire + local estimators
CP_PLANS = ("components", "layers")  # the cut of the 2 stages: after the LSTM | between its layers


def check_device(device: str) -> None:
    """Raise ValueError unless ``device`` is ``cpu``, ``cuda`` or ``cuda:N`` of a GPU torch sees."""
    import re

    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise ValueError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"--device {device} requested but torch sees no CUDA device")
        n = int(device.split(":")[1]) if ":" in device else 0
        if n >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)")


def _check_threads(n: int) -> None:
    # torch starts every thread at once: 99,999 of them exhaust the OS's threads (a segfault, or libgomp's "Out of
    # memory" and exit 1); beyond a few per core they only slow a run
    if n > 4 * usable_cores():
        raise ValueError(f"--threads must be at most 4 per core (this process may use {usable_cores()} cores: "
                         f"≤ {4 * usable_cores()}), got {n}")


def _check_split(split: str) -> None:
    from ..data.splits import parse_fractions

    parse_fractions(split)


def _check_split_days(days: str) -> None:
    from ..data.splits import parse_days

    if days:
        parse_days(days)


def _check_accumulation(spec: str) -> None:
    from ..accum.schedulers import parse_spec

    parse_spec(spec, 1)


@dataclass
class TrainConfig:
    """Everything a training run depends on. Each field is the `stfast train` flag of its name (``batch_size``:
    ``--batch-size``), but three, whose flags take another unit or sense: ``gap_s`` (seconds) is ``--gap-min``
    (minutes), ``time_budget_s`` is ``--time-budget``, ``progress`` is ``--no-progress`` (its negation).
    ``stfast train --help`` lists them all with their defaults; :func:`stfast.train.trainer.train` runs one."""

    # ---- data (DATA_OPTIONS: what evaluate/predict take from a checkpoint)
    data: str | None = same_option(DataOptions, "data")
    format: str = same_option(DataOptions, "format")
    n_synthetic: int = option(20000, "trips of the synthetic city", ge=1)  # when data is None
    on_error: str = same_option(DataOptions, "on_error")
    columns: str | None = same_option(DataOptions, "columns")
    modes: tuple = same_option(DataOptions, "modes")
    min_spacing_km: float = same_option(DataOptions, "min_spacing_km")
    gap_s: float = same_option(DataOptions, "gap_s")
    tz: str | None = same_option(DataOptions, "tz")
    # ---- defaults by data (stfast.train.presets): the fields of presets.FIELDS default to None (not given) and
    # take the preset's values when the config is built (__post_init__)
    preset: str = option("auto", "the values of the options marked [preset] that are not given: paper (the faithful "
                                 "DeepTTE reproduction), real (chosen on real data: prior head, log loss, weight "
                                 "averaging; docs/real_data.md), auto (the default: paper on the synthetic city, "
                                 "real on --data)", choices=presets.CHOICES)
    # ---- optimization
    epochs: int | None = option(None, "passes over the training split", ge=1)
    batch_size: int = option(64, "global batch: trips per optimizer step", ge=1)  # over all ranks
    lr: float | None = option(None, "Adam learning rate per optimizer step", gt=0.0)
    weight_decay: float | None = option(None, "Adam weight decay (L2)", ge=0.0)
    subtrips: int | None = option(None, "add N random sub-trajectories of every training trip to the training split "
                                        "(each a contiguous half or more of its points, with its own travel time; "
                                        "stfast.data.subtrips): more examples from the same trips", ge=0)
    subtrips_resample: str | None = option(None, "once: the same pieces every epoch; epoch: a fresh random set of "
                                                 "pieces every epoch (more distinct examples, the same epoch "
                                                 "length)", choices=("once", "epoch"))
    lr_schedule: str = option("constant", "cosine: lr × ½(1 + cos(π·epoch/epochs)) from epoch to epoch "
                                          "(Loshchilov & Hutter 2017)", choices=("constant", "cosine"))
    ema_decay: float | None = option(None, "validate, checkpoint and test an exponential moving average of the "
                                           "weights, updated after every optimizer step with this decay per "
                                           "micro-batch (decay^k at k accumulation steps; Polyak & Juditsky "
                                           "1992), e.g. 0.9; replaces the preset's --swa-start", gt=0.0, lt=1.0)
    # "none" (swa.OFF): no average
    swa_start: float | str | None = option(None, "validate, checkpoint and test the mean of the weights after every "
                                                 "optimizer step from this fraction of --epochs on (stochastic "
                                                 "weight averaging, Izmailov et al. 2018; stfast.train.swa); none: off",
                                           ge=0.0, lt=1.0, cli=OrWord(swa.OFF))
    select: str | None = option(None, "checkpoint.pt (what is tested): the epoch of the best validation MAPE, or the "
                                      "last epoch", choices=swa.SELECT)
    # ---- the model (DeepTTEConfig's options: MODEL_OPTIONS; None: the preset's)
    alpha: float = same_option(DeepTTEConfig, "alpha")
    compat: str = same_option(DeepTTEConfig, "compat")
    head: str | None = same_option(DeepTTEConfig, "head", default=None)
    loss: str | None = same_option(DeepTTEConfig, "loss", default=None)
    dropout: float | None = same_option(DeepTTEConfig, "dropout", default=None)
    driver_dim: int | None = same_option(DeepTTEConfig, "driver_dim", default=None)
    time_bin_min: int | None = same_option(DeepTTEConfig, "time_bin_min", default=None)
    week: str | None = same_option(DeepTTEConfig, "week", default=None)
    hidden_size: int | None = same_option(DeepTTEConfig, "hidden_size", default=None)
    members: int | None = same_option(DeepTTEConfig, "members", default=None)
    kernels: str = same_option(DeepTTEConfig, "kernels")
    # ---- the run
    patience: int | None = option(None, "early stop after N epochs without improvement", ge=1)  # in validation MAPE
    seed: int = option(0, "seed of the model's initialisation and batch order")
    data_seed: int | None = option(None, "seed of the synthetic city and of the random split (default: --seed)")
    ensemble: int = option(1, "train N models (seeds SEED..SEED+N-1, same data and split) into OUT/seed<k> and "
                              "score their mean prediction", ge=1)
    split: str = option(DEFAULT_SPLIT, "seeded random train/val/test fractions", check=_check_split)
    split_by: str = option("random", "date: last day test, the day before validation, the rest training",
                           choices=("random", "date"))
    split_days: str | None = option(None, "explicit TRAIN/VAL/TEST days of month, e.g. 24-28/29/30",
                                    check=_check_split_days)
    device: str = option("cpu", "cpu, cuda or cuda:N", check=check_device)
    # None: not given (--resume: the run's own; else 32); TrainConfig resolves it with its alias --dtype, which
    # then holds the parameter and batch dtype (float32 under bf16-mixed: the master weights)
    precision: str | None = option(None, "numeric precision (Lightning's names): 32 or 64: parameters and every op "
                                         "in float32 or float64; bf16-mixed: float32 parameters, optimizer state, "
                                         "loss and reductions, matrix products (linear layers, convolution, LSTM) in "
                                         "bfloat16 with float32 accumulation (torch.autocast); default 32, on "
                                         "--resume the run's", choices=prec.PRECISIONS)
    dtype: str | None = option(None, "alias of --precision: float32 is 32, float64 is 64",
                               choices=tuple(prec.FROM_DTYPE))
    nproc: int = option(1, "data-parallel processes (torch.distributed)", ge=1)
    comm: str = option("torch", "gradient-sync communicator: torch.distributed, or stfast's C++ NCCL communicator",
                       choices=("torch", "nccl"))
    slicer: str | None = option(None, "how a global batch is cut into per-rank shards: balanced (cost model; default "
                                      "with --nproc > 1), equal (equal counts, random), sorted (sorted by length, "
                                      "dealt round-robin)", choices=("balanced", "equal", "sorted"))
    threads: int | None = option(None, "torch threads per process", ge=1, check=_check_threads)  # None: cores / processes
    max_steps: int | None = option(None, "stop after this many optimizer steps", ge=1)  # tests, smoke runs
    # None: not given (--resume: the run's own; else off); --no-compile: off, also on --resume
    compile: bool | None = option(None, "run the model's forward through torch.compile (inductor, dynamic shapes); "
                                        "compiled before the first epoch's clock (stfast.train.compiled); default "
                                        "off, on --resume the run's; --no-compile: eager")
    out: str = option("runs/latest", "output folder: one run per folder (must be empty or new)")
    resume: bool = option(False, "continue from OUT/last.pt (or checkpoint.pt), with the run's own values of the "
                                 "[preset] options not given")
    overwrite: bool = option(False, "replace the run in a non-empty --out (its metrics, checkpoints, plots are "
                                    "deleted first)")
    # ---- warm start (stfast.train.warm_start)
    init_from: str | None = option(None, "start from this checkpoint's weights on --data (a fine-tune, a new run in "
                                         "--out): its model options, preset, precision, preprocessing and "
                                         "normalization statistics carried over, new drivers given new embedding "
                                         "rows, its training area extended; another model shape, preset or "
                                         "preprocessing is refused")
    refit_stats: bool = option(False, "with --init-from: recompute the normalization statistics on the new "
                                      "training split instead of keeping the checkpoint's")
    allow_outside: bool = option(False, "with --init-from: train even when most trips of --data lie outside the "
                                        "checkpoint's training area (refused without it)")
    # None: progress bars only on a TTY and rank 0
    progress: bool | None = option(None, "no progress bars", flag="--no-progress", cli=SwitchTo(False))
    # ---- gradient accumulation (stfast.accum); batch_size is then the global MICRO-batch
    accumulation: str | None = option(None, "micro-batches per optimizer step: K or fixed:K, goodput (Pollux-style) "
                                            "or rl (the agent); default 2 when --nproc > 1, else 1. --batch-size is "
                                            "then the global micro-batch", check=_check_accumulation)
    accum_window: int = option(10, "optimizer steps between decisions on k", ge=1)
    accum_start: int = option(1, "the k an adaptive scheduler (goodput, rl) starts at, before its first decision "
                                 "(AdaptDL's initial batch size); one of 1, 2, 4, 8, 16", ge=1)
    lr_scaling: str = option("sqrt", "learning rate × √k (Adam, default), × k (SGD) or unchanged when k grows",
                             choices=("sqrt", "linear", "none"))
    noise_scale: str | None = option(None, "gradient noise scale the accumulation schedulers read: adam "
                                           "(preconditioned by Adam's v̂, Pollux; the default under Adam) or plain "
                                           "(B_simple)", choices=NOISE_KINDS)
    time_budget_s: float | None = option(None, "stop after this many seconds of training", unit="s", gt=0.0,
                                         flag="--time-budget")  # checked at window ends
    # ---- reliability (stfast.train.guards)
    checkpoint_every: int | None = option(None, "also write last.pt every N optimizer steps (resume mid-epoch after "
                                                "a crash)", ge=1)
    max_bad_steps: int = option(5, "stop after N optimizer steps in a row with a non-finite loss or gradient (each "
                                   "is skipped)", ge=1)
    timeout_s: float = option(300.0, "timeout of every torch.distributed collective: a dead or hung rank ends the "
                                     "job", unit="s", gt=0.0)
    # ---- component parallelism (stfast.parallel.components)
    parallel: str = option("dp", "dp: data parallel; cp: DeepTTE's components concurrently (1 process) or as 2 "
                                 "pipeline stages (--nproc 2); dp+cp: --nproc/2 data-parallel replicas of 2 stages",
                           choices=PARALLEL_MODES)
    micro_batches: int | None = option(None, "GPipe micro-batches per batch with --parallel cp/dp+cp (default 4 with 2 "
                                             "stages, else 1)", ge=1)
    cp_plan: str = option("components", "--parallel cp/dp+cp graph and cut: components (attr + geo-conv + LSTM | "
                                        "estimators) or layers (the LSTM per layer: attr + geo-conv + layer 0 | "
                                        "layer 1 + estimators)", choices=CP_PLANS)

    def __post_init__(self):
        """Fill the options not given (None) from the preset (stfast.train.presets.fill): the Python API
        resolves as `stfast train` does. Raises ValueError naming --preset for an unknown preset."""
        _options.check_value(type(self), "preset", self.preset)
        if self.resume:  # the options not given continue the run's own (its checkpoint's), not the preset's
            fill_from_checkpoint(self)
        # --init-from: the options not given are the parent checkpoint's model, preset, precision and preprocessing
        parent = warm_start.fill(self) if self.init_from and not self.resume else None
        presets.fill(self)
        self.precision, self.dtype = prec.resolve(self.precision, self.dtype)
        self.compile = bool(self.compile)  # not given (and not the resumed run's): off
        if parent is not None:
            warm_start.check(self, *parent)

    @property
    def split_seed(self) -> int:
        """Seed of the data (synthetic city) and of the random split: ``data_seed``, else ``seed``."""
        return self.seed if self.data_seed is None else self.data_seed

    def to_dict(self) -> dict:
        d = asdict(self)
        d["modes"] = list(self.modes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """The config :meth:`to_dict` wrote (a checkpoint's ``train_config``); keys this version does not
        know are ignored, missing ones take their defaults."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["modes"] = tuple(kw.get("modes", ()))
        kw.setdefault("preset", "paper")  # written before presets: the paper's defaults were the only ones
        # a warm-started run's config is complete: its parent (which may be gone or replaced since) is not read again
        init_from = kw.pop("init_from", None)
        cfg = cls(**kw)
        cfg.init_from = init_from
        return cfg

    @classmethod
    def from_args(cls, args) -> "TrainConfig":
        """The config of parsed `stfast train` arguments (a parser :func:`add_arguments` built)."""
        return cls(**_options.values_from_args(cls, args))

    @property
    def slicer_method(self) -> str:
        """The slicer method a data-parallel run uses: --slicer, balanced when not given."""
        return self.slicer or "balanced"

    def data_options(self) -> dict:
        """The settings that decide which trips the data becomes (reading and preprocessing): what
        ``evaluate``/``predict`` take from a checkpoint and ``--resume`` must not change. Keys are the
        TrainConfig field names (:data:`DATA_OPTIONS`; :func:`flag` gives the flag of each)."""
        d = {k: getattr(self, k) for k in DATA_OPTIONS}
        d["modes"] = sorted(d["modes"])
        return d

    def lr_factor(self, epoch: int) -> float:
        """Epoch ``epoch``'s factor of the learning rate (lr_schedule "cosine": ½(1 + cos(π·epoch/epochs)),
        Loshchilov & Hutter 2017, SGDR without restarts; else 1); the accumulation controller applies k's rule."""
        return 0.5 * (1.0 + math.cos(math.pi * epoch / self.epochs)) if self.lr_schedule == "cosine" else 1.0

    def steps_reached(self, step: int) -> bool:
        """True when ``step`` optimizer steps reach --max-steps."""
        return self.max_steps is not None and step >= self.max_steps

    def validate(self) -> None:
        """Reject inconsistent settings before any work. Raises ValueError with one clear line, naming the
        flag: each field's declared rules (choices, range, its own check), then the rules between fields."""
        _options.check_options(self)
        if self.resume and self.overwrite:
            raise ValueError("--resume continues the run in --out, --overwrite replaces it: choose one")
        warm_start.check_flags(self)
        if self.ensemble > 1 and self.nproc > 1:
            raise ValueError("--ensemble trains its members one after another in one process; with --nproc, "
                             "train one run per --seed (same --data-seed) and score them with "
                             "`stfast evaluate --checkpoint RUN1/checkpoint.pt RUN2/checkpoint.pt ...`")
        if self.comm == "nccl" and not self.device.startswith("cuda"):
            raise ValueError("--comm nccl needs --device cuda (NCCL moves CUDA tensors only)")
        # ---- component parallelism
        if self.parallel == "cp" and self.nproc not in (1, CP_STAGES):
            raise ValueError(f"--parallel cp runs DeepTTE on 1 process or as {CP_STAGES} stages on {CP_STAGES} "
                             f"processes, got --nproc {self.nproc} (use --parallel dp+cp for replicas of stages)")
        if self.parallel == "dp+cp" and self.nproc % CP_STAGES:
            raise ValueError(f"--parallel dp+cp needs --nproc a multiple of {CP_STAGES} (replicas × {CP_STAGES} "
                             f"stages), got {self.nproc}")
        if self.members > 1 and self.parallel != "dp":
            raise ValueError(f"--members {self.members} trains several whole models; --parallel {self.parallel} places "
                             "one model's components: use --parallel dp (or --members 1)")
        if (self.split_days or self.split_by == "date") and self.split != DEFAULT_SPLIT:
            given = "--split-days" if self.split_days else "--split-by date"
            raise ValueError(f"--split {self.split} divides the trips at random, {given} by day: choose one")
        swa.check(self)  # the averaging options together
        if self.accum_start != 1:
            from ..accum.schedulers import check_start

            check_start(self.accumulation, self.accum_start, self.nproc)
        if self.cp_plan != "components" and self.parallel == "dp":
            raise ValueError(f"--cp-plan {self.cp_plan} places components: use it with --parallel cp or dp+cp")
        compiled.check(self)


#: the data settings (field names), in flag order
DATA_OPTIONS = PREPROCESS_OPTIONS
#: the model's options (TrainConfig fields that are DeepTTEConfig's fields of the same name)
MODEL_OPTIONS = _options.names_from(TrainConfig, DeepTTEConfig)


def flag(name: str) -> str:
    """The `stfast train` flag of TrainConfig field ``name`` (``gap_s`` → ``--gap-min``)."""
    return _options.flag(TrainConfig, name)


def show(name: str, value) -> str:
    """``value`` of TrainConfig field ``name`` as written in its flag (``gap_s`` 1200.0 → ``20``)."""
    return _options.show(TrainConfig, name, value)


def add_arguments(parser, names=None, overrides=None) -> None:
    """Add the flags of TrainConfig's fields ``names`` (default: all) to ``parser``
    (:func:`stfast._options.add_arguments`)."""
    _options.add_arguments(parser, TrainConfig, names, overrides)


def data_options_from_args(args) -> dict:
    """The data flags of parsed ``args`` as TrainConfig fields (None: not given, as evaluate/predict
    default them to the checkpoint's), each given value checked. Raises ValueError naming the flag."""
    return preprocess_options_from_args(args)
