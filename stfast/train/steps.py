"""How one rank runs the micro-steps of an optimizer step, one executor per parallel mode:

- :class:`WholeModelSteps`: one process, or data parallel with equal shards (dp.equal_shard): the whole
  model on this rank's shard; the last micro-step's backward starts the bucketed gradient sync;
- :class:`SlicedSteps`: data parallel with the load-balancing slicer: the shard is the
  BalancedBatchSampler's cut, each micro-step is timed (the sampler refits its cost model from the
  times after the step, and calibrates it on a warm-up profile before the first);
- :class:`ComponentSteps`: ``--parallel cp`` / ``dp+cp`` (stfast.parallel.components): DeepTTE's
  components run concurrently (one process) or as two pipeline stages (two ranks per replica).

The Trainer (stfast.train.trainer) calls, per optimizer step: begin_step(), micro_step() per micro-batch,
statistics() on the vector summed in the gradient all-reduce, and end_step() after the optimizer step.
Every executor runs the forward pass and the loss under ``autocast()`` (the run's precision,
stfast.train.precision: torch.autocast for bf16-mixed, nothing for 32/64) and the backward pass outside it.
"""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

import numpy as np
import torch

from ..models.deeptte import DeepTTE, local_count, training_loss
from ..parallel import data_parallel as dp
from ..parallel.slicer import BalancedBatchSampler, LinearCostModel

LossFn = Callable[[object, object], torch.Tensor]  # (model output, its batch) → this shard's loss
Autocast = Callable[[], contextlib.AbstractContextManager]  # the run's precision around a forward pass


class StepLoss(float):
    """An optimizer step's loss on this rank (a float) and ``skipped``: why the step was skipped (a
    non-finite loss or gradient, see guards.BadStepGuard.problem), None when the optimizer stepped."""

    skipped: str | None

    def __new__(cls, value: float, skipped: str | None = None):
        obj = super().__new__(cls, value)
        obj.skipped = skipped
        return obj


class WholeModelSteps:
    """Each rank runs the whole ``model`` on its equal-count shard (``info``: the data-parallel group) of
    every micro-batch; ``batch_of(idx)`` builds the batch of trip indices [n] on the model's device;
    ``grad_sync`` (None: one process) skips the gradient sync on micro-steps 1..k−1; ``autocast``: the context of
    the forward passes (the run's precision); ``forward``: what runs the model on a batch (default the model;
    ``--compile``: stfast.train.compiled.CompiledForward)."""

    def __init__(self, model: DeepTTE, batch_of: Callable, info: dp.DistInfo, grad_sync=None,
                 autocast: Autocast = contextlib.nullcontext, forward: Callable | None = None):
        self.model, self.batch_of, self.info, self.grad_sync = model, batch_of, info, grad_sync
        self.autocast = autocast
        self.forward = forward if forward is not None else model
        self.data_s = 0.0  # this step's data-side seconds on this rank: the shard's cut and its collation

    def describe(self) -> str | None:
        """A line for the log (None: nothing to say)."""
        return None

    def prepare(self, resume: dict | None) -> str | None:
        """Before the first step (``resume``: the checkpoint continued from); a line for the log or None."""
        return None

    def begin_step(self) -> None:
        self.data_s = 0.0

    def _quiet(self, last: bool):
        return self.grad_sync.no_sync() if self.grad_sync is not None and not last else contextlib.nullcontext()

    def _shard(self, micro: np.ndarray) -> np.ndarray:
        return dp.equal_shard(micro, self.info)

    def _forward_backward(self, batch, loss_fn: LossFn) -> float:
        with self.autocast():
            loss = loss_fn(self.forward(batch), batch)
        loss.backward()
        return float(loss.detach())

    def micro_step(self, micro: np.ndarray, last: bool, loss_fn: LossFn) -> tuple[int, float]:
        """Forward + backward of this rank's shard of ``micro`` ([b] trip indices; ``last``: the step's last
        micro-step). Returns (trips in the shard, its loss)."""
        with self._quiet(last):
            t = time.perf_counter()
            shard = self._shard(micro)
            batch = self.batch_of(shard) if len(shard) else None
            self.data_s += time.perf_counter() - t
            loss = self._forward_backward(batch, loss_fn) if len(shard) else 0.0
        return len(shard), loss

    def statistics(self, extra: torch.Tensor) -> torch.Tensor:
        """The accumulation statistics summed in the gradient all-reduce, as this rank contributes them."""
        return extra

    def end_step(self, step: int, compute_s: list[float], started: float) -> dict | None:
        """After optimizer step ``step``: its metrics row ("step" type) or None."""
        return None

    def slicer_state(self) -> dict | None:
        """The slicer's cost model for the checkpoint (None: no slicer)."""
        return None


