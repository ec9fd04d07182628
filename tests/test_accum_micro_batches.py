"""Issue 62: gradient accumulation in one line of a user's loop (AccumulationController.micro_batches) makes the
decisions of the eight calls made by hand (start_clock, begin_step, after_micro_step, extra, end_step,
window_due, window_stats, end_window): the same k sequence, the same statistics, bitwise-equal parameters
(float64), within an epoch, across epochs that end mid-step, and in examples/accumulation_loop.py."""
import sys
import time
from pathlib import Path

import pytest
import torch

from stfast.accum import AccumulationController, AccumulationScheduler, MicroBatch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import accumulation_loop  # noqa: E402
from _sequences import SeqRegressor, make_sequences  # noqa: E402

MICRO_BATCH, WINDOW = 5, 2


class LossDriven(AccumulationScheduler):
    """k from the low bits of the window's loss slope, so any difference between two runs shows in the k
    sequence; records what it saw (its times excepted: they are the clock's)."""

    def __init__(self):
        super().__init__((1, 2, 3, 4), 2)
        self.seen = []

    def observe(self, stats):
        self.seen.append((stats.k, stats.steps, stats.trips, stats.loss_slope, stats.noise_scale, stats.budget_used))
        self.k = self.choices[int(abs(stats.loss_slope) * 1e9) % len(self.choices)]
        return self.k


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = SeqRegressor(hidden=8).double()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    ctl = AccumulationController(LossDriven(), model.parameters(), MICRO_BATCH, WINDOW, opt, noise_scale="plain")
    return model, ctl


