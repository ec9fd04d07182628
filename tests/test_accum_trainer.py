"""Gradient accumulation in the trainer: k micro-batches ≡ one batch of their union (1 and 2 Gloo ranks,
float64, unequal shards, an empty shard), exactly one all-reduce per optimizer step and after the LAST
micro-step, the LR rule, windows in metrics.jsonl, resume."""
import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import test_trainer
import torch

from stfast.accum.controller import AccumulationController
from stfast.accum.schedulers import FixedScheduler
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer

trips_file = test_trainer.trips_file  # the fixture: 120 random trips

# micro-batch sizes 5, 1 and 7 over 2 ranks: shards 3/2, 1/0 (an empty shard) and 4/3
MICRO = [5, 1, 7]
STEPS = 3


def cfg(trips_file, out, **kw):
    base = {"data": trips_file, "format": "deeptte", "epochs": 1, "batch_size": 16, "seed": 3, "out": str(out),
                "progress": False, "threads": 1, "dtype": "float64", "lr_scaling": "none", "accumulation": "1",
            "preset": "paper"}
    base.update(kw)
    return TrainConfig(**base)


def micro_batches(step):
    rng = np.random.default_rng(100 + step)
    perm = rng.permutation(80)
    cuts = np.cumsum(MICRO)[:-1]
    return np.split(perm[:sum(MICRO)], cuts)


def run_one_process(trips_file, out, accumulate: bool):
    tr = Trainer(cfg(trips_file, out))
    for s in range(STEPS):
        mb = micro_batches(s)
        tr.train_step(mb if accumulate else np.concatenate(mb), use_local=True)
    return {k: v.clone() for k, v in tr.model.state_dict().items()}


def assert_close(a, b, tol=1e-9):
    for k, v in a.items():
        if v.is_floating_point():
            assert (v - b[k]).abs().max().item() < tol, k


def test_k_micro_batches_equal_one_batch_of_their_union_one_process(trips_file, tmp_path):
    big = run_one_process(trips_file, tmp_path / "a", accumulate=False)
    acc = run_one_process(trips_file, tmp_path / "b", accumulate=True)
    assert_close(big, acc)
    # and the comparison is not between two untouched models, nor insensitive to the loss scaling
    tr = Trainer(cfg(trips_file, tmp_path / "c"))
    init = tr.model.state_dict()["entire.out.weight"].clone()
    assert (big["entire.out.weight"] - init).abs().max().item() > 1e-4


