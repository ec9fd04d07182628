"""Training loop: data parallel exactness, resume, the last smaller batch, fault 3 (local loss every epoch)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import random_trips
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer, epoch_batches


@pytest.fixture(scope="module")
def trips_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "trips.jsonl"
    random_trips(120, seed=21, max_len=25).to_jsonl(path)
    return str(path)


def cfg(trips_file, out, **kw):
    base = dict(data=trips_file, format="deeptte", epochs=1, batch_size=16, seed=3, out=str(out),
                progress=False, threads=1, preset="paper")  # the paper's configuration (checkpoint.pt: best epoch)
    base.update(kw)
    return TrainConfig(**base)


def params(path):
    return ckpt.load(path)["model_state"]


def test_epoch_batches_cover_every_trip_once_with_a_smaller_last_batch():
    lengths = np.random.default_rng(0).integers(3, 50, 37)
    batches = epoch_batches(lengths, 8, seed=1, epoch=0)
    sizes = sorted(len(b) for b in batches)
    assert sizes == [5, 8, 8, 8, 8]
    assert sorted(np.concatenate(batches).tolist()) == list(range(37))
    again = epoch_batches(lengths, 8, seed=1, epoch=0)
    assert all((a == b).all() for a, b in zip(batches, again))
    assert any((a != b).any() for a, b in zip(batches, epoch_batches(lengths, 8, seed=1, epoch=1)) if len(a) == len(b))


def test_train_writes_metrics_summary_and_checkpoint(trips_file, tmp_path):
    s = Trainer(cfg(trips_file, tmp_path, epochs=2, batch_size=1000)).fit()  # one batch, B = whole split
    rows = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert [r["epoch"] for r in rows] == [1, 2] and all(r["type"] == "epoch" for r in rows)
    assert set(rows[0]) >= {"epoch", "train_loss", "val_mape", "val_mae", "val_rmse", "samples_per_s", "wall_s"}
    summ = json.load(open(tmp_path / "summary.json"))
    for k in ("test_mape", "test_mae", "test_rmse", "baseline_const_speed_mape", "baseline_mean_time_mape",
              "n_train", "n_val", "n_test", "dropped"):
        assert k in summ
    assert summ["n_train"] + summ["n_val"] + summ["n_test"] == 120
    st = ckpt.load(tmp_path / "checkpoint.pt")
    assert st["best_val_mape"] == pytest.approx(min(r["val_mape"] for r in rows))
    assert {"model_config", "norm_stats", "drivers", "optimizer_state", "rng"} <= set(st)
    assert s["test_mape"] > 0
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batch_of_one_trains(trips_file, tmp_path):
    Trainer(cfg(trips_file, tmp_path, batch_size=1, max_steps=5)).fit()
    assert ckpt.load(tmp_path / "last.pt")["step"] == 5


@pytest.mark.parametrize("compat", ["fixed", "original"])
def test_fault3_local_loss_trained_every_epoch(trips_file, tmp_path, compat):
    tr = Trainer(cfg(trips_file, tmp_path, epochs=2, compat=compat))
    local_grads = []
    orig = tr.train_step

    def spy(gb, use_local):
        loss = orig(gb, use_local)
        g = tr.model.local.out.weight.grad
        local_grads.append((tr.epoch, 0.0 if g is None else g.abs().sum().item()))
        return loss

    tr.train_step = spy
    tr.fit()
    epoch2 = [g for e, g in local_grads if e == 1]
    assert epoch2 and all(g > 0 for g in epoch2) == (compat == "fixed")


@pytest.mark.parametrize("schedule,ema", [("constant", None), ("cosine", None), ("constant", 0.8)])
def test_resume_continues_where_it_stopped(trips_file, tmp_path, schedule, ema):
    kw = dict(dtype="float64", epochs=3, lr_schedule=schedule, ema_decay=ema)
    Trainer(cfg(trips_file, tmp_path / "full", **kw)).fit()
    Trainer(cfg(trips_file, tmp_path / "part", max_steps=9, **kw)).fit()  # stops mid-epoch 2
    assert ckpt.load(tmp_path / "part" / "last.pt")["step"] == 9
    Trainer(cfg(trips_file, tmp_path / "part", resume=True, **kw)).fit()
    a, b = params(tmp_path / "full" / "last.pt"), params(tmp_path / "part" / "last.pt")
    if ema is not None:  # the weight average resumes too: the validated (best) weights agree
        a.update({"ema." + k: v for k, v in params(tmp_path / "full" / "checkpoint.pt").items()})
        b.update({"ema." + k: v for k, v in params(tmp_path / "part" / "checkpoint.pt").items()})
    assert ckpt.load(tmp_path / "part" / "last.pt")["step"] == ckpt.load(tmp_path / "full" / "last.pt")["step"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = [r for r in map(json.loads, open(tmp_path / "part" / "metrics.jsonl")) if r["type"] == "epoch"]
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    # the learning rate of each epoch: lr, or lr × ½(1 + cos(π·e/E)) for epochs e = 0, 1, 2 of E = 3
    want = [1e-3 * (0.5 * (1 + math.cos(math.pi * e / 3)) if schedule == "cosine" else 1.0) for e in range(3)]
    assert [r["lr"] for r in rows] == pytest.approx(want, rel=1e-12)


def test_resume_to_more_epochs_averages_the_weights_as_a_fresh_run(trips_file, tmp_path):
    """--swa-start 0.5 averages from epoch ⌊0.5·epochs⌋: a finished 2-epoch run continued to --epochs 4
    starts its average afresh at epoch 3, so it ends with the weights a fresh 4-epoch run ends with (it kept
    the 2-epoch run's epoch-2 steps in the average before)."""
    kw = dict(dtype="float64", swa_start=0.5, select="last")
    Trainer(cfg(trips_file, tmp_path / "fresh", epochs=4, **kw)).fit()
    Trainer(cfg(trips_file, tmp_path / "ext", epochs=2, **kw)).fit()
    Trainer(cfg(trips_file, tmp_path / "ext", epochs=4, resume=True, **kw)).fit()
    a, b = params(tmp_path / "fresh" / "checkpoint.pt"), params(tmp_path / "ext" / "checkpoint.pt")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_resume_with_fewer_epochs_says_when_the_average_starts(trips_file, tmp_path, capsys, caplog):
    """Issue 62: a 20-epoch run with --swa-start 0.5 stopped in epoch 4, resumed with --epochs 4 (whose average
    starts at epoch 3, already passed), says the average starts now (before: a warning that the average "began at
    epoch 11 of 20" and "continues the average it holds", in a run that never reached epoch 11)."""
    kw = dict(dtype="float64", swa_start=0.5, select="last")
    Trainer(cfg(trips_file, tmp_path / "r", epochs=20, max_steps=20, **kw)).fit()  # 6 steps an epoch: in epoch 4
    capsys.readouterr()
    Trainer(cfg(trips_file, tmp_path / "r", epochs=4, resume=True, **kw)).fit()
    said = capsys.readouterr().out + caplog.text
    assert "began at epoch" not in said and "average it holds" not in said, said
    assert "the weight average starts now, in epoch 4 of 4" in said, said


def test_resume_refuses_another_preset(trips_file, tmp_path):
    out = tmp_path / "r"
    Trainer(cfg(trips_file, out, preset="real", max_steps=2)).fit()
    with pytest.raises(ValueError, match="trained with --preset real, not paper"):
        cfg(trips_file, out, resume=True)  # preset="paper"
    assert cfg(trips_file, out, resume=True, preset="auto").preset == "real"


@pytest.mark.parametrize("k", [1, 2])
def test_ema_decay_validates_and_checkpoints_the_moving_average(trips_file, tmp_path, k):
    decay = 0.7
    tr = Trainer(cfg(trips_file, tmp_path, dtype="float64", epochs=1, batch_size=16, ema_decay=decay,
                     accumulation=f"fixed:{k}"))
    after_step, orig = [], tr.train_step

    def spy(gb, use_local):
        loss = orig(gb, use_local)
        after_step.append({k: v.detach().clone() for k, v in tr.model.named_parameters()})
        return loss

    tr.train_step = spy
    tr.fit()
    assert len(after_step) >= 3
    # EMA_1 = θ_1, EMA_t = d·EMA_{t−1} + (1 − d)·θ_t with d = decay^k: the decay is per micro-batch
    d = decay**k
    want = dict(after_step[0])
    for theta in after_step[1:]:
        want = {n: d * want[n] + (1 - d) * theta[n] for n in want}
    best, last = params(tmp_path / "checkpoint.pt"), ckpt.load(tmp_path / "last.pt")
    for n, v in want.items():
        assert torch.allclose(best[n], v, rtol=1e-12, atol=1e-15), n  # checkpoint.pt: the validated average
        assert torch.equal(last["model_state"][n], after_step[-1][n]), n  # last.pt: the trained weights
    assert not all(torch.equal(best[n], after_step[-1][n]) for n in want)
    # what validation scored is the average: re-scoring checkpoint.pt gives the best validation MAPE
    from stfast.train.run_data import evaluate

    tr.model.load_state_dict(best)
    assert evaluate(tr.model, tr.data.val_ds)["mape"] == pytest.approx(last["best_val_mape"], rel=1e-12)
    with pytest.raises(ValueError, match="--ema-decay"):
        TrainConfig(ema_decay=1.0).validate()


def _cli(args, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "stfast.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.mark.slow
def test_data_parallel_two_gloo_ranks_equal_one_process(trips_file, tmp_path):
    # --dropout 0: dropout's masks are drawn per rank, so only a model without dropout is exactly the same
    # (the real-data preset's other options, weekday/weekend and the weight average, are covered)
    common = ["train", "--data", trips_file, "--format", "deeptte", "--dtype", "float64", "--batch-size", "9",
              "--max-steps", "10", "--epochs", "5", "--seed", "5", "--threads", "1", "--no-progress", "--dropout", "0",
              # k = 1 on both: with --nproc > 1 the default accumulates 2 micro-batches
              "--accumulation", "1", "--members", "2"]
    r1 = _cli(common + ["--out", str(tmp_path / "one")])
    assert r1.returncode == 0, r1.stderr
    r2 = _cli(common + ["--out", str(tmp_path / "two"), "--nproc", "2"])
    assert r2.returncode == 0, r2.stderr + r2.stdout
    assert "world size 2" in r2.stdout
    a, b = ckpt.load(tmp_path / "one" / "last.pt"), ckpt.load(tmp_path / "two" / "last.pt")
    assert a["step"] == b["step"] == 10
    for k, v in a["model_state"].items():
        diff = (v - b["model_state"][k]).abs().max().item() if v.is_floating_point() else 0
        assert diff < 1e-9, (k, diff)
    # and training moved the parameters (the comparison is not between two untouched models)
    # the real preset with two members (what the runs used)
    fresh = Trainer(cfg(trips_file, tmp_path / "init", dtype="float64", seed=5, preset="real", dropout=0.0, members=2))
    out_w = "members.0.entire.out.weight"
    init = fresh.model.state_dict()[out_w]
    assert (a["model_state"][out_w] - init).abs().max().item() > 1e-4


def test_cli_rejects_bad_arguments_with_one_line(trips_file, tmp_path):
    r = _cli(["train", "--data", trips_file, "--batch-size", "0", "--out", str(tmp_path)])
    assert r.returncode == 2 and "--batch-size must be ≥ 1" in r.stderr
    r = _cli(["train", "--data", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)])
    assert r.returncode == 2 and "missing.jsonl" in r.stderr


def test_train_drops_the_trainer_before_leaving_the_process_group(trips_file, tmp_path, monkeypatch):
    """Issue 53, item 6: the trainer, its gradient sync (whose hooks on the parameters kept it, its buckets and the
    model alive in a cycle the garbage collector cannot see) and every tensor of the run are released before
    dp.shutdown() destroys the process group, with the interpreter alive: a release left to the interpreter's
    finalization is where a Gloo rank aborted ("terminate called without an active exception", reproduced 1 in 21
    runs). Both were still alive during shutdown before."""
    import gc
    import weakref

    from stfast.parallel import data_parallel as dp
    from stfast.parallel.comm import GradientSync
    from stfast.train import trainer as tr_mod

    class OneRank:  # a world of one: a sum is the tensor itself
        def all_reduce(self, tensor, op="sum", async_op=False):
            return type("Done", (), {"wait": lambda self: None})() if async_op else None

    made, seen = [], []
    init = tr_mod.Trainer.__init__

    def record(self, *a, **k):
        init(self, *a, **k)
        self.grad_sync = GradientSync(self.model.parameters(), OneRank())  # as under --nproc: hooks on the model
        made.extend([weakref.ref(self), weakref.ref(self.grad_sync), weakref.ref(next(self.model.parameters()))])

    def shutdown(wait_for_peers=False):
        gc.collect()
        seen.append((wait_for_peers, [r() is None for r in made]))

    monkeypatch.setattr(tr_mod.Trainer, "__init__", record)
    monkeypatch.setattr(dp, "shutdown", shutdown)
    tr_mod.train(cfg(trips_file, tmp_path / "run", max_steps=2))
    assert seen == [(True, [True, True, True])]