def _micro_batches(n: int, seed: int = 1):
    """n micro-batches (sequences [L_i, 4] float64, targets [b] float64), the last of an odd size."""
    seqs, target = make_sequences(n * MICRO_BATCH, seed=seed, max_len=12)
    seqs, target = [s.double() for s in seqs], target.double()
    cuts = list(range(0, n * MICRO_BATCH, MICRO_BATCH)) + [n * MICRO_BATCH - 2]
    return [(seqs[a:b], target[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _loss(model, batch):
    seqs, y = batch
    return (model(seqs) - y).square().mean()


def eight_calls(model, ctl, epochs, windows=None):
    """The loop of examples/accumulation_loop.py before issue 62 (stfast's trainer's order: the last step of
    an epoch takes the micro-batches left), each loss weighted by its share of the step's samples."""
    opt, chosen = ctl.optimizer, [ctl.k]
    ctl.start_clock()
    for batches in epochs:
        ctl.restart_step_clock()
        bi = 0
        while bi < len(batches) and ctl.n_windows != windows:
            group = batches[bi:bi + ctl.k]
            bi += len(group)
            n_total = sum(len(y) for _, y in group)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            ctl.begin_step()
            step_loss = 0.0
            for j, (seqs, y) in enumerate(group):
                loss = _loss(model, (seqs, y)) * (len(y) / n_total)
                loss.backward()
                ctl.after_micro_step(len(y), n_total, last=j == len(group) - 1)
                step_loss += loss.item()
            reduced = ctl.extra(step_loss)
            opt.step()
            ctl.end_step(reduced, n_total, step_s=time.perf_counter() - t0, sync_s=0.0)
            if ctl.window_due():
                budget = (ctl.n_windows + 1) / (windows or 10)
                ctl.window_stats(budget)
                chosen.append(ctl.end_window(budget, out_of_time=False)[1]["k_next"])
    return chosen


def _assert_same_run(a, b):
    (model_a, ctl_a), (model_b, ctl_b) = a, b
    assert ctl_a.scheduler.seen and repr(ctl_a.scheduler.seen) == repr(ctl_b.scheduler.seen)  # nan-safe, exact
    for (name, pa), pb in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(pa, pb), name
    assert ctl_a.optimizer.param_groups[0]["lr"] == ctl_b.optimizer.param_groups[0]["lr"]
    assert repr(ctl_a.noise.state_dict()) == repr(ctl_b.noise.state_dict())


def test_the_example_makes_the_eight_calls_decisions_bitwise():
    windows = 6
    data = _micro_batches(4 * WINDOW * windows + 4)  # enough for k = 4 throughout
    old = _setup()
    k_old = eight_calls(*old, [data], windows)[:windows]
    new = _setup()
    k_new = accumulation_loop.train(*new, iter(data), windows)
    assert k_new == k_old and len(set(k_old)) > 1, k_old  # the scheduler moved k
    assert new[1].n_windows == windows
    _assert_same_run(old, new)


def test_epochs_that_end_mid_step_step_on_what_is_left():
    """Epochs of 7 micro-batches (the last one short) under k = 2, 3, 4: each epoch's last optimizer step takes
    the micro-batches left, weighted over their own samples; windows run on across epochs."""
    data = _micro_batches(7)
    old = _setup()
    k_old = eight_calls(*old, [data] * 5)
    model, ctl = new = _setup()
    k_new, partial = [ctl.k], 0
    for epoch in range(5):
        steps = []
        for micro in ctl.micro_batches(data, budget_used=lambda: (ctl.n_windows + 1) / 10, size=lambda b: len(b[1]),
                                       on_window=lambda row: k_new.append(row["k_next"])):
            if micro.index == 0:
                steps.append((ctl.k, []))
            steps[-1][1].append(micro)
            micro.backward(_loss(model, micro.batch))
        assert sum(len(group) for _, group in steps) == 7
        for i, (k, group) in enumerate(steps):
            assert all(m.k == len(group) and m.step_size == sum(g.size for g in group) for m in group)
            assert sum(m.weight for m in group) == pytest.approx(1.0) and group[-1].last
            # only the epoch's last step may hold fewer than k micro-batches: what was left
            assert len(group) == k or (i == len(steps) - 1 and len(group) < k)
        partial += len(steps[-1][1]) < steps[-1][0]
    assert partial > 0 and k_new == k_old and len(set(k_old)) > 1
    assert ctl.n_windows == len(k_new) - 1 > 0
    _assert_same_run(old, new)


def test_a_micro_batch_must_go_through_micro_backward():
    model, ctl = _setup()
    data = _micro_batches(4)
    with pytest.raises(RuntimeError, match=r"micro-batch 0 of the step was not backpropagated: call micro.backward"):
        for micro in ctl.micro_batches(data, size=lambda b: len(b[1])):
            _loss(model, micro.batch).backward()  # plain PyTorch: the loss would not be weighted
    with pytest.raises(RuntimeError, match="called twice"):
        for micro in ctl.micro_batches(data, size=lambda b: len(b[1])):
            micro.backward(_loss(model, micro.batch))
            micro.backward(_loss(model, micro.batch))
    micro = next(iter(ctl.micro_batches(data, size=lambda b: len(b[1]))))
    assert isinstance(micro, MicroBatch) and micro.index == 0 and micro.k == ctl.k
    with pytest.raises(ValueError, match="one-element tensor"):
        micro.backward(model(micro.batch[0]) - micro.batch[1])  # a loss per sample, not the mean
    no_opt = AccumulationController(LossDriven(), model.parameters(), MICRO_BATCH, WINDOW)
    with pytest.raises(ValueError, match="no optimizer"):
        next(iter(no_opt.micro_batches(data)))


def test_help_is_readable():
    """Every public name of the one-line form has a docstring saying what it does, its shapes and errors."""
    for obj in (AccumulationController.micro_batches, MicroBatch, MicroBatch.backward, MicroBatch.weight,
                MicroBatch.last, AccumulationController.start_clock, AccumulationController.begin_step,
                AccumulationController.window_due, AccumulationController.after_micro_step,
                AccumulationController.extra, AccumulationController.end_step, AccumulationController.window_stats,
                AccumulationController.end_window):
        assert obj.__doc__ and len(obj.__doc__) > 40, obj
    assert "Raises" in AccumulationController.micro_batches.__doc__ and "Raises" in MicroBatch.backward.__doc__
