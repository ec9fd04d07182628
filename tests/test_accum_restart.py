"""Accumulation decisions survive a restart (issue 22, item 3): the scheduler's and the RL agent's state
and the open window travel in the checkpoint, so after a kill and ``--resume`` — or a torchrun restart —
the run continues at the k it had, with the same scheduler (replay memory, exploration generator, EMA
statistics), for ``--accumulation rl``, ``goodput`` and a fixed k."""
import copy
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import random_trips
from test_reliability import _env, _kill_tree, _rank_pid, _torchrun, _wait_for_checkpoint

from stfast.accum.agent import RLScheduler
from stfast.accum.schedulers import GoodputScheduler, make_scheduler
from stfast.accum.window import WindowStats
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer

SPECS = ["rl", "goodput", "fixed:4"]
WINDOW = 2  # --accum-window of the runs below: checkpoints every 3 steps fall mid-window
CLI = ["--preset", "paper", "--format", "deeptte", "--epochs", "10", "--batch-size", "4", "--seed", "3", "--threads", "1",
       "--no-progress", "--accum-window", str(WINDOW), "--checkpoint-every", "3"]


@pytest.fixture(scope="module")
def trips_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "trips.jsonl"
    random_trips(120, seed=22, max_len=25).to_jsonl(path)
    return str(path)


@pytest.fixture(autouse=True)
def one_thread():
    """The RL agent's pre-training (a small MLP, thousands of tiny steps) in one thread: with two on this
    shared 2-core machine it took 9× as long (180 s against 20 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _window(k: int, i: int, rng: np.random.Generator) -> WindowStats:
    """A plausible window at k: 4 steps of k micro-steps (50 ms each) plus 40 ms per step that does not
    grow with k, ±10 % noise; the noise scale grows over training, so adaptive schedulers move k."""
    steps, micro = 4, 16
    fixed = steps * 0.04
    wall = (steps * k * 0.05 + fixed) * rng.uniform(0.9, 1.1)
    return WindowStats(k=k, micro_batch=micro, steps=steps, trips=steps * k * micro, wall_s=wall, comm_s=0.5 * fixed,
                       loss_slope=-0.01 * rng.uniform(0.5, 1.5), noise_scale=8.0 * 1.4 ** i, budget_used=i / 40,
                       overhead_s=fixed)


def _same_state(a, b, path="") -> None:
    """Deep equality of two state dicts (tensors, arrays, floats with nan, nested containers)."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _same_state(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), path
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, path


@pytest.mark.parametrize("spec", SPECS)
def test_a_scheduler_restored_from_a_checkpoint_decides_as_the_original(spec, tmp_path):
    """The state goes through a checkpoint file (ckpt.save_atomic / load, as the trainer writes it) into a
    freshly built scheduler; both then see the same windows and must choose the same k every time (rl:
    exploration draws, replay memory and online updates included) and end in the same state."""
    rng = np.random.default_rng(7)
    original = make_scheduler(spec, seed=0)
    ks = [original.observe(_window(original.k, i, rng)) for i in range(12)]
    if spec != "fixed:4":  # the saved state is not the initial one: k moved and the scheduler learned
        assert len(set(ks)) > 1 and original.k != 1, ks
    if isinstance(original, RLScheduler):
        assert len(original.agent.replay) == 11 and 0 < original.agent.n_recorded < original.update_every
    ckpt.save_atomic({"scheduler": original.state_dict()}, tmp_path / "s.pt")
    restored = make_scheduler(spec, seed=0)
    restored.load_state_dict(ckpt.load(tmp_path / "s.pt")["scheduler"])
    assert restored.k == original.k
    later = [np.random.default_rng(8), np.random.default_rng(8)]
    for i in range(12, 30):  # spans an online update of the agent (every 8 recorded windows)
        k_a = original.observe(_window(original.k, i, later[0]))
        k_b = restored.observe(_window(restored.k, i, later[1]))
        assert k_a == k_b, i
    _same_state(original.state_dict(), restored.state_dict())
    if isinstance(original, GoodputScheduler):
        assert math.isfinite(original.times.t_micro)  # the step-time model's EMA is part of what matched


def _cfg(trips_file, out, **kw):
    base = {"data": trips_file, "format": "deeptte", "epochs": 4, "batch_size": 8, "seed": 3, "out": str(out),
            "progress": False, "threads": 1, "accum_window": 3, "preset": "paper"}
    base.update(kw)
    return TrainConfig(**base)


def _windows(out) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r.get("type") == "window"]


