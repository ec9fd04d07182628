"""DeepTTE in plain PyTorch — the reference every fused kernel is checked and benchmarked against.

Source: Wang, Zhang, Cao, Li, Zheng, "When Will You Arrive? Estimating Travel Time Based on Deep
Neural Networks", AAAI 2018 (code: UrbComp/DeepTTE). Layer sizes follow the original's defaults
(see docs DEEPTTE.md); seven faults of the original are fixed, each noted where it is fixed:

1. attention is masked to each trip's valid positions;   2. ``dist`` is normalized once;
3. the local loss is trained every epoch (trainer);      4. statistics describe the quantity they
   normalize (NormStats);                                5. B = 1 works (no squeeze);
6. driver vocabulary sized from data, index 0 = unknown; 7. trips shorter than k are rejected here.

``compat="original"`` reproduces faults 1–3 for side-by-side comparison.

Shapes: B trips, L points (padded), L' = L − k + 1 conv positions, H hidden (``hidden_size``, 128),
A = 28 attribute values.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

import torch
import torch.nn.functional as F
from torch import nn

from .._options import check_options, option
from ..data.dataset import NormStats, TripBatch
from ..parallel.components.graph import Component, ComponentGraph

_SOURCES = ("driver", "week_id", "time_id", "dist_n", "lng_n", "lat_n", "state", "local_dist_n",
            "point_lengths", "lengths", "mask", "dist")  # keys of DeepTTE.component_inputs
EPS_LOCAL_S = 10.0  # seconds added to the local label in the local MAPE (the original's EPS)


@dataclass
class DeepTTEConfig:
    """Hyper-parameters of DeepTTE. Defaults are the original's."""

    n_drivers: int  # embedding rows = known drivers + 1 (index 0 = unknown)
    driver_dim: int = option(16, "driver embedding size (0: no driver id)", ge=0)
    week_dim: int = 3
    time_dim: int = 8
    state_dim: int = 2
    geo_hidden: int = 16
    conv_channels: int = 32
    kernel_size: int = 3
    hidden_size: int = option(128, "LSTM hidden size, also the width of the attention and the entire estimator",
                              ge=1)
    num_layers: int = 2
    local_hidden: tuple = (64, 32)
    n_residual: int = 3
    # the options a user sets (stfast train's flags of the same names: stfast.train.config)
    alpha: float = option(0.3, "weight of the local loss", ge=0.0, le=1.0)
    compat: str = option("fixed", "original: reproduce faults 1-3 of the original DeepTTE",
                         choices=("fixed", "original"))
    head: str = option("paper", "paper: DeepTTE's normalized-time head; prior: correction to distance / mean speed",
                       choices=("paper", "prior"))
    # mape: the paper's; log: |log ŷ − log y|; mae: in units of the mean travel time
    loss: str = option("mape", "loss of the entire estimate", choices=("mape", "log", "mae"))
    dropout: float = option(0.0, "dropout probability in the estimators", ge=0.0, lt=1.0)  # input and hidden layers
    time_bin_min: int = option(1, "departure-time embedding bin in minutes", unit="minutes", ge=1, le=1440)
    week: str = option("day", "weekday embedding: one row per day (the paper), or two: Monday-Friday, "
                              "Saturday-Sunday", choices=("day", "weekend"))
    members: int = option(1, "DeepTTE models trained together on the same batches, predicting their mean travel "
                             "time (stfast.models.members); each member gets the gradient of its own loss, the "
                             "logged training loss is their sum; a preset gives 1 under --parallel cp/dp+cp", ge=1)
    kernels: str = option("fused", "fused: stfast's native ops; reference: plain PyTorch (same parameters)",
                          choices=("fused", "reference"))

    def __post_init__(self):
        check_options(self, by_flag=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["local_hidden"] = list(self.local_hidden)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DeepTTEConfig":
        d = dict(d)
        d["local_hidden"] = tuple(d.get("local_hidden", (64, 32)))
        return cls(**d)

    @property
    def attr_size(self) -> int:
        return self.driver_dim + self.week_dim + self.time_dim + 1


def _linear(cfg: DeepTTEConfig) -> type[nn.Linear]:
    """The model's linear layers: ``stfast.nn.Linear`` (its CPU products on the GEMM library stfast chose,
    docs/gemm.md) with the fused kernels, ``torch.nn.Linear`` with the reference ones (stock PyTorch). Same
    parameters and initialization either way. The one-output heads stay ``torch.nn.Linear``: a matrix-vector
    product, which the micro-kernel ran at 4.4 GFLOP/s against MKL's 14.5 (Zen 3, 6,400 × 32 × 1)."""
    if cfg.kernels == "fused":
        from ..nn.linear import Linear

        return Linear
    return nn.Linear


def _norm_buffers(module: nn.Module, stats: NormStats) -> None:
    for k, v in stats.to_dict().items():
        if k != "kernel_size":
            module.register_buffer(k, torch.tensor(float(v), dtype=torch.float64), persistent=True)


class AttrEmbedding(nn.Module):
    """Trip attributes → [B, A] (A = 16 + 3 + 8 + 1 = 28): driver, weekday and departure-minute
    embeddings concatenated with the normalized trip distance."""

    def __init__(self, cfg: DeepTTEConfig):
        super().__init__()
        # driver_dim = 0 drops the driver id (useful when most test drivers are unseen)
        self.driver = nn.Embedding(cfg.n_drivers, cfg.driver_dim) if cfg.driver_dim > 0 else None
        # "weekend": Monday-Friday share one row, Saturday-Sunday the other. On a few days of data most
        # weekdays are absent from training, and the row of an absent day keeps its random initial value
        # (the Chengdu date split trains on Sun-Thu, validates on a Friday and tests on a Saturday)
        self.weekend = cfg.week == "weekend"
        self.week = nn.Embedding(2 if self.weekend else 7, cfg.week_dim)
        # coarser bins share rows: 1,440 per-minute rows are mostly unseen in a thousand trips
        self.time_bin = cfg.time_bin_min
        self.time = nn.Embedding(-(-1440 // cfg.time_bin_min), cfg.time_dim)

    def forward(self, driver, week_id, time_id, dist_norm):
        """driver, week_id (0 = Monday), time_id: [B] int64; dist_norm: [B] float (already normalized once)."""
        week = (week_id >= 5).long() if self.weekend else week_id
        parts = [self.week(week), self.time(time_id // self.time_bin), dist_norm.unsqueeze(-1)]
        if self.driver is not None:
            parts.insert(0, self.driver(driver))
        return torch.cat(parts, dim=-1)


class GeoConv(nn.Module):
    """DeepTTE's geo-convolution, plain PyTorch (the reference of the fused op).

    Per point: [normalized lng, lat, Embedding(2, 2)(state)] (F_in = 4) → Linear(4 → 16) → tanh;
    Conv1d(16 → 32, k, no padding) → ELU over each trip; the normalized distance covered by each
    output position's k points is appended as one more channel.

    Parameters: ``state_em.weight`` [2, 2], ``proj.weight`` [16, 4], ``proj.bias`` [16],
    ``conv.weight`` [32, 16, k], ``conv.bias`` [32] (the fused ``stfast.nn.GeoConv`` uses the same names).
    """

    def __init__(self, cfg: DeepTTEConfig):
        super().__init__()
        self.kernel_size = cfg.kernel_size
        self.state_em = nn.Embedding(2, cfg.state_dim)
        self.proj = nn.Linear(2 + cfg.state_dim, cfg.geo_hidden)
        self.conv = nn.Conv1d(cfg.geo_hidden, cfg.conv_channels, cfg.kernel_size)

    def forward(self, lng_n, lat_n, state, local_dist_n, lengths=None):
        """lng_n, lat_n: [B, L] normalized coordinates; state: [B, L] 0/1; local_dist_n: [B, L']
        normalized k-point distances (L' = L − k + 1). Returns [B, L', C + 1] (C = 32); positions past
        a trip's own L_i − k + 1 hold values computed from padding and must be masked by the caller
        (``lengths`` is accepted for the fused module's signature and not needed here)."""
        s = self.state_em(state.long())
        x = torch.tanh(self.proj(torch.cat([lng_n.unsqueeze(-1), lat_n.unsqueeze(-1), s], dim=-1)))
        conv = F.elu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return torch.cat([conv, local_dist_n.unsqueeze(-1)], dim=-1)


class SpatioTemporal(nn.Module):
    """Geo-convolution + LSTM: per-point features → [B, L', H] hidden states (zero past each trip's
    L_i − k + 1 valid positions). ``kernels="fused"``: stfast.nn.GeoConv and stfast.nn.LSTM (variable-length
    LSTM op over the padded batch, no packing); ``"reference"``: stock PyTorch at its best, the plain-PyTorch
    geo-conv (Linear, tanh, Conv1d, ELU) and ``torch.nn.LSTM`` over the padded batch (one fused RNN call:
    oneDNN's on the CPU, cuDNN's on CUDA), its outputs past each length zeroed. A unidirectional LSTM never
    looks ahead, so its outputs at valid positions are the packed ones; packing (pack_padded_sequence) would
    cost the CPU 2.3× the time (issue 44). Both have the same parameter names and initialization, so
    checkpoints load either way and a seed gives the same model."""

    def __init__(self, cfg: DeepTTEConfig):
        super().__init__()
        lstm_args = (cfg.conv_channels + 1 + cfg.attr_size, cfg.hidden_size, cfg.num_layers)
        self.fused_lstm = cfg.kernels == "fused"
        if cfg.kernels == "fused":
            from ..nn.geo_conv import GeoConv as FusedGeoConv
            from ..nn.lstm import LSTM as FusedLSTM

            self.geo_conv = FusedGeoConv(cfg)
            self.lstm = FusedLSTM(*lstm_args, batch_first=True)
        else:
            self.geo_conv = GeoConv(cfg)
            self.lstm = nn.LSTM(*lstm_args, batch_first=True)

    def forward(self, geo, attr, lengths):
        """geo: [B, L', C + 1] geo-conv output; attr: [B, A]; lengths: [B] valid positions (≥ 1)."""
        return self.run_lstm(self.lstm, self.lstm_input(geo, attr), lengths)

    @staticmethod
    def lstm_input(geo, attr):
        """The LSTM's input [B, L', C + 1 + A]: each position's geo-conv features and the trip's attributes."""
        return torch.cat([geo, attr.unsqueeze(1).expand(-1, geo.shape[1], -1)], dim=-1)

    def run_lstm(self, lstm: nn.Module, x, lengths):
        """``lstm`` (``self.lstm`` or one of :meth:`layers`) over x [B, L', I] with ``lengths`` [B] →
        [B, L', H], zero past each length."""
        if self.fused_lstm:  # zero past each length
            return lstm(x, lengths=lengths)[0]
        h, _ = lstm(x)  # every position of the padded batch; those past a length are zeroed
        valid = torch.arange(x.shape[1])[None, :] < lengths.cpu()[:, None]  # on the host: no device sync
        return h * valid.to(h.device, non_blocking=True).unsqueeze(-1)

    def layers(self) -> list[nn.Module]:
        """The LSTM's layers as one-layer LSTMs of the same class (fused or torch.nn.LSTM) whose parameters
        ARE layer k's (``weight_ih_l{k}`` … registered as ``weight_ih_l0`` …: the same Parameter objects,
        so gradients land on the model's parameters and the state dict is unchanged). Running them in turn
        through :meth:`run_lstm` equals the multi-layer LSTM (layer k reads layer k − 1's output; the
        stacked op does the same, without dropout between layers: DeepTTE uses none)."""
        lstm = self.lstm
        out = []
        for k in range(lstm.num_layers):
            in_k = lstm.input_size if k == 0 else lstm.hidden_size
            # meta: no memory for the placeholder weights replaced right below
            layer = type(lstm)(in_k, lstm.hidden_size, 1, bias=lstm.bias, batch_first=True, device="meta")
            names = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if lstm.bias else ())
            for name in names:
                setattr(layer, f"{name}_l0", getattr(lstm, f"{name}_l{k}"))
            out.append(layer)
        return out


class AttentionPooling(nn.Module):
    """Weights ∝ exp(−⟨h_t, tanh(W attr)⟩) over each trip's valid positions; pooled [B, H]."""

    def __init__(self, cfg: DeepTTEConfig):
        super().__init__()
        self.attr_proj = _linear(cfg)(cfg.attr_size, cfg.hidden_size)
        self.masked = cfg.compat != "original"

    def forward(self, h, attr, mask):
        """h: [B, L', H]; attr: [B, A]; mask: [B, L'] bool valid positions."""
        a = torch.tanh(self.attr_proj(attr))
        score = -(h * a.unsqueeze(1)).sum(-1)  # [B, L']
        if self.masked:  # fault 1 fixed: padded positions get no weight
            w = torch.softmax(score.masked_fill(~mask, float("-inf")), dim=1)
        else:  # the original: exp over valid positions, but padded zero states add exp(0) = 1 each
            e = torch.exp(score) * mask + (~mask).to(h.dtype)
            w = (torch.exp(score) * mask) / e.sum(1, keepdim=True)
        return (w.unsqueeze(-1) * h).sum(1)


class EntireEstimator(nn.Module):
    """[B, H + A] → [B] one number per trip (normalized time for the paper's head, log-correction of
    the constant-speed time for the prior head): Linear, leaky ReLU, residual blocks, Linear."""

    def __init__(self, cfg: DeepTTEConfig):
        super().__init__()
        self.inp = _linear(cfg)(cfg.hidden_size + cfg.attr_size, cfg.hidden_size)
        self.res = nn.ModuleList(_linear(cfg)(cfg.hidden_size, cfg.hidden_size) for _ in range(cfg.n_residual))
        self.out = nn.Linear(cfg.hidden_size, 1)  # a matrix-vector product: MKL's (see _linear)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        h = F.leaky_relu(self.inp(self.drop(x)))
        for lin in self.res:
            h = h + F.leaky_relu(lin(self.drop(h)))
        return self.out(h).squeeze(-1)  # squeeze(-1) only: B = 1 stays [1] (fault 5)


class LocalEstimator(nn.Module):
    """[B, L', H] → [B, L'] normalized travel time over each k-point span."""

    def __init__(self, cfg: DeepTTEConfig):
        super().__init__()
        dims = (cfg.hidden_size, *cfg.local_hidden)
        self.hidden = nn.ModuleList(_linear(cfg)(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.out = nn.Linear(dims[-1], 1)  # as EntireEstimator.out

    def forward(self, h):
        for lin in self.hidden:
            h = F.leaky_relu(lin(h))
        return self.out(h).squeeze(-1)


@dataclass
class DeepTTEOutput:
    """Predictions in seconds: ``time`` [B]; ``local_time`` [B, L'] (valid where ``mask``); ``members``: the
    members' own outputs when the model is several trained together (stfast.models.members), else None."""

    time: torch.Tensor
    local_time: torch.Tensor
    mask: torch.Tensor
    members: tuple | None = None


class DeepTTE(nn.Module):
    """DeepTTE: attribute embedding, spatio-temporal (geo-conv + LSTM), entire and local estimators.

    Normalization statistics live in the module as buffers, so a checkpoint carries them and inputs
    are raw units (degrees, km, s). Forward takes a :class:`TripBatch`; raises ValueError when a
    trip has fewer than ``kernel_size`` points (fault 7).
    """

    def __init__(self, cfg: DeepTTEConfig, stats: NormStats):
        super().__init__()
        if cfg.members != 1:
            raise ValueError(f"DeepTTE is one model, the config asks for members={cfg.members}: build it with "
                             "stfast.models.members.build")
        if stats.kernel_size != cfg.kernel_size:
            raise ValueError(f"NormStats kernel_size {stats.kernel_size} != model kernel_size {cfg.kernel_size}")
        self.cfg = cfg
        _norm_buffers(self, stats)
        self.attr = AttrEmbedding(cfg)
        self.spatio_temporal = SpatioTemporal(cfg)
        self.attention = AttentionPooling(cfg)
        self.entire = EntireEstimator(cfg)
        self.local = LocalEstimator(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights, zero biases (the original's initialization). With the prior head the
        entire estimator's last layer starts at zero, so the untrained model IS the constant-speed
        baseline and training learns a correction to it."""
        for name, p in self.named_parameters():
            if "bias" in name:
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                nn.init.xavier_uniform_(p)
        if self.cfg.head == "prior":
            nn.init.zeros_(self.entire.out.weight)

    def _n(self, x, name):
        return (x - getattr(self, name + "_mean").to(x.dtype)) / getattr(self, name + "_std").to(x.dtype)

    def component_inputs(self, b: TripBatch) -> dict[str, torch.Tensor]:
        """The source values of the component graph for batch ``b`` (all batch-major, [B] or [B, L] /
        [B, L']): normalized inputs, valid-position counts and mask. Raises ValueError when a trip has
        fewer than ``kernel_size`` points (fault 7)."""
        k = self.cfg.kernel_size
        host = b.host_lengths  # on the CPU: the check and the ops' launch sizes read it without a device sync
        if not torch.compiler.is_compiling() and len(host) and int(host.min()) < k:  # (skipped when traced)
            bad = int(torch.argmin(host))
            raise ValueError(f"trip {bad} of the batch has {int(host[bad])} points; DeepTTE's geo-conv "
                             f"needs at least kernel_size={k} (drop such trips in preprocessing)")
        dist_n = self._n(b.dist, "dist")
        if self.cfg.compat == "original":  # fault 2 reproduced: normalized a second time
            dist_n = self._n(dist_n, "dist")
        local_dist = b.dist_gap[:, k - 1:] - b.dist_gap[:, :-k + 1 or None]
        # the mask from the device copy (no transfer); the lengths the ops read, from the host copy
        mask = torch.arange(local_dist.shape[1], device=b.lengths.device)[None, :] < (b.lengths - k + 1)[:, None]
        return {"driver": b.driver, "week_id": b.week_id, "time_id": b.time_id, "dist_n": dist_n,
                "lng_n": self._n(b.lng, "lng"), "lat_n": self._n(b.lat, "lat"), "state": b.state,
                "local_dist_n": self._n(local_dist, "local_dist") * mask, "point_lengths": host,
                "lengths": host - k + 1, "mask": mask, "dist": b.dist}

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' dtype: what the outputs, the attention's reductions and the loss are computed in.
        Under autocast (``--precision bf16-mixed``) the GEMMs run in bfloat16 and their results come back to it
        here, so only matrix products see bfloat16 (float32 master weights, loss and reductions)."""
        return self.entire.out.weight.dtype

    def entire_time(self, h, attr, mask, dist):
        """Attention pooling + entire estimator + head: [B, L', H], [B, A], [B, L'], [B] km → [B] s."""
        h = h.to(self.dtype)  # no-op in 32/64; from the LSTM's bfloat16 under autocast
        pooled = self.attention(h, attr, mask)
        est = self.entire(torch.cat([pooled, attr], dim=-1)).to(h.dtype)
        if self.cfg.head == "prior":  # t = dist / v̂ · exp(correction); clamped so early steps cannot overflow
            return dist / self.speed_km_s.to(h) * torch.exp(est.clamp(-6.0, 6.0))
        return est * self.time_std.to(h) + self.time_mean.to(h)

    def local_time(self, h):
        """Local estimator: [B, L', H] → [B, L'] seconds per k-point span."""
        out = self.local(h).to(self.dtype)  # no-op in 32/64 (see dtype)
        return out * self.local_time_std.to(out) + self.local_time_mean.to(out)

    def forward(self, b: TripBatch) -> DeepTTEOutput:
        x = self.component_inputs(b)
        attr = self.attr(x["driver"], x["week_id"], x["time_id"], x["dist_n"])
        st = self.spatio_temporal
        geo = st.geo_conv(x["lng_n"], x["lat_n"], x["state"], x["local_dist_n"], x["point_lengths"])
        h = st(geo, attr, x["lengths"])
        return DeepTTEOutput(time=self.entire_time(h, attr, x["mask"], x["dist"]), local_time=self.local_time(h),
                             mask=x["mask"])

    # ---- component graph (stfast.parallel.components): the forward above as a DAG, for component parallelism
    def component_graph(self, split_lstm_layers: bool = False) -> ComponentGraph:
        """DeepTTE's forward as a DAG of components (ARCHITECTURE.md): ``attr`` and ``geo_conv`` are
        independent, ``lstm`` (the critical path) needs both, ``entire`` (attention pooling + estimator)
        and ``local`` are independent of each other. Executing the graph equals :meth:`forward`.

        ``split_lstm_layers``: the LSTM as one component per layer, ``lstm_l0`` → ``lstm_l1`` → … (values
        ``h_l0``, ``h_l1``, …, the last one ``h``; each owns its layer's parameters, see
        :meth:`SpatioTemporal.layers`), so a pipeline can cut the critical path between layers
        (``ComponentPlan.split_after(g, "lstm_l0", ...)``: attr + geo-conv + layer 0 | layer 1 + estimators).
        """
        st = self.spatio_temporal
        comps = [
            Component("attr", self.attr, ("driver", "week_id", "time_id", "dist_n"), ("attr",), (self.attr,)),
            Component("geo_conv", st.geo_conv, ("lng_n", "lat_n", "state", "local_dist_n", "point_lengths"),
                      ("geo",), (st.geo_conv,)),
        ]
        if not split_lstm_layers:
            comps.append(Component("lstm", st, ("geo", "attr", "lengths"), ("h",), (st.lstm,)))
        else:
            layers = st.layers()
            last = len(layers) - 1
            for k, layer in enumerate(layers):
                out = "h" if k == last else f"h_l{k}"
                if k == 0:
                    fn = lambda geo, attr, lengths, layer=layer: st.run_lstm(layer, st.lstm_input(geo, attr), lengths)
                    ins = ("geo", "attr", "lengths")
                else:
                    fn = lambda x, lengths, layer=layer: st.run_lstm(layer, x, lengths)
                    ins = (f"h_l{k - 1}", "lengths")
                comps.append(Component(f"lstm_l{k}", fn, ins, (out,), (layer,)))
        comps += [
            Component("entire", self.entire_time, ("h", "attr", "mask", "dist"), ("time",),
                      (self.attention, self.entire)),
            Component("local", self.local_time, ("h",), ("local_time",), (self.local,)),
        ]
        return ComponentGraph(comps, sources=_SOURCES, host_sources=("point_lengths", "lengths"),
                              outputs=("time", "local_time", "mask"), make_inputs=self.component_inputs,
                              make_output=lambda v: DeepTTEOutput(v["time"], v["local_time"], v["mask"]))


@dataclass
class LossParts:
    """Per-shard SUMS (not means) so the trainer can divide by the GLOBAL counts."""

    entire_ape_sum: torch.Tensor  # Σ over trips of the entire loss (|ŷ − y| / y for the paper's MAPE)
    local_ape_sum: torch.Tensor  # Σ |Δŷ − Δy| / (Δy + ε) over valid positions
    n_trips: int
    n_local: int


def loss_parts(model: DeepTTE, out: DeepTTEOutput, b: TripBatch) -> LossParts:
    """The multi-task loss terms of DeepTTE (entire per ``cfg.loss`` and local MAPE), as sums over this
    shard. Entire losses: mape |ŷ − y|/y (the paper's; rewards under-prediction), log |log ŷ − log y|
    (symmetric in ratio), mae |ŷ − y| / mean training time. Several members (``out.members``): the sums of
    the members' own terms, so each member's gradient is that of its own loss."""
    if out.members is not None:
        parts = [loss_parts(m, o, b) for m, o in zip(model.members, out.members)]
        return LossParts(sum(p.entire_ape_sum for p in parts), sum(p.local_ape_sum for p in parts), len(b),
                         parts[0].n_local)
    k = model.cfg.kernel_size
    if model.cfg.loss == "mape":
        ent = ((out.time - b.time).abs() / b.time).sum()
    elif model.cfg.loss == "log":
        ent = (torch.log(out.time.clamp_min(1.0)) - torch.log(b.time)).abs().sum()
    else:
        ent = ((out.time - b.time).abs() / model.time_mean.to(b.time.dtype)).sum()
    local_y = b.time_gap[:, k - 1:] - b.time_gap[:, :-k + 1 or None]
    loc = ((out.local_time - local_y).abs() / (local_y + EPS_LOCAL_S))[out.mask].sum()
    # the mask's count, from the host lengths (int(out.mask.sum()) would wait for the device)
    return LossParts(ent, loc, len(b), local_count(b.host_lengths, k))


def combine_loss(p: LossParts, alpha: float, n_trips_global: int, n_local_global: int,
                 use_local: bool = True) -> torch.Tensor:
    """(1 − α)·entire + α·local with both means taken over the GLOBAL batch (exact under unequal shards)."""
    ent = p.entire_ape_sum / n_trips_global
    if not use_local:
        return ent
    return (1 - alpha) * ent + alpha * p.local_ape_sum / max(n_local_global, 1)


def local_count(lengths, kernel_size: int) -> int:
    """Local estimates (one per geo-conv window) of trips with these ``lengths`` [n] (points):
    Σ max(len − kernel_size + 1, 0), the local loss's denominator when taken over these trips."""
    return int(np.maximum(np.asarray(lengths) - kernel_size + 1, 0).sum())


def training_loss(model: DeepTTE, out: DeepTTEOutput, b: TripBatch, n_trips: int, n_local: int,
                  use_local: bool = True) -> torch.Tensor:
    """The loss rule: shard ``b``'s part (its output ``out``) of the loss of a global batch of ``n_trips`` trips
    and ``n_local`` local estimates (:func:`local_count` of all its trips, over every rank and micro-batch).
    Summed over the shards, the gradients are the global batch's mean gradient whatever the shard sizes."""
    return combine_loss(loss_parts(model, out, b), model.cfg.alpha, n_trips, n_local, use_local)
