"""Crashes and restarts: hashed checkpoints with a previous generation, arguments rejected before any
work, kill -9 mid-epoch then --resume (bitwise), SIGTERM/SIGINT, non-finite steps, and under torchrun a
killed rank (restart from the last checkpoint) or a hung one (timeout naming it)."""
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_line_error as _one_line_error
from conftest import random_trips

from stfast.cli import main
from stfast.models import deeptte as deeptte_mod
from stfast.train import checkpoint as ckpt
from stfast.train.config import TrainConfig
from stfast.train.guards import TrainingDiverged
from stfast.train.trainer import Trainer

ARGS = {"preset": "paper", "format": "deeptte", "epochs": 2, "batch_size": 4, "seed": 3, "dtype": "float64", "progress": False,
        "threads": 1}
CLI_ARGS = ["--preset", "paper", "--format", "deeptte", "--epochs", "2", "--batch-size", "4", "--seed", "3", "--dtype", "float64",
            "--threads", "1", "--no-progress"]
N_STEPS = 2 * 21  # 120 trips → 84 training trips → 21 batches of 4 per epoch


@pytest.fixture(scope="module")
def trips_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "trips.jsonl"
    random_trips(120, seed=21, max_len=25).to_jsonl(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(trips_file, tmp_path_factory):
    """Final parameters of an uninterrupted run (one process, CPU, float64)."""
    out = tmp_path_factory.mktemp("reference")
    Trainer(TrainConfig(data=trips_file, out=str(out), **ARGS)).fit()
    st = ckpt.load(out / "last.pt")
    assert st["step"] == N_STEPS
    return st["model_state"]


def assert_bitwise(state: dict, ref: dict) -> None:
    for k, v in ref.items():
        assert torch.equal(state["model_state"][k], v), k


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONSAFEPATH="1")


