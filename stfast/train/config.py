"""Configuration of one training run (what `stfast train` parses into)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

PARALLEL_MODES = ("dp", "cp", "dp+cp")
#: data settings (TrainConfig field → the flag a user types, and how a value is shown in that flag's unit)
DATA_FLAGS = {"modes": ("--modes", lambda v: ",".join(v) or "(all)"),
              "min_spacing_km": ("--min-spacing-km", lambda v: f"{v:g}"),
              "gap_s": ("--gap-min", lambda v: f"{v / 60:g}"),
              "tz": ("--tz", lambda v: v or "(the format's default)")}
CP_STAGES = 2  # DeepTTE across processes: attr + geo-conv + LSTM | attention + entire + local estimators
CP_PLANS = ("components", "layers")  # the cut of the 2 stages: after the LSTM | between its layers


@dataclass
class TrainConfig:
    """Everything a training run depends on. Units: lr per optimizer step, times in seconds."""

    data: str | None = None  # None: the synthetic city
    format: str = "auto"
    n_synthetic: int = 20000  # trips of the synthetic city when data is None
    on_error: str = "raise"  # "raise" or "skip" bad records
    modes: tuple = ()  # GeoLife transport modes to keep (empty: all)
    min_spacing_km: float = 0.2  # raw traces: resampling distance (0: keep every point)
    gap_s: float = 1200.0  # raw traces: split trips at longer time gaps
    tz: str | None = None  # IANA time zone of local time (weekID/timeID/dateID); None: the format's default
    epochs: int = 10
    batch_size: int = 64  # GLOBAL batch (trips per optimizer step, over all ranks)
    lr: float = 1e-3
    weight_decay: float = 0.0
    lr_schedule: str = "constant"  # or "cosine": lr × ½(1 + cos(π·epoch/epochs)), set at every epoch start
    ema_decay: float | None = None  # validate/checkpoint/test an exponential moving average of the weights
    alpha: float = 0.3  # local loss weight
    compat: str = "fixed"  # "original" reproduces faults 1-3 of the original DeepTTE
    head: str = "paper"  # "paper" or "prior" (see DeepTTEConfig)
    loss: str = "mape"  # entire-estimate loss: mape, log or mae
    dropout: float = 0.0
    driver_dim: int = 16  # 0 drops the driver id
    time_bin_min: int = 1  # departure-time embedding bin (minutes)
    kernels: str = "fused"  # "fused" (native ops) or "reference" (plain PyTorch)
    patience: int | None = None  # stop after this many epochs without a better validation MAPE
    seed: int = 0
    data_seed: int | None = None  # seed of the synthetic city and the random split (None: seed)
    ensemble: int = 1  # models trained with seeds seed..seed+ensemble-1, scored as their mean
    split: str = "0.7/0.15/0.15"
    split_by: str = "random"  # "random" or "date"
    split_days: str | None = None  # e.g. "24-28/29/30"
    device: str = "cpu"
    dtype: str = "float32"  # or "float64"
    nproc: int = 1
    comm: str = "torch"  # gradient-sync communicator: "torch" (torch.distributed) or "nccl" (stfast's C++ NCCL)
    slicer: str | None = None  # balanced, equal or sorted shards per rank (None: balanced when distributed)
    threads: int | None = None  # torch intra-op threads per process (default: cores / processes)
    max_steps: int | None = None  # stop after this many optimizer steps (tests, smoke runs)
    out: str = "runs/latest"
    resume: bool = False
    overwrite: bool = False  # a non-empty ``out`` without ``resume``: clear its run files (else refused)
    progress: bool | None = None  # None: only on a TTY and rank 0
    # ---- gradient accumulation (stfast.accum); batch_size is then the global MICRO-batch ----
    accumulation: str | None = None  # K, fixed:K, goodput or rl; None: rl when nproc > 1, else fixed:1
    accum_window: int = 10  # optimizer steps per scheduler decision (a window)
    lr_scaling: str = "sqrt"  # LR rule when the effective batch k·B changes: sqrt (Adam), linear, none
    noise_scale: str | None = None  # noise scale the schedulers read: adam, plain; None: adam under Adam/AdamW
    time_budget_s: float | None = None  # stop after this wall time (checked at window ends)
    # ---- reliability (stfast.train.guards)
    checkpoint_every: int | None = None  # also write last.pt every this many optimizer steps (mid-epoch)
    max_bad_steps: int = 5  # stop after this many optimizer steps in a row with a non-finite loss/gradient
    timeout_s: float = 300.0  # torch.distributed timeout of the process group (every collective), s
    # ---- component parallelism (stfast.parallel.components)
    parallel: str = "dp"  # dp; cp (DeepTTE's components: 1 process concurrent, 2 processes as 2 stages); dp+cp
    micro_batches: int | None = None  # GPipe micro-batches per rank's batch (None: 4 with 2 stages, else 1)
    cp_plan: str = "components"  # components: attr+geo+LSTM | heads; layers: attr+geo+LSTM layer 0 | layer 1+ + heads

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
        return cls(**kw)

    def data_options(self) -> dict:
        """The settings that decide which trips the data becomes (reading and preprocessing): what
        ``evaluate``/``predict`` take from a checkpoint and ``--resume`` must not change. Keys are the
        TrainConfig field names (see :data:`DATA_FLAGS` for the flag of each)."""
        d = {k: getattr(self, k) for k in DATA_FLAGS}
        d["modes"] = sorted(d["modes"])
        return d

    def validate(self) -> None:
        """Reject inconsistent settings before any work. Raises ValueError with one clear line."""
        if self.epochs < 1:
            raise ValueError(f"--epochs must be ≥ 1, got {self.epochs}")
        check_device(self.device)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be ≥ 1, got {self.threads}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"--max-steps must be ≥ 1, got {self.max_steps} (a run of no step would report "
                             "nothing it trained)")
        if self.n_synthetic < 1:
            raise ValueError(f"--n-synthetic must be ≥ 1, got {self.n_synthetic}")
        check_data_options(self.min_spacing_km, self.gap_s, self.tz)
        if self.resume and self.overwrite:
            raise ValueError("--resume continues the run in --out, --overwrite replaces it: choose one")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be ≥ 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.nproc < 1:
            raise ValueError(f"--nproc must be ≥ 1, got {self.nproc}")
        if self.slicer not in (None, "balanced", "equal", "sorted"):
            raise ValueError(f"--slicer must be balanced, equal or sorted, got {self.slicer}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"--dtype must be float32 or float64, got {self.dtype}")
        from ..data.splits import parse_days, parse_fractions

        parse_fractions(self.split)
        if self.split_days:
            parse_days(self.split_days)
        if self.split_by not in ("random", "date"):
            raise ValueError(f"--split-by must be random or date, got {self.split_by}")
        if self.compat not in ("fixed", "original"):
            raise ValueError(f"--compat must be fixed or original, got {self.compat}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"--on-error must be raise or skip, got {self.on_error}")
        if self.head not in ("paper", "prior"):
            raise ValueError(f"--head must be paper or prior, got {self.head}")
        if self.loss not in ("mape", "log", "mae"):
            raise ValueError(f"--loss must be mape, log or mae, got {self.loss}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        if not self.weight_decay >= 0:
            raise ValueError(f"--weight-decay must be ≥ 0, got {self.weight_decay}")
        if not 1 <= self.time_bin_min <= 1440:
            raise ValueError(f"--time-bin-min must be in 1..1440 minutes, got {self.time_bin_min}")
        if self.driver_dim < 0:
            raise ValueError(f"--driver-dim must be ≥ 0, got {self.driver_dim}")
        if self.ensemble < 1:
            raise ValueError(f"--ensemble must be ≥ 1, got {self.ensemble}")
        if self.ensemble > 1 and self.nproc > 1:
            raise ValueError("--ensemble trains its members one after another in one process; with --nproc, "
                             "train one run per --seed (same --data-seed) and score them with "
                             "`stfast evaluate --checkpoint RUN1/checkpoint.pt RUN2/checkpoint.pt ...`")
        if self.patience is not None and self.patience < 1:
            raise ValueError(f"--patience must be ≥ 1, got {self.patience}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"--alpha must be in [0, 1], got {self.alpha}")
        if self.comm not in ("torch", "nccl"):
            raise ValueError(f"--comm must be torch or nccl, got {self.comm}")
        if self.comm == "nccl" and not self.device.startswith("cuda"):
            raise ValueError("--comm nccl needs --device cuda (NCCL moves CUDA tensors only)")
        # ---- gradient accumulation
        from ..accum.goodput import lr_scale
        from ..accum.noise import NOISE_KINDS
        from ..accum.schedulers import parse_spec

        parse_spec(self.accumulation, self.nproc)
        lr_scale(1, self.lr_scaling)
        if self.noise_scale not in (None, *NOISE_KINDS):  # the trainer's optimizer is Adam: both are valid
            raise ValueError(f"--noise-scale must be adam or plain, got {self.noise_scale!r}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"--lr-schedule must be constant or cosine, got {self.lr_schedule!r}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"--ema-decay must be in (0, 1), got {self.ema_decay}")
        if self.accum_window < 1:
            raise ValueError(f"--accum-window must be ≥ 1, got {self.accum_window}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"--time-budget must be > 0 s, got {self.time_budget_s}")
        # ---- reliability
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ValueError(f"--checkpoint-every must be ≥ 1, got {self.checkpoint_every}")
        if self.max_bad_steps < 1:
            raise ValueError(f"--max-bad-steps must be ≥ 1, got {self.max_bad_steps}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout-s must be > 0, got {self.timeout_s}")
        # ---- component parallelism
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(f"--parallel must be one of {', '.join(PARALLEL_MODES)}, got {self.parallel}")
        if self.parallel == "cp" and self.nproc not in (1, CP_STAGES):
            raise ValueError(f"--parallel cp runs DeepTTE on 1 process or as {CP_STAGES} stages on {CP_STAGES} "
                             f"processes, got --nproc {self.nproc} (use --parallel dp+cp for replicas of stages)")
        if self.parallel == "dp+cp" and self.nproc % CP_STAGES:
            raise ValueError(f"--parallel dp+cp needs --nproc a multiple of {CP_STAGES} (replicas × {CP_STAGES} "
                             f"stages), got {self.nproc}")
        if self.micro_batches is not None and self.micro_batches < 1:
            raise ValueError(f"--micro-batches must be ≥ 1, got {self.micro_batches}")
        if self.cp_plan not in CP_PLANS:
            raise ValueError(f"--cp-plan must be one of {', '.join(CP_PLANS)}, got {self.cp_plan}")
        if self.cp_plan != "components" and self.parallel == "dp":
            raise ValueError(f"--cp-plan {self.cp_plan} places components: use it with --parallel cp or dp+cp")


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


def check_data_options(min_spacing_km: float | None, gap_s: float | None, tz: str | None) -> None:
    """Raise ValueError naming the flag (``--min-spacing-km``, ``--gap-min``, ``--tz``) of a value out of
    range. None means unset (the default, or the checkpoint's)."""
    if min_spacing_km is not None and not min_spacing_km >= 0:
        raise ValueError(f"--min-spacing-km must be ≥ 0 (0 keeps every point), got {min_spacing_km:g}")
    if gap_s is not None and not gap_s > 0:
        raise ValueError(f"--gap-min must be > 0 minutes, got {gap_s / 60:g}")
    if tz is not None:
        from ..data.tz import check_tz

        try:
            check_tz(tz)
        except ValueError as e:
            raise ValueError(f"--tz: {e}") from None
