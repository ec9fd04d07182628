"""``stfast train --compile``: the model's forward pass through ``torch.compile`` (inductor).

What is compiled: the model's forward (``DeepTTE.forward``, what a training step's executor calls under the
run's autocast, stfast.train.steps); the loss, the backward's bookkeeping, the optimizer, validation and the
test evaluation stay eager. The backward of the compiled forward is AOTAutograd's compiled graph.

- **Shapes.** Every batch is padded to its own longest trip, so the forward is compiled once with dynamic shapes
  (``dynamic=True``): on a tiny run one graph served every batch, where the default (static first, then
  automatic dynamic) compiled twice. Sizes 0 and 1 are specialized by torch, so a batch of one trip or of trips
  with one valid position compiles once more.
- **The fused kernels** are registered torch ops with fake kernels (stfast.ops): the whole forward is one graph;
  the fused geo-conv packs by boolean masks (data-dependent sizes), which dynamo captures with
  ``capture_dynamic_output_shape_ops`` and ``capture_scalar_outputs`` (set around each call, :class:`CompiledForward`).
- **The reference kernels** (stock PyTorch): dynamo does not trace ``torch.nn.LSTM`` (a graph break), so the
  geo-conv and attributes before it and the attention and estimators after it are compiled, and the LSTM
  runs as eager oneDNN between them; inductor specializes the geo-conv's Conv1d backward on the padded length
  (torch 2.14: a guard on its input gradient's strides), so the graph before the LSTM compiles again per new
  padded length until dynamo's recompile limit (8), then runs eagerly. What a user of the stock model gets
  from ``torch.compile``; on the Chengdu sample its first epoch ran at 72 trips/s, its second as eager.
- **Compile time** is spent before the first epoch's clock (:func:`warm_up`: a forward + backward of the epoch's
  smallest and largest batch, :func:`warm_up_batches`; gradients discarded, random streams restored): an epoch's ``samples_per_s`` (metrics.jsonl) is the
  compiled model's throughput, the run's ``wall_s`` includes the compilation, and ``compile_s`` (summary.json,
  and the log line) is its time. A later recompilation (a shape the graph does not cover) is in its epoch's time.

Refused with one line (ValueError, exit 2 from the CLI): where torch.compile cannot build a kernel on the run's
device (:func:`unavailable`: no C++ compiler or Python headers for inductor on the CPU, no Triton for CUDA),
with ``--nproc`` > 1 and with ``--parallel cp`` / ``dp+cp`` (:func:`check`). A resumed compiled run (``--resume``
with neither ``--compile`` nor ``--no-compile``) that cannot compile there continues eagerly, with a warning
(:func:`refuse`); ``--no-compile`` resumes it eagerly anywhere.
"""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import numpy as np
import torch

log = logging.getLogger("stfast.train")

#: dynamo settings under which the fused geo-conv's data-dependent packing stays inside the graph
DYNAMO_CONFIG = {"capture_dynamic_output_shape_ops": True, "capture_scalar_outputs": True}


def refuse(cfg, why: str) -> None:
    """``--compile`` cannot run here, ``why``: a ValueError naming the fix where the user gave ``--compile``; where
    the setting came from the resumed run (``cfg.compile_inherited``), the run continues without torch.compile
    and a warning says so (the same model: compiling changes no value beyond the order of float sums)."""
    if getattr(cfg, "compile_inherited", False):
        log.warning("--resume: the run was trained with --compile, but %s; it continues without torch.compile "
                    "(--no-compile: the same, without this warning)", why)
        cfg.compile = False
        return
    raise ValueError(f"--compile: {why}; train without --compile")


def check(cfg) -> None:
    """The rules between ``cfg.compile`` (a TrainConfig) and the other options: --compile with --nproc > 1 or with
    component parallelism is refused (:func:`refuse`: a ValueError naming the flags, or, for a resumed compiled
    run, a warning and an eager run)."""
    if not cfg.compile:
        return
    if cfg.parallel != "dp":
        refuse(cfg, f"it compiles the whole model's forward, and --parallel {cfg.parallel} runs its components "
                    "separately (use --parallel dp)")
    elif cfg.nproc > 1:
        refuse(cfg, f"it runs in one process, not with --nproc {cfg.nproc} (use --nproc 1)")