def _start(args, out, cwd):
    cmd = [sys.executable, "-m", "stfast.cli", "train", *args, "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=cwd)


def _wait_for_checkpoint(path: Path, proc, ok, timeout_s: float = 120.0) -> dict:
    """Poll ``path`` until its state satisfies ``ok`` (the process must still be running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file():
            try:
                st = ckpt.load(path)
            except (ValueError, FileNotFoundError):  # replaced while read: try again
                st = None
            if st is not None and ok(st):
                return st
        assert proc.poll() is None, f"finished before the wanted checkpoint: {proc.communicate()[0][-3000:]}"
        time.sleep(0.01)
    proc.kill()
    raise AssertionError(f"no checkpoint satisfying the condition after {timeout_s} s")


# ---------------------------------------------------------------- checkpoints: hash and generations
def test_checkpoint_hash_detects_corruption_and_truncation(tmp_path):
    p = tmp_path / "last.pt"
    ckpt.save_atomic({"step": 1, "w": torch.randn(1000)}, p, keep_previous=True)
    ckpt.save_atomic({"step": 2, "w": torch.randn(1000)}, p, keep_previous=True)
    assert ckpt.load(p)["step"] == 2 and ckpt.load(ckpt.previous_path(p))["step"] == 1
    assert ckpt.previous_path(p).name == "last.prev.pt"
    data = bytearray(p.read_bytes())
    i = data.find(b"step") + 40  # a byte inside the payload (the state's own bytes)
    data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="last.pt is (corrupt|unreadable)"):
        ckpt.load(p)
    p.write_bytes(p.read_bytes()[: len(data) // 2])
    with pytest.raises(ValueError, match="last.pt is unreadable"):
        ckpt.load(p)


def test_a_kill_inside_save_never_leaves_the_target_missing(tmp_path, monkeypatch):
    """A process killed between keeping the previous generation and renaming the new file in must still
    leave ``last.pt`` (the old one) in place: the previous generation is a link, not a move. The kill is
    simulated by making the final rename fail."""
    p = tmp_path / "last.pt"
    ckpt.save_atomic({"step": 1}, p, keep_previous=True)
    ckpt.save_atomic({"step": 2}, p, keep_previous=True)
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == p:
            raise KeyboardInterrupt("killed before the new file was renamed in")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_atomic({"step": 3}, p, keep_previous=True)
    monkeypatch.setattr(os, "replace", real_replace)
    assert ckpt.load(p)["step"] == 2 and ckpt.load(ckpt.previous_path(p))["step"] == 2
    assert sorted(f.name for f in tmp_path.iterdir()) == ["last.prev.pt", "last.pt"]  # no temp files left
    ckpt.save_atomic({"step": 4}, p, keep_previous=True)  # the two names are independent files after it
    assert ckpt.load(p)["step"] == 4 and ckpt.load(ckpt.previous_path(p))["step"] == 2


def test_load_first_falls_back_to_the_previous_generation(tmp_path, caplog):
    p = tmp_path / "last.pt"
    ckpt.save_atomic({"step": 1}, p, keep_previous=True)
    ckpt.save_atomic({"step": 2}, p, keep_previous=True)
    p.write_bytes(p.read_bytes()[:100])  # truncated by a crash of the file system, say
    with caplog.at_level("WARNING", logger="stfast.train"):
        st, used = ckpt.load_first([p, ckpt.previous_path(p)])
    assert st["step"] == 1 and used == ckpt.previous_path(p)
    assert str(p) in caplog.text and "last.prev.pt" in caplog.text
    ckpt.previous_path(p).write_bytes(b"garbage")
    with pytest.raises(ValueError, match="no intact checkpoint"):
        ckpt.load_first([p, ckpt.previous_path(p)])


def test_resume_from_a_corrupt_last_pt_uses_the_previous_one(trips_file, tmp_path, reference, caplog):
    out = tmp_path / "run"
    Trainer(TrainConfig(data=trips_file, out=str(out), checkpoint_every=5, max_steps=12, **ARGS)).fit()
    assert ckpt.load(ckpt.previous_path(out / "last.pt"))["step"] == 10
    raw = bytearray((out / "last.pt").read_bytes())
    raw[len(raw) // 2] ^= 0x55
    (out / "last.pt").write_bytes(bytes(raw))
    with caplog.at_level("WARNING", logger="stfast.train"):
        Trainer(TrainConfig(data=trips_file, out=str(out), resume=True, checkpoint_every=5, **ARGS)).fit()
    assert "last.pt" in caplog.text and "using" in caplog.text and "last.prev.pt" in caplog.text
    assert_bitwise(ckpt.load(out / "last.pt"), reference)


# ---------------------------------------------------------------- arguments rejected before any work
def test_resume_rejects_another_model_config_or_version(trips_file, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "--data", trips_file, *CLI_ARGS, "--max-steps", "2", "--out", str(out)]
    assert main(base) == 0
    capsys.readouterr()
    err = _one_line_error(capsys, main(base + ["--resume", "--head", "prior", "--driver-dim", "8"]))
    assert "another model configuration" in err and "--head paper in the checkpoint, prior now" in err
    assert "--driver-dim 16 in the checkpoint, 8 now" in err and "last.pt" in err
    f32 = [x if x != "float64" else "float32" for x in base]
    err = _one_line_error(capsys, main(f32 + ["--resume"]))
    assert "--precision 64 in the checkpoint, 32 now" in err
    st = ckpt.load(out / "last.pt")
    st["stfast_version"] = "0.0.1"
    ckpt.save_atomic(st, out / "last.pt")
    err = _one_line_error(capsys, main(base + ["--resume"]))
    assert "written by stfast 0.0.1" in err
    st = ckpt.load(out / "last.pt")
    assert st["step"] == 2  # the rejected runs trained nothing


def test_nproc_larger_than_training_trips_is_rejected_before_starting_ranks(trips_file, tmp_path):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "stfast.cli", "train", "--data", trips_file, *CLI_ARGS,
                        "--nproc", "85", "--out", str(tmp_path / "r")], capture_output=True, text=True,
                       env=_env(), timeout=300, check=False)
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert errors == ["stfast: error: --nproc 85 is larger than the 84 training trips; use at most 84 processes"]
    assert "torch.distributed" not in r.stdout + r.stderr and not (tmp_path / "r").exists()
    assert time.monotonic() - t0 < 120


def test_zero_batch_and_bad_reliability_options(trips_file, tmp_path, capsys):
    for opt, val, words in (("--batch-size", "0", "--batch-size must be ≥ 1"),
                            ("--checkpoint-every", "0", "--checkpoint-every must be ≥ 1"),
                            ("--max-bad-steps", "0", "--max-bad-steps must be ≥ 1"),
                            ("--timeout-s", "0", "--timeout-s must be > 0")):
        err = _one_line_error(capsys, main(["train", "--data", trips_file, opt, val, "--out", str(tmp_path)]))
        assert words in err
    assert not (tmp_path / "metrics.jsonl").exists()


# ---------------------------------------------------------------- kill -9, SIGTERM, SIGINT
def test_kill_9_mid_epoch_then_resume_is_bitwise_identical(trips_file, tmp_path, reference):
    out = tmp_path / "run"
    proc = _start(["--data", trips_file, *CLI_ARGS, "--checkpoint-every", "5"], out, tmp_path)
    seen = _wait_for_checkpoint(out / "last.pt", proc, lambda s: 0 < s["epoch_batch"] and s["step"] <= 25)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    killed = ckpt.load(out / "last.pt")
    assert killed["step"] >= seen["step"] and killed["step"] < N_STEPS
    assert 0 < killed["epoch_batch"] < 21 and killed["step"] % 5 == 0  # written mid-epoch by --checkpoint-every
    r = subprocess.run([sys.executable, "-m", "stfast.cli", "train", "--data", trips_file, *CLI_ARGS,
                        "--checkpoint-every", "5", "--resume", "--out", str(out)], capture_output=True, text=True,
                       env=_env(), timeout=300, cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr
    assert f"step {killed['step']}" in r.stdout
    final = ckpt.load(out / "last.pt")
    assert final["step"] == N_STEPS
    assert_bitwise(final, reference)
    epochs = [json.loads(r)["epoch"] for r in (out / "metrics.jsonl").read_text().splitlines()
              if '"epoch"' in r]
    assert epochs == [1, 2]  # rows written after the checkpoint were cut, then written once


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_finishes_the_step_writes_last_pt_and_exits_128_plus_it(trips_file, tmp_path, reference, sig):
    out = tmp_path / "run"
    proc = _start(["--data", trips_file, *CLI_ARGS, "--checkpoint-every", "7"], out, tmp_path)
    _wait_for_checkpoint(out / "last.pt", proc, lambda s: s["step"] >= 7)
    proc.send_signal(sig)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stdout[-3000:]  # the run is not finished: `train && evaluate` stops
    name = signal.Signals(sig).name
    assert f"{name} received" in stdout
    line = next(ln for ln in stdout.splitlines() if ln.startswith("stopped after"))
    step = int(line.split()[2])
    assert f"({name})" in line and "--resume" in line
    st = ckpt.load(out / "last.pt")
    assert st["step"] == step and 7 <= step < N_STEPS
    assert "test split (" not in stdout  # exited promptly, without the test evaluation
    assert not (out / ".stfast.lock").exists()  # the run ended: its folder is free, and holds no lock file
    if sig == signal.SIGTERM:  # and the run continues from there to the same end
        assert main(["train", "--data", trips_file, *CLI_ARGS, "--resume", "--out", str(out)]) == 0
        assert_bitwise(ckpt.load(out / "last.pt"), reference)


def test_ctrl_c_in_the_python_api_writes_last_pt_then_raises_keyboard_interrupt(trips_file, tmp_path, reference):
    """Issue 62: Ctrl-C inside train(TrainConfig(...)) saves what the CLI saves, then raises KeyboardInterrupt
    naming resume=True (before, it returned {'stopped_by': 'SIGINT', ...} and the script carried on), and
    resume=True continues the run to the uninterrupted one's end."""
    out = tmp_path / "run"
    code = (f"from stfast.train.config import TrainConfig\n"
            f"from stfast.train.trainer import train\n"
            f"train(TrainConfig(data={trips_file!r}, out={str(out)!r}, checkpoint_every=7, **{ARGS!r}))\n"
            f"print('the script carried on')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=tmp_path)
    _wait_for_checkpoint(out / "last.pt", proc, lambda s: s["step"] >= 7)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, stderr[-3000:]  # Python's end for an uncaught KeyboardInterrupt
    raised = stderr.strip().splitlines()[-1]
    assert raised.startswith("KeyboardInterrupt: stopped after ") and "(SIGINT)" in raised, stderr[-3000:]
    assert "TrainConfig(..., resume=True)" in raised and "--resume" not in raised and str(out / "last.pt") in raised
    step = int(raised.split()[3])
    st = ckpt.load(out / "last.pt")  # written at the stop, before the exception
    assert st["step"] == step and 7 <= step < N_STEPS
    assert "the script carried on" not in stdout and "test split (" not in stdout
    from stfast.train.trainer import train
    train(TrainConfig(data=trips_file, out=str(out), resume=True, **ARGS))
    assert_bitwise(ckpt.load(out / "last.pt"), reference)


# ---------------------------------------------------------------- non-finite loss or gradient
def _poison(monkeypatch, bad_calls, kind="loss"):
    """Make models.deeptte.combine_loss's n-th call (1-based, in bad_calls) give a NaN loss, or a finite loss whose
    gradient is NaN (sqrt|u| at u = 0: value 0, derivative 0·inf)."""
    calls = {"n": 0}
    orig = deeptte_mod.combine_loss

    def poisoned(*a, **k):
        calls["n"] += 1
        loss = orig(*a, **k)
        if calls["n"] not in bad_calls:
            return loss
        return loss * float("nan") if kind == "loss" else loss + (loss - loss.detach()).abs().sqrt()

    monkeypatch.setattr(deeptte_mod, "combine_loss", poisoned)  # what models.deeptte.training_loss calls


@pytest.mark.parametrize("kind", ["loss", "gradient"])
def test_nonfinite_steps_are_skipped_and_logged(trips_file, tmp_path, monkeypatch, kind):
    _poison(monkeypatch, {3, 4}, kind)
    tr = Trainer(TrainConfig(data=trips_file, out=str(tmp_path), **{**ARGS, "epochs": 1}))
    snaps = []
    orig_step = tr.train_step

    def spy(gb, use_local):
        before = [p.detach().clone() for p in tr.model.parameters()]
        loss = orig_step(gb, use_local)
        same = all(torch.equal(a, p) for a, p in zip(before, tr.model.parameters()))
        snaps.append((loss.skipped, same))
        return loss

    tr.train_step = spy
    tr.fit()
    assert [b for b, _ in snaps] == [None, None, f"non-finite {kind}", f"non-finite {kind}"] + [None] * 17
    assert all(same == (b is not None) for b, same in snaps)  # skipped steps leave the parameters alone
    rows = [json.loads(r) for r in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    bad = [r for r in rows if r.get("type") == "bad_step"]
    assert [(r["bad_step"], r["at_batch"], r["reason"]) for r in bad] == [(3, 3, f"non-finite {kind}"),
                                                                          (3, 4, f"non-finite {kind}")]
    assert [r["at_epoch"] for r in bad] == [1, 1]  # numbered from 1, as the epoch rows are
    st = ckpt.load(tmp_path / "last.pt")
    assert st["step"] == 19 and all(torch.isfinite(v).all() for v in st["model_state"].values())
    assert st["optimizer_state"]["state"][0]["step"] == 19
    assert [r["epoch"] for r in rows if "epoch" in r] == [1] and np.isfinite(rows[-1]["train_loss"])


def test_too_many_bad_steps_stop_with_the_last_good_checkpoint(trips_file, tmp_path, monkeypatch, capsys):
    _poison(monkeypatch, set(range(6, 1000)))
    out = tmp_path / "run"
    rc = main(["train", "--data", trips_file, *CLI_ARGS, "--checkpoint-every", "2", "--max-bad-steps", "3",
               "--out", str(out)])
    err = _one_line_error(capsys, rc, expect_rc=1)
    assert "3 optimizer steps in a row had a non-finite loss" in err and "--max-bad-steps 3" in err
    st = ckpt.load(out / "last.pt")
    assert st["step"] == 4 and ckpt.load(ckpt.previous_path(out / "last.pt"))["step"] == 2
    assert all(torch.isfinite(v).all() for v in st["model_state"].values())
    with pytest.raises(TrainingDiverged):
        Trainer(TrainConfig(data=trips_file, out=str(tmp_path / "again"), max_bad_steps=3, **ARGS)).fit()


# ---------------------------------------------------------------- torchrun: a killed rank, a hung rank
def _descendants(pid: int) -> list[int]:
    kids = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _rank_pid(root: int, rank: int) -> int | None:
    for pid in _descendants(root):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RESTART_COUNT=0" in env:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"stfast.cli" in cmd:
                return pid
    return None


def _kill_tree(proc) -> None:
    """SIGKILL a still-running torchrun and its workers (a failed test must not leave ranks behind)."""
    if proc.poll() is None:
        for pid in _descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()


def _torchrun(args, out, cwd, max_restarts):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(max_restarts), "--monitor-interval", "0.5", "-m", "stfast.cli", "train", *args,
           "--out", str(out)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=cwd)


@pytest.mark.slow
def test_torchrun_restarts_after_a_rank_is_killed_and_finishes(trips_file, tmp_path, reference):
    out = tmp_path / "run"
    proc = _torchrun(["--data", trips_file, *CLI_ARGS, "--checkpoint-every", "4", "--timeout-s", "30",
                      "--accumulation", "1"], out, tmp_path, max_restarts=2)
    try:
        _wait_for_checkpoint(out / "last.pt", proc, lambda s: s["step"] >= 8, timeout_s=240)
        victim = _rank_pid(proc.pid, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=300)
    finally:
        _kill_tree(proc)
    assert proc.returncode == 0, stdout[-5000:]
    assert "restarted by torchrun (restart 1): resuming" in stdout
    assert "rank 0 of 2: a collective failed" in stdout and "rank(s) not responding: 1" in stdout, stdout[-5000:]
    final = ckpt.load(out / "last.pt")
    assert final["step"] == N_STEPS
    for k, v in reference.items():  # two ranks compute the one-process step (float64, within rounding)
        assert (final["model_state"][k] - v).abs().max().item() < 1e-9, k


@pytest.mark.slow
def test_a_hung_rank_times_out_with_an_error_naming_it(trips_file, tmp_path):
    out = tmp_path / "run"
    proc = _torchrun(["--data", trips_file, *CLI_ARGS, "--checkpoint-every", "4", "--timeout-s", "20"], out,
                     tmp_path, max_restarts=0)
    hung = None
    try:
        _wait_for_checkpoint(out / "last.pt", proc, lambda s: s["step"] >= 4, timeout_s=240)
        hung, rank0 = _rank_pid(proc.pid, 1), _rank_pid(proc.pid, 0)
        os.kill(hung, signal.SIGSTOP)
        t0 = time.monotonic()
        while Path(f"/proc/{rank0}").exists() and time.monotonic() - t0 < 120:
            status = Path(f"/proc/{rank0}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(
                f"/proc/{rank0}/stat").exists() else "X"
            if status == "Z":
                break
            time.sleep(0.2)
        waited = time.monotonic() - t0
        os.kill(hung, signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        _kill_tree(proc)
    assert waited < 90, "rank 0 kept waiting for the stopped rank"  # 20 s timeout + 5 s to name it, loaded CI
    assert proc.returncode != 0
    assert "rank 0 of 2: a collective failed" in stdout and "rank(s) not responding: 1" in stdout, stdout[-5000:]
    assert "timeout 20 s" in stdout


def test_a_second_run_into_a_folder_in_use_is_refused(trips_file, tmp_path, capsys):
    """One process writes into a run folder at a time: while another process holds it (a run in progress),
    `stfast train` into it, fresh or --resume, is refused naming the holder's pid, and the holder's files are
    untouched. Within one process the hold is shared (an environment's reset makes a new Trainer), and a run
    that ends releases it, so a --resume in the same process works."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from stfast.train.guards import lock_out_dir; "
                               f"lock_out_dir({str(out)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in ([], ["--resume"]):
            assert main(["train", "--data", trips_file, *CLI_ARGS, "--out", str(out), *extra]) == 2
            err = capsys.readouterr().err
            assert f"--out {out} is in use by another stfast run (pid {holder.pid})" in err
        assert sorted(p.name for p in out.iterdir()) == [".stfast.lock"]
    finally:
        holder.kill()
        holder.wait()
    assert main(["train", "--data", trips_file, *CLI_ARGS, "--epochs", "1", "--out", str(out)]) == 0
    cfg = TrainConfig(data=trips_file, out=str(out), resume=True, **ARGS)
    a = Trainer(cfg)
    b = Trainer(cfg)  # the same process: shares the hold
    a.release_out_dir()
    b.release_out_dir()
    assert main(["train", "--data", trips_file, *CLI_ARGS, "--out", str(out), "--resume"]) == 0


@pytest.mark.parametrize("end", ["finished", "failed", "ctrl-c"])
def test_a_run_that_ended_leaves_no_lock_file(trips_file, tmp_path, monkeypatch, end):
    """.stfast.lock is there while a run writes into its folder, not after: a run that finished, failed or was
    interrupted (KeyboardInterrupt) removes it (before: it stayed in every run folder)."""
    out = tmp_path / "run"
    out.mkdir()  # a folder the run did not create: kept, with what the run wrote
    args = ["train", "--data", trips_file, *CLI_ARGS, "--epochs", "1", "--out", str(out)]
    if end == "finished":
        assert main(args) == 0
    else:
        def stop(self, *a, **k):
            assert (out / ".stfast.lock").is_file()  # held while the run writes
            raise KeyboardInterrupt if end == "ctrl-c" else RuntimeError("a failure mid-run")

        monkeypatch.setattr(Trainer, "_after_step", stop)
        with pytest.raises(KeyboardInterrupt if end == "ctrl-c" else RuntimeError):
            main(args)
    assert out.is_dir() and ".stfast.lock" not in os.listdir(out)
    if end == "finished":
        assert "summary.json" in os.listdir(out)


def test_input_refused_after_the_folder_is_claimed_leaves_no_folder(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"lngs": [1, 2]}\n')
    out = tmp_path / "never"
    assert main(["train", "--data", str(bad), "--format", "deeptte", "--out", str(out)]) == 2
    assert not out.exists()


def test_a_rank_whose_peers_never_come_fails_in_one_line_within_its_timeout(trips_file, tmp_path):
    """torchrun's variables for two ranks but only rank 0 started: the rendezvous times out after --timeout-s
    and the run ends (exit 1) with one line naming the rank, the address and the likely causes, not torch's
    DistStoreError traceback; it leaves no run folder."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(_env(), WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "stfast.cli", "train", "--data", trips_file, *CLI_ARGS,
                        "--timeout-s", "3", "--out", str(out)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("stfast: error: rank 0 of world size 2 could not join the process group at "
                           f"127.0.0.1:{port} within --timeout-s 3"), p.stderr[-2000:]
    assert "Traceback" not in p.stderr and not out.exists()


def test_a_checkpoint_on_a_full_disk_is_one_line_and_keeps_the_old(tmp_path, monkeypatch):
    """A full disk while a run saved last.pt was torch's ``RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos`` traceback (torch.save into the file hid the OSError). Now ValueError, one line naming the file
    and what to do (the CLI: ``stfast: error:``, exit 2); the previous file is left as it was, no temporary."""
    import builtins
    import errno

    path = tmp_path / "last.pt"
    ckpt.save_atomic({"step": 1}, path)
    before = path.read_bytes()

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_open = builtins.open
    from stfast.data import durable

    monkeypatch.setattr(durable, "open", lambda p, mode="r", *a, **k: io.BufferedWriter(Full()) if "w" in mode
                        else real_open(p, mode, *a, **k), raising=False)
    with pytest.raises(ValueError, match=rf"cannot write {path}: No space left on device; the disk is full"):
        ckpt.save_atomic({"step": 2}, path, keep_previous=True)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_summary_json_on_a_full_disk_is_one_line(trips_file, tmp_path, capsys, monkeypatch):
    """A full disk when a finished run wrote summary.json was an ``OSError [Errno 28]`` traceback (repro: ``stfast
    train --out`` on a 3752 kB tmpfs), leaving ``.summary.json.tmp``; now one line naming the file, exit 2."""
    import builtins
    import errno

    real = builtins.open

    def full_for_summary(file, *a, **k):
        if ".summary.json.tmp" in str(file):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real(file, *a, **k)

    monkeypatch.setattr(builtins, "open", full_for_summary)
    monkeypatch.setattr(io, "open", full_for_summary)  # pathlib's write_text opens through io.open
    out = tmp_path / "run"
    rc = main(["train", "--data", trips_file, "--max-steps", "2", "--batch-size", "16", "--threads", "1",
               "--no-progress", "--out", str(out)])
    err = _one_line_error(capsys, rc)
    assert f"cannot write {out / 'summary.json'}:" in err and "No space left on device" in err, err
    assert not [p.name for p in out.iterdir() if p.name.startswith(".summary.json.tmp")]
