"""``stfast train --compile`` (issue 51, item 5: stock PyTorch at its best includes torch.compile): the model's
forward through torch.compile trains as the eager model does (within float32 reordering), with the fused and the
reference kernels; the compilation is done before the epochs' clocks and reported; --resume keeps the setting;
the combinations it does not support, and a machine where inductor cannot build kernels, are refused in one line.

Not marked slow: with an empty inductor cache (TORCHINDUCTOR_CACHE_DIR) each compiling test took 34–44 s on the
2-core development machine (the whole file 140 s; 55 s with inductor's on-disk cache warm)."""
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from conftest import random_trips
from stfast import cli
from stfast.train import checkpoint as ckpt
from stfast.train import compiled
from stfast.train.config import TrainConfig
from stfast.train.trainer import Trainer


@pytest.fixture(scope="module")
def varied_file(tmp_path_factory):
    """Trips of 5–30 points: every batch is padded to another length (the dynamic-shape case)."""
    path = tmp_path_factory.mktemp("compile") / "varied.jsonl"
    random_trips(60, seed=51, min_len=5, max_len=30).to_jsonl(path)
    return str(path)


@pytest.fixture(scope="module")
def equal_file(tmp_path_factory):
    """Trips of 12 points each: every batch has one padded length. The reference kernels' geo-conv is a Conv1d,
    whose backward inductor specializes on the padded length (a recompilation per new length); one length
    keeps the reference test to one compilation."""
    path = tmp_path_factory.mktemp("compile") / "equal.jsonl"
    random_trips(60, seed=52, min_len=12, max_len=12).to_jsonl(path)
    return str(path)


def _cfg(data, out, **kw):
    """A one-epoch run of 3 optimizer steps (42 training trips, batch 16) on 1 thread."""
    kw = {"epochs": 1, **kw}
    return TrainConfig(data=data, format="deeptte", preset="paper", batch_size=16, seed=1, out=str(out),
                       progress=False, threads=1, **kw)


def _epoch_row(out) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["type"] == "epoch")


def _fresh_dynamo() -> None:
    """Dynamo's caches and counters emptied: the graphs counted after it are this test's (the toolchain probe,
    once per process, is compiled before)."""
    assert compiled.unavailable("cpu") is None
    torch._dynamo.reset()
    counters.clear()


def _graphs() -> int:
    """Graphs dynamo compiled since :func:`_fresh_dynamo` (torch.compile's own statistics)."""
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("kernels, data, precision", [("fused", "varied", "32"), ("reference", "equal", "32"),
                                                      ("fused", "varied", "bf16-mixed")])
def test_compiled_training_gives_the_eager_losses(kernels, data, precision, varied_file, equal_file, tmp_path,
                                                  capsys):
    """An epoch (3 optimizer steps) with --compile: the same training loss and validation MAPE as eager within
    float32 reordering (bf16-mixed: bfloat16's rounding), the forward compiled by dynamo (no recompilation per
    padded length), the compilation said and recorded as summary.json's compile_s, before the epoch's clock."""
    path = varied_file if data == "varied" else equal_file
    kw = {"kernels": kernels, "precision": precision}
    eager = Trainer(_cfg(path, tmp_path / "eager", **kw))
    eager_summary = eager.fit()
    _fresh_dynamo()
    tr = Trainer(_cfg(path, tmp_path / "compiled", compile=True, **kw))
    summary = tr.fit()
    # fused: one graph served every padded length (dynamic shapes); reference: graphs around the LSTM's break
    assert _graphs() == 1 if kernels == "fused" else _graphs() >= 2
    assert "compile_s" not in eager_summary and summary["compile_s"] > 0
    assert "torch.compile: the model's forward and backward compiled in" in capsys.readouterr().out
    e, c = _epoch_row(tmp_path / "eager"), _epoch_row(tmp_path / "compiled")
    rtol = 1e-5 if precision == "32" else 1e-2
    assert c["step"] == e["step"] == 3
    np.testing.assert_allclose(c["train_loss"], e["train_loss"], rtol=rtol)
    np.testing.assert_allclose(c["val_mape"], e["val_mape"], rtol=rtol)
    # the compilation is before the epoch's clock: the epoch's trips/s is not its 20+ s
    assert c["wall_s"] > summary["compile_s"] > 42 / c["samples_per_s"]
    if precision == "32":
        for (n, p), q in zip(tr.model.named_parameters(), eager.model.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=n)


def test_resume_keeps_compile_and_the_checkpoint_records_it(varied_file, tmp_path):
    out = tmp_path / "run"
    _fresh_dynamo()
    Trainer(_cfg(varied_file, out, compile=True, max_steps=2)).fit()
    assert _graphs() == 1
    assert ckpt.load(out / "last.pt")["train_config"]["compile"] is True
    cfg = _cfg(varied_file, out, resume=True, max_steps=3)  # --compile not given: the run's
    assert cfg.compile is True
    summary = Trainer(cfg).fit()
    assert summary["steps"] == 3 and summary["compile_s"] > 0
    assert _graphs() == 1  # the resumed model's parameters are the graph's inputs: the same graph serves it


