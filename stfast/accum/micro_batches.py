"""Gradient accumulation in one line of a hand-written loop: :meth:`AccumulationController.micro_batches`.

Hugging Face Accelerate's ``with accelerator.accumulate(model):`` and Lightning's ``accumulate_grad_batches``
with a k that the scheduler chooses::

    ctl = AccumulationController(make_scheduler("goodput"), model.parameters(), micro_batch=16, window=5,
                                 optimizer=opt)
    for epoch in range(epochs):
        for micro in ctl.micro_batches(loader, budget_used=lambda: epoch / epochs, size=lambda b: len(b[0])):
            x, y = micro.batch                        # a DataLoader's [x, y]: size counts x's rows
            micro.backward(F.mse_loss(model(x), y))   # the micro-batch's mean loss, as in plain PyTorch

The iterator groups the loader's batches k at a time (k: the controller's, which the scheduler sets every
``window`` optimizer steps) and makes the controller's eight calls around the user's forward and backward:
``start_clock`` (once), ``begin_step`` after ``optimizer.zero_grad()`` before a step's first micro-batch,
``after_micro_step`` in :meth:`MicroBatch.backward`, then after the step's last backward ``extra``,
``optimizer.step()``, ``end_step``, and, when ``window_due``, ``window_stats`` / ``end_window`` (the next k and
its learning rate). Its decisions are the eight-call form's, step for step (tests/test_accum_micro_batches.py).

An epoch (the loader) that ends mid-step: its last optimizer step takes the micro-batches left (fewer than k),
their losses weighted over their own samples, so that step's gradient is the mean over them; it counts as one
step of the window, which goes on into the next epoch (stfast's trainer does the same). Nothing is carried
into the next call.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class _Step:
    """One optimizer step in progress: its loss so far (the weighted losses' sum) and whether each micro-batch
    was backpropagated."""

    loss: float = 0.0
    done: list[bool] = field(default_factory=list)


@dataclass(eq=False)
class MicroBatch:
    """One micro-batch of an optimizer step, as :meth:`AccumulationController.micro_batches` yields it.

    Attributes:
        batch: the loader's item, as it gave it.
        index: its place in the optimizer step, 0 .. k − 1.
        k: micro-batches in this optimizer step: the controller's k, or fewer in an epoch's last step.
        size: samples (trips) in it: ``size(batch)`` (``len(batch)`` by default: pass ``size`` for a
            DataLoader's ``[x, y]`` batches, whose len is 2).
        step_size: samples in the whole optimizer step (the sum of its micro-batches' sizes).
    """

    batch: Any
    index: int
    k: int
    size: int
    step_size: int
    _controller: Any = field(repr=False)
    _step: _Step = field(repr=False)

    @property
    def last(self) -> bool:
        """Whether this is the optimizer step's last micro-batch (the optimizer steps after its backward)."""
        return self.index == self.k - 1

    @property
    def weight(self) -> float:
        """size / step_size: what :meth:`backward` multiplies the micro-batch's mean loss by, so that the step's
        accumulated gradient is the gradient of the mean loss over all its samples."""
        return self.size / self.step_size

    def backward(self, loss: torch.Tensor) -> None:
        """``(loss · weight).backward()`` — use it instead of ``loss.backward()`` (as Accelerate's
        ``accelerator.backward(loss)``) — then the controller's statistics of this micro-step (its gradient's
        share of the noise scale) and the step's loss (the sum of the weighted losses, what the loss EMA and the
        scheduler see).

        loss: a scalar tensor, the mean loss over this micro-batch's ``size`` samples (``reduction="mean"``,
        torch's default; divide a summed loss by ``size`` first).
        Raises ValueError: ``loss`` is not a one-element tensor; RuntimeError: called twice for one micro-batch.
        """
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(f"MicroBatch.backward: loss must be a one-element tensor (the micro-batch's mean loss), "
                             f"got {got}")
        if self._step.done[self.index]:
            raise RuntimeError(f"MicroBatch.backward was called twice for micro-batch {self.index} of the step")
        weighted = loss * self.weight
        weighted.backward()
        self._step.done[self.index] = True
        self._controller.after_micro_step(self.size, self.step_size, last=self.last)
        self._step.loss += weighted.item()


def _accumulate(ctl, batches: Iterable, budget_used: Callable[[], float] | None, size: Callable[[Any], int],
               on_window: Callable[[dict], None] | None) -> Iterator[MicroBatch]:
    """The iterator behind :meth:`AccumulationController.micro_batches` (see there)."""
    if ctl.optimizer is None:
        raise ValueError("micro_batches: the controller has no optimizer to step (give optimizer= to "
                         "AccumulationController)")
    if ctl.distributed:
        raise ValueError("micro_batches runs one process; under torch.distributed call the controller's steps "
                         "yourself around your gradient all-reduce (begin_step, after_micro_step, extra, end_step)")
    if not ctl.clock_started:
        ctl.start_clock()
    ctl.restart_step_clock()  # the time before this call (an epoch's validation) is no step's
    it = iter(batches)
    while group := list(itertools.islice(it, ctl.k)):
        t0 = time.perf_counter()
        sizes = [size(b) for b in group]
        step = _Step(done=[False] * len(group))
        ctl.optimizer.zero_grad(set_to_none=True)
        ctl.begin_step()
        for j, (b, n) in enumerate(zip(group, sizes)):
            yield MicroBatch(b, j, len(group), n, sum(sizes), ctl, step)
            if not step.done[j]:
                raise RuntimeError(f"micro-batch {j} of the step was not backpropagated: call micro.backward(loss) "
                                   "(not loss.backward(): it weights the loss into the step's mean and measures the "
                                   "micro-step)")
        reduced = ctl.extra(step.loss)
        ctl.optimizer.step()
        ctl.end_step(reduced, sum(sizes), step_s=time.perf_counter() - t0, sync_s=0.0)
        if ctl.window_due():
            _, row = ctl.end_window(budget_used() if budget_used is not None else 0.0, out_of_time=False)
            if on_window is not None:
                on_window(row)