WORKER = textwrap.dedent("""
    import sys, numpy as np, torch, torch.distributed as dist
    sys.path.insert(0, {tests!r})
    import test_accum_trainer as t
    from stfast.train.trainer import Trainer
    events = []
    real = dist.all_reduce
    def counting(tensor, *a, **kw):
        events.append("all_reduce")
        return real(tensor, *a, **kw)
    dist.all_reduce = counting
    tr = Trainer(t.cfg({data!r}, {out!r}, noise_scale="plain"))  # B_adam would wait for Adam's warm-up
    tr.model.entire.out.weight.register_hook(lambda g: events.append("backward"))
    per_step = []
    for s in range(t.STEPS):
        events.clear()
        tr.train_step(t.micro_batches(s), use_local=True)
        per_step.append(list(events))
    torch.save({{"state": tr.model.state_dict(), "events": per_step, "noise_n": tr.accum.noise.n,
                "n_buckets": len(tr.grad_sync.buckets)}},
               {out!r} + f"/rank{{tr.info.rank}}.pt")
    from stfast.parallel.data_parallel import shutdown
    shutdown(wait_for_peers=True)  # a rank that tears Gloo down while its peer still works may abort
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_change_of_k_rescales_adams_second_moments_by_what_it_does_to_the_mean_square_gradient():
    """A move from k to k' multiplies Adam's exp_avg_sq by (1 + φ/(k'B)) / (1 + φ/(kB)) (φ the noise scale's
    bound), by k/k' while there is no bound, and leaves it alone when k stays or the optimizer has none; the first
    moments and the parameters are not touched."""
    w = torch.nn.Parameter(torch.randn(7))
    opt = torch.optim.Adam([w], lr=1e-2)
    ctl = AccumulationController(FixedScheduler(1), [w], micro_batch=8, window=100, optimizer=opt)
    (w.square().sum() + (w * torch.randn(7)).sum()).backward()
    opt.step()
    v0, m0, w0 = opt.state[w]["exp_avg_sq"].clone(), opt.state[w]["exp_avg"].clone(), w.detach().clone()
    assert math.isnan(ctl.noise.lower_confidence())
    ctl.set_k(4)  # no noise scale yet: the noise-dominated limit
    torch.testing.assert_close(opt.state[w]["exp_avg_sq"], v0 / 4)
    ctl.set_k(4)
    torch.testing.assert_close(opt.state[w]["exp_avg_sq"], v0 / 4)
    torch.testing.assert_close(opt.state[w]["exp_avg"], m0)
    torch.testing.assert_close(w.detach(), w0)
    ctl.noise.lower_confidence = lambda: 24.0  # φ = 3 B
    assert ctl.second_moment_factor(4, 2) == pytest.approx((1 + 3 / 2) / (1 + 3 / 4))
    ctl.set_k(2)
    torch.testing.assert_close(opt.state[w]["exp_avg_sq"], v0 / 4 * (2.5 / 1.75))
    assert ctl.second_moment_factor(2, 2) == 1.0
    ctl.noise.lower_confidence = lambda: -40.0  # a negative trace estimate: no noise, v̂ unchanged (not negative)
    assert ctl.second_moment_factor(1, 4) == 1.0
    sgd = torch.optim.SGD([w], lr=1e-2, momentum=0.9)
    AccumulationController(FixedScheduler(1), [w], micro_batch=8, window=100, optimizer=sgd).set_k(4)  # no v: no-op


@pytest.mark.slow
def test_k_micro_batches_on_two_gloo_ranks_equal_one_batch_and_sync_once_after_the_last(trips_file, tmp_path):
    big = run_one_process(trips_file, tmp_path / "one", accumulate=False)
    out = tmp_path / "two"
    out.mkdir()
    script = WORKER.format(tests=os.path.dirname(__file__), data=trips_file, out=str(out))
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    for rank in range(2):
        r = torch.load(out / f"rank{rank}.pt", weights_only=False)
        assert_close(big, r["state"])
        for ev in r["events"]:
            # one synchronization per optimizer step, after every micro-step's backward (not after the
            # first): GradientSync's bucket all-reduces plus one of the noise statistics, none earlier
            assert ev.count("all_reduce") == r["n_buckets"] + 1, ev
            assert "all_reduce" not in ev[:max(i for i, e in enumerate(ev) if e == "backward")], ev
            # rank 1 has an empty shard in the 1-trip micro-batch: 2 backward passes, rank 0 has 3
            assert ev.count("backward") == (3 if rank == 0 else 2), ev
        assert r["noise_n"] == STEPS  # the noise scale was estimated from the units of every step


def test_learning_rate_follows_the_effective_batch(trips_file, tmp_path):
    for rule, factor in (("sqrt", 2.0), ("linear", 4.0), ("none", 1.0)):
        tr = Trainer(cfg(trips_file, tmp_path / rule, lr_scaling=rule, lr=1e-3, accumulation="fixed:4"))
        assert tr.opt.param_groups[0]["lr"] == pytest.approx(1e-3 * factor)


def test_fit_with_accumulation_writes_windows_and_resumes(trips_file, tmp_path):
    # plain: B_adam waits for ADAM_WARMUP_STEPS of Adam, more than these 18 steps
    kw = {"epochs": 3, "batch_size": 8, "accumulation": "2", "accum_window": 2, "noise_scale": "plain"}
    Trainer(cfg(trips_file, tmp_path / "full", **kw)).fit()
    with open(tmp_path / "full" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    windows = [r for r in rows if "window" in r]
    assert windows and all(r["k"] == 2 and r["steps"] == 2 for r in windows)
    assert {r["type"] for r in rows} == {"epoch", "window"} and windows == [r for r in rows if r["type"] == "window"]
    # 84 training trips = 11 micro-batches (10 of 8, one of 4) per epoch → 6 optimizer steps (the last
    # with k=1), 18 steps in 3 epochs = 9 windows of 2 steps holding every trip 3 times
    assert len(windows) == 9 and sum(r["trips"] for r in windows) == 3 * 84
    assert all(r["window_s"] > 0 and r["steps_per_s"] > 0 for r in windows)
    assert [r["wall_s"] for r in windows] == sorted(r["wall_s"] for r in windows)
    assert all(0 <= r["comm_share"] <= 1 and r["samples_per_s"] > 0 for r in windows)
    assert windows[-1]["noise_scale"] is not None  # estimable from micro-steps on one rank
    assert [r["epoch"] for r in rows if "epoch" in r] == [1, 2, 3]
    full = ckpt.load(tmp_path / "full" / "last.pt")
    assert full["step"] == 3 * 6 and full["accumulation"]["k"] == 2
    Trainer(cfg(trips_file, tmp_path / "part", max_steps=8, **kw)).fit()
    Trainer(cfg(trips_file, tmp_path / "part", resume=True, **kw)).fit()
    part = ckpt.load(tmp_path / "part" / "last.pt")
    assert part["step"] == full["step"]
    for k, v in full["model_state"].items():
        assert torch.equal(v, part["model_state"][k]), k


def test_time_budget_stops_at_a_window_end(trips_file, tmp_path):
    Trainer(cfg(trips_file, tmp_path, epochs=50, batch_size=8, accum_window=1, time_budget_s=1e-6)).fit()
    st = ckpt.load(tmp_path / "last.pt")
    assert st["step"] == 1 and st["epoch"] == 0
    # no epoch ended: the final evaluation's report, no learning curve (before: one with no curve on it, and a
    # --max-steps run stopped alike wrote no report)
    assert (tmp_path / "report.html").is_file() and not (tmp_path / "learning_curve.png").exists()


def test_time_budget_stops_within_a_window(trips_file, tmp_path):
    # a window of 50 steps, budget spent after the first: the run stops after step 1, not at the window's end,
    # and the partial window still gets its metrics row
    Trainer(cfg(trips_file, tmp_path, epochs=50, batch_size=8, accum_window=50, time_budget_s=1e-6)).fit()
    st = ckpt.load(tmp_path / "last.pt")
    assert st["step"] == 1 and st["epoch"] == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in rows if "window" in r]
    assert len(windows) == 1 and windows[0]["steps"] == 1


def test_bad_accumulation_arguments(trips_file, tmp_path):
    for kw, msg in (({"accumulation": "fixed:0"}, "--accumulation"), ({"accumulation": "often"}, "--accumulation"),
                    ({"lr_scaling": "cubic"}, "--lr-scaling"), ({"accum_window": 0}, "--accum-window"),
                    ({"time_budget_s": 0.0}, "--time-budget"), ({"noise_scale": "fisher"}, "--noise-scale"),
                    ({"accumulation": "rl", "accum_start": 3}, "--accum-start must be one of 1, 2, 4, 8, 16"),
                    ({"accumulation": "fixed:2", "accum_start": 4}, "--accum-start 4 is the first k of")):
        with pytest.raises(ValueError, match=msg):
            cfg(trips_file, tmp_path, **kw).validate()


def test_controller_owns_the_learning_rate_rule_for_k_and_reduces_its_decision():
    """The controller sets lr · lr_scale(k) · the caller's schedule factor from construction on, after every
    change of k (set_k, a window's decision), and sums the decision (rank 0's k, stop flag and second-moment factor)
    with the reduce function it was given."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    reduced = []
    ctl = AccumulationController(FixedScheduler(4), [w], micro_batch=4, window=1, optimizer=opt, lr_scaling="linear",
                                 reduce=lambda a: reduced.append(a.copy()) or a)
    assert ctl.k == 4 and opt.param_groups[0]["lr"] == pytest.approx(0.4)
    ctl.apply_lr(0.5)  # e.g. a cosine schedule's factor for this epoch
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    ctl.set_k(2)  # the factor stays
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    w.grad = torch.ones(3)
    ctl.begin_step()
    ctl.end_step(torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64), 8, step_s=0.01, sync_s=0.0)
    stop, row = ctl.end_window(0.5, out_of_time=False)
    assert not stop and row["k_next"] == 4 and ctl.k == 4 and opt.param_groups[0]["lr"] == pytest.approx(0.2)
    # k, stop, and the factor on Adam's second moments for the move 2 → 4 (no noise scale yet: 2/4)
    assert len(reduced) == 1 and reduced[0].tolist() == [4.0, 0.0, 0.5]


def test_controller_charges_the_work_between_steps_to_them_but_not_an_epoch_end():
    """A window's wall time runs from the end of one step to the end of the next (the slicer's bookkeeping,
    metrics and stop checks happen between steps, once per step); its overhead is that wall time minus
    the forward + backward compute. restart_step_clock() leaves out an epoch's validation."""
    w = torch.nn.Parameter(torch.ones(3))
    ctl = AccumulationController(FixedScheduler(1), [w], micro_batch=4, window=3)
    reduced = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    w.grad = torch.ones(3)
    ctl.begin_step()
    ctl.end_step(reduced, 4, step_s=0.01, sync_s=0.002, compute_s=0.006)  # first step: its own time
    time.sleep(0.05)  # work between steps
    ctl.end_step(reduced, 4, step_s=0.01, sync_s=0.002, compute_s=0.006)
    ctl.restart_step_clock()
    time.sleep(0.2)  # an epoch's validation: not counted
    ctl.end_step(reduced, 4, step_s=0.01, sync_s=0.002, compute_s=0.006)
    st = ctl.window_stats(0.5)
    assert st.steps == 3 and st.comm_s == pytest.approx(0.006)
    assert 0.01 + 0.05 <= st.wall_s < 0.01 + 0.05 + 0.01 + 0.1
    assert st.overhead_s == pytest.approx(st.wall_s - 0.018)
    assert st.fixed_s == st.overhead_s > st.comm_s


def _windows(out):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "window" in r]