@functools.cache
def unavailable(device: str) -> str | None:
    """Why torch.compile (inductor) cannot build kernels on ``device`` (a torch device name) here, or None where
    it can: a tiny function is compiled and run once per process, so whatever inductor needs (a C++ compiler
    and Python's headers on the CPU, Triton on CUDA) is asked of inductor itself, not guessed."""
    x = torch.ones(3, device=device)
    try:
        torch.compile(lambda t: torch.tanh(t) * 2.0 + 1.0, dynamic=False)(x)
    except Exception as e:  # noqa: BLE001 - any failure of the toolchain is the answer
        text = " ".join(str(e).split())
        if "InvalidCxxCompiler" in type(e).__name__ + text:
            return (f"torch.compile cannot build kernels on {device} here: inductor found no working C++ compiler "
                    "(install g++, or set CXX to a working one)")
        text = text.split(" Set TORCHDYNAMO_VERBOSE")[0]  # torch's hint about its own stack trace
        if len(text) > 200:
            text = text[:200].rsplit(" ", 1)[0] + " …"
        return f"torch.compile cannot build kernels on {device} here ({type(e).__name__}: {text})"
    return None


class CompiledForward:
    """``model``'s forward through ``torch.compile(model, dynamic=True)`` (the same parameters: the model is
    not copied); called as the model is, with a :class:`~stfast.data.dataset.TripBatch`."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.compiled = torch.compile(model, dynamic=True)

    def __call__(self, batch):
        with torch._dynamo.config.patch(**DYNAMO_CONFIG):
            return self.compiled(batch)


def warm_up_batches(batches: list[np.ndarray], lengths: np.ndarray) -> list[np.ndarray]:
    """The batches the compilation runs on: of ``batches`` ([b] trip indices each; ``lengths`` [N] points of
    every trip), the smallest and the largest by padded size (trips × the longest trip's points), once each.
    Inductor picks some kernels by size (on the Chengdu sample a graph guarded B·(L − 2) ≤ 4096 and a larger
    batch compiled again, in the epoch): both ends of the epoch's sizes compile before its clock."""
    size = [len(b) * int(lengths[b].max()) for b in batches]
    ends = {int(np.argmin(size)), int(np.argmax(size))}
    return [batches[i] for i in sorted(ends)]


def warm_up(run_step: Callable[[], object], model: torch.nn.Module, device: torch.device) -> float:
    """Compile before the clock: ``run_step()`` (one forward + backward through the compiled forward) with the
    random streams (CPU and ``device``'s) restored after it and ``model``'s gradients discarded, so training
    continues as if it had not run. Returns its seconds (the compilation, mostly)."""
    devices = [device] if device.type == "cuda" else []
    t = time.perf_counter()
    with torch.random.fork_rng(devices=devices):
        run_step()
    seconds = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    return seconds


def compile_run(tr) -> float:
    """--compile: compile the model's forward (and its backward) now, before the first epoch's clock, with a
    forward + backward of the epoch's smallest and largest batch (trips × padded length; gradients discarded,
    random streams restored: stfast.train.compiled.warm_up); its seconds go to the log and to summary.json's
    ``compile_s``. ``tr``: the Trainer; returns the seconds."""
    batches = tr.data.epoch_batches(tr.cfg.batch_size, tr.cfg.seed, tr.epoch)
    use_local = tr.cfg.compat != "original" or tr.epoch == 0
    lengths = tr.data.train_ds.lengths

    def run():
        for idx in warm_up_batches(batches, lengths):
            tr.steps.begin_step()
            tr.steps.micro_step(idx, True, tr._loss_fn([idx], use_local))

    seconds = warm_up(run, tr.model, tr.device)
    tr.say(f"torch.compile: the model's forward and backward compiled in {seconds:.1f} s (before the "
           "epochs' clocks: trips/s excludes it, wall_s includes it)")
    return seconds


def refuse_unsupported(cfg, device: torch.device, info) -> None:
    """Refuse, before a run's data is read, what cannot run here: ``--kernels reference --precision bf16-mixed``
    where the stock LSTM has no bfloat16, and ``--compile`` in a distributed job (``info``) or where compiling is
    unavailable on ``device`` (ValueError naming the flags)."""
    if cfg.kernels == "reference" and cfg.precision == "bf16-mixed" and device.type == "cpu":
        from .precision import stock_bf16_lstm_error

        if why := stock_bf16_lstm_error():
            raise ValueError(f"--kernels reference --precision bf16-mixed: {why}; use --kernels fused (stfast's "
                             "LSTM runs bfloat16 here) or --precision 32")
    if cfg.compile and info.distributed:  # launched by torchrun itself (--nproc is refused in validate)
        refuse(cfg, f"it runs in one process, and this job has world size {info.world_size}")
    if cfg.compile and (why := unavailable(str(device))):
        refuse(cfg, why)