class SlicedSteps(WholeModelSteps):
    """Data parallel with ``sampler`` (BalancedBatchSampler: the same cut on every rank); micro-steps are
    timed for its cost model (CUDA kernels finished first)."""

    def __init__(self, model: DeepTTE, batch_of: Callable, info: dp.DistInfo, grad_sync, sampler: BalancedBatchSampler,
                 device: torch.device, autocast: Autocast = contextlib.nullcontext):
        super().__init__(model, batch_of, info, grad_sync, autocast)
        self.sampler, self.device = sampler, device
        self.cut: list[list[np.ndarray]] = []  # every rank's shards [micro-step][rank] of the current step

    def prepare(self, resume: dict | None) -> str:
        """The cost model from the checkpoint, else from the sampler's warm-up profile: forward + backward of
        each profile shard (gradients discarded, no sync, the RNG streams left as they were)."""
        cm = self.sampler.cost_model
        if resume is not None and resume.get("slicer_cost_model") is not None:
            cm.load_state_dict(resume["slicer_cost_model"])
            how = "restored from the checkpoint"
        else:
            devices = [self.device] if self.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), self.grad_sync.no_sync():
                how = self.sampler.calibrate(self._time_shard)
            self.model.zero_grad(set_to_none=True)
        return (f"slicer: {self.sampler.method}; cost model {how}: "
                + ", ".join(f"{k} {v:.3g}" for k, v in cm.to_dict().items()))

    def _time_shard(self, idx: np.ndarray) -> float:
        t = time.perf_counter()
        b = self.batch_of(idx)
        n_local = local_count(self.sampler.lengths[idx], self.model.cfg.kernel_size)
        with self.autocast():
            loss = training_loss(self.model, self.model(b), b, self.sampler.global_batch_size, n_local, True)
        loss.backward()
        self._finish_kernels()
        return time.perf_counter() - t

    def _finish_kernels(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the slicer's timing needs the kernels finished

    def begin_step(self) -> None:
        super().begin_step()
        self.cut = []

    def _shard(self, micro: np.ndarray) -> np.ndarray:
        self.cut.append(self.sampler.shards(micro))  # the sampler caches only the last cut
        return self.cut[-1][self.sampler.rank]

    def micro_step(self, micro: np.ndarray, last: bool, loss_fn: LossFn) -> tuple[int, float]:
        out = super().micro_step(micro, last, loss_fn)
        self._finish_kernels()
        return out

    def end_step(self, step: int, compute_s: list[float], started: float) -> dict:
        """The sampler's step record (:meth:`BalancedBatchSampler.observe_step`) and ``data_s``: this rank's
        seconds of the step spent cutting its shards and collating their batches (inside ``compute_s``)."""
        return {**self.sampler.observe_step(self.cut, compute_s, step, started), "data_s": self.data_s}

    def slicer_state(self) -> dict | None:
        cm = self.sampler.cost_model
        return cm.state_dict() if isinstance(cm, LinearCostModel) else None


class ComponentSteps(WholeModelSteps):
    """--parallel cp / dp+cp: one process runs DeepTTE's independent components concurrently (CUDA streams;
    CPU threads); several run replicas of 2 stages (ranks 2r, 2r+1: attr + geo-conv + LSTM | estimators;
    with --cp-plan layers attr + geo-conv + the first half of the LSTM's layers | the rest + estimators)
    exchanging activations over their cp group, on the replica's shard. Every rank keeps the whole model:
    gradients are summed over the WORLD (a stage's parameters have gradients only on its ranks, so this is
    the sum over replicas), which keeps every copy equal for evaluation, checkpoints and --resume."""

    def __init__(self, model: DeepTTE, batch_of: Callable, info: dp.DistInfo, grad_sync, device: torch.device,
                 cp_plan: str, micro_batches: int | None, autocast: Autocast = contextlib.nullcontext):
        from ..parallel.comm import TorchCommunicator
        from ..parallel.components import ComponentExecutor, ComponentPlan, ParallelLayout
        from .config import CP_STAGES

        layers = cp_plan == "layers"  # the LSTM per layer: the cut halves the critical path
        graph = model.component_graph(split_lstm_layers=layers)
        cut = f"lstm_l{max(1, model.cfg.num_layers // 2) - 1}" if layers else "lstm"
        self.layout = None
        if not info.distributed:
            self.plan = ComponentPlan.concurrent(graph, device)
            self.executor = ComponentExecutor(self.plan, micro_batches or 1, threads=device.type == "cpu")
        else:
            self.layout = ParallelLayout.build(CP_STAGES)
            info = self.layout.data_info
            self.plan = ComponentPlan.split_after(graph, cut, [device] * CP_STAGES)
            self.executor = ComponentExecutor(self.plan, micro_batches or 4, place_modules=False,
                                              comm=TorchCommunicator(self.layout.cp_group))
        super().__init__(model, batch_of, info, grad_sync, autocast)

    def describe(self) -> str:
        from .config import CP_STAGES

        return (f"component parallel: {self.plan}, {self.executor.micro_batches} micro-batches"
                + (f", {self.layout.dp} replicas × {CP_STAGES} stages" if self.layout else ""))

    def _quiet(self, last: bool):
        # the executor backpropagates per component and micro-batch (a parameter's gradient becomes ready
        # several times): its buckets are all started by GradientSync.finish()
        return self.grad_sync.no_sync() if self.grad_sync is not None else contextlib.nullcontext()

    def _forward_backward(self, batch, loss_fn: LossFn) -> float:
        with self.autocast():  # the executor's forward tasks take it up, its backward tasks leave it
            return self.executor.forward_backward(batch, loss_fn).loss or 0.0  # None on stage 0: the loss is later

    def statistics(self, extra: torch.Tensor) -> torch.Tensor:
        if self.layout is not None and self.layout.stage > 0:
            # a unit's gradient is split over its replica's stages: the |g_u|² parts add up in the sum, its
            # size and count must be counted once (stage 0's)
            extra[1:3] = 0.0
        return extra


def for_mode(cfg, model: DeepTTE, batch_of: Callable, info: dp.DistInfo, grad_sync, device: torch.device,
             lengths: np.ndarray, batches: Callable[[int], list[np.ndarray]]) -> WholeModelSteps:
    """The executor of ``cfg.parallel`` (a TrainConfig): components for cp / dp+cp; under data parallelism
    the slicer (``cfg.slicer_method``) over the training trips' ``lengths`` and the epoch's
    global ``batches``; else whole batches. Forward passes run in ``cfg.precision``; with ``cfg.compile``
    (one process, whole batches: stfast.train.compiled.check) through torch.compile."""
    from .precision import autocast as precision_autocast

    autocast = functools.partial(precision_autocast, cfg.precision, device)
    if cfg.parallel != "dp":
        return ComponentSteps(model, batch_of, info, grad_sync, device, cfg.cp_plan, cfg.micro_batches, autocast)
    if not info.distributed:
        from .compiled import CompiledForward

        return WholeModelSteps(model, batch_of, info, grad_sync, autocast,
                               CompiledForward(model) if cfg.compile else None)
    sampler = BalancedBatchSampler(lengths, cfg.batch_size, info.world_size, info.rank, cfg.seed,
                                   method=cfg.slicer_method, batches=batches,
                                   all_gather=lambda a: dp.all_gather_floats(a, info),
                                   broadcast=lambda a: dp.broadcast_floats(a, info))
    return SlicedSteps(model, batch_of, info, grad_sync, sampler, device, autocast)