def test_one_process_at_k1_estimates_the_noise_scale_it_is_told_to(trips_file, tmp_path):
    """One process at k = 1 has one unit per step: the differenced estimator over consecutive steps gives
    the noise scale once Adam has warmed up — B_adam by default (Adam), B_simple under --noise-scale plain,
    on the same batches and weights, different values; the kind travels in the checkpoint, and a resume under
    the other kind starts its estimate afresh."""
    # 7 epochs of 11 steps: past Adam's warm-up (ADAM_WARMUP_STEPS) and the estimate's first min_updates steps
    kw = {"epochs": 7, "batch_size": 8, "accumulation": "1", "accum_window": 3}
    last = {}
    for noise in (None, "plain"):
        out = tmp_path / str(noise)
        Trainer(cfg(trips_file, out, noise_scale=noise, **kw)).fit()
        windows = _windows(out)
        kind = noise or "adam"
        assert {r["noise_kind"] for r in windows} == {kind}
        last[kind] = windows[-1]["noise_scale"]
        st = ckpt.load(out / "last.pt")["accumulation"]
        assert st["noise_kind"] == kind and st["noise"]["n"] > 0
    assert last["adam"] is not None and last["plain"] is not None and last["adam"] != last["plain"]
    tr = Trainer(cfg(trips_file, tmp_path / "plain", noise_scale="adam", resume=True, **{**kw, "epochs": 8}))
    assert tr.accum.noise.n == 0  # the checkpoint's estimate was of B_simple
    tr = Trainer(cfg(trips_file, tmp_path / "plain", noise_scale="plain", resume=True, **{**kw, "epochs": 8}))
    assert tr.accum.noise.n > 0