@pytest.mark.parametrize("spec", ["rl", "goodput"])
def test_resume_restores_the_whole_accumulation_state_and_runs_at_its_k(spec, trips_file, tmp_path, monkeypatch):
    """A run stopped mid-window (--max-steps 7, windows of 3 steps): the resumed trainer holds exactly the
    checkpoint's accumulation state — scheduler, noise statistics, window counters — and runs its first
    window at the checkpoint's k. The checkpoint is given k = 4 (as if the scheduler had chosen it; on
    this tiny run it stays at 1 or 2), so a resume that fell back to the first k (1) is seen. The resumed RL
    agent comes from the checkpoint alone: no pre-training (~20 s) on resume."""
    out = tmp_path / "run"
    Trainer(_cfg(trips_file, out, accumulation=spec, max_steps=7)).fit()
    st = ckpt.load(out / "last.pt")
    acc = st["accumulation"]
    assert st["step"] == 7 and acc["n_windows"] == 2 and acc["window"]["w_steps"] == 1
    acc["k"] = acc["scheduler"]["k"] = 4
    for g in st["optimizer_state"]["param_groups"]:  # and the learning rate of k = 4 (lr_scaling sqrt)
        g["lr"] *= 2
    ckpt.save_atomic(st, out / "last.pt")
    from stfast.accum import agent as agent_mod

    monkeypatch.setattr(agent_mod, "_pretrained_state", lambda *a: pytest.fail("the agent was pre-trained on resume"))
    tr = Trainer(_cfg(trips_file, out, accumulation=spec, resume=True, max_steps=12))
    got = copy.deepcopy(tr.accum.state_dict())
    assert got.pop("wall_before") >= acc.pop("wall_before")  # elapsed: the time before the stop, and on
    _same_state(got, acc)
    tr.fit()
    w = _windows(out)
    assert [r["window"] for r in w] == [1, 2, 3, 4]
    # the window open at the stop closed after its 3 steps (1 before, 2 after) at the checkpoint's k
    assert w[2]["k"] == 4 and w[2]["steps"] == 3 and w[2]["step"] == 9
    assert w[3]["k"] == w[2]["k_next"]


def _check_continued(out, spec: str, killed: dict | None = None) -> None:
    """The resumed run's window rows continue the killed run's: numbered 1..N without a gap or a repeat,
    every window at the k the previous one chose (across the restart too), every optimizer step counted
    in exactly one window, and (rl) one transition in the agent's replay memory per decision, none lost.
    ``killed``: the checkpoint resumed from, whose k the first window after it must have run at, and
    whose replay memory the final one must begin with."""
    final = ckpt.load(out / "last.pt")
    w = _windows(out)
    assert [r["window"] for r in w] == list(range(1, len(w) + 1)) and len(w) == final["accumulation"]["n_windows"]
    assert all(b["k"] == a["k_next"] for a, b in zip(w, w[1:])), [(r["k"], r["k_next"]) for r in w]
    assert sum(r["steps"] for r in w) + final["accumulation"]["window"]["w_steps"] == final["step"]
    if spec.startswith("fixed:"):
        assert {r["k"] for r in w} == {int(spec[6:])}
    if spec == "rl":  # the agent decides from the first window with a noise scale on; before it, k is kept
        decided = next((i for i, r in enumerate(w) if r.get("noise_scale") is not None), len(w))
        assert len(final["accumulation"]["scheduler"]["agent"]["replay"]) == max(len(w) - decided - 1, 0)
    if killed is None:
        return
    acc = killed["accumulation"]
    after = w[acc["n_windows"]]  # the first window closed after the checkpoint
    assert after["k"] == acc["k"] and after["step"] > killed["step"]
    if spec == "rl":
        before = acc["scheduler"]["agent"]["replay"]
        assert len(before) > 0
        _same_state(final["accumulation"]["scheduler"]["agent"]["replay"][:len(before)], before)


def _wait_two_decisions(out, proc, spec: str = "") -> None:
    """Until last.pt holds a checkpoint after two decisions on k, in the middle of a window (rl: after the
    agent recorded a transition, which needs a noise scale: Adam's warm-up first)."""
    def ok(s) -> bool:
        acc = s["accumulation"]
        recorded = spec != "rl" or len(acc["scheduler"]["agent"]["replay"]) > 0
        return acc["n_windows"] >= 2 and acc["window"]["w_steps"] > 0 and recorded

    _wait_for_checkpoint(out / "last.pt", proc, ok, timeout_s=240)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_kill_9_two_ranks_then_resume_continues_at_the_k_it_had(spec, trips_file, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--data", trips_file, *CLI, "--nproc", "2", "--accumulation", spec, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "stfast.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env(), cwd=tmp_path)
    try:
        _wait_two_decisions(out, proc, spec)
    finally:
        _kill_tree(proc)  # SIGKILL to the launcher and both ranks
    assert proc.wait(60) == -signal.SIGKILL
    killed = ckpt.load(out / "last.pt")
    r = subprocess.run([sys.executable, "-m", "stfast.cli", *args, "--resume"], capture_output=True, text=True,
                       env=_env(), timeout=600, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"step {killed['step']}" in r.stdout
    _check_continued(out, spec, killed)


@pytest.mark.slow
def test_torchrun_restart_continues_at_the_k_it_had(trips_file, tmp_path):
    out = tmp_path / "run"
    proc = _torchrun(["--data", trips_file, *CLI, "--accumulation", "rl", "--timeout-s", "30"], out, tmp_path,
                     max_restarts=2)
    try:
        _wait_two_decisions(out, proc)
        os.kill(_rank_pid(proc.pid, 1), signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=400)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 0, stdout[-5000:]
    assert "restarted by torchrun (restart 1): resuming" in stdout
    # which checkpoint the restart found depends on when rank 0 noticed: the rows must continue whichever
    resumed = int(stdout.split("resumed from ")[1].split("step ")[1].split()[0].rstrip(","))
    assert resumed >= 3
    _check_continued(out, "rl")