def test_a_compiled_run_resumes_eagerly_where_it_cannot_compile(varied_file, tmp_path, monkeypatch, caplog):
    """A compiled run resumed (--compile not given) where torch.compile cannot run (no C++ compiler, --nproc > 1,
    component parallelism) continues eagerly with a warning: before, it was refused, naming "train without
    --compile", a flag there was no way to give. --compile given explicitly is still refused."""
    out = tmp_path / "run"
    Trainer(_cfg(varied_file, out, max_steps=1)).fit()
    state = ckpt.load(out / "last.pt")
    state["train_config"]["compile"] = True  # as a compiled run's checkpoint records it
    ckpt.save_atomic(state, out / "last.pt")
    monkeypatch.setattr(compiled, "unavailable", lambda device: "no compiler here")
    cfg = _cfg(varied_file, out, resume=True, max_steps=2)
    assert cfg.compile is True
    with caplog.at_level(logging.WARNING, logger="stfast.train"):
        summary = Trainer(cfg).fit()
    assert summary["steps"] == 2 and "compile_s" not in summary and cfg.compile is False
    assert "the run was trained with --compile, but no compiler here; it continues without torch.compile" in caplog.text
    with pytest.raises(ValueError, match="^--compile: no compiler here; train without --compile$"):
        Trainer(_cfg(varied_file, out, resume=True, compile=True, max_steps=3))
    cfg = _cfg(varied_file, out, resume=True, max_steps=3, parallel="cp")  # the config's own rule, alike
    assert cfg.compile is False


def test_no_compile_resumes_a_compiled_run_eagerly(varied_file, tmp_path, caplog):
    """--compile/--no-compile: neither given is None (a fresh run eager, a resumed one the run's setting);
    --no-compile turns a compiled run's resume eager, without the warning of a run that cannot compile. Before,
    there was only --compile: --no-compile was refused as an unknown argument."""
    parse = cli.build_parser("train").parse_args
    assert [parse(["train", *f]).compile for f in ([], ["--compile"], ["--no-compile"])] == [None, True, False]
    out = tmp_path / "run"
    Trainer(_cfg(varied_file, out, max_steps=1)).fit()
    state = ckpt.load(out / "last.pt")
    state["train_config"]["compile"] = True  # as a compiled run's checkpoint records it
    ckpt.save_atomic(state, out / "last.pt")
    cfg = TrainConfig.from_args(parse(["train", "--resume", "--no-compile", "--out", str(out)]))
    assert cfg.compile is False
    with caplog.at_level(logging.WARNING, logger="stfast.train"):
        summary = Trainer(_cfg(varied_file, out, resume=True, compile=False, max_steps=2)).fit()
    assert summary["steps"] == 2 and "compile_s" not in summary
    assert "compile" not in caplog.text
    assert ckpt.load(out / "last.pt")["train_config"]["compile"] is False  # the run continues eager from here on


def test_compile_is_off_unless_given_and_off_for_checkpoints_before_it(tmp_path):
    assert TrainConfig().compile is False
    assert cli.build_parser("train").parse_args(["train", "--compile"]).compile is True
    assert TrainConfig.from_args(cli.build_parser("train").parse_args(["train"])).compile is False
    assert TrainConfig.from_dict({"precision": "32"}).compile is False  # a checkpoint's train_config without it


@pytest.mark.parametrize("flags, message", [
    (["--nproc", "2"], "--compile: it runs in one process, not with --nproc 2 (use --nproc 1); train without"),
    (["--parallel", "cp"], "--compile: it compiles the whole model's forward, and --parallel cp runs its components"),
])
def test_unsupported_combinations_are_refused_in_one_line(flags, message, tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["train", "--n-synthetic", "50", "--compile", "--out", str(out), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"stfast: error: {message}") and err.count("\n") == 1
    assert not out.exists()


def test_without_a_cpp_compiler_compile_is_refused_in_one_line_and_writes_nothing(tmp_path):
    """Inductor's CPU kernels need a C++ compiler (CXX, default g++): without one, --compile is refused before
    any data is read, naming the cause; a fresh process, so that inductor reads CXX and nothing is cached."""
    out = tmp_path / "run"
    env = {**__import__("os").environ, "CXX": str(tmp_path / "no-such-g++"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    p = subprocess.run([sys.executable, "-m", "stfast.cli", "train", "--n-synthetic", "50", "--compile",
                        "--max-steps", "1", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.startswith("stfast: error:")]
    assert lines[0] == ("stfast: error: --compile: torch.compile cannot build kernels on cpu here: inductor found no "
                        "working C++ compiler (install g++, or set CXX to a working one); train without --compile"), \
        p.stderr[-2000:]
    assert "Traceback" not in p.stderr and not out.exists()


def test_unavailable_is_none_where_inductor_builds_kernels():
    assert compiled.unavailable("cpu") is None


def test_warm_up_runs_the_epochs_smallest_and_largest_batch_once_each():
    """Padded size = trips × the longest trip's points: inductor picks some kernels by size (a guard
    B·(L − 2) ≤ 4096 was seen on the Chengdu sample), so both ends compile before the clock."""
    lengths = np.array([5, 30, 10, 10, 7])
    batches = [np.array([0, 4]), np.array([1, 2]), np.array([3])]  # sizes 14, 60, 10
    got = compiled.warm_up_batches(batches, lengths)
    assert [b.tolist() for b in got] == [[1, 2], [3]]
    assert [b.tolist() for b in compiled.warm_up_batches(batches[:1], lengths)] == [[0, 4]]


def test_a_job_launched_by_torchrun_is_refused_with_compile(monkeypatch, tmp_path):
    """--nproc is refused by the config; a job torchrun started itself (world size from its environment) is
    refused by the Trainer, before anything is read or written (rank 0 here, of 2)."""
    from stfast.parallel import data_parallel as dp
    from stfast.train import trainer

    monkeypatch.setattr(trainer.dp, "init_from_env", lambda device, timeout_s: dp.DistInfo(0, 2, 0))
    monkeypatch.setattr(trainer.guards, "agree_out_dir", lambda cfg, info: None)  # no process group here
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^--compile: it runs in one process, and this job has world size 2; train "
                                         r"without --compile$"):
        Trainer(TrainConfig(n_synthetic=50, compile=True, out=str(out), progress=False))
    assert not out.exists()