def test_adam_statistics_wait_for_adams_warm_up_and_refresh_the_preconditioner():
    """No B_adam statistics while Adam has taken fewer than ADAM_WARMUP_STEPS steps (its v̂ is noise); then the
    preconditioner is read every PRECOND_REFRESH_STEPS steps, not every step."""
    from stfast.accum import controller as ctl_mod
    from stfast.accum.noise import ADAM_WARMUP_STEPS

    w = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.Adam([w], lr=1e-2)
    ctl = AccumulationController(FixedScheduler(2), [w], micro_batch=4, window=100, optimizer=opt)
    assert ctl.noise_kind == "adam"
    reads = []
    real = ctl_mod.adam_preconditioner
    ctl_mod.adam_preconditioner = lambda *a: reads.append(1) or real(*a)
    try:
        for step in range(ADAM_WARMUP_STEPS + 2 * ctl_mod.PRECOND_REFRESH_STEPS):
            ctl.begin_step()
            w.grad = None
            for j in range(2):
                (w * torch.randn(5)).sum().backward()
                ctl.after_micro_step(2, 4, last=j == 1)
            ctl.end_step(ctl.extra(1.0), 4, step_s=0.01, sync_s=0.0, compute_s=0.005)
            opt.step()
            assert ctl.noise.n == max(0, step + 1 - ADAM_WARMUP_STEPS), step
    finally:
        ctl_mod.adam_preconditioner = real
    # one read per step while warming up (None each time), then one every PRECOND_REFRESH_STEPS
    assert len(reads) == ADAM_WARMUP_STEPS + 2


@pytest.mark.slow
def test_two_ranks_estimate_b_adam_from_their_shards(trips_file, tmp_path):
    """Two Gloo ranks at k = 1: the units are the ranks' shards (their preconditioned norms summed in the
    gradient all-reduce); B_adam is estimated (7 epochs: past Adam's warm-up)."""
    out = tmp_path / "run"
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import test_accum_trainer as t
        from stfast.train.trainer import train
        # train(), not Trainer.fit(): it leaves the process group through a barrier (a rank that exits
        # while its peer still writes the summary may abort Gloo)
        train(t.cfg({str(trips_file)!r}, {str(out)!r}, epochs=7, batch_size=8, accum_window=3))
    """)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    last = _windows(out)[-1]
    assert last["noise_kind"] == "adam" and last["noise_scale"] is not None
    st = ckpt.load(out / "last.pt")["accumulation"]
    assert st["noise"]["n"] > 0


@pytest.mark.parametrize("spec", ["goodput", "rl"])
def test_an_adaptive_scheduler_starts_at_accum_start(spec, trips_file, tmp_path):
    """--accum-start 4: the first window runs at k = 4 with the learning rate of k = 4 (√4 under sqrt), and the
    scheduler decides from there; without it the first window runs at k = 1."""
    kw = {"epochs": 2, "batch_size": 4, "accumulation": spec, "accum_window": 2, "lr_scaling": "sqrt", "lr": 1e-3}
    tr = Trainer(cfg(trips_file, tmp_path / "k4", accum_start=4, **kw))
    assert tr.accum.k == 4 and tr.accum.scheduler.k == 4
    assert tr.opt.param_groups[0]["lr"] == pytest.approx(2e-3)
    tr.fit()
    first = _windows(tmp_path / "k4")[0]
    assert first["k"] == 4 and first["trips"] == 2 * 4 * 4  # 2 steps of 4 micro-batches of 4 trips
    Trainer(cfg(trips_file, tmp_path / "k1", **kw)).fit()
    assert _windows(tmp_path / "k1")[0]["k"] == 1
